"""Showback from the cloud: `usage --bill` with a bill export of each cloud (the samples in
docs/examples/bills), `usage --prices` with hourly prices per instance type, the nodes' provider
ids as `reconcile --nodes-json` stored them, a hypothesis property test of bill pricing against
a brute-force oracle, and bad bills as one-line errors."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub import usage
from hub.common import InputError
from hub.usage import _bills as bills
from hub.validate import _reconcile as rc
from hub.validate import _reconcile_store as store
from tests.support.clirun import gpufleet
from tests.support.nodes import node_object

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples"
HOUR = 3600.0
T0 = dt.datetime(2026, 10, 1, 20, 0, 0)
PERIOD = ["--from", "2026-10-01T20:00:00Z", "--until", "2026-10-01T23:00:00Z"]
H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
AKS_VMSS = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
            "mc_ml_aks_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/"
            "aks-gpu-12345678-vmss")

#: cluster -> [(node, instance type, providerID, model)]
FLEET = {
    "eks": [("ip-10-0-1-1.ec2.internal", "p5.48xlarge", "aws:///us-east-1a/i-0a1b2c3d4e5f60001",
             H100),
            ("ip-10-0-1-2.ec2.internal", "g6e.12xlarge",
             "aws:///us-east-1b/i-0a1b2c3d4e5f60002", L40S),
            ("ip-10-0-1-3.ec2.internal", "p5.48xlarge", "aws:///us-east-1a/i-0a1b2c3d4e5f60003",
             H100)],
    "gke": [("gke-ml-a3-pool-1a2b", "a3-highgpu-8g", "gce://ml-prod/us-central1-a/"
             "gke-ml-a3-pool-1a2b", H100)],
    "aks": [("aks-gpu-12345678-vmss000000", "Standard_ND96isr_H100_v5",
             f"azure://{AKS_VMSS}/virtualMachines/0", H100)],
}


# -- reading each cloud's export -----------------------------------------------------------------
def test_each_clouds_sample_reads_as_cost_and_node_hours():
    got = {}
    for name in ("aws-cur", "gcp-billing-export", "azure-cost-details"):
        bill = usage.load_bill(EXAMPLES / "bills" / f"{name}.csv")
        got[bill.format] = bills.resource_costs(bill.lines, T0, T0 + dt.timedelta(hours=3))
    aws = got[bills.AWS]
    # savings-plan effective cost, not the on-demand figure its negation cancels; the
    # instance's data transfer costs but is no node-hour; the EBS volume is not a VM
    assert aws == {"aws/i-0a1b2c3d4e5f60001": (pytest.approx(138.5), 2.5),
                   "aws/i-0a1b2c3d4e5f60002": (pytest.approx(10.5), 3.0)}
    # three SKU lines per hour are one hour of the VM; committed-use credits lower the cost
    assert got[bills.GCP] == {"gce/ml-prod/us-central1-a/gke-ml-a3-pool-1a2b":
                              (pytest.approx(204.0), 3.0)}
    azure = got[bills.AZURE]
    assert azure[bills.azure_key(AKS_VMSS)] == (pytest.approx(3365.76), 48.0)  # a whole day


def test_cur_2_0_column_names_read_the_same():
    legacy = (EXAMPLES / "bills" / "aws-cur.csv").read_text().splitlines()
    renamed = {"lineItem/LineItemType": "line_item_line_item_type",
               "lineItem/UsageStartDate": "line_item_usage_start_date",
               "lineItem/UsageEndDate": "line_item_usage_end_date",
               "lineItem/UsageType": "line_item_usage_type",
               "lineItem/ResourceId": "line_item_resource_id",
               "lineItem/UsageAmount": "line_item_usage_amount",
               "lineItem/UnblendedCost": "line_item_unblended_cost",
               "savingsPlan/SavingsPlanEffectiveCost": "savings_plan_savings_plan_effective_cost",
               "reservation/EffectiveCost": "reservation_effective_cost"}
    header = ",".join(renamed.get(c, c) for c in legacy[0].split(","))
    two = bills.parse_bill("\n".join([header, *legacy[1:]]), "cur2")
    assert two == usage.load_bill(EXAMPLES / "bills" / "aws-cur.csv")


@pytest.mark.parametrize("provider_id, keys", [
    ("aws:///us-east-1a/i-0abc", ["aws/i-0abc"]),
    ("gce://proj/us-central1-a/node-1", ["gce/proj/us-central1-a/node-1", "gce/node-1"]),
    ("azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/vm1",
     ["azure/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm1"]),
    (f"azure://{AKS_VMSS}/virtualMachines/3",
     [bills.azure_key(AKS_VMSS + "/virtualMachines/3"), bills.azure_key(AKS_VMSS)]),
    ("kind://docker/kind/kind-worker", []), (None, []),
])
def test_provider_ids_name_the_bill_keys(provider_id, keys):
    assert bills.provider_keys(provider_id) == keys


CUR_HEAD = ("lineItem/ResourceId,lineItem/UsageStartDate,lineItem/UsageEndDate,"
            "lineItem/UsageAmount,lineItem/UnblendedCost")


@pytest.mark.parametrize("text, message", [
    ("a,b,c\n1,2,3\n", "unknown bill format"),
    ("", "empty file"),
    ("lineItem/ResourceId,lineItem/UsageEndDate,lineItem/UnblendedCost,lineItem/UsageAmount\n",
     "AWS Cost and Usage Report without column lineItem/UsageStartDate"),
    ("lineItem/UsageStartDate,lineItem/UsageEndDate,lineItem/UnblendedCost\n",
     "AWS Cost and Usage Report without column lineItem/ResourceId"),
    ("usage_start_time,usage_end_time,cost\n", "Google Cloud billing export without column "
     "resource.name"),
    ("Date,ResourceId,CostInBillingCurrency\n", "Azure cost details without column Quantity"),
    ("lineItem/ResourceId,lineItem/UsageStartDate,lineItem/UsageEndDate,lineItem/UnblendedCost,"
     "lineItem/UsageAmount\ni-1,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,lots,1\n",
     "line 2 cost: 'lots' is not a number"),
    ("lineItem/ResourceId,lineItem/UsageStartDate,lineItem/UsageEndDate,lineItem/UnblendedCost,"
     "lineItem/UsageAmount\ni-1,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,1,-1\n",
     "usage amount -1 is negative"),
    ("Date,ResourceId,CostInBillingCurrency,Quantity\nyesterday,/subscriptions/s/providers/"
     "Microsoft.Compute/virtualMachines/v,1,1\n", "'yesterday' is not a time"),
    # issue 42: what a hostile bill did instead of one line
    (CUR_HEAD + "\ni-1,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,1,\"" + "x" * (200 << 10)
     + "\"\n", "line 2: not CSV (field larger than field limit (131072))"),  # _csv.Error
    (CUR_HEAD + "\ni-1,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,1,5e301\n",
     "line 2 cost: 5e+301 is beyond the 1e+12 one bill line may cost"),
    (CUR_HEAD + "\ni-1,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,1e300,1\n",
     "line 2 usage amount: 1e+300 hours is more than 1,000 VMs run in the line's 1 h"),
    ("Date,ResourceId,CostInBillingCurrency,Quantity\n10/01/2026,/subscriptions/s/providers/"
     "Microsoft.Compute/virtualMachines/v,3365.76,1e300\n",  # priced every hour at 0.0
     "line 2 quantity: 1e+300 hours is more than 1,000 VMs run in the line's 24 h"),
    (CUR_HEAD + "\n" + "x" * (2 << 20), "a line longer than 1,048,576 characters"),
])
def test_bad_bills_are_one_line_errors(text, message):
    with pytest.raises(InputError) as err:
        bills.parse_bill(text, "bill b.csv")
    assert message in err.value.format_message()
    assert "\n" not in err.value.format_message()


# -- the command -------------------------------------------------------------------------------
def _row(bucket: dt.datetime, cluster: str, node: str, gpu: str, model: str | None,
         hours: float, namespace: str = "ml", share: float = 1.0) -> dict[str, Any]:
    return {"bucket_start": bucket, "bucket_end": bucket + dt.timedelta(hours=1),
            "cluster": cluster, "node": node, "uuid": gpu, "slice": "" if share == 1 else "3g/1",
            "namespace": namespace, "pod": f"p-{gpu}" if namespace else "", "vendor": "nvidia",
            "model": model, "gpu_share": share, "gpu_hours": share * hours,
            "avg_utilisation_pct": 50.0, "max_utilisation_pct": 50.0, "avg_power_w": None,
            "energy_wh": None, "coverage": hours}


def _fleet_db(tmp_path: Path, url: str | None = None) -> tuple[str, Path]:
    """A ledger of 3 hours: one whole GPU per node and hour (the p5 in eks also a 3/7 MIG
    slice of another), and the reconcile run that stored the nodes' provider ids."""
    url = url or f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    for b in range(3):
        start = T0 + dt.timedelta(hours=b)
        rows = [_row(start, c, n, f"GPU-{n}", model, 1.0)
                for c, nodes in FLEET.items() for n, _, _, model in nodes]
        rows.append(_row(start, "eks", FLEET["eks"][0][0], "GPU-mig", H100, 1.0, "vision",
                         3 / 7))
        with engine.begin() as conn:
            usage.write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), HOUR, rows, 9)
    engine.dispose()
    args = []
    for cluster, nodes in FLEET.items():
        items = []
        for name, itype, provider, _ in nodes:
            obj = node_object(name, {"nvidia.com/gpu": "8"}, instance=itype)
            obj["spec"]["providerID"] = provider
            items.append(obj)
        path = tmp_path / f"{cluster}.json"
        path.write_text(json.dumps({"kind": "List", "items": items}))
        args += ["--nodes-json", f"{cluster}={path}"]
    result = gpufleet("reconcile", *args, "--db", url)
    assert result.exit_code == 1, result.output  # the ledger's nodes are not in the inventory
    return url, tmp_path


