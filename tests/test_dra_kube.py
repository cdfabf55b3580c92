"""DRA objects through the official client and the test API server: resource.k8s.io v1 (and
v1beta2/v1beta1 where a server lacks v1), paged with limit/continue, typed API or the client's
generic call."""

from __future__ import annotations

import types

import pytest
from kubernetes import client

from hub.kube import _client as kube
from hub.kube import _dra as dra
from tests.support import dra as fx
from tests.support.kubeapi import KubeAPI
from tests.support.kubeapi import kube_api as kube_api


def serve(api: KubeAPI, version: str = "v1") -> None:
    api.serve_dra(version)
    for obj in fx.dra_slices(version):
        api.put_object(obj, plural="resourceslices")
    for obj in fx.dra_claims(version):
        api.put_object(obj, plural="resourceclaims", namespaced=True)
    for name, driver in (("gpu.nvidia.com", "gpu.nvidia.com"), ("mig.nvidia.com", "gpu.nvidia.com"),
                         ("gpu.amd.com", "gpu.amd.com"),
                         ("compute-domain-default-channel.nvidia.com",
                          "compute-domain.nvidia.com")):
        api.put_object(fx.device_class(name, driver, version), plural="deviceclasses")


@pytest.fixture
def api(kube_api: KubeAPI) -> client.ApiClient:
    with kube.api_client(str(kube_api.kubeconfig_path("c1")), "c1") as api_client:
        yield api_client


def test_the_client_has_the_typed_v1_api():
    """The installed client (kubernetes 37) has ResourceV1Api; older ones take the generic
    path, tested below with a module that lacks the class."""
    assert hasattr(client, "ResourceV1Api")


def test_v1_slices_claims_and_classes_are_listed_in_pages(kube_api, api):
    serve(kube_api)
    assert kube.dra_version(api) == "v1"
    slices = list(kube.list_resource_slices(api, "v1", page_size=3))
    assert len(slices) == len(fx.dra_slices())
    pages = kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert len(pages) == -(-len(slices) // 3)
    assert pages[0].query == {"limit": "3"} and "continue" in pages[1].query
    assert "kind" not in slices[0]  # list items of a built-in group, as the API writes them
    nodes = dra.dra_nodes(slices)
    assert len(nodes[fx.DRA_H100].gpus) == 8
    claims = list(kube.list_resource_claims(api, "v1", page_size=2))
    assert {c["metadata"]["namespace"] for c in claims} >= {"team-a", "monitoring"}
    assert kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceclaims")
    classes = [c["metadata"]["name"] for c in kube.list_device_classes(api, "v1")]
    assert "gpu.nvidia.com" in classes and len(classes) == 4


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_a_server_without_v1_is_read_in_its_beta_version(kube_api, api, version):
    serve(kube_api, version)
    assert kube.dra_version(api) == version
    slices = list(kube.list_resource_slices(api, version, page_size=4))
    assert kube_api.requests_to("GET", f"/apis/resource.k8s.io/{version}/resourceslices")
    assert not kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/")
    assert {n: len(d.gpus) for n, d in dra.dra_nodes(slices).items()} == \
        {n: len(d.gpus) for n, d in dra.dra_nodes(fx.dra_slices()).items()}


def test_v1_is_preferred_when_a_server_serves_several(kube_api, api):
    kube_api.serve_dra("v1beta1", "v1beta2", "v1")
    assert kube.dra_version(api) == "v1"


def test_a_server_without_dra_has_no_version(kube_api, api):
    assert kube.dra_version(api) is None


def test_a_client_without_the_typed_api_uses_its_generic_call(kube_api, api):
    serve(kube_api)
    bare = types.SimpleNamespace()  # a kubernetes.client without ResourceV1Api
    slices = list(kube.list_resource_slices(api, "v1", apis=bare, page_size=5))
    assert len(slices) == len(fx.dra_slices())
    pages = kube_api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert len(pages) == -(-len(slices) // 5) and "continue" in pages[-1].query
    claims = list(kube.list_resource_claims(api, "v1", apis=bare))
    assert len(claims) == len(fx.dra_claims())


def test_a_refused_list_is_a_one_line_error(kube_api, api):
    serve(kube_api)
    kube_api.fail("GET", "/apis/resource.k8s.io/v1/resourceslices", 403, "Forbidden")
    with pytest.raises(Exception) as info:
        list(kube.list_resource_slices(api, "v1"))
    message = info.value.format_message()  # type: ignore[attr-defined]
    assert "refused listing resourceslices.resource.k8s.io/v1 (HTTP 403)" in message
    assert "\n" not in message


def test_one_read_gives_nodes_slices_and_claims(kube_api, api):
    serve(kube_api)
    kube_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": fx.DRA_H100}})
    found = kube.read_gpu_objects(api, page_size=4)
    assert [n["metadata"]["name"] for n in found.nodes] == [fx.DRA_H100]
    assert (found.dra_version, len(found.slices), len(found.claims or [])) == (
        "v1", len(fx.dra_slices()), len(fx.dra_claims()))
    assert found.notes == []


def test_refused_claims_cost_only_the_claims_refused_slices_fail(kube_api, api):
    serve(kube_api)
    kube_api.fail("GET", "/apis/resource.k8s.io/v1/resourceclaims", 403, "Forbidden")
    found = kube.read_gpu_objects(api)
    assert found.claims is None and len(found.slices) == len(fx.dra_slices())
    [note] = found.notes
    assert "refused listing resourceclaims.resource.k8s.io/v1 (HTTP 403)" in note
    kube_api.fail("GET", "/apis/resource.k8s.io/v1/resourceslices", 403, "Forbidden")
    with pytest.raises(Exception, match="refused listing resourceslices"):
        kube.read_gpu_objects(api)


def test_a_cluster_without_dra_reads_nodes_only(kube_api, api):
    found = kube.read_gpu_objects(api)
    assert (found.nodes, found.dra_version, found.slices, found.claims) == ([], None, [], None)
