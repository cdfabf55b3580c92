"""The DRA counting rules (hub.kube._dra) with plain objects shaped as the API writes them,
and property tests of the GPU count against a brute-force oracle."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.kube import _dra as dra
from tests.support import dra as fx

NV, AMD = "gpu.nvidia.com", "gpu.amd.com"


def test_the_mixed_cluster_counts_physical_gpus_per_node():
    nodes = dra.dra_nodes(fx.dra_slices())
    counts = {n: (len(d.gpus), d.partitions, d.complete) for n, d in nodes.items()}
    assert counts == {
        fx.DRA_H100: (8, 0, True),  # generation 1 (7 other GPUs) ignored; IMEX not GPUs
        fx.DRA_MIG: (2, 26, True),  # 2 GPUs whatever the 26 placements
        fx.DRA_SILENT: (4, 0, True),
        fx.DRA_PARTIAL: (4, 0, False),  # 1 of 2 slices: unknown, whatever it lists
        fx.DRA_AMD: (2, 8, True),  # one SPX GPU + one CPX GPU's 8 partitions
        fx.BOTH: (8, 0, True),
    }
    h100 = nodes[fx.DRA_H100]
    assert {g.key for g in h100.gpus} == {fx.gpu_uuid(fx.DRA_H100, i) for i in range(8)}
    assert h100.models() == [fx.H100] and h100.memory_mib() == [80 * 1024.0]
    assert [(p.generation, p.slices_seen, p.stale_slices) for p in h100.pools] == [(2, 1, 1)]
    assert nodes[fx.DRA_AMD].vendor == "amd"
    assert {g.key for g in nodes[fx.DRA_AMD].gpus} == set(fx.AMD_BUS)
    [partial] = nodes[fx.DRA_PARTIAL].incomplete_pools
    assert (partial.generation, partial.slices_seen, partial.slices_expected) == (5, 1, 2)


def test_v1beta1_slices_nest_attributes_under_basic_and_count_the_same():
    v1 = dra.dra_nodes(fx.dra_slices("v1"))
    beta = dra.dra_nodes(fx.dra_slices("v1beta1"))
    assert {n: [g.key for g in d.gpus] for n, d in v1.items()} == \
        {n: [g.key for g in d.gpus] for n, d in beta.items()}


def test_a_mig_parent_listed_itself_counts_once():
    node = "n"
    devices = [fx.nvidia_gpu(node, 0, fx.A100), *fx.nvidia_mig_placements(node, 0)]
    [only] = dra.dra_nodes([fx.resource_slice("s", NV, node, devices)]).values()
    assert len(only.gpus) == 1 and only.gpus[0].device == "gpu-0"
    assert only.partitions == len(devices) - 1


def test_qualified_attribute_names_are_the_drivers_own():
    dev = {"name": "gpu-0", "attributes": {"gpu.nvidia.com/type": {"string": "gpu"},
                                           "gpu.nvidia.com/uuid": {"string": "GPU-x"}}}
    [only] = dra.dra_nodes([fx.resource_slice("s", NV, "n", [dev])]).values()
    assert [g.key for g in only.gpus] == ["GPU-x"]


def test_other_drivers_and_network_attached_pools_are_not_gpus():
    slices = [fx.imex_slice("n"),
              fx.resource_slice("nic", "rdma.example.com", "n", [fx.device("eth0", {})]),
              fx.resource_slice("cluster-wide", NV, None, [fx.nvidia_gpu("x", 0)],
                                allNodes=True)]
    assert dra.dra_nodes(slices) == {}


def test_a_vfio_function_is_not_an_extra_gpu():
    vfio = fx.device("gpu-vfio-0", {"type": "vfio", "uuid": "GPU-v", "pcieBusID": "0000:01:00.0"})
    [only] = dra.dra_nodes([fx.resource_slice("s", NV, "n", [vfio])]).values()
    assert (only.gpus, only.other_devices) == ((), 1)


def test_a_pool_with_no_devices_still_names_its_node():
    [only] = dra.dra_nodes([fx.resource_slice("s", NV, "n", [])]).values()
    assert only.node == "n" and only.gpus == () and only.complete


@pytest.mark.parametrize(("text", "mib"), [("80Gi", 81920.0), ("81559Mi", 81559.0),
                                           ("85899345920", 81920.0), ("1.5Gi", 1536.0),
                                           ("96G", 96e9 / 2**20)])
def test_quantities(text, mib):
    assert dra.capacity_mib({"capacity": {"memory": {"value": text}}}) == pytest.approx(mib)


def test_bad_quantities_and_missing_capacity_are_none():
    assert dra.quantity("lots") is None and dra.quantity("") is None
    assert dra.quantity("1e3") == Decimal(1000)
    assert dra.capacity_mib({"capacity": {}}) is None
    # AMD's DRA driver says memory 0 when it does not know: unknown, never 0 MiB
    assert dra.capacity_mib({"capacity": {"memory": {"value": "0"}}}) is None
    amd = fx.amd_gpu(0, 128, "0000:c1:00.0")
    amd["capacity"] = {"memory": {"value": "0"}}
    [node] = dra.dra_nodes([fx.resource_slice("s", AMD, "amd-node", [amd])]).values()
    assert [g.memory_mib for g in node.gpus] == [None] and node.memory_mib() == []


@pytest.mark.parametrize(("raw", "norm"), [("00000000:C1:00.0", "0000:c1:00.0"),
                                           ("0000:c1:00.0", "0000:c1:00.0"),
                                           ("c1:00.0", "0000:c1:00.0"), ("", "")])
def test_pci_addresses_are_one_spelling(raw, norm):
    assert dra.normalise_pci(raw) == norm


@pytest.mark.parametrize("bad", [
    {"metadata": {"name": "x"}},
    {"metadata": {"name": "x"}, "spec": {"driver": NV, "pool": {}}},
    {"metadata": {"name": "x"}, "spec": {"driver": NV, "pool": {"name": "p",
                                                               "generation": "new"}}},
    {"metadata": {"name": "x"}, "spec": {"driver": NV, "pool": {"name": "p"},
                                         "devices": "gpu-0"}},
])
def test_a_malformed_slice_names_itself(bad):
    with pytest.raises(dra.SliceError, match="ResourceSlice x"):
        dra.dra_nodes([bad])


# -- claims ------------------------------------------------------------------------------------
def test_claims_reserved_by_pods_allocate_gpus_and_admin_access_does_not():
    nodes = dra.dra_nodes(fx.dra_slices())
    allocs = dra.claim_allocations(nodes, dra.claimed_devices(fx.dra_claims()))
    got = {(a.node, a.gpu, a.slice, a.namespace, a.pod) for a in allocs}
    h100 = lambda i: fx.gpu_uuid(fx.DRA_H100, i)  # noqa: E731
    assert got == {
        (fx.DRA_H100, h100(0), "", "team-a", "trainer-0"),
        (fx.DRA_H100, h100(1), "", "team-a", "trainer-0"),
        (fx.DRA_H100, h100(4), "", "team-d", "legacy-0"),  # an extended-resource claim
        (fx.DRA_MIG, fx.gpu_uuid(fx.DRA_MIG, 1), "gpu-1-mig-19-3-1", "team-b", "notebook"),
    }  # gpu-2: admin access only; gpu-3: reserved by no pod; IMEX channel: not a GPU
    assert {a.profile for a in allocs if a.slice} == {"1g.10gb"}


def test_a_claim_on_a_device_no_current_slice_lists_is_dropped():
    nodes = dra.dra_nodes(fx.dra_slices())
    gone = fx.resource_claim("ns", "c", [(NV, fx.DRA_H100, "gpu-9")], pods=["p"])
    assert dra.claim_allocations(nodes, dra.claimed_devices([gone])) == []


# -- property: the count is the number of distinct physical GPUs of each node's newest pools -----
@st.composite
def pools(draw):
    """Random NVIDIA pools on a few nodes: generations, whole GPUs and MIG placements of GPUs
    that may or may not be listed themselves, sometimes split over several slices."""
    slices, truth = [], {}
    for n in range(draw(st.integers(1, 3))):
        node = f"node-{n}"
        generations = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True))
        for gen in generations:
            gpus = draw(st.lists(st.tuples(st.integers(0, 7), st.booleans(),
                                           st.integers(0, 3)), max_size=8,
                                 unique_by=lambda t: t[0]))
            devices = []
            for minor, listed, placements in gpus:
                uuid = fx.gpu_uuid(f"{node}@{gen}", minor)
                if listed:
                    devices.append(fx.device(f"gpu-{minor}", {"type": "gpu", "uuid": uuid}))
                devices += [fx.device(f"gpu-{minor}-mig-19-{p}-1",
                                      {"type": "mig", "parentUUID": uuid, "profile": "1g.10gb"})
                            for p in range(placements)]
            parts = draw(st.integers(1, 3))
            for i in range(parts):
                slices.append(fx.resource_slice(f"{node}-{gen}-{i}", NV, node,
                                                devices[i::parts], generation=gen, count=parts))
            if gen == max(generations):
                truth[node] = {fx.gpu_uuid(f"{node}@{gen}", m) for m, listed, p in gpus
                               if listed or p}
    order = draw(st.permutations(range(len(slices))))
    return [slices[i] for i in order], truth


@settings(max_examples=150, deadline=None)
@given(pools())
def test_gpu_count_matches_a_brute_force_oracle(case):
    slices, truth = case
    nodes = dra.dra_nodes(slices)
    assert {n: {g.key for g in d.gpus} for n, d in nodes.items()} == truth
    assert all(d.complete for d in nodes.values())


@settings(max_examples=60, deadline=None)
@given(pools(), st.data())
def test_dropping_a_current_slice_makes_the_node_unknown_never_a_smaller_count(case, data):
    slices, _ = case
    nodes = dra.dra_nodes(slices)
    newest = {n: max(p.generation for p in d.pools) for n, d in nodes.items()}
    current = [i for i, s in enumerate(slices)
               if s["spec"]["pool"]["generation"] == newest[s["spec"]["nodeName"]]
               and s["spec"]["pool"]["resourceSliceCount"] > 1]
    if not current:
        return
    drop = data.draw(st.sampled_from(current))
    node = slices[drop]["spec"]["nodeName"]
    after = dra.dra_nodes([s for i, s in enumerate(slices) if i != drop])
    assert not after[node].complete


def test_the_rules_do_not_load_the_kubernetes_client():
    """reconcile from files and the usage answers use the DRA rules without the client."""
    import subprocess
    import sys

    code = ("import sys, hub.validate, hub.usage, hub.kube\n"
            "print('kubernetes' in sys.modules)\n"
            "hub.kube.list_nodes\n"
            "print('kubernetes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", "True"], out.stderr