def _costs(url: str, *args: str) -> tuple[dict[tuple[str, str], Any], str]:
    out = gpufleet("usage", *PERIOD, "--by", "node", *args, "-o", "json",
                   env={"GPUFLEET_DB": url})
    assert out.exit_code == 0, out.output
    return {(r["cluster"], r["node"]): r["cost"] for r in json.loads(out.stdout)}, out.stderr


def test_each_clouds_bill_prices_its_nodes_gpu_hours(tmp_path, db_url):
    url, _ = _fleet_db(tmp_path, db_url)
    p5, g6e, p5_unbilled = (n for n, *_ in FLEET["eks"])
    cost, note = _costs(url, "--bill", str(EXAMPLES / "bills" / "aws-cur.csv"))
    # 138.50 paid for 2.5 node-hours of a p5.48xlarge (8 GPUs): 6.925 per GPU-hour, for
    # 3 whole-GPU hours and 3 hours of a 3/7 slice
    assert cost[("eks", p5)] == pytest.approx(138.5 / 2.5 / 8 * (3 + 3 * 3 / 7))
    assert cost[("eks", g6e)] == pytest.approx(10.5 / 3 / 4 * 3)  # spot, 4 GPUs
    assert cost[("eks", p5_unbilled)] is None  # no bill line, no price file: never 0
    assert cost[("gke", FLEET["gke"][0][0])] is None
    assert "no price for NVIDIA H100 80GB HBM3" in note
    assert "AWS Cost and Usage Report with 7 VM lines; 2 node(s) priced" in note
    cost, _ = _costs(url, "--bill", str(EXAMPLES / "bills" / "gcp-billing-export.csv"))
    assert cost[("gke", FLEET["gke"][0][0])] == pytest.approx(204.0 / 3 / 8 * 3)
    cost, _ = _costs(url, "--bill", str(EXAMPLES / "bills" / "azure-cost-details.csv"))
    assert cost[("aks", FLEET["aks"][0][0])] == pytest.approx(3365.76 / 48 / 8 * 3)


