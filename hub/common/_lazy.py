"""The house's one way to load part of a package on first use (PEP 562).

A package whose names pull in something heavy or optional (requests, the kubernetes client,
http.server) exports them through ``__getattr__ = lazy_attributes(__name__, {...})``: the
command that never touches them starts without loading them, and ``from hub.store import
HubClient`` still works. Everything else is imported at the top of a module, never inside a
function, unless it breaks an import cycle (say so in a comment there).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``modules`` is read from the
    submodule it maps to (``{"HubClient": "_client"}``), imported when first asked for."""

    def __getattr__(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
