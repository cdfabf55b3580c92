"""``--acm-collection auto``: which ACM collection path the hub runs, read from its
MultiClusterObservability.

With ``spec.capabilities.platform.metrics.default.enabled: true`` the operator hands platform
collection to the multicluster-observability-addon and removes the legacy metrics-collector
and its allowlist from every spoke; ``spec.capabilities.userWorkloads.metrics.default.enabled``
does the same for user-workload metrics. Some builds of the operator spell the last step
``collection.enabled``: both are read (FIELD_NOTES, fifth round).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hub.common import InputError, UnavailableError
from hub.store import ACM_COLLECTIONS, LEGACY_COLLECTION, MCOA_COLLECTION

AUTO = "auto"
#: what ``--acm-collection`` takes
CHOICES = (*ACM_COLLECTIONS, AUTO)
#: spec.capabilities.<key> per monitoring stack
_CAPABILITY = {"platform": "platform", "user-workload": "userWorkloads"}


@dataclass(frozen=True)
class Collection:
    """The path chosen, and what it was read from (said to the user in one line)."""

    path: str
    reason: str


def check_choice(value: str | None) -> str:
    """``--acm-collection``: legacy, mcoa or auto (one line, exit 2, for anything else)."""
    choice = (value or LEGACY_COLLECTION).strip().lower()
    if choice not in CHOICES:
        raise InputError(f"--acm-collection {str(value)[:40]!r} is not one of "
                         f"{', '.join(CHOICES)}")
    return choice


def _enabled(metrics: Any) -> bool:
    if not isinstance(metrics, Mapping):
        return False
    return any(isinstance(metrics.get(step), Mapping) and metrics[step].get("enabled") is True
               for step in ("default", "collection"))


def collection_of(objects: Iterable[Mapping[str, Any]], monitoring: str = "platform"
                  ) -> Collection:
    """The path a hub's MultiClusterObservability has enabled for ``monitoring``."""
    found = list(objects)
    if not found:
        raise UnavailableError("the hub has no MultiClusterObservability object: ACM "
                               "Observability is not enabled there; pass --acm-collection "
                               "legacy or mcoa")
    capability = _CAPABILITY[monitoring]
    for obj in found:
        name = (obj.get("metadata") or {}).get("name") or "?"
        metrics = (((obj.get("spec") or {}).get("capabilities") or {}).get(capability) or {}
                   ).get("metrics")
        if _enabled(metrics):
            return Collection(MCOA_COLLECTION, f"MultiClusterObservability {name}: "
                                               f"spec.capabilities.{capability}.metrics "
                                               "enabled (multicluster-observability-addon)")
    names = ", ".join(str((o.get("metadata") or {}).get("name") or "?") for o in found)
    return Collection(LEGACY_COLLECTION, f"MultiClusterObservability {names}: "
                                         f"spec.capabilities.{capability}.metrics not enabled "
                                         "(the legacy metrics-collector)")