def test_bill_then_instance_type_price_then_model_price(tmp_path):
    url, _ = _fleet_db(tmp_path)
    p5, g6e, p5_unbilled = (n for n, *_ in FLEET["eks"])
    prices = str(EXAMPLES / "prices-instance-types.yaml")
    cost, note = _costs(url, "--prices", prices)
    assert cost[("eks", p5_unbilled)] == pytest.approx(55.04 / 8 * 3)
    assert cost[("eks", g6e)] == pytest.approx(10.49 / 4 * 3)
    assert cost[("gke", FLEET["gke"][0][0])] == pytest.approx(2.5 * 3)  # the model's price
    assert note == ""
    cost, _ = _costs(url, "--prices", prices, "--bill", str(EXAMPLES / "bills" / "aws-cur.csv"))
    assert cost[("eks", p5)] == pytest.approx(138.5 / 2.5 / 8 * (3 + 3 * 3 / 7))  # the bill
    assert cost[("eks", p5_unbilled)] == pytest.approx(55.04 / 8 * 3)  # the type's price


@pytest.mark.parametrize("name, text, message", [
    ("bill.csv", "a,b\n1,2\n", "unknown bill format"),
    ("bill.csv", "Date,ResourceId,CostInBillingCurrency\n", "without column Quantity"),
    ("prices.yaml", "instance_types:\n  p5.48xlarge: -3\n", "prices are 0 or more"),
    ("prices.yaml", "instance_types:\n  p5.48xlarge: dear\n", "is 'dear', not a number"),
    ("prices.yaml", "instance_types: [p5]\n", "must map instance types to hourly prices"),
    # issue 42: a price past any real one, and bills a traceback or a price below 0 came of
    ("prices.yaml", '"NVIDIA H100 80GB HBM3": 5.0e+301\n',
     "is 5e+301; prices are 0 or more and at most 1,000,000,000"),
    ("prices.yaml", "instance_types:\n  p5.48xlarge: 5.0e+301\n", "at most 1,000,000,000"),
    ("bill.csv", CUR_HEAD + "\ni-0a1b2c3d4e5f60001,2026-10-01T20:00:00Z,"
     "2026-10-01T21:00:00Z,1,\"" + "x" * (200 << 10) + "\"\n", "line 2: not CSV"),
    ("bill.csv", CUR_HEAD + "\ni-0a1b2c3d4e5f60001,2026-10-01T20:00:00Z,"
     "2026-10-01T21:00:00Z,1,-50\n",
     "the bill's price of node ip-10-0-1-1.ec2.internal in eks per GPU-hour is -6.25; prices "
     "are 0 or more"),
])
def test_bad_bills_and_instance_type_prices_exit_2_in_one_line(tmp_path, name, text, message):
    url, _ = _fleet_db(tmp_path)
    path = tmp_path / name
    path.write_text(text)
    flag = "--bill" if name.endswith(".csv") else "--prices"
    out = gpufleet("usage", *PERIOD, flag, str(path), env={"GPUFLEET_DB": url})
    assert out.exit_code == 2 and message in out.stderr, out.output
    assert len(out.stderr.strip().splitlines()) == 1
    nobody = gpufleet("usage", "--from", "2026-11-01T00:00:00Z", "--bill",
                      str(EXAMPLES / "bills" / "aws-cur.csv"), env={"GPUFLEET_DB": url})
    assert nobody.exit_code == 0
    assert "0 node(s) priced per node-hour or instance type: no node's provider id" in \
        nobody.stderr
    missing = gpufleet("usage", "--bill", str(tmp_path / "none.csv"), env={"GPUFLEET_DB": url})
    assert missing.exit_code == 2 and "cannot read bill" in missing.stderr


