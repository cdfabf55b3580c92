"""The one place a caller's scope is applied to an answer before it leaves.

Every route of the app is registered through one wrapper (``hub.service._routing``) that passes
what its handler returns through :func:`confine` with the caller's scope, JSON and page
alike, so a handler that forgets its scope cannot leak: at worst it reads more than it needs.
Handlers still narrow their reads by the scope (in SQL, so paging stays exact); this is the
guarantee, not the filter.

The rules follow the inventory's own field names, which every answer shares (a name is a
string: the description's ``"cluster": {schema}`` is not one):

* an object with a ``cluster`` outside the scope goes (from a list; elsewhere it becomes
  null): its node, GPU and pod names go with it;
* an object with a ``namespace`` outside the scope and free text (``message``: a finding
  that names the pod in words) goes; one without free text stays with the namespace shown as
  ``"other"`` and ``pod``/``container`` emptied (another team's pod on your GPU);
* a page section that lost rows counts only what is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hub.service._auth import OTHER, Scope

_DROP = object()
#: keys whose value is free text that may name a pod or namespace in words
TEXT_KEYS = ("message",)


def confine(data: Any, scope: Scope) -> Any:
    """``data`` as ``scope`` may see it (the same object when the scope is the whole fleet)."""
    if scope.unrestricted:
        return data
    out = _walk(data, scope)
    return None if out is _DROP else out


def _walk(value: Any, scope: Scope) -> Any:
    if isinstance(value, Mapping):
        return _mapping(value, scope)
    if isinstance(value, (list, tuple)):
        items = [_walk(v, scope) for v in value]
        kept = [v for v in items if v is not _DROP]
        return kept if isinstance(value, list) else tuple(kept)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass(value, scope)
    return value


def _mapping(item: Mapping[str, Any], scope: Scope) -> Any:
    cluster = item.get("cluster", _DROP)
    if (cluster is None or isinstance(cluster, str)) and scope.clusters is not None \
            and not scope.allows_cluster(cluster):
        return _DROP
    out = dict(item)
    namespace = out.get("namespace")
    if isinstance(namespace, str) and namespace != OTHER \
            and not scope.allows_namespace(namespace):
        if any(k in out for k in TEXT_KEYS):
            return _DROP
        out["namespace"] = OTHER
        for key in ("pod", "container"):
            if key in out:
                out[key] = None
    for key, value in out.items():
        if isinstance(value, (Mapping, list, tuple)) or dataclasses.is_dataclass(value):
            walked = _walk(value, scope)
            out[key] = None if walked is _DROP else walked
    return out


def _dataclass(value: Any, scope: Scope) -> Any:
    """A page section (or any record of rows): its fields confined; a ``total`` that counted
    rows now gone counts what is left."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        current = getattr(value, f.name)
        walked = _walk(current, scope)
        if walked is not current:
            changes[f.name] = None if walked is _DROP else walked
    rows_before = getattr(value, "rows", None)
    rows_after = changes.get("rows")  # a walked list is a list, never dropped
    if isinstance(rows_after, list) and isinstance(rows_before, list) \
            and getattr(value, "total", None) is not None \
            and len(rows_after) != len(rows_before):
        changes["total"] = len(rows_after)
    return dataclasses.replace(value, **changes) if changes else value
