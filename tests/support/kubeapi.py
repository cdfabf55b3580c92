"""A small, generic Kubernetes API server for tests, spoken to by the official client unchanged.

No real API server can be installed here, so tests point a kubeconfig at this one. It answers
the real REST paths with realistic JSON and real ``Status`` objects for errors, which is all the
``kubernetes`` client looks at:

* core ``/api/v1/...`` and group ``/apis/GROUP/VERSION/...`` paths, cluster-scoped
  (``/api/v1/nodes/NAME``, ``/apis/cluster.open-cluster-management.io/v1/managedclusters``) and
  namespaced (``/apis/G/V/namespaces/NS/PLURAL/NAME``); a list on the cluster path of a
  namespaced resource lists all namespaces, as in Kubernetes;
* GET (get; list with ``limit``/``continue`` paging, ``metadata.continue``,
  ``remainingItemCount``, ``labelSelector`` and ``fieldSelector`` on metadata.name/namespace),
  POST (create; 409 AlreadyExists; 404 when the namespace does not exist), PUT (replace; 409
  Conflict on a stale ``resourceVersion``), PATCH (merge-patch and strategic-merge as merge for
  built-in kinds, 415 for strategic-merge on custom resources, JSON patch, and server-side
  apply: ``application/apply-patch+yaml`` with ``fieldManager`` and ``force``), DELETE;
* managed fields, lite: which manager set which field (maps walked to their leaves, a list
  is one field), shown as ``metadata.managedFields``; an apply that would change a field
  another manager owns is a 409 Conflict naming the fields and managers (as kube-apiserver's
  Status does) unless forced; fields a manager applied before and applies no more are
  removed; other writes (create, replace, merge patch) make their manager (``fieldManager``,
  else "unknown") own what they changed;
  ``/status`` subresources; ``/version``, ``/api``, ``/apis`` and per-group discovery;
* bearer-token authentication (401 without the token the kubeconfig carries).

Objects are stored by (group, version, plural, namespace, name); every write bumps one global
``resourceVersion``. Kinds are learned from stored objects; common ones are known up front.

Use the ``kube_api`` fixture (``from tests.support.kubeapi import kube_api as kube_api`` in a test
module) or :class:`KubeAPI` directly::

    api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, ...})
    path = api.kubeconfig_path("hub")          # a kubeconfig whose context "hub" points here
    ...                                        # run code under test with that kubeconfig
    assert ("GET", "/api/v1/nodes") in [(r.method, r.path) for r in api.requests]
    assert api.requests[-1].query == {"limit": "2", "continue": "..."}

``fail(method, path, status)`` makes the next matching request fail, to test error handling.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import http.server
import json
import re
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

Key = tuple[str, str, str, str, str]  # group, version, plural, namespace ("" = cluster), name

#: Groups whose kinds are compiled into kube-apiserver: list items omit kind/apiVersion, PUT
#: without resourceVersion is allowed and strategic-merge patches are accepted.
BUILTIN_GROUPS = {
    "", "apps", "batch", "rbac.authorization.k8s.io", "networking.k8s.io", "policy",
    "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io", "autoscaling",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "node.k8s.io",
    "discovery.k8s.io", "certificates.k8s.io", "resource.k8s.io",
}

#: plural -> (kind, namespaced) for the resources tests commonly use; more are learned.
KNOWN: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "nodes"): ("Node", False),
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "services"): ("Service", True),
    ("", "v1", "configmaps"): ("ConfigMap", True),
    ("", "v1", "secrets"): ("Secret", True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True),
    ("policy.open-cluster-management.io", "v1", "policies"): ("Policy", True),
    ("policy.open-cluster-management.io", "v1", "placementbindings"): ("PlacementBinding", True),
    ("cluster.open-cluster-management.io", "v1beta1", "placements"): ("Placement", True),
    ("cluster.open-cluster-management.io", "v1beta2", "managedclustersetbindings"):
        ("ManagedClusterSetBinding", True),
    ("cluster.open-cluster-management.io", "v1", "managedclusters"): ("ManagedCluster", False),
    ("cluster.open-cluster-management.io", "v1alpha1", "addonplacementscores"):
        ("AddOnPlacementScore", True),
}

#: Dynamic Resource Allocation's resources (the same in v1, v1beta2 and v1beta1); a server
#: serves them only when a test says so (``serve_dra``), as clusters before 1.32 do not.
DRA_GROUP = "resource.k8s.io"
DRA_RESOURCES = {"resourceslices": ("ResourceSlice", False),
                 "resourceclaims": ("ResourceClaim", True),
                 "deviceclasses": ("DeviceClass", False)}

SUBRESOURCES = {"status"}


@dataclass(frozen=True)
class LoggedRequest:
    """One request the server received (the query parsed, single values)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.query.items())
        return f"{self.method} {self.path}" + (f"?{query}" if query else "")