# -- billed arithmetic against a brute-force oracle ---------------------------------------------
NODES = [(f"n{i}", f"i-{i:04d}", itype) for i, itype in
         enumerate(["p5.48xlarge", "g6e.12xlarge", "g4dn.xlarge", "p5.48xlarge"])]
GPUS = {"p5.48xlarge": 8, "g6e.12xlarge": 4, "g4dn.xlarge": 1}

line_strategy = st.fixed_dictionaries({
    "node": st.integers(0, len(NODES)), "hour": st.integers(-2, 6),
    "cost": st.floats(-20, 120, allow_nan=False).map(lambda c: round(c, 4)),
    "amount": st.sampled_from([1.0, 0.5, 0.25, 0.0]),
    "kind": st.sampled_from(["BoxUsage:x", "SpotUsage:x", "DataTransfer-Out-Bytes"]),
})
usage_strategy = st.fixed_dictionaries({
    "node": st.integers(0, len(NODES) - 1), "hour": st.integers(0, 3),
    "coverage": st.sampled_from([1.0, 0.5, 1 / 12]), "share": st.sampled_from([1.0, 3 / 7]),
    "namespace": st.sampled_from(["", "ml", "vision"]),
})


def oracle(lines: list[dict], used: list[dict], model_price: float | None,
           hours: int, type_prices: dict[str, float]) -> dict[str, tuple[float | None, float]]:
    """Per namespace: (cost, unpriced GPU-hours), each ledger row priced on its own at its
    node's billed cost per node-hour / GPUs, from the lines whose hour meets the period;
    else at its instance type's hourly price / GPUs; else at its model's price."""
    out: dict[str, list[float]] = {}
    for u in used:
        _, _, itype = NODES[u["node"]]
        inside = [x for x in lines if x["node"] == u["node"] and 0 <= x["hour"] < hours]
        paid = sum(x["cost"] for x in inside)
        node_hours = sum(x["amount"] for x in inside if "Usage:" in x["kind"])
        if node_hours > 0:
            price: float | None = paid / node_hours / GPUS[itype]
        elif itype in type_prices:
            price = type_prices[itype] / GPUS[itype]
        else:
            price = model_price
        group = out.setdefault(u["namespace"], [0.0, 0.0])
        gpu_hours = u["share"] * u["coverage"]
        if price is None:
            group[1] += gpu_hours
        else:
            group[0] += gpu_hours * price
    return {ns: (None if g[1] > 1e-9 else g[0], g[1]) for ns, g in out.items()}


