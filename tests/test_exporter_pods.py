"""Pod attribution from a real gRPC server speaking the kubelet's pod-resources v1 service.

The server in each test listens on a unix socket, as the kubelet does, and answers ``List`` with
bytes encoded here by hand from api.proto's field numbers (including fields the exporter does
not read: cpu_ids, memory, topology), so a wrong field number in the exporter's descriptor
would show up as missing labels rather than agreeing with itself.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spoke import Exporter, NvmlBackend
from spoke._fakekubelet import FakeKubelet
from spoke._fakes import FakeMigSlice, FakeNvml, FakeNvmlGpu
from spoke._naming import select_fields
from spoke._podresources import KubeletPods

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-0000-0000-0000-000000000000"
GPU2 = "GPU-22222222-0000-0000-0000-000000000000"


# -- protobuf wire format, by hand ----------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def devices(resource: str, *ids: str) -> bytes:
    """ContainerDevices{resource_name=1, device_ids=2, topology=3{nodes=1{ID=1}}}."""
    topology = _bytes(3, _bytes(1, _varint(1 << 3 | 0) + _varint(1)))
    return b"".join([_str(1, resource), *(_str(2, i) for i in ids), topology])


def container(name: str, *devs: bytes) -> bytes:
    """ContainerResources{name=1, devices=2, cpu_ids=3 (packed), memory=4}."""
    cpu_ids = _bytes(3, _varint(4) + _varint(5))
    memory = _bytes(4, _str(1, "hugepages-2Mi") + _varint(2 << 3 | 0) + _varint(2 << 20))
    return _str(1, name) + b"".join(_bytes(2, d) for d in devs) + cpu_ids + memory


def pod(name: str, namespace: str, *containers: bytes) -> bytes:
    """PodResources{name=1, namespace=2, containers=3}."""
    return _str(1, name) + _str(2, namespace) + b"".join(_bytes(3, c) for c in containers)


def list_response(*pods: bytes) -> bytes:
    """ListPodResourcesResponse{pod_resources=1}."""
    return b"".join(_bytes(1, p) for p in pods)


# -- a kubelet ----------------------------------------------------------------------------
@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Callable[[Callable[[], bytes]], FakeKubelet]]:
    started: list[FakeKubelet] = []

    def start(answer: Callable[[], bytes]) -> FakeKubelet:
        k = FakeKubelet(tmp_path / "kubelet.sock", answer).start()
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


def nvml_exporter(pods: KubeletPods | None, **kwargs) -> Exporter:
    fake = FakeNvml([
        FakeNvmlGpu(uuid=GPU0, pci_bus_id="00000000:18:00.0", util=80),
        FakeNvmlGpu(uuid=GPU1, pci_bus_id="00000000:19:00.0", util=0),
        FakeNvmlGpu(uuid=GPU2, pci_bus_id="00000000:1A:00.0",
                    mig=[FakeMigSlice(gi_id=1, profile="3g.40gb", slot=0),
                         FakeMigSlice(gi_id=2, profile="1g.10gb", slot=1)]),
    ])
    backend = NvmlBackend(nvml=fake)
    backend.open()
    return Exporter(backend, hostname="node-1", interval=30, pods=pods, **kwargs)


def collected_once(tmp_path: Path) -> Exporter:
    """One collection with pod attribution from the kubelet socket in ``tmp_path``."""
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=5)
    try:
        exp = nvml_exporter(client)
        exp.collect_once()
    finally:
        client.close()
    return exp


def series(exp: Exporter, name: str) -> list[dict[str, str]]:
    text = exp.exposition().decode()
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]


def pods_of(exp: Exporter, name: str = "DCGM_FI_DEV_FB_USED") -> set[tuple[str, ...]]:
    return {(lbl["UUID"], lbl.get("GPU_I_ID", ""), lbl.get("namespace", ""), lbl.get("pod", ""),
             lbl.get("container", "")) for lbl in series(exp, name)}


def test_allocated_gpus_and_mig_slices_carry_pod_namespace_container(kubelet, tmp_path):
    mig_uuid = FakeMigSlice(gi_id=2, profile="1g.10gb", slot=1).uuid
    k = kubelet(lambda: list_response(
        pod("trainer-0", "team-a", container("main", devices("nvidia.com/gpu", GPU0)),
            container("sidecar", devices("example.com/nic", "eth1"))),
        pod("notebook", "team-b", container("jupyter", devices("nvidia.com/mig-1g.10gb",
                                                               mig_uuid))),
        pod("web", "team-c", container("nginx")),  # no devices at all
    ))
    exp = collected_once(tmp_path)
    assert k.calls == 1
    assert pods_of(exp) == {
        (GPU0, "", "team-a", "trainer-0", "main"),
        (GPU1, "", "", "", ""),  # not allocated: no pod labels at all, as upstream
        (GPU2, "", "", "", ""),
        (GPU2, "1", "", "", ""),
        (GPU2, "2", "team-b", "notebook", "jupyter"),  # by MIG device UUID
    }


def test_time_sliced_replicas_give_one_series_per_pod(kubelet, tmp_path):
    kubelet(lambda: list_response(
        pod("a", "ns", container("c", devices("nvidia.com/gpu", f"{GPU1}::0"))),
        pod("b", "ns", container("c", devices("nvidia.com/gpu", f"{GPU1}::3"))),
    ))
    exp = collected_once(tmp_path)
    assert {p for p in pods_of(exp, "DCGM_FI_DEV_GPU_UTIL") if p[0] == GPU1} == {
        (GPU1, "", "ns", "a", "c"), (GPU1, "", "ns", "b", "c")}


def test_allocation_is_refreshed_every_collection(kubelet, tmp_path):
    answers = [list_response(pod("a", "ns", container("c", devices("nvidia.com/gpu", GPU0)))),
               list_response()]
    k = kubelet(lambda: answers[min(k.calls - 1, 1)])
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=5)
    try:
        exp = nvml_exporter(client)
        exp.collect_once()
        assert (GPU0, "", "ns", "a", "c") in pods_of(exp)
        exp.collect_once()  # the pod ended
        assert (GPU0, "", "", "", "") in pods_of(exp)
    finally:
        client.close()


def test_a_kubelet_that_does_not_answer_costs_the_labels_not_the_collection(kubelet,
                                                                            tmp_path):
    release = threading.Event()

    def hang() -> bytes:
        release.wait(10)
        return list_response()

    kubelet(hang)
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=0.3)
    try:
        exp = nvml_exporter(client)
        started = time.monotonic()
        snap = exp.collect_once()
        took = time.monotonic() - started
    finally:
        release.set()
        client.close()
    assert snap.ok and took < 5  # bounded by the timeout, not the kubelet
    assert pods_of(exp) and all(p[2:] == ("", "", "") for p in pods_of(exp))
    assert [x for x in series(exp, "gpufleet_exporter_up")] == [{"hostname": "node-1"}]


def test_no_server_on_the_socket_is_an_error_per_pass_not_a_crash(tmp_path):
    (tmp_path / "kubelet.sock").write_text("")  # a stale path with nobody listening
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=0.5)
    try:
        exp = nvml_exporter(client)
        assert exp.collect_once().ok
        assert all(p[2:] == ("", "", "") for p in pods_of(exp))
    finally:
        client.close()


def test_fields_option_selects_a_subset_and_names_unknown_fields():
    exp = nvml_exporter(None, fields=select_fields("nvidia", ["DEV_GPU_UTIL",
                                                             "DCGM_FI_DEV_FB_USED"]))
    exp.collect_once()
    text = exp.exposition().decode()
    names = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("DCGM")}
    assert names == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}
    with pytest.raises(ValueError, match="unknown nvidia field 'DCGM_FI_DEV_NOPE'"):
        select_fields("nvidia", ["DCGM_FI_DEV_NOPE"])
    assert [f.name for f in select_fields("amd", ["amd_gpu_gfx_activity"])] == [
        "gpu_gfx_activity"]


def test_exporter_without_kubelet_socket_does_not_load_grpc(tmp_path):
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from hub.cli import cli\n"
            f"r = CliRunner().invoke(cli, ['exporter', '--backend', 'sim', '--port', '0', "
            f"'--kubelet-socket', {str(tmp_path / 'absent.sock')!r}, '--fields', 'NOPE'])\n"
            "print(r.exit_code, 'grpc' in sys.modules, 'sqlalchemy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["2", "False", "False"], out.stdout + out.stderr


# -- Dynamic Resource Allocation: each container's dynamic_resources -------------------------
def claim_resource(driver: str, pool: str, device: str, cdi: str = "") -> bytes:
    """ClaimResource{cdi_devices=1{name=1}, driver_name=2, pool_name=3, device_name=4}."""
    cdi = cdi or f"k8s.{driver}/claim=9f2c-{device}"
    return _bytes(1, _str(1, cdi)) + _str(2, driver) + _str(3, pool) + _str(4, device)


def dynamic(claim: str, namespace: str, *resources: bytes) -> bytes:
    """DynamicResource{claim_name=2, claim_namespace=3, claim_resources=4} (1 is unused)."""
    return _str(2, claim) + _str(3, namespace) + b"".join(_bytes(4, r) for r in resources)


def dra_container(name: str, *claims: bytes, devs: tuple[bytes, ...] = ()) -> bytes:
    """ContainerResources with dynamic_resources=5 beside devices, cpu_ids and memory."""
    return container(name, *devs) + b"".join(_bytes(5, c) for c in claims)


def test_dra_gpus_and_mig_devices_carry_their_pods(kubelet, tmp_path):
    nv = "gpu.nvidia.com"
    k = kubelet(lambda: list_response(
        pod("trainer-0", "team-a", dra_container(
            "main", dynamic("trainer-0-gpu-x7", "team-a", claim_resource(nv, "node-1", "gpu-0")),
            dynamic("trainer-0-imex", "team-a",
                    claim_resource("compute-domain.nvidia.com", "node-1", "channel-0")))),
        pod("notebook", "team-b", dra_container(
            "jupyter", dynamic("nb-mig", "team-b",
                               claim_resource(nv, "node-1", "gpu-2-mig-19-1-1")))),
        pod("ghost", "team-c", dra_container(
            "c", dynamic("gone", "team-c", claim_resource(nv, "node-1", "gpu-9")))),
        pod("plugin", "team-d", container("c", devices("nvidia.com/gpu", GPU1))),
    ))
    exp = collected_once(tmp_path)
    assert k.calls == 1
    assert pods_of(exp) == {
        (GPU0, "", "team-a", "trainer-0", "main"),  # gpu-0: minor 0; the IMEX channel is no GPU
        (GPU1, "", "team-d", "plugin", "c"),  # a device-plugin pod beside, as before
        (GPU2, "", "", "", ""),
        (GPU2, "1", "", "", ""),
        (GPU2, "2", "team-b", "notebook", "jupyter"),  # 1g.10gb at placement 1: gpu-2-mig-19-1-1
    }  # gpu-9 names no GPU here: no labels anywhere


def test_dra_names_follow_the_minor_number_not_the_index(kubelet, tmp_path):
    kubelet(lambda: list_response(pod("p", "ns", dra_container(
        "c", dynamic("c1", "ns", claim_resource("gpu.nvidia.com", "n", "gpu-7"))))))
    fake = FakeNvml([FakeNvmlGpu(uuid=GPU0, minor=7), FakeNvmlGpu(uuid=GPU1, minor=0)])
    backend = NvmlBackend(nvml=fake)
    backend.open()
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=5)
    try:
        exp = Exporter(backend, hostname="node-1", interval=30, pods=client)
        exp.collect_once()
    finally:
        client.close()
    assert pods_of(exp) == {(GPU0, "", "ns", "p", "c"), (GPU1, "", "", "", "")}


def test_amd_dra_devices_are_found_by_pci_address(kubelet, tmp_path):
    from spoke import AmdSmiBackend
    from spoke._fakes import FakeAmdGpu, FakeAmdSmi
    from spoke._podresources import DrmPciAddresses

    sysfs = tmp_path / "sys"
    for card, bus in ((1, "0000:0c:00.0"), (2, "0000:8c:00.0"), (3, "amdgpu_xcp_1")):
        target = sysfs / "devices" / "pci0000:00" / bus
        target.mkdir(parents=True)
        (sysfs / "class" / "drm" / f"card{card}").mkdir(parents=True)
        (sysfs / "class" / "drm" / f"card{card}" / "device").symlink_to(target)
    amd = "gpu.amd.com"
    kubelet(lambda: list_response(
        pod("llm", "inference", dra_container(
            "vllm", dynamic("llm-gpu", "inference", claim_resource(amd, "node-2", "gpu-2-130")))),
        pod("part", "inference", dra_container(
            "w", dynamic("p", "inference", claim_resource(amd, "node-2", "gpu-3-131")))),
    ))
    fake = FakeAmdSmi([FakeAmdGpu(uuid="00000000-0000-1000-80f6-e4d2c51d0d02",
                                  bdf="0000:0c:00.0"),
                       FakeAmdGpu(uuid="00000001-0000-1000-80f6-e4d2c51d0d02",
                                  bdf="0000:8c:00.0", serial="692251001125")])
    backend = AmdSmiBackend(amdsmi=fake)
    backend.open()
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=5,
                         amd_pci=DrmPciAddresses(str(sysfs)))
    try:
        exp = Exporter(backend, hostname="node-2", interval=30, pods=client)
        exp.collect_once()
    finally:
        client.close()
    got = {(lbl["gpu_id"], lbl.get("namespace", ""), lbl.get("pod", ""))
           for lbl in series(exp, "gpu_total_vram")}
    # card 2 is 0000:8c:00.0, GPU 1; card 3 is a partition without a PCI address of its own:
    # its pod is left unlabelled rather than put on a guessed GPU
    assert got == {("0", "", ""), ("1", "inference", "llm")}


def edges_of(exp: Exporter) -> dict[tuple[str, str, str], dict[str, float]]:
    """(UUID, GPU_I_ID, pod) -> {"start": ..., "end": ...} of the published edges."""
    from spoke._naming import EDGE_END, EDGE_START

    out: dict[tuple[str, str, str], dict[str, float]] = {}
    text = exp.exposition().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (EDGE_START, EDGE_END):
                key = (s.labels["UUID"], s.labels.get("GPU_I_ID", ""), s.labels["pod"])
                out.setdefault(key, {})["start" if s.name == EDGE_START else "end"] = s.value
    return out


def test_allocation_edges_are_published_and_the_end_lingers_two_pushes(kubelet, tmp_path):
    """Device-plugin and DRA allocations alike: the start from the first pass that sees it,
    the end from the first that does not, published beside the start for two push
    intervals plus one collection; an allocation held when the exporter started has no
    edges (its start is unknown), and a kubelet that does not answer ends nothing."""
    from spoke._edges import Edges

    mig_uuid = FakeMigSlice(gi_id=2, profile="1g.10gb", slot=1).uuid
    old = pod("old", "ns", container("c", devices("nvidia.com/gpu", GPU0)))
    dra = pod("dra", "ns", dra_container(
        "c", dynamic("claim", "ns", claim_resource("gpu.nvidia.com", "node-1", "gpu-1"))))
    mig = pod("nb", "ns", container("c", devices("nvidia.com/mig-1g.10gb", mig_uuid)))
    answers = [list_response(old), list_response(old, dra, mig), list_response(old, mig)]
    state = {"pass": 0, "now": 1000.0}

    def answer() -> bytes:
        if state["pass"] == 99:
            raise RuntimeError("kubelet down")
        return answers[min(state["pass"], 2)]

    kubelet(answer)
    client = KubeletPods(str(tmp_path / "kubelet.sock"), timeout=5)
    try:
        exp = nvml_exporter(client, edges=Edges(linger=2 * 300 + 30),
                            clock=lambda: state["now"])

        def at(now: float, step: int) -> dict:
            state["now"], state["pass"] = now, step
            exp.collect_once()
            return edges_of(exp)

        assert at(1000, 0) == {}  # "old" was held before the exporter started
        started = {(GPU1, "", "dra"): {"start": 1030}, (GPU2, "2", "nb"): {"start": 1030}}
        assert at(1030, 1) == started
        ended = {(GPU1, "", "dra"): {"start": 1030, "end": 1060},
                 (GPU2, "2", "nb"): {"start": 1030}}
        assert at(1060, 2) == ended
        assert at(1400, 99) == ended  # the kubelet does not answer: nothing ends
        assert at(1689, 2) == ended  # 629 s after the end: still carried
        assert at(1690, 2) == {(GPU2, "2", "nb"): {"start": 1030}}
    finally:
        client.close()
