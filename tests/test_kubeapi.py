"""The test Kubernetes API server behaves like one, as seen through the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hub.common import InputError, UnavailableError
from hub.kube import _client as kube
from tests.support.kubeapi import KubeAPI, parse_route, plural_of
from tests.support.kubeapi import kube_api as kube_api

POLICY = ("policy.open-cluster-management.io", "v1")


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                       "allocatable": {"nvidia.com/gpu": str(gpus)}}}


def policy(name: str, namespace: str = "ns1", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"remediationAction": "inform", "disabled": False}}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@pytest.fixture
def api(kube_api: KubeAPI) -> client.ApiClient:
    kube_api.put_object(namespace("ns1"))
    with kube.api_client(str(kube_api.kubeconfig_path("hub")), "hub") as api_client:
        yield api_client


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def test_nodes_list_pages_with_limit_and_continue(kube_api, api):
    for i in range(5):
        kube_api.put_object(node(f"gpu-{i}"))
    core = client.CoreV1Api(api)
    first = core.list_node(limit=2)
    assert [n.metadata.name for n in first.items] == ["gpu-0", "gpu-1"]
    assert first.metadata._continue and first.metadata.remaining_item_count == 3
    second = core.list_node(limit=2, _continue=first.metadata._continue)
    third = core.list_node(limit=2, _continue=second.metadata._continue)
    assert [n.metadata.name for n in second.items + third.items] == ["gpu-2", "gpu-3", "gpu-4"]
    assert third.metadata._continue is None
    assert second.metadata.resource_version == first.metadata.resource_version  # one snapshot
    pages = kube_api.requests_to("GET", "/api/v1/nodes")
    assert [r.query.get("limit") for r in pages] == ["2", "2", "2"]
    assert "continue" not in pages[0].query and all("continue" in r.query for r in pages[1:])
    assert third.items[0].status.capacity == {"nvidia.com/gpu": "8"}


def test_list_all_follows_every_page_and_returns_plain_dicts(kube_api, api):
    for i in range(7):
        kube_api.put_object(node(f"n{i}", gpus=i))
    items = list(kube.list_all(api, "listing nodes", client.CoreV1Api(api).list_node,
                               page_size=3))
    assert [i["metadata"]["name"] for i in items] == [f"n{i}" for i in range(7)]
    assert items[6]["status"]["capacity"] == {"nvidia.com/gpu": "6"}
    assert len(kube_api.requests_to("GET", "/api/v1/nodes")) == 3


def test_create_get_and_already_exists(kube_api, api):
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(*POLICY, "ns1", "policies", policy("p1"))
    assert created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    fetched = custom.get_namespaced_custom_object(*POLICY, "ns1", "policies", "p1")
    assert fetched["spec"] == {"remediationAction": "inform", "disabled": False}
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(*POLICY, "ns1", "policies", policy("p1"))
    assert info.value.status == 409
    assert status_of(info.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'policies.policy.open-cluster-management.io "p1" already exists',
        "reason": "AlreadyExists", "code": 409,
        "details": {"name": "p1", "group": "policy.open-cluster-management.io",
                    "kind": "policies"}}


def test_create_in_a_missing_namespace_is_not_found(api):
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(*POLICY, "nope", "policies", policy("p", "nope"))
    assert info.value.status == 404
    assert status_of(info.value)["message"] == 'namespaces "nope" not found'


def test_replace_needs_the_current_resource_version(kube_api, api):
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(*POLICY, "ns1", "policies", policy("p1"))
    stale = created["metadata"]["resourceVersion"]
    body = policy("p1")
    body["spec"]["remediationAction"] = "enforce"
    body["metadata"]["resourceVersion"] = stale
    updated = custom.replace_namespaced_custom_object(*POLICY, "ns1", "policies", "p1", body)
    assert updated["spec"]["remediationAction"] == "enforce"
    assert updated["metadata"]["generation"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(stale)
    with pytest.raises(ApiException) as info:
        custom.replace_namespaced_custom_object(*POLICY, "ns1", "policies", "p1", body)
    assert info.value.status == 409 and status_of(info.value)["reason"] == "Conflict"
    del body["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as info:
        custom.replace_namespaced_custom_object(*POLICY, "ns1", "policies", "p1", body)
    assert info.value.status == 422  # custom resources need a resourceVersion on update


def test_merge_patch_json_patch_and_strategic_merge(kube_api, api):
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*POLICY, "ns1", "policies", policy("p1", a="1", b="2"))
    patched = custom.patch_namespaced_custom_object(
        *POLICY, "ns1", "policies", "p1", {"metadata": {"labels": {"a": None, "c": "3"}}})
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert kube_api.requests[-1].method == "PATCH"
    with pytest.raises(ApiException) as info:
        custom.patch_namespaced_custom_object(
            *POLICY, "ns1", "policies", "p1", {"spec": {}},
            _content_type="application/strategic-merge-patch+json")
    assert info.value.status == 415  # as for real custom resources
    kube_api.put_object(node("n1"))
    core = client.CoreV1Api(api)
    result = core.patch_node("n1", [{"op": "add", "path": "/metadata/labels/zone", "value": "a"}])
    assert result.metadata.labels == {"nvidia.com/gpu.present": "true", "zone": "a"}
    result = core.patch_node("n1", {"metadata": {"labels": {"zone": "b"}}},
                             _content_type="application/strategic-merge-patch+json")
    assert result.metadata.labels["zone"] == "b"


def test_status_subresource_and_delete(kube_api, api):
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*POLICY, "ns1", "policies", policy("p1"))
    custom.patch_namespaced_custom_object_status(
        *POLICY, "ns1", "policies", "p1", {"status": {"compliant": "Compliant"}})
    current = custom.get_namespaced_custom_object(*POLICY, "ns1", "policies", "p1")
    assert current["status"] == {"compliant": "Compliant"}
    # The main resource ignores status changes.
    current["status"] = {"compliant": "NonCompliant"}
    replaced = custom.replace_namespaced_custom_object(*POLICY, "ns1", "policies", "p1", current)
    assert replaced["status"] == {"compliant": "Compliant"}
    deleted = custom.delete_namespaced_custom_object(*POLICY, "ns1", "policies", "p1")
    assert deleted["metadata"]["name"] == "p1"
    with pytest.raises(ApiException) as info:
        custom.get_namespaced_custom_object(*POLICY, "ns1", "policies", "p1")
    assert info.value.status == 404 and status_of(info.value)["reason"] == "NotFound"


def test_selectors_and_lists_across_namespaces(kube_api, api):
    kube_api.put_object(policy("a", "ns1", team="x"))
    kube_api.put_object(policy("b", "ns2", team="y"))
    kube_api.put_object(policy("c", "ns2"))
    custom = client.CustomObjectsApi(api)
    every = custom.list_cluster_custom_object(*POLICY, "policies")
    assert every["kind"] == "PolicyList"
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in every["items"]] == [
        ("ns1", "a"), ("ns2", "b"), ("ns2", "c")]
    assert every["items"][0]["kind"] == "Policy"  # custom resources keep kind in lists

    def names(**kwargs: Any) -> list[str]:
        listed = custom.list_cluster_custom_object(*POLICY, "policies", **kwargs)
        return [i["metadata"]["name"] for i in listed["items"]]

    assert names(label_selector="team=x") == ["a"]
    assert names(label_selector="team") == ["a", "b"]
    assert names(label_selector="!team") == ["c"]
    assert names(label_selector="team in (x,y),team!=y") == ["a"]
    assert names(label_selector="team notin (x)") == ["b", "c"]
    assert names(field_selector="metadata.namespace=ns2") == ["b", "c"]
    assert custom.list_namespaced_custom_object(*POLICY, "ns2", "policies")["items"][0][
        "metadata"]["name"] == "b"
    empty = custom.list_namespaced_custom_object(*POLICY, "ns9", "policies")
    assert empty["items"] == [] and empty["kind"] == "PolicyList"


def test_cluster_scoped_custom_resources(kube_api, api):
    kube_api.put_object({"apiVersion": "cluster.open-cluster-management.io/v1",
                         "kind": "ManagedCluster", "metadata": {"name": "east"},
                         "spec": {"hubAcceptsClient": True}})
    listed = client.CustomObjectsApi(api).list_cluster_custom_object(
        "cluster.open-cluster-management.io", "v1", "managedclusters")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["east"]
    assert kube_api.requests[-1].path == \
        "/apis/cluster.open-cluster-management.io/v1/managedclusters"


def test_discovery_and_version(kube_api, api):
    assert client.VersionApi(api).get_code().git_version == "v1.30.0"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = client.ApisApi(api).get_api_versions()
    assert "policy.open-cluster-management.io" in [g.name for g in groups.groups]
    resources = client.CoreV1Api(api).get_api_resources()
    assert {"nodes", "namespaces"} <= {r.name for r in resources.resources}


def test_bad_requests_get_status_objects(kube_api, api):
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(api).list_node(_continue="not-a-token")
    assert info.value.status == 400 and status_of(info.value)["reason"] == "BadRequest"
    with pytest.raises(ApiException) as info:
        client.CustomObjectsApi(api).list_cluster_custom_object("example.com", "v1", "widgets")
    assert info.value.status == 404


def test_token_is_required(kube_api):
    path = kube_api.kubeconfig_path("hub")
    path.write_text(path.read_text().replace("test-token", "wrong-token"))
    with kube.api_client(str(path), "hub") as api, pytest.raises(InputError) as info:
        kube.call(api, "listing nodes", client.CoreV1Api(api).list_node)
    assert info.value.exit_code == 2 and "HTTP 401" in info.value.message
    assert "wrong-token" not in info.value.message


def test_injected_failures_and_an_unreachable_server_are_unavailable(kube_api, api):
    kube_api.fail("GET", "/api/v1/nodes", 503, "ServiceUnavailable")
    with pytest.raises(UnavailableError) as info:
        kube.call(api, "listing nodes", client.CoreV1Api(api).list_node)
    assert info.value.exit_code == 3 and "HTTP 503" in info.value.message
    assert kube.call(api, "listing nodes", client.CoreV1Api(api).list_node).items == []
    kube_api.stop()
    with pytest.raises(UnavailableError) as info:
        kube.call(api, "listing nodes", client.CoreV1Api(api).list_node)
    assert "unreachable" in info.value.message and "\n" not in info.value.message


def test_kubeconfig_errors_are_input_errors(kube_api, tmp_path):
    with pytest.raises(InputError, match="not found"):
        kube.api_client(str(tmp_path / "missing"), None)
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        kube.api_client(str(bad), None)
    path = kube_api.kubeconfig_path("hub")
    with pytest.raises(InputError, match="context 'other' not found"):
        kube.api_client(str(path), "other")
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(InputError) as info:
        kube.api_client(str(empty), None)
    assert info.value.exit_code == 2


def test_one_kubeconfig_can_name_several_servers(kube_api, tmp_path):
    with KubeAPI(workdir=tmp_path, token="other-token") as second:
        path = kube_api.kubeconfig_path("east")
        second.kubeconfig_path("west", path=path)
        kube_api.put_object(node("e1"))
        second.put_object(node("w1"))
        for context, expected in (("east", "e1"), ("west", "w1"), (None, "e1")):
            with kube.api_client(str(path), context) as api:
                listed = client.CoreV1Api(api).list_node()
            assert [n.metadata.name for n in listed.items] == [expected]


def test_route_parsing_and_plurals():
    route = parse_route("/api/v1/namespaces/ns1/pods/p")
    assert (route.group, route.namespace, route.plural, route.name) == ("", "ns1", "pods", "p")
    route = parse_route("/api/v1/namespaces/ns1")
    assert (route.plural, route.namespace, route.name) == ("namespaces", "", "ns1")
    route = parse_route("/api/v1/namespaces/ns1/status")
    assert (route.plural, route.name, route.subresource) == ("namespaces", "ns1", "status")
    route = parse_route("/apis/g.io/v1/namespaces/a/things/b/status")
    assert (route.group, route.namespace, route.plural, route.name, route.subresource) == (
        "g.io", "a", "things", "b", "status")
    assert parse_route("/healthz") is None
    assert [plural_of(k) for k in ("Policy", "Node", "Ingress", "Placement")] == [
        "policies", "nodes", "ingresses", "placements"]