def _billed_nets(lines: list[dict], hours: int) -> list[float]:
    """Each node's paid cost in the period, where the bill gives it node-hours (the nodes
    the bill prices): a negative one is no price, and the showback refuses it."""
    nets = []
    for n in range(len(NODES)):
        inside = [x for x in lines if x["node"] == n and 0 <= x["hour"] < hours]
        if sum(x["amount"] for x in inside if "Usage:" in x["kind"]) > 0:
            nets.append(sum(x["cost"] for x in inside))
    return nets


def _cur(lines: list[dict]) -> str:
    head = ("lineItem/LineItemType,lineItem/UsageStartDate,lineItem/UsageEndDate,"
            "lineItem/UsageType,lineItem/ResourceId,lineItem/UsageAmount,lineItem/UnblendedCost")
    out = [head]
    for x in lines:
        start = T0 + dt.timedelta(hours=x["hour"])
        resource = NODES[x["node"]][1] if x["node"] < len(NODES) else "vol-0001"
        out.append(f"Usage,{start.isoformat()}Z,{(start + dt.timedelta(hours=1)).isoformat()}Z,"
                   f"USE1-{x['kind']},{resource},{x['amount']},{x['cost']}")
    return "\n".join(out) + "\n"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=st.lists(line_strategy, max_size=25),
       used=st.lists(usage_strategy, min_size=1, max_size=20),
       model_price=st.none() | st.floats(0, 10, allow_nan=False).map(lambda p: round(p, 3)),
       hours=st.integers(1, 4),
       type_prices=st.dictionaries(st.sampled_from(sorted(GPUS)),
                                   st.floats(0, 100, allow_nan=False).map(lambda p: round(p, 2)),
                                   max_size=2))
def test_bill_pricing_equals_the_oracle(tmp_path_factory, lines, used, model_price, hours,
                                        type_prices):
    engine = inv.make_engine(f"sqlite:///{tmp_path_factory.mktemp('b') / 'inv.db'}",
                             create=True)
    inv.ensure_schema(engine)
    rows: dict[tuple, dict] = {}
    for u in used:  # one ledger row per GPU or slice, pod and bucket: later draws replace
        node = NODES[u["node"]][0]
        gpu = f"GPU-{node}" + ("" if u["share"] == 1 else "-s")
        row = _row(T0 + dt.timedelta(hours=u["hour"]), "c", node, gpu, H100, u["coverage"],
                   u["namespace"], u["share"])
        rows[(row["bucket_start"], gpu, row["slice"], u["namespace"])] = {**row, "_u": u}
    kept = [r.pop("_u") for r in rows.values()]
    with engine.begin() as conn:
        for b in range(4):
            start = T0 + dt.timedelta(hours=b)
            mine = [r for r in rows.values() if r["bucket_start"] == start]
            usage.write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), HOUR, mine, 9)
        results = [rc.NodeResult("c", n, "match", "whole", 8, 8, "", instance_type=t,
                                 provider_id=f"aws:///us-east-1a/{i}") for n, i, t in NODES]
        store.save_run(conn, rc.Reconciliation(results, []), source="file", started_at=T0,
                       managed_clusters=False)
    bill = bills.parse_bill(_cur(lines), "cur")
    prices = usage.Prices({H100: model_price} if model_price is not None else {},
                          instance_types=type_prices)
    if any(net < -1e-9 for net in _billed_nets(lines, hours)):  # credits beyond the cost
        with engine.connect() as conn, pytest.raises(InputError, match="are 0 or more"):
            usage.usage_summary(conn, T0, T0 + dt.timedelta(hours=hours), ("namespace",),
                                prices=prices, bill=bill)
        engine.dispose()
        return
    with engine.connect() as conn:
        got = usage.usage_summary(conn, T0, T0 + dt.timedelta(hours=hours), ("namespace",),
                                  prices=prices, bill=bill)
    engine.dispose()
    want = oracle(lines, [u for u in kept if u["hour"] < hours], model_price, hours,
                  type_prices)
    assert {r["namespace"] or "" for r in got} == set(want)
    for r in got:
        cost, unpriced = want[r["namespace"] or ""]
        assert r["unpriced_gpu_hours"] == pytest.approx(unpriced, abs=1e-6)
        if cost is None:
            assert r["cost"] is None
        else:
            assert r["cost"] == pytest.approx(cost, rel=1e-9, abs=1e-6)


