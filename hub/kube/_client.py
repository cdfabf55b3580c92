"""The one door to Kubernetes APIs: a client for a kubeconfig context, and error translation.

Everything gpufleet asks of a Kubernetes API server (the ACM hub's policies here, node capacity
elsewhere) goes through the official ``kubernetes`` client built by :func:`api_client`, and every
failure comes out of :func:`translate` as a one-line :class:`~hub.common.GpufleetError` with the
documented exit code. Nothing here prints tokens or kubeconfig contents: messages name the
kubeconfig file, the context and the API host, never credentials.

Tests point a kubeconfig at a local HTTP server (``tests/support/kubeapi.py``) that answers
the real API paths; the client itself is never patched.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from hub.common import GpufleetError, InputError, UnavailableError, shorten

T = TypeVar("T")

#: (connect, read) timeouts of one API request, in seconds.
REQUEST_TIMEOUT = (5.0, 30.0)
#: Page size of list calls: bounded memory and API-server load whatever the fleet's size.
PAGE_SIZE = 250


def kubeconfig_path(kubeconfig: str | None) -> str:
    """The kubeconfig to read: the flag, else ``$KUBECONFIG`` (may list several), else ~/.kube."""
    # Read KUBECONFIG now: the kubernetes package reads it once at import time.
    return kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An ApiClient for one context of a kubeconfig; InputError (exit 2) when it is unusable."""
    path = kubeconfig_path(kubeconfig)
    files = [p for p in path.split(os.pathsep) if p]
    missing = [p for p in files if not Path(p).expanduser().is_file()]
    if not files or len(missing) == len(files):
        raise InputError(f"kubeconfig {path} not found (use --kubeconfig or KUBECONFIG)")
    where = f"kubeconfig {path}" + (f", context {context!r}" if context else "")
    try:
        api = config.new_client_from_config(config_file=path, context=context,
                                            persist_config=False)
    except ConfigException as exc:
        text = str(exc)
        if context and "Expected object with name" in text:
            raise InputError(f"context {context!r} not found in kubeconfig {path}") from None
        # ConfigException texts name missing keys, never their values.
        raise InputError(f"cannot use {where}: {_first_line(text)}") from None
    except yaml.YAMLError:
        raise InputError(f"kubeconfig {path} is not valid YAML") from None
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"cannot use {where}: {type(exc).__name__}") from None
    host = api.configuration.host or ""
    if not urlsplit(host).hostname:
        raise InputError(f"{where} names no API server")
    return api


def hub_api_client(kubeconfig: str | None = None,
                   context: str | None = None) -> client.ApiClient:
    """The ACM hub's API for `serve --placement-scores`: in a pod without a kubeconfig, its
    service account (the in-cluster config); otherwise as :func:`api_client`."""
    if kubeconfig is None and context is None and not os.environ.get("KUBECONFIG") \
            and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise InputError(f"cannot use the pod's service account: "
                             f"{_first_line(str(exc))}") from None
        return client.ApiClient(configuration)
    return api_client(kubeconfig, context)


def host_of(api: client.ApiClient) -> str:
    """scheme://host:port of the API server, for messages (no path, no credentials)."""
    parts = urlsplit(api.configuration.host or "")
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _first_line(text: str) -> str:
    return shorten((text.strip().splitlines() or [""])[0])


def _transport_reason(exc: BaseException) -> str:
    """"Connection refused", "timed out", ...: the useful end of a urllib3 error chain."""
    reason = getattr(exc, "reason", None) or exc
    match = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(reason))
    if match:
        return match.group(1).strip()
    if isinstance(reason, urllib3.exceptions.TimeoutError | TimeoutError):
        return "timed out"
    return type(reason).__name__


def status_message(exc: ApiException) -> str:
    """The ``message`` of the Kubernetes Status object in an error response, if any."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return _first_line(str(exc.reason or ""))
    if isinstance(body, dict) and body.get("message"):
        return _first_line(str(body["message"]))
    return _first_line(str(exc.reason or ""))


def translate(exc: BaseException, api: client.ApiClient, doing: str) -> GpufleetError:
    """Map a client failure to the CLI's error classes (exit 2 input, exit 3 unavailable)."""
    host = host_of(api)
    if isinstance(exc, ApiException):
        code = exc.status or 0
        message = status_message(exc)
        if code == 0:  # the client's own wrapper around TLS and transport failures
            return UnavailableError(f"Kubernetes API at {host} unreachable while {doing}: "
                                    f"{message}")
        if code in (401, 403):
            refused = InputError(f"Kubernetes API at {host} refused {doing} (HTTP {code}): "
                                 f"{message}")
            refused.http_status = code
            return refused
        if code == 404:
            missing = UnavailableError(f"{doing}: not found at {host}: {message}")
            missing.http_status = 404  # absent, not unreachable
            return missing
        if code >= 500 or code == 429:
            return UnavailableError(f"Kubernetes API at {host} failed {doing} (HTTP {code}): "
                                    f"{message}")
        return InputError(f"Kubernetes API at {host} rejected {doing} (HTTP {code}): {message}")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return UnavailableError(f"Kubernetes API at {host} unreachable while {doing}: "
                                f"{_transport_reason(exc)}")
    return UnavailableError(f"Kubernetes API at {host}: {doing} failed: {type(exc).__name__}")


