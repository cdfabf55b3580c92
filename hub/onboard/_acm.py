"""Put rendered ACM governance objects on the hub, and read their compliance back.

``apply`` is what ``kubectl apply --server-side --field-manager gpufleet`` does for these few
kinds, without kubectl on the operator's machine: one PATCH with the apply content type per
object. gpufleet owns the fields it sets and no others, so the labels, annotations and fields
ACM or another tool set (OpenShift annotates namespaces, ACM writes status and may label a
Policy) stay; a field another manager owns is a conflict, reported in one line and taken over
only with ``--force-conflicts``. ``policy_status`` reads ``Policy.status``: the overall
``compliant`` and the per-cluster ``status[]`` entries ACM's policy propagator fills in.

All API access goes through :mod:`hub.kube`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hub.common import EXIT_FINDINGS, GpufleetError, InputError, UnavailableError
from hub.kube import call, list_all, translate

POLICY_GROUP = "policy.open-cluster-management.io"
CLUSTER_GROUP = "cluster.open-cluster-management.io"


@dataclass(frozen=True)
class Resource:
    """Where the API serves one kind: ``/apis/GROUP/VERSION[/namespaces/NS]/PLURAL``."""

    group: str  # "" is the core group (/api/v1)
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


#: The kinds ``policy render`` writes, in the order they must be created.
KINDS: dict[tuple[str, str], Resource] = {
    ("v1", "Namespace"): Resource("", "v1", "namespaces", False),
    (f"{CLUSTER_GROUP}/v1beta2", "ManagedClusterSetBinding"):
        Resource(CLUSTER_GROUP, "v1beta2", "managedclustersetbindings", True),
    (f"{CLUSTER_GROUP}/v1beta1", "Placement"):
        Resource(CLUSTER_GROUP, "v1beta1", "placements", True),
    (f"{POLICY_GROUP}/v1", "Policy"): Resource(POLICY_GROUP, "v1", "policies", True),
    (f"{POLICY_GROUP}/v1", "PlacementBinding"):
        Resource(POLICY_GROUP, "v1", "placementbindings", True),
}
_ORDER = {key: i for i, key in enumerate(KINDS)}


def load_dir(directory: str | Path) -> list[dict[str, Any]]:
    """The objects of a ``policy render`` directory, in creation order."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"--dir {root} is not a directory")
    objects: list[tuple[int, str, dict[str, Any]]] = []
    for path in sorted(root.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        except (OSError, UnicodeDecodeError):
            raise InputError(f"cannot read {path}") from None
        except yaml.YAMLError:
            raise InputError(f"{path} is not valid YAML") from None
        for doc in docs:
            if not isinstance(doc, dict):
                raise InputError(f"{path}: expected Kubernetes objects")
            key = (str(doc.get("apiVersion")), str(doc.get("kind")))
            if key not in KINDS:
                raise InputError(f"{path}: {key[1]} ({key[0]}) is not a kind gpufleet applies")
            if not (doc.get("metadata") or {}).get("name"):
                raise InputError(f"{path}: {key[1]} has no metadata.name")
            if KINDS[key].namespaced and not doc["metadata"].get("namespace"):
                raise InputError(f"{path}: {key[1]} has no metadata.namespace")
            objects.append((_ORDER[key], path.name, doc))
    if not objects:
        raise InputError(f"--dir {root} holds no objects (run `gpufleet policy render` first)")
    return [doc for _, _, doc in sorted(objects, key=lambda item: (item[0], item[1]))]


def _describe(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


#: The field manager gpufleet applies as: it owns the fields it sets, no others.
FIELD_MANAGER = "gpufleet"
APPLY_PATCH = "application/apply-patch+yaml"


class ApplyConflict(GpufleetError):
    """Another field manager (ACM, a person with kubectl) owns a field gpufleet would set:
    a problem found, not an input error; --force-conflicts takes the fields over."""

    exit_code = EXIT_FINDINGS


def _conflict(exc: ApiException, obj: dict[str, Any]) -> ApplyConflict:
    """One line from the API's Status: which fields, set by which managers."""
    import json
    import re

    try:
        status = json.loads(exc.body or "{}")
    except ValueError:
        status = {}
    causes = [c for c in (status.get("details") or {}).get("causes") or []
              if isinstance(c, dict)]
    fields = sorted({str(c.get("field")) for c in causes if c.get("field")})
    managers = sorted({m for c in causes
                       for m in re.findall(r'conflict with "([^"]+)"', str(c.get("message")))})
    what = (f"{', '.join(fields)} set by {', '.join(managers) or 'another field manager'}"
            if fields else str(status.get("message") or exc.reason))
    return ApplyConflict(f"{_describe(obj)}: {what}; not applied (`gpufleet policy apply "
                         "--force-conflicts` takes those fields over)")


def _version(found: Any) -> str | None:
    meta = found.get("metadata") if isinstance(found, dict) else getattr(found, "metadata",
                                                                          None)
    if isinstance(meta, dict):
        return meta.get("resourceVersion")
    return getattr(meta, "resource_version", None)


def _apply_one(api: client.ApiClient, res: Resource, obj: dict[str, Any],
               force: bool) -> str:
    """Server-side apply (`kubectl apply --server-side`): one PATCH with the apply content
    type as field manager "gpufleet", so labels, annotations and fields that ACM or another
    tool set stay theirs. created / configured / unchanged, from the resourceVersion."""
    meta = obj["metadata"]
    # a Namespace through the core API, anything else as a custom object: other signatures,
    # one call shape (``*where``)
    get: Callable[..., Any]
    patch: Callable[..., Any]
    where: tuple[Any, ...]
    if res.plural == "namespaces" and not res.group:
        core = client.CoreV1Api(api)
        get, patch, where = core.read_namespace, core.patch_namespace, (meta["name"],)
    else:
        custom = client.CustomObjectsApi(api)
        where = ((res.group, res.version, meta["namespace"], res.plural, meta["name"])
                 if res.namespaced else (res.group, res.version, res.plural, meta["name"]))
        get = (custom.get_namespaced_custom_object if res.namespaced
               else custom.get_cluster_custom_object)
        patch = (custom.patch_namespaced_custom_object if res.namespaced
                 else custom.patch_cluster_custom_object)
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        before = _version(call(api, f"reading {_describe(obj)}", get, *where))
    except UnavailableError as exc:
        if exc.http_status != 404:
            raise
        before = None  # not there yet: the apply creates it
    doing = f"applying {_describe(obj)}"
    try:
        after = _version(call(api, doing, patch, *where, body, field_manager=FIELD_MANAGER,
                              force=force or None, _content_type=APPLY_PATCH))
    except ApiException as exc:
        if exc.status == 409:
            raise _conflict(exc, obj) from None
        raise translate(exc, api, doing) from None
    return "created" if before is None else "unchanged" if after == before else "configured"


def apply_objects(api: client.ApiClient, objects: Iterable[dict[str, Any]], *,
                  force_conflicts: bool = False) -> list[dict[str, Any]]:
    """Server-side apply each object in order; one row per object with what happened. A
    field another manager owns stops the apply with one line (ApplyConflict, exit 1) unless
    ``force_conflicts``."""
    rows = []
    for obj in objects:
        res = KINDS[(obj["apiVersion"], obj["kind"])]
        action = _apply_one(api, res, obj, force_conflicts)
        meta = obj["metadata"]
        rows.append({"kind": obj["kind"], "namespace": meta.get("namespace"),
                     "name": meta["name"], "action": action})
    return rows


def policy_status(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """Compliance of every gpufleet Policy in ``namespace``: one row per (policy, cluster).

    A policy that no cluster has reported on yet gets one row with no cluster, so an empty
    placement is visible rather than silently absent.
    """
    custom = client.CustomObjectsApi(api)
    items = list_all(api, f"listing policies in namespace {namespace}",
                     custom.list_namespaced_custom_object, POLICY_GROUP, "v1", namespace,
                     "policies", label_selector="app.kubernetes.io/managed-by=gpufleet")
    rows: list[dict[str, Any]] = []
    for policy in sorted(items, key=lambda p: p["metadata"]["name"]):
        status = policy.get("status") or {}
        base = {
            "policy": policy["metadata"]["name"],
            "remediation": (policy.get("spec") or {}).get("remediationAction"),
            "overall": status.get("compliant") or "Pending",
        }
        clusters = [c for c in status.get("status") or [] if isinstance(c, dict)]
        if not clusters:
            rows.append({**base, "cluster": None, "compliant": None})
        for entry in sorted(clusters, key=lambda c: str(c.get("clustername") or "")):
            rows.append({**base, "cluster": entry.get("clustername"),
                         "compliant": entry.get("compliant") or "Pending"})
    return rows




def any_noncompliant(rows: Iterable[dict[str, Any]]) -> bool:
    return any(r.get("compliant") == "NonCompliant" or r.get("overall") == "NonCompliant"
               for r in rows)


# -- ACM placement scores (issue 39) ------------------------------------------------------------
#: AddOnPlacementScore: namespaced in the managed cluster's namespace, scores in its status
SCORES = Resource(CLUSTER_GROUP, "v1alpha1", "addonplacementscores", True)


def _exists(api: client.ApiClient, doing: str, get: Callable[..., Any], *where: Any) -> Any:
    """The object, or None on 404."""
    try:
        return call(api, doing, get, *where)
    except UnavailableError as exc:
        if exc.http_status != 404:
            raise
        return None


def apply_scores(api: client.ApiClient, objects: Iterable[dict[str, Any]], *,
                 force_conflicts: bool = False) -> list[dict[str, Any]]:
    """Server-side apply each AddOnPlacementScore as field manager "gpufleet": the object
    (its metadata), then its status through the status subresource, where the scores live
    (ACM's Placement reads ``status.scores``). A cluster without a namespace on the hub is no
    managed cluster: skipped, with a row that says so."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    rows = []
    for obj in objects:
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        row = {"kind": obj["kind"], "namespace": namespace, "name": name}
        if _exists(api, f"reading namespace {namespace}", core.read_namespace,
                   namespace) is None:
            rows.append({**row, "action": "skipped (no namespace: not a managed cluster)"})
            continue
        where = (SCORES.group, SCORES.version, namespace, SCORES.plural, name)
        before = _version(_exists(api, f"reading {_describe(obj)}",
                                  custom.get_namespaced_custom_object, *where))
        _apply_one(api, SCORES, obj, force_conflicts)
        doing = f"applying the status of {_describe(obj)}"
        body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                "metadata": {"name": name, "namespace": namespace}, "status": obj["status"]}
        try:
            after = _version(call(api, doing, custom.patch_namespaced_custom_object_status,
                                  *where, body, field_manager=FIELD_MANAGER,
                                  force=force_conflicts or None, _content_type=APPLY_PATCH))
        except ApiException as exc:
            if exc.status == 409:
                raise _conflict(exc, obj) from None
            raise translate(exc, api, doing) from None
        action = ("created" if before is None else "unchanged" if after == before
                  else "configured")
        rows.append({**row, "action": action})
    return rows