def test_a_node_the_bill_does_not_name_gets_its_clusters_rate_for_its_type():
    head = ("lineItem/LineItemType,lineItem/UsageStartDate,lineItem/UsageEndDate,"
            "lineItem/UsageType,lineItem/ResourceId,lineItem/UsageAmount,"
            "lineItem/UnblendedCost,resourceTags/user:eks:cluster-name")
    rows = ["Usage,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,USE1-BoxUsage:p5.48xlarge,"
            "i-a,1,60,eks",
            "Usage,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,USE1-SpotUsage:p5.48xlarge,"
            "i-b,0.5,20,eks",
            "Usage,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,USE1-DataTransfer-Out-Bytes,"
            "i-b,3,9,eks",  # not instance time: no node-hours, not in the type's rate
            "Usage,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,USE1-BoxUsage:p5.48xlarge,"
            "i-c,1,99,other",
            "Usage,2026-10-01T20:00:00Z,2026-10-01T21:00:00Z,USE1-BoxUsage:g6e.12xlarge,"
            "i-d,1,10,eks"]
    bill = bills.parse_bill("\n".join([head, *rows]), "cur")
    nodes = [bills.CloudNode("eks", "by-id", "p5.48xlarge", "aws:///us-east-1a/i-b", None),
             bills.CloudNode("eks", "no-id", "p5.48xlarge", None, None),
             bills.CloudNode("eks", "gone", "P5.48XLARGE", "aws:///us-east-1a/i-z", None),
             bills.CloudNode("west", "untagged", "p5.48xlarge", None, None)]
    prices = bills.node_prices(nodes, None, bill, T0, T0 + dt.timedelta(hours=1))
    assert prices[("eks", "by-id")] == pytest.approx((20 + 9) / 0.5 / 8)  # its own lines
    assert prices[("eks", "no-id")] == pytest.approx((60 + 20) / 1.5 / 8)  # eks's p5 rate
    assert prices[("eks", "gone")] == prices[("eks", "no-id")]
    assert ("west", "untagged") not in prices  # the price file's model price, or none


