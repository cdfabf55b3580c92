"""Put rendered ACM governance objects on the hub, and read their compliance back.

``apply`` is what ``kubectl apply -k`` would do for these few kinds, without kubectl on the
operator's machine: create, and when the object exists (409), replace it carrying the current
``resourceVersion`` so a concurrent edit is detected instead of overwritten. Namespaces are the
exception: they are shared with other tools (OpenShift annotates them), so only our labels are
merged into an existing one. ``policy_status`` reads ``Policy.status``: the overall
``compliant`` and the per-cluster ``status[]`` entries ACM's policy propagator fills in.

All API access goes through :mod:`hub.kube`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hub.common import InputError, UnavailableError
from hub.kube import call, list_all, translate

POLICY_GROUP = "policy.open-cluster-management.io"
CLUSTER_GROUP = "cluster.open-cluster-management.io"
#: Conflicts tolerated in a row while replacing one object (someone else keeps writing it).
MAX_CONFLICTS = 3


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


def _apply_namespace(api: client.ApiClient, obj: dict[str, Any]) -> str:
    core = client.CoreV1Api(api)
    name = obj["metadata"]["name"]
    doing = f"creating {_describe(obj)}"
    try:
        call(api, doing, core.create_namespace, obj)
        return "created"
    except ApiException as exc:
        if exc.status != 409:
            raise translate(exc, api, doing) from None
    patch = {"metadata": {"labels": obj["metadata"].get("labels") or {}}}
    try:
        call(api, f"labelling {_describe(obj)}", core.patch_namespace, name, patch,
             _content_type="application/merge-patch+json")
    except ApiException as exc:
        raise translate(exc, api, f"labelling {_describe(obj)}") from None
    return "configured"


def _apply_custom(api: client.ApiClient, res: Resource, obj: dict[str, Any]) -> str:
    custom = client.CustomObjectsApi(api)
    meta = obj["metadata"]
    scope = (res.group, res.version, meta["namespace"]) if res.namespaced else (
        res.group, res.version)
    create = (custom.create_namespaced_custom_object if res.namespaced
              else custom.create_cluster_custom_object)
    get = (custom.get_namespaced_custom_object if res.namespaced
           else custom.get_cluster_custom_object)
    put = (custom.replace_namespaced_custom_object if res.namespaced
           else custom.replace_cluster_custom_object)
    doing = f"creating {_describe(obj)}"
    try:
        call(api, doing, create, *scope, res.plural, obj)
        return "created"
    except ApiException as exc:
        if exc.status != 409:
            raise translate(exc, api, doing) from None
    doing = f"replacing {_describe(obj)}"
    for _ in range(MAX_CONFLICTS):
        current = call(api, f"reading {_describe(obj)}", get, *scope, res.plural, meta["name"])
        body = {**obj, "metadata": {**meta,
                                    "resourceVersion": current["metadata"]["resourceVersion"]}}
        try:
            call(api, doing, put, *scope, res.plural, meta["name"], body)
            return "configured"
        except ApiException as exc:
            if exc.status != 409:
                raise translate(exc, api, doing) from None
    raise UnavailableError(f"{doing}: the object kept changing on the hub; try again")


def apply_objects(api: client.ApiClient, objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Create or update each object; one row per object with what happened."""
    rows = []
    for obj in objects:
        res = KINDS[(obj["apiVersion"], obj["kind"])]
        action = _apply_namespace(api, obj) if res.plural == "namespaces" and not res.group \
            else _apply_custom(api, res, obj)
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
