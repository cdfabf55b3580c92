"""Which GPU library to use: the ``--backend`` choice resolved against what the host has.

Loaders live in a plain mapping so the CLI can be handed other ones (tests pass loaders that
raise ``LibraryNotFound`` or return a fake library through click's ``obj``), and the answer
never depends on what the machine running the tests happens to have installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from spoke._amdsmi import AmdSmiBackend, load_amdsmi
from spoke._model import EVERY_PASS, Backend, Cadence, LibraryNotFound
from spoke._nvml import NvmlBackend, load_nvml

log = logging.getLogger(__name__)

NO_LIBRARY = "no GPU management library found (NVML, AMD SMI)"

Loader = Callable[[], Any]

#: backend name -> function returning its library module (raises LibraryNotFound)
LOADERS: dict[str, Loader] = {"nvml": load_nvml, "amdsmi": load_amdsmi}

#: AMD SMI's calls were never measured to be slow, so only NVML takes the cadence
_FACTORIES: dict[str, Callable[[Any, Cadence], Backend]] = {
    "nvml": lambda lib, cadence: NvmlBackend(nvml=lib, cadence=cadence),
    "amdsmi": lambda lib, cadence: AmdSmiBackend(amdsmi=lib),
}
AUTO_ORDER = ("nvml", "amdsmi")


def open_backend(choice: str, loaders: Mapping[str, Loader] | None = None,
                 cadence: Cadence = EVERY_PASS) -> Backend:
    """An opened backend for ``auto``, ``nvml`` or ``amdsmi``; LibraryNotFound otherwise."""
    table = {**LOADERS, **(loaders or {})}
    names = AUTO_ORDER if choice == "auto" else (choice,)
    reasons: list[str] = []
    for name in names:
        if name not in _FACTORIES:
            raise ValueError(f"unknown backend {name!r}")
        try:
            backend = _FACTORIES[name](table[name](), cadence)
            backend.open()
        except LibraryNotFound as exc:
            log.debug("backend %s unavailable: %s", name, exc)
            reasons.append(str(exc))
            continue
        return backend
    if choice == "auto":
        raise LibraryNotFound(NO_LIBRARY)
    raise LibraryNotFound(reasons[0])