def test_a_bill_is_streamed_and_folded_as_read(tmp_path):
    """A 4.5 MB bill of 50,000 lines: read a line at a time and folded into one line per
    instance, hour and kind (48 here), so memory follows what is billed, not the file (the
    whole text and a line object per row took about 10x the file: 991 MB for 100 MB)."""
    import tracemalloc

    path = tmp_path / "cur.csv"
    want = [0.0, 0.0]  # i-0's cost and node-hours, added up as written
    with path.open("w") as f:
        f.write("lineItem/LineItemType,lineItem/UsageStartDate,lineItem/UsageEndDate,"
                "lineItem/UsageType,lineItem/ResourceId,lineItem/UsageAmount,"
                "lineItem/UnblendedCost\n")
        for n in range(50_000):
            hour, instance = n % 24, f"i-{n % 2}"
            start = T0 + dt.timedelta(hours=hour)
            kind = "BoxUsage:p5.48xlarge" if n // 24 % 2 else "DataTransfer-Out-Bytes"
            f.write(f"Usage,{start.isoformat()}Z,{(start + dt.timedelta(hours=1)).isoformat()}Z,"
                    f"USE1-{kind},{instance},0.001,0.01\n")
            if instance == "i-0":
                want[0] += 0.01
                want[1] += 0.001 if kind.startswith("BoxUsage") else 0.0
    size = path.stat().st_size
    assert size > 4_000_000
    tracemalloc.start()
    try:
        bill = usage.load_bill(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (bill.read, len(bill.lines)) == (50_000, 48)
    assert peak < size / 8, peak  # the text alone was the file's size, twice
    costs = bills.resource_costs(bill.lines, T0, T0 + dt.timedelta(hours=24))
    assert costs["aws/i-0"] == pytest.approx(tuple(want))


# -- one currency per answer ---------------------------------------------------------------------
def _rows(url: str, *args: str) -> Any:
    out = gpufleet("usage", *PERIOD, "--by", "node", *args, "-o", "json",
                   env={"GPUFLEET_DB": url})
    return out, (json.loads(out.stdout) if out.exit_code == 0 else None)


def test_the_bills_currency_shows_with_bill_alone(tmp_path):
    url, _ = _fleet_db(tmp_path)
    for name in ("aws-cur", "gcp-billing-export", "azure-cost-details"):
        out, rows = _rows(url, "--bill", str(EXAMPLES / "bills" / f"{name}.csv"))
        assert out.exit_code == 0, out.output
        assert {r["currency"] for r in rows} == {"USD"}, name
    table = gpufleet("usage", *PERIOD, "--bill", str(EXAMPLES / "bills" / "aws-cur.csv"),
                     env={"GPUFLEET_DB": url})
    assert table.exit_code == 0 and "USD" in table.stdout


@pytest.mark.parametrize("price_currency, message", [
    ("currency: EUR\n", "the bill is in USD and the price file in EUR"),
    ("", "the price file names no currency (add `currency: USD`"),
])
def test_a_bill_and_prices_in_two_currencies_exit_2_naming_both(tmp_path, price_currency,
                                                                 message):
    url, _ = _fleet_db(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text(f'{price_currency}"NVIDIA H100 80GB HBM3": 2.5\n')
    out, _ = _rows(url, "--bill", str(EXAMPLES / "bills" / "aws-cur.csv"),
                   "--prices", str(prices))
    assert out.exit_code == 2 and message in out.stderr, out.output
    assert "never sums two currencies" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""
    # the same currency on both sides is one answer, in that currency
    prices.write_text('currency: USD\n"NVIDIA H100 80GB HBM3": 2.5\n')
    out, rows = _rows(url, "--bill", str(EXAMPLES / "bills" / "aws-cur.csv"),
                      "--prices", str(prices))
    assert out.exit_code == 0 and {r["currency"] for r in rows} == {"USD"}


def test_a_bill_in_two_currencies_is_refused_naming_both(tmp_path):
    text = (EXAMPLES / "bills" / "gcp-billing-export.csv").read_text().splitlines()
    text[2] = text[2].replace(",USD,", ",EUR,")
    with pytest.raises(InputError, match=r"lines in USD \(line 2\) and EUR \(line 3\)"):
        bills.parse_bill("\n".join(text) + "\n", "bill")
    with pytest.raises(InputError, match="currency 'dollars' is not an ISO 4217 code"):
        bills.parse_bill("\n".join([text[0], text[1].replace(",USD,", ",dollars,")]), "bill")


@given(bill=st.sampled_from([None, "USD", "EUR"]), prices=st.sampled_from([None, "USD", "EUR"]))
def test_showback_currency_is_one_source_or_refused(bill, prices):
    """Whatever the two sources say, an answer has one currency: the one both agree on, or a
    refusal naming what each says."""
    got_bill = bills.Bill(bills.AWS, [], currency=bill)
    got_prices = usage.Prices({}, currency=prices)
    if bill == prices:
        assert bills.showback_currency(got_prices, got_bill) == bill
    else:
        with pytest.raises(InputError) as err:
            bills.showback_currency(got_prices, got_bill)
        for code in (bill, prices):
            if code is not None:
                assert code in str(err.value)
    assert bills.showback_currency(None, got_bill) == bill
    assert bills.showback_currency(got_prices, None) == prices