def call(api: client.ApiClient, doing: str, func: Callable[..., T], *args: Any,
         **kwargs: Any) -> T:
    """Run one client method with timeouts; failures come out as GpufleetError.

    ``ApiException`` with status 409 (conflict) is re-raised untouched: callers that create or
    update decide what a conflict means.
    """
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    try:
        return func(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 409:
            raise
        raise translate(exc, api, doing) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise translate(exc, api, doing) from None


def list_all(api: client.ApiClient, doing: str, func: Callable[..., Any], *args: Any,
             page_size: int = PAGE_SIZE, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every item of a list call as a plain dict, page by page with ``limit``/``continue``.

    Paging keeps memory and API-server load bounded whatever the size of the cluster. ``func``
    is any client list method: CustomObjectsApi returns dicts, typed APIs return models, which
    are turned into the same dicts the API sent (camelCase keys).
    """
    token: str | None = None
    while True:
        extra = {"_continue": token} if token else {}
        page = call(api, doing, func, *args, limit=page_size, **extra, **kwargs)
        if not isinstance(page, dict):
            page = api.sanitize_for_serialization(page)
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            return


# -- listings for reconcile (issue 5) ---------------------------------------------------------
MANAGED_CLUSTERS = ("cluster.open-cluster-management.io", "v1", "managedclusters")


def _raw_json(api: client.ApiClient, doing: str,
              func: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    """A list method returning the API's JSON as is: no typed models to build and validate
    (large clusters list faster, and a field the models do not expect cannot break a read)."""

    def fetch(*args: Any, **kwargs: Any) -> dict[str, Any]:
        resp = func(*args, _preload_content=False, **kwargs)
        try:
            page = json.loads(resp.data)
        except ValueError:
            raise UnavailableError(f"Kubernetes API at {host_of(api)} answered {doing} with "
                                   "something that is not JSON") from None
        finally:
            resp.release_conn()
        if not isinstance(page, dict):
            raise UnavailableError(f"Kubernetes API at {host_of(api)} answered {doing} with "
                                   "an unexpected document")
        return page

    return fetch


def list_nodes(api: client.ApiClient, page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
    """Every Node of one cluster, as the API sent it (capacity, allocatable, labels)."""
    doing = "listing nodes"
    return list_all(api, doing, _raw_json(api, doing, client.CoreV1Api(api).list_node),
                    page_size=page_size)


def list_managed_clusters(api: client.ApiClient, page_size: int = PAGE_SIZE,
                          label_selector: str | None = None) -> Iterator[dict[str, Any]]:
    """Every ACM ManagedCluster on a hub (optionally those a label selector picks): the
    clusters that should be reporting."""
    group, version, plural = MANAGED_CLUSTERS
    extra = {"label_selector": label_selector} if label_selector else {}
    return list_all(api, "listing ManagedClusters (is this context an ACM hub?)",
                    client.CustomObjectsApi(api).list_cluster_custom_object, group, version,
                    plural, page_size=page_size, **extra)


#: ACM Observability's top object (cluster-scoped; one per hub, usually "observability")
MULTICLUSTER_OBSERVABILITY = ("observability.open-cluster-management.io", "v1beta2",
                              "multiclusterobservabilities")


def list_multicluster_observability(api: client.ApiClient) -> list[dict[str, Any]]:
    """The hub's MultiClusterObservability objects. Without the CRD (ACM Observability not
    installed) the API answers 404: one line, exit 3, like an unreachable hub."""
    group, version, plural = MULTICLUSTER_OBSERVABILITY
    doing = "reading MultiClusterObservability"
    try:
        return list(list_all(api, doing, client.CustomObjectsApi(api).list_cluster_custom_object,
                             group, version, plural))
    except UnavailableError as exc:
        if exc.http_status != 404:
            raise
        missing = UnavailableError(
            f"the Kubernetes API at {host_of(api)} serves no MultiClusterObservability "
            f"({group}/{version}): ACM Observability is not installed on this hub (or the "
            "context is not the hub); pass --acm-collection legacy or mcoa")
        missing.http_status = 404
        raise missing from None


#: the NVIDIA GPU Operator's one configuration object (cluster-scoped)
CLUSTER_POLICIES = ("nvidia.com", "v1", "clusterpolicies")


def _absent_is_none(read: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return read()
    except UnavailableError as exc:
        if exc.http_status == 404:
            return None
        raise


def get_cluster_policy(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """The GPU Operator's ClusterPolicy ``name`` as the API sent it; None when the cluster has
    none (no object, or no GPU Operator CRD)."""
    group, version, plural = CLUSTER_POLICIES
    objects = client.CustomObjectsApi(api)

    def read() -> dict[str, Any]:
        found = call(api, f"reading ClusterPolicy {name}", objects.get_cluster_custom_object,
                     group, version, plural, name)
        return found if isinstance(found, dict) else {}

    return _absent_is_none(read)


def get_config_map(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """ConfigMap ``namespace/name`` as plain JSON (its ``data``); None when it is not there."""
    doing = f"reading ConfigMap {namespace}/{name}"
    core = client.CoreV1Api(api)
    return _absent_is_none(lambda: api.sanitize_for_serialization(
        call(api, doing, core.read_namespaced_config_map, name, namespace)))


# -- Dynamic Resource Allocation (issue 21) ---------------------------------------------------
DRA_GROUP = "resource.k8s.io"
#: versions whose ResourceSlice/ResourceClaim shapes gpufleet reads, preferred first
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
#: typed API classes of the client, per version (a client without one uses the generic call)
_DRA_APIS = {"v1": "ResourceV1Api", "v1beta2": "ResourceV1beta2Api",
             "v1beta1": "ResourceV1beta1Api"}
#: resource -> (typed list method, cluster-wide plural)
_DRA_LISTS = {"resourceslices": "list_resource_slice",
              "resourceclaims": "list_resource_claim_for_all_namespaces",
              "deviceclasses": "list_device_class"}


def dra_version(api: client.ApiClient) -> str | None:
    """The newest resource.k8s.io version the server serves that gpufleet reads; None when
    it serves none (DRA off or a cluster before 1.32: every GPU node uses device plugins)."""
    doing = "discovering API groups"
    groups = call(api, doing, _raw_json(api, doing, client.ApisApi(api).get_api_versions))
    served: set[str] = set()
    for group in groups.get("groups") or []:
        if isinstance(group, dict) and group.get("name") == DRA_GROUP:
            served |= {str(v.get("version")) for v in group.get("versions") or []
                       if isinstance(v, dict)}
    return next((v for v in DRA_VERSIONS if v in served), None)


def _dra_list(api: client.ApiClient, version: str, plural: str, page_size: int,
              apis: Any = client) -> Iterator[dict[str, Any]]:
    """Every object of one DRA resource, page by page, through the client's typed API for
    that version when it has one, else through its generic custom-objects call (older
    clients lack ResourceV1Api; the server's JSON is the same). ``apis`` is the module the
    typed classes are looked up in (tests pass one without them)."""
    doing = f"listing {plural}.{DRA_GROUP}/{version}"
    typed = getattr(apis, _DRA_APIS[version], None)
    method = getattr(typed(api), _DRA_LISTS[plural], None) if typed is not None else None
    if method is not None:
        return list_all(api, doing, _raw_json(api, doing, method), page_size=page_size)
    return list_all(api, doing, client.CustomObjectsApi(api).list_cluster_custom_object,
                    DRA_GROUP, version, plural, page_size=page_size)


def list_resource_slices(api: client.ApiClient, version: str, *, apis: Any = client,
                         page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
    """Every ResourceSlice (cluster-scoped): the devices DRA drivers publish per node."""
    return _dra_list(api, version, "resourceslices", page_size, apis)


def list_resource_claims(api: client.ApiClient, version: str, *, apis: Any = client,
                         page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
    """Every ResourceClaim of every namespace: which pods hold which devices."""
    return _dra_list(api, version, "resourceclaims", page_size, apis)


def list_device_classes(api: client.ApiClient, version: str, *, apis: Any = client,
                        page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
    """Every DeviceClass: which drivers' devices a cluster offers under which class name."""
    return _dra_list(api, version, "deviceclasses", page_size, apis)


@dataclass
class GpuObjects:
    """What one cluster's API says about its GPUs: the Node list, and where the cluster
    serves resource.k8s.io, its ResourceSlices and ResourceClaims."""

    nodes: list[dict[str, Any]]
    dra_version: str | None = None
    slices: list[dict[str, Any]] = field(default_factory=list)
    #: None: not read (DRA not served, or listing claims refused: claims only feed capacity)
    claims: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)


def read_gpu_objects(api: client.ApiClient, page_size: int = PAGE_SIZE,
                     apis: Any = client) -> GpuObjects:
    """Nodes, then DRA objects in the newest version served, each list paged.

    A refused ResourceSlice list fails the read (GPU counts of DRA nodes would be wrong); a
    refused ResourceClaim list only costs `capacity` its claims, so it becomes a note.
    """
    found = GpuObjects(list(list_nodes(api, page_size)))
    found.dra_version = dra_version(api)
    if found.dra_version is None:
        return found
    found.slices = list(list_resource_slices(api, found.dra_version, apis=apis,
                                             page_size=page_size))
    try:
        found.claims = list(list_resource_claims(api, found.dra_version, apis=apis,
                                                 page_size=page_size))
    except InputError as exc:
        if exc.http_status != 403:
            raise
        found.notes.append(f"{exc.format_message()}: DRA claims not read, `capacity` keeps "
                           "the previous reading (grant list on resourceclaims: "
                           "`spoke render --reconcile-reader`)")
    return found