class ApiError(Exception):
    """Becomes a Kubernetes Status object in the response."""

    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class Route:
    """A parsed API path."""

    group: str
    version: str
    plural: str
    namespace: str  # "" when cluster-scoped or across namespaces
    name: str  # "" for collections
    subresource: str = ""

    def resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def plural_of(kind: str) -> str:
    """The usual English plural Kubernetes uses for a kind (pass ``plural=`` when it differs)."""
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in "aeiou":
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    return lower + "s"


def _split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


#: fields no manager owns (identity and bookkeeping), as in kube-apiserver's managedFields
_UNOWNED_META = {"name", "namespace", "uid", "resourceVersion", "generation",
                 "creationTimestamp", "managedFields"}


def _leaves(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """The fields of an object a manager can own: maps walked to their leaves, a list or a
    scalar one field; apiVersion, kind, status and identity metadata left out."""
    out: dict[tuple[str, ...], Any] = {}
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        path = (*prefix, key)
        if not prefix and key in ("apiVersion", "kind", "status"):
            continue
        if prefix == ("metadata",) and key in _UNOWNED_META:
            continue
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


def _set_path(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _remove_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    """Remove a field and the maps it leaves empty."""
    parents = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _fields_v1(paths: set[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(paths):
        node = out
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return out


def _dotted(path: tuple[str, ...]) -> str:
    return "".join(f".{p}" for p in path)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(doc: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, test (what clients send in practice)."""
    doc = copy.deepcopy(doc)
    for op in operations:
        parts = _pointer(op.get("path", ""))
        if not parts:
            raise ApiError(422, "Invalid", "JSON patch on the whole object is not supported")
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise ApiError(422, "Invalid", f"path {op.get('path')} does not exist")
        last = parts[-1]
        kind = op.get("op")
        try:
            if kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op.get("value"):
                    raise ApiError(422, "Invalid", f"test failed at {op.get('path')}")
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, op.get("value"))
                    else:
                        parent[index] = op.get("value")
                else:
                    if kind == "replace" and last not in parent:
                        raise ApiError(422, "Invalid", f"path {op.get('path')} does not exist")
                    parent[last] = op.get("value")
            elif kind == "remove":
                if isinstance(parent, list):
                    del parent[int(last)]
                else:
                    del parent[last]
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"path {op.get('path')} does not exist") from None
    return doc


def _selector_terms(selector: str) -> list[str]:
    """Split a selector on the commas that are not inside ``in (a,b)`` sets."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")


def _label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: =, ==, !=, in, notin, key, !key."""
    for term in _selector_terms(selector):
        set_term = _SET_TERM.match(term)
        if set_term:
            key, op, values = set_term.groups()
            wanted = {v.strip() for v in values.split(",") if v.strip()}
            present = key in labels and labels[key] in wanted
            if present != (op == "in"):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field_selector_matches(selector: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    fields = {"metadata.name": meta.get("name", ""),
              "metadata.namespace": meta.get("namespace", "")}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        if key not in fields:
            raise ApiError(400, "BadRequest",
                           f'"{key}" is not a known field selector: only "metadata.name", '
                           '"metadata.namespace"')
        if (fields[key] == value) == negate:
            return False
    return True


class KubeAPI:
    """The server: state, the HTTP handler and helpers for tests."""

    def __init__(self, token: str = "test-token", workdir: Path | None = None,
                 version: str = "1.30") -> None:
        self.token = token
        self.version = version
        self.objects: dict[Key, dict[str, Any]] = {}
        #: per object: manager -> (operation "Apply" | "Update", the fields it owns)
        self.owners: dict[Key, dict[str, tuple[str, set[tuple[str, ...]]]]] = {}
        #: per object: manager -> the status fields it applied through ``/status``
        self.status_owners: dict[Key, dict[str, set[tuple[str, ...]]]] = {}
        self.kinds: dict[tuple[str, str, str], tuple[str, bool]] = dict(KNOWN)
        self.requests: list[LoggedRequest] = []
        self._failures: list[tuple[str, str, int, str]] = []
        self._rv = 100
        self._lock = threading.RLock()
        self._workdir = workdir
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> KubeAPI:
        api = self

        class Handler(_Handler):
            server_api = api

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut kept-alive connections: clients then see a server that is gone."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._connections.clear()

    def __enter__(self) -> KubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "KubeAPI not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig_path(self, context_name: str = "test", path: str | Path | None = None,
                        namespace: str | None = None) -> Path:
        """Write (or extend) a kubeconfig whose context ``context_name`` points at this server.

        Passing the ``path`` of an earlier kubeconfig adds the context to it, so one file can
        name several servers (one per cluster); its current-context stays the first one.
        """
        if path is None:
            base = self._workdir or Path(tempfile.mkdtemp(prefix="kubeapi-"))
            path = Path(base) / f"kubeconfig-{context_name}"
        path = Path(path)
        data: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "preferences": {},
                                "clusters": [], "users": [], "contexts": []}
        if path.exists():
            data = yaml.safe_load(path.read_text()) or data
        for section, entry in (
            ("clusters", {"name": context_name, "cluster": {"server": self.url}}),
            ("users", {"name": context_name, "user": {"token": self.token}}),
            ("contexts", {"name": context_name, "context": {
                "cluster": context_name, "user": context_name,
                **({"namespace": namespace} if namespace else {})}}),
        ):
            items = [i for i in data.get(section) or [] if i.get("name") != context_name]
            data[section] = [*items, entry]
        data.setdefault("current-context", context_name)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # -- test helpers --------------------------------------------------------------------
    def put_object(self, obj: dict[str, Any], plural: str | None = None,
                   namespaced: bool | None = None,
                   manager: str = "another-client") -> dict[str, Any]:
        """Store an object directly (no admission checks), as if another client (field
        manager ``manager``) created or updated it.

        The plural defaults to the kind's usual plural and is remembered with the kind, so
        lists of that resource know their kind even when empty.
        """
        group, version = _split_api_version(obj["apiVersion"])
        plural = plural or self._plural_for(group, version, obj["kind"])
        meta = obj.setdefault("metadata", {})
        is_namespaced = bool(meta.get("namespace")) if namespaced is None else namespaced
        with self._lock:
            self.kinds[(group, version, plural)] = (obj["kind"], is_namespaced)
            key = (group, version, plural, meta.get("namespace", "") if is_namespaced else "",
                   meta["name"])
            previous = self.objects.get(key)
            stored = self._stamp(copy.deepcopy(obj), previous)
            self._record_update(key, previous, stored, manager)
            self.objects[key] = stored
            return copy.deepcopy(stored)

    def serve_dra(self, *versions: str) -> None:
        """Serve resource.k8s.io in these versions (discovery lists them; lists answer, empty
        until objects are put): ``serve_dra("v1")`` is Kubernetes 1.34+, ``serve_dra("v1beta1")``
        a 1.32 cluster."""
        with self._lock:
            for version in versions or ("v1",):
                for plural, known in DRA_RESOURCES.items():
                    self.kinds[(DRA_GROUP, version, plural)] = known

    def get_object(self, api_version: str, kind_or_plural: str, name: str,
                   namespace: str = "") -> dict[str, Any] | None:
        group, version = _split_api_version(api_version)
        plural = (kind_or_plural if kind_or_plural.islower()
                  else self._plural_for(group, version, kind_or_plural))
        found = self.objects.get((group, version, plural, namespace, name))
        return copy.deepcopy(found) if found else None

    def list_objects(self, api_version: str, kind_or_plural: str) -> list[dict[str, Any]]:
        group, version = _split_api_version(api_version)
        plural = (kind_or_plural if kind_or_plural.islower()
                  else self._plural_for(group, version, kind_or_plural))
        return [copy.deepcopy(o) for k, o in sorted(self.objects.items())
                if k[:3] == (group, version, plural)]

    def fail(self, method: str, path: str, code: int = 500, reason: str = "InternalError",
             times: int = 1) -> None:
        """Make the next ``times`` requests with this method and exact path fail."""
        for _ in range(times):
            self._failures.append((method.upper(), path, code, reason))

    def requests_to(self, method: str | None = None, prefix: str = "") -> list[LoggedRequest]:
        return [r for r in self.requests
                if (method is None or r.method == method) and r.path.startswith(prefix)]

    # -- internals -----------------------------------------------------------------------
    def _plural_for(self, group: str, version: str, kind: str) -> str:
        for (g, v, plural), (k, _) in self.kinds.items():
            if (g, v, k) == (group, version, kind):
                return plural
        return plural_of(kind)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _stamp(self, obj: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if previous:
            old = previous["metadata"]
            meta["uid"] = old["uid"]
            meta["creationTimestamp"] = old["creationTimestamp"]
            generation = old.get("generation", 1)
            if previous.get("spec") != obj.get("spec"):
                generation += 1
            meta["generation"] = generation
        else:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", dt.datetime.now(dt.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"))
            meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_rv()
        return obj

    def _record_update(self, key: Key, before: dict[str, Any] | None,
                       after: dict[str, Any], manager: str) -> None:
        """A write that is not an apply: its manager owns the fields it changed (taken from
        whoever owned them), and fields gone from the object are nobody's."""
        old, new = _leaves(before or {}), _leaves(after)
        changed = {p for p, v in new.items() if p not in old or old[p] != v}
        owners = self.owners.setdefault(key, {})
        for name, (op, paths) in list(owners.items()):
            owners[name] = (op, {p for p in paths if p in new and p not in changed})
        op, mine = owners.get(manager, ("Update", set()))
        owners[manager] = (op, mine | changed)
        self._show_managed(key, after)

    def _show_managed(self, key: Key, obj: dict[str, Any]) -> None:
        owners = self.owners.get(key, {})
        obj.setdefault("metadata", {})["managedFields"] = [
            {"manager": name, "operation": op, "apiVersion": obj.get("apiVersion"),
             "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(paths)}
            for name, (op, paths) in sorted(owners.items()) if paths]

    def _apply(self, route: Route, kind: str, namespaced: bool,
               current: dict[str, Any] | None, body: Any,
               query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Server-side apply: the manager owns exactly the fields of its body."""
        manager = query.get("fieldManager") or ""
        if not manager:
            raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: "
                                           "fieldManager: Required value: is required for "
                                           "apply patch")
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "an apply patch must be an object")
        force = query.get("force") == "true"
        key = self._key(route)
        owners = self.owners.setdefault(key, {})
        applied = _leaves(body)
        now = _leaves(current or {})
        conflicts = sorted((name, p) for p, v in applied.items()
                           for name, (_, paths) in owners.items()
                           if name != manager and p in paths and now.get(p) != v)
        group_version = f"{route.group}/{route.version}" if route.group else route.version
        if conflicts and not force:
            raise ApiError(409, "Conflict", f"Apply failed with {len(conflicts)} conflict"
                           f"{'s' * (len(conflicts) != 1)}: " + "; ".join(
                               f'conflict with "{n}" using {group_version}: {_dotted(p)}'
                               for n, p in conflicts),
                           {"name": route.name, "group": route.group, "kind": route.plural,
                            "causes": [{"reason": "FieldManagerConflict",
                                        "message": f'conflict with "{n}" using '
                                                   f"{group_version}",
                                        "field": _dotted(p)} for n, p in conflicts]})
        if current is None:
            if namespaced:
                self._check_namespace(route)
            new: dict[str, Any] = {"apiVersion": group_version, "kind": kind,
                                   "metadata": {"name": route.name}}
            if namespaced:
                new["metadata"]["namespace"] = route.namespace
        else:
            new = copy.deepcopy(current)
        _, before = owners.get(manager, ("Apply", set()))
        others = set().union(*(paths for name, (_, paths) in owners.items()
                               if name != manager)) if owners else set()
        for path in before - set(applied) - others:
            _remove_path(new, path)
        for path, value in applied.items():
            _set_path(new, path, value)
        taken = {p for _, p in conflicts} if force else set()
        for name, (op, paths) in list(owners.items()):
            if name != manager:
                owners[name] = (op, paths - taken)
        owners[manager] = ("Apply", set(applied))
        if current is not None and _leaves(new) == now:  # a no-op keeps its version
            self._show_managed(key, current)
            return 200, copy.deepcopy(current)
        stored = self._stamp(new, current)
        self._show_managed(key, stored)
        self.objects[key] = stored
        return (201 if current is None else 200), copy.deepcopy(stored)

    def _apply_status(self, route: Route, current: dict[str, Any] | None, body: Any,
                      query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Server-side apply on ``/status``: the manager owns the status fields of its body
        (tracked apart from the main resource's, as kube-apiserver's managedFields say
        ``subresource: status``); the object must exist, and nothing but status changes."""
        manager = query.get("fieldManager") or ""
        if not manager:
            raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: "
                                           "fieldManager: Required value: is required for "
                                           "apply patch")
        if current is None:
            raise self._not_found(route, route.name)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "an apply patch must be an object")
        key = self._key(route)
        owners = self.status_owners.setdefault(key, {})
        applied = _leaves(body.get("status") or {}, ("status",))
        now = _leaves(current.get("status") or {}, ("status",))
        conflicts = sorted((name, p) for p, v in applied.items()
                           for name, paths in owners.items()
                           if name != manager and p in paths and now.get(p) != v)
        if conflicts and query.get("force") != "true":
            raise ApiError(409, "Conflict", "Apply failed with conflicts: " + "; ".join(
                f'conflict with "{n}": {_dotted(p)}' for n, p in conflicts),
                {"name": route.name, "group": route.group, "kind": route.plural,
                 "causes": [{"reason": "FieldManagerConflict",
                             "message": f'conflict with "{n}"', "field": _dotted(p)}
                            for n, p in conflicts]})
        new = copy.deepcopy(current)
        others = set().union(*(paths for name, paths in owners.items() if name != manager))
        for path in owners.get(manager, set()) - set(applied) - others:
            _remove_path(new, path)
        for path, value in applied.items():
            _set_path(new, path, value)
        for name in list(owners):
            if name != manager:
                owners[name] -= {p for _, p in conflicts}
        owners[manager] = set(applied)
        if new.get("status") == current.get("status"):
            return 200, copy.deepcopy(current)
        stored = self._stamp(new, current)
        self.objects[key] = stored
        return 200, copy.deepcopy(stored)

    def _kind(self, route: Route) -> tuple[str, bool]:
        known = self.kinds.get((route.group, route.version, route.plural))
        if known is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return known

    def _not_found(self, route: Route, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{route.resource()} "{name}" not found',
                        {"name": name, "group": route.group, "kind": route.plural})

    def _key(self, route: Route, name: str | None = None) -> Key:
        return (route.group, route.version, route.plural, route.namespace,
                route.name if name is None else name)

    def _check_namespace(self, route: Route) -> None:
        if route.namespace and ("", "v1", "namespaces", "", route.namespace) not in self.objects:
            raise ApiError(404, "NotFound", f'namespaces "{route.namespace}" not found',
                           {"name": route.namespace, "kind": "namespaces"})

    def _for_output(self, route: Route, obj: dict[str, Any], in_list: bool) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        if in_list and route.group in BUILTIN_GROUPS:
            out.pop("kind", None)
            out.pop("apiVersion", None)
        return out

    # -- verbs ---------------------------------------------------------------------------
    def handle(self, method: str, route: Route, query: dict[str, str],
               body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            kind, namespaced = self._kind(route)
            if route.namespace and not namespaced:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if method == "GET" and not route.name:
                return 200, self._list(route, kind, query)
            if method == "POST" and not route.name:
                created = self._create(route, kind, namespaced, body)
                key = self._key(route, created["metadata"]["name"])
                self._record_update(key, None, self.objects[key],
                                    query.get("fieldManager") or "unknown")
                return 201, self._for_output(route, self.objects[key], False)
            if not route.name:
                raise ApiError(405, "MethodNotAllowed",
                               f"the server does not allow this method on {route.resource()}")
            if namespaced and not route.namespace:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            current = self.objects.get(self._key(route))
            if method == "GET":
                if current is None:
                    raise self._not_found(route, route.name)
                return 200, self._for_output(route, current, False)
            if method == "DELETE":
                if current is None:
                    raise self._not_found(route, route.name)
                del self.objects[self._key(route)]
                self.owners.pop(self._key(route), None)
                self.status_owners.pop(self._key(route), None)
                if route.group in BUILTIN_GROUPS:
                    return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                 "status": "Success",
                                 "details": {"name": route.name, "kind": route.plural,
                                             "uid": current["metadata"]["uid"]}}
                return 200, current
            if method == "PATCH" and content_type.split(";")[0].strip().lower() == \
                    "application/apply-patch+yaml":
                if route.subresource == "status":
                    return self._apply_status(route, current, body, query)
                return self._apply(route, kind, namespaced, current, body, query)
            if method in ("PUT", "PATCH"):
                if method == "PUT":
                    self._replace(route, kind, current, body)
                else:
                    self._patch(route, current, body, content_type)
                assert current is not None
                self._record_update(self._key(route), current, self.objects[self._key(route)],
                                    query.get("fieldManager") or "unknown")
                return 200, self._for_output(route, self.objects[self._key(route)], False)
            raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed")

    def _list(self, route: Route, kind: str, query: dict[str, str]) -> dict[str, Any]:
        if query.get("watch") in ("1", "true"):
            raise ApiError(400, "BadRequest", "watch is not supported by this test server")
        prefix = (route.group, route.version, route.plural)
        items = [(k, o) for k, o in sorted(self.objects.items()) if k[:3] == prefix
                 and (not route.namespace or k[3] == route.namespace)]
        if query.get("labelSelector"):
            items = [(k, o) for k, o in items if _label_selector_matches(
                query["labelSelector"], (o.get("metadata") or {}).get("labels") or {})]
        if query.get("fieldSelector"):
            items = [(k, o) for k, o in items
                     if _field_selector_matches(query["fieldSelector"], o)]
        list_rv = str(self._rv)
        token = query.get("continue")
        if token:
            try:
                state = json.loads(base64.b64decode(token.encode(), validate=True))
                start, list_rv = str(state["start"]), str(state["rv"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid") from None
            items = [(k, o) for k, o in items if f"{k[3]}/{k[4]}" > start]
        metadata: dict[str, Any] = {"resourceVersion": list_rv}
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = items[limit - 1][0]
            state = {"v": "meta.k8s.io/v1", "rv": int(list_rv), "start": f"{last[3]}/{last[4]}"}
            metadata["continue"] = base64.b64encode(json.dumps(state).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "kind": f"{kind}List",
            "apiVersion": f"{route.group}/{route.version}" if route.group else route.version,
            "metadata": metadata,
            "items": [self._for_output(route, o, True) for _, o in items],
        }

    def _create(self, route: Route, kind: str, namespaced: bool, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if namespaced:
            if not route.namespace:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if meta.get("namespace") and meta["namespace"] != route.namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                                                  "not match the namespace sent on the request")
            meta["namespace"] = route.namespace
            self._check_namespace(route)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", f"{kind} \"\" is invalid: metadata.name: "
                                               "Required value: name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        obj.setdefault("apiVersion",
                       f"{route.group}/{route.version}" if route.group else route.version)
        obj.setdefault("kind", kind)
        key = self._key(route, meta["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists",
                           f'{route.resource()} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": route.group, "kind": route.plural})
        meta.pop("resourceVersion", None)
        if route.group not in BUILTIN_GROUPS:  # custom resources: status only via /status
            obj.pop("status", None)
        stored = self._stamp(obj, None)
        self.objects[key] = stored
        return copy.deepcopy(stored)

    def _check_version(self, route: Route, current: dict[str, Any], wanted: str | None) -> None:
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {route.resource()} '
                           f'"{route.name}": the object has been modified; please apply your '
                           "changes to the latest version and try again",
                           {"name": route.name, "group": route.group, "kind": route.plural})

    def _replace(self, route: Route, kind: str, current: dict[str, Any] | None,
                 body: Any) -> dict[str, Any]:
        if current is None:
            raise self._not_found(route, route.name)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != route.name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name "
                                              "on the URL")
        wanted = meta.get("resourceVersion")
        if not wanted and route.group not in BUILTIN_GROUPS:
            raise ApiError(422, "Invalid", f'{kind}.{route.group} "{route.name}" is invalid: '
                                           "metadata.resourceVersion: Invalid value: 0x0: must "
                                           "be specified for an update")
        self._check_version(route, current, wanted)
        if route.subresource == "status":
            new = copy.deepcopy(current)
            new["status"] = copy.deepcopy(body.get("status"))
        else:
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            new["metadata"]["name"] = route.name
            if route.namespace:
                new["metadata"]["namespace"] = route.namespace
            new.setdefault("apiVersion", current.get("apiVersion"))
            new.setdefault("kind", current.get("kind"))
            if "status" in current:  # the main resource ignores status changes
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        stored = self._stamp(new, current)
        self.objects[self._key(route)] = stored
        return copy.deepcopy(stored)

    def _patch(self, route: Route, current: dict[str, Any] | None, body: Any,
               content_type: str) -> dict[str, Any]:
        if current is None:
            raise self._not_found(route, route.name)
        media = content_type.split(";")[0].strip().lower()
        if media == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            new = _json_patch(current, body)
        elif media in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if media.startswith("application/strategic") and route.group not in BUILTIN_GROUPS:
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted "
                               "media types include: application/json-patch+json, "
                               "application/merge-patch+json, application/apply-patch+yaml")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            self._check_version(route, current,
                                (body.get("metadata") or {}).get("resourceVersion"))
            new = _merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format: {media}")
        for fixed in ("name", "namespace", "uid", "creationTimestamp"):
            if fixed in current["metadata"]:
                new["metadata"][fixed] = current["metadata"][fixed]
        if route.subresource != "status" and "status" in current:
            new["status"] = current["status"]
        stored = self._stamp(new, current)
        self.objects[self._key(route)] = stored
        return copy.deepcopy(stored)

    # -- discovery -----------------------------------------------------------------------
    def discovery(self, path: str) -> dict[str, Any] | None:
        path = path.rstrip("/") or "/"
        if path == "/version":
            major, minor = self.version.split(".")[:2]
            return {"major": major, "minor": minor, "gitVersion": f"v{self.version}.0",
                    "gitCommit": "0" * 40, "gitTreeState": "clean",
                    "buildDate": "2024-04-17T17:27:03Z", "goVersion": "go1.22.2",
                    "compiler": "gc", "platform": "linux/amd64"}
        groups: dict[str, set[str]] = {}
        for group, version, _ in self.kinds:
            groups.setdefault(group, set()).add(version)
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            ordered = {g: sorted(vs, key=_version_priority) for g, vs in groups.items()}
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g,
                 "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(ordered.items()) if g]}
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            group, version = "", parts[1]
        elif parts[0] == "apis" and len(parts) == 3:
            group, version = parts[1], parts[2]
        else:
            return None
        resources = [
            {"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
             "kind": kind, "verbs": ["create", "delete", "get", "list", "patch", "update"]}
            for (g, v, plural), (kind, namespaced) in sorted(self.kinds.items())
            if (g, v) == (group, version)
        ]
        if not resources:
            return None
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' order of API versions, preferred first: GA, then beta, then alpha, each
    newest first (v1 before v1beta2 before v1beta1)."""
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (3, 0, 0)
    major, stage, minor = match.groups()
    return ({None: 0, "beta": 1, "alpha": 2}[stage], -int(major), -int(minor or 0))


def parse_route(path: str) -> Route | None:
    """Split an API path into its parts; None when it is not a resource path."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in SUBRESOURCES | {"finalize"}:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 or (sub and sub not in SUBRESOURCES):
        return None
    return Route(group, version, plural, namespace, name, sub)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_api: KubeAPI
    protocol_version = "HTTP/1.1"
    # Headers and body in one buffered write, sent at once: otherwise Nagle's algorithm and
    # delayed ACKs add ~40 ms to every request.
    wbufsize = -1
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is api.requests; keep pytest output clean

    def setup(self) -> None:
        super().setup()
        self.server_api._connections.add(self.connection)

    def finish(self) -> None:
        self.server_api._connections.discard(self.connection)
        super().finish()

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        api = self.server_api
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        api.requests.append(LoggedRequest(method, parts.path, query))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            for i, (m, p, code, reason) in enumerate(api._failures):
                if m == method and p == parts.path:
                    del api._failures[i]
                    raise ApiError(code, reason, f"injected failure ({code} {reason})")
            if method == "GET":
                found = api.discovery(parts.path)
                if found is not None:
                    self._send(200, found)
                    return
            route = parse_route(parts.path)
            if route is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            content_type = self.headers.get("Content-Type") or ""
            try:
                if raw and "yaml" in content_type:  # an apply patch: YAML (JSON is YAML)
                    body = yaml.safe_load(raw)
                else:
                    body = json.loads(raw) if raw else None
            except (ValueError, yaml.YAMLError):
                raise ApiError(400, "BadRequest", "the body of the request is not JSON") from None
            code, payload = api.handle(method, route, query, body, content_type)
            self._send(code, payload)
        except ApiError as exc:
            self._send(exc.code, exc.status())

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubeAPI]:
    """A running :class:`KubeAPI`; its kubeconfigs go to the test's tmp_path."""
    api = KubeAPI(workdir=tmp_path).start()
    try:
        yield api
    finally:
        api.stop()
