"""Showback at what the cloud charged: a bill export's cost per node-hour, or a price per
instance type, turned into a price per GPU-hour of each node.

A price per GPU model is a guess at what an hour costs; the bill says what was paid
(discounts, reservations, savings plans, spot). ``usage --bill FILE`` reads one of three
exports, told apart by their header:

* AWS Cost and Usage Report (legacy ``lineItem/ResourceId`` columns or CUR 2.0's
  ``line_item_resource_id``): each line's cost is what was paid for it (the savings plan's or
  reservation's effective cost on covered usage, the unblended cost otherwise; the negation
  lines of savings plans are skipped); node-hours are the usage amount of its instance-time
  lines (``BoxUsage``, ``SpotUsage``, ``DedicatedUsage``, ``HostUsage``).
* Google Cloud billing export (``usage_start_time``, ``cost``, ``resource.name``): cost plus
  ``credits.amount`` where the export has it; node-hours are the time its lines cover (each
  hour's SKU lines - cores, memory, GPUs - are one hour of the VM).
* Azure cost details (``ResourceId``, ``Date``, ``CostInBillingCurrency``): node-hours are
  the quantity of its ``Virtual Machines`` lines in hours (``UnitOfMeasure`` "1 Hour",
  "10 Hours", ...). A scale set billed as a whole prices every node in it alike.

Lines are joined to nodes through the node's ``spec.providerID`` as the latest reconcile
(``--source kube`` or ``file``) stored it: AWS instance id, Google Cloud project/zone/name,
Azure resource id (a VM, or a scale-set VM's scale set). A node the bill does not name (no
provider id stored, or a bill that does not have the instance) is priced through the
cluster's tag where the AWS report carries one (``resourceTags/aws:eks:cluster-name``,
``resourceTags/user:eks:cluster-name`` or ``resourceTags/user:cluster``, equal to
gpufleet's cluster name): the cluster's cost per node-hour of instances of its type.
A node's price per GPU-hour is (Σ cost of its lines) / (Σ node-hours) / (its GPUs: the
instance type's count from the catalog, else what reconcile expected), over the lines whose
interval meets the period asked (an Azure line is a day: the day's cost per node-hour prices
each of its hours).
A node without a bill line keeps the price file's price, or stays unpriced: null, never 0.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.common import InputError, brief_repr
from hub.kube import Catalog, shipped_catalog
from hub.usage._prices import Prices, check_price

#: a month's cost export of a large account is tens of MB; past this it is not a bill
MAX_BILL_BYTES = 1 << 30
#: one physical line of a bill: a CUR row with every tag column is a few kB. Read a line at a
#: time up to this, so a file without newlines cannot be read into memory whole
MAX_LINE_CHARS = 1 << 20
#: the cost of one line, in any currency, beyond which it is a typo or an attack (5e301
#: would make every sum infinite); a line may be negative (a credit or a refund)
MAX_LINE_COST = 1e12
#: VMs one line may bill at once (an Azure scale set billed whole has at most 1,000): a line
#: billing more node-hours than that over its interval is not a bill (1e300 hours priced
#: every node-hour at 0.0)
MAX_VMS_PER_LINE = 1000

AWS, GCP, AZURE = "aws-cur", "gcp-billing-export", "azure-cost-details"
FORMAT_NAMES = {AWS: "AWS Cost and Usage Report", GCP: "Google Cloud billing export",
                AZURE: "Azure cost details"}

#: role -> accepted header spellings, per format (legacy CUR and CUR 2.0 side by side)
COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    AWS: {
        "resource": ("lineItem/ResourceId", "line_item_resource_id"),
        "start": ("lineItem/UsageStartDate", "line_item_usage_start_date"),
        "end": ("lineItem/UsageEndDate", "line_item_usage_end_date"),
        "cost": ("lineItem/UnblendedCost", "line_item_unblended_cost"),
        "amount": ("lineItem/UsageAmount", "line_item_usage_amount"),
        "type?": ("lineItem/LineItemType", "line_item_line_item_type"),
        "usage_type?": ("lineItem/UsageType", "line_item_usage_type"),
        "sp_cost?": ("savingsPlan/SavingsPlanEffectiveCost",
                     "savings_plan_savings_plan_effective_cost"),
        "ri_cost?": ("reservation/EffectiveCost", "reservation_effective_cost"),
        # the cluster's tag, where activated as a cost allocation tag
        "cluster?": ("resourceTags/aws:eks:cluster-name", "resourceTags/user:eks:cluster-name",
                     "resourceTags/user:cluster"),
        "currency?": ("lineItem/CurrencyCode", "line_item_currency_code"),
    },
    GCP: {
        "resource": ("resource.name", "resource_name"),
        "start": ("usage_start_time",),
        "end": ("usage_end_time",),
        "cost": ("cost",),
        "credits?": ("credits.amount", "credits_amount"),
        "project?": ("project.id", "project_id"),
        "zone?": ("location.zone", "location_zone"),
        "currency?": ("currency",),
    },
    AZURE: {
        "resource": ("ResourceId", "InstanceId"),
        "date": ("Date", "UsageDateTime", "UsageDate"),
        "cost": ("CostInBillingCurrency", "PreTaxCost", "Cost", "CostInUsd"),
        "quantity": ("Quantity", "UsageQuantity"),
        "unit?": ("UnitOfMeasure",),
        "category?": ("MeterCategory",),
        "currency?": ("BillingCurrency", "BillingCurrencyCode", "Currency"),
    },
}
#: the columns whose presence says which export a header is
SIGNATURES = {AWS: ("cost",), GCP: ("start", "cost"), AZURE: ("resource", "cost")}
AWS_INSTANCE_TIME = re.compile(r"(^|[-:])(BoxUsage|SpotUsage|DedicatedUsage|HostUsage)(:|$)")
AWS_SKIPPED = {"SavingsPlanNegation"}  # cancels the covered usage's on-demand cost
AZURE_HOURS = re.compile(r"^\s*(\d+)?\s*hours?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)  # slots: a month of hourly lines is held at once
class BillLine:
    """One line of a bill, in the shape every export is read into."""

    resource: str  # join key (provider_keys' spelling)
    start: dt.datetime  # naive UTC
    end: dt.datetime
    cost: float
    #: node-hours the line bills; None: the line's interval is the node's time (GCP)
    hours: float | None = None
    instance_time: bool = True  # whether ``hours`` counts (AWS: instance-time lines)
    #: the cluster's tag and the instance type the line bills (AWS instance-time lines):
    #: a node the bill does not name by id is priced at its cluster's rate for its type
    cluster: str | None = None
    instance_type: str | None = None


@dataclass(frozen=True)
class Bill:
    """A bill's VM lines, folded as read: lines of one resource, interval and kind are one
    line with their costs and node-hours summed (all pricing reads are sums over them), so
    its memory grows with the resources and hours billed, not with the file."""

    format: str
    lines: list[BillLine]
    read: int = 0  # VM lines read from the file, before folding
    #: ISO 4217 code every line is billed in (the export's currency column); None: the export
    #: has no such column, so the bill does not say
    currency: str | None = None


# -- reading ---------------------------------------------------------------------------------
def _lookup(header: Sequence[str], spellings: Sequence[str]) -> int | None:
    folded = {h.strip().lower(): i for i, h in enumerate(header)}
    for name in spellings:
        if name.lower() in folded:
            return folded[name.lower()]
    return None


def detect(header: Sequence[str], source: str) -> tuple[str, dict[str, int]]:
    """Which export the header is, and the index of each role; one-line InputError when it is
    none of them or lacks a needed column."""
    for fmt in (AWS, GCP, AZURE):
        roles = COLUMNS[fmt]
        if all(_lookup(header, roles[r]) is not None for r in SIGNATURES[fmt]):
            found: dict[str, int] = {}
            for role, spellings in roles.items():
                index = _lookup(header, spellings)
                if index is None and not role.endswith("?"):
                    raise InputError(f"{source}: {FORMAT_NAMES[fmt]} without column "
                                     f"{spellings[0]}")
                if index is not None:
                    found[role.rstrip("?")] = index
            return fmt, found
    raise InputError(f"{source}: unknown bill format (expected an AWS Cost and Usage Report "
                     "with lineItem/UnblendedCost, a Google Cloud billing export with "
                     "usage_start_time and cost, or Azure cost details with ResourceId and "
                     "CostInBillingCurrency)")


def _time(text: str, where: str) -> dt.datetime:
    value = text.strip()
    if not value:
        raise InputError(f"{where}: no time")
    value = value.replace(" UTC", "+00:00")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        try:  # Azure's US date spelling, 11/26/2026
            parsed = dt.datetime.strptime(value, "%m/%d/%Y")
        except ValueError:
            raise InputError(f"{where}: {text!r} is not a time") from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    return parsed


def _number(text: str, where: str, *, blank: float | None = None) -> float:
    value = text.strip()
    if not value and blank is not None:
        return blank
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"{where}: {brief_repr(text)} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"{where}: {brief_repr(text)} is not a number")
    return number


def _cost(text: str, where: str, *, blank: float | None = None) -> float:
    cost = _number(text, where, blank=blank)
    if abs(cost) > MAX_LINE_COST:
        raise InputError(f"{where}: {cost:g} is beyond the {MAX_LINE_COST:g} one bill line "
                         "may cost")
    return cost


def _hours(hours: float, start: dt.datetime, end: dt.datetime, where: str) -> float:
    """Node-hours of a line, held to what MAX_VMS_PER_LINE VMs can run in its interval."""
    span = max((end - start).total_seconds() / 3600.0, 1.0)
    if hours > span * MAX_VMS_PER_LINE:
        raise InputError(f"{where}: {hours:g} hours is more than {MAX_VMS_PER_LINE:,} VMs "
                         f"run in the line's {span:g} h")
    return hours


def aws_key(instance_id: str) -> str:
    return f"aws/{instance_id.strip()}"


def gce_key(name: str, project: str = "", zone: str = "") -> str:
    return f"gce/{project}/{zone}/{name}" if project and zone else f"gce/{name}"


def azure_key(resource_id: str) -> str:
    return "azure" + "/" + resource_id.strip().strip("/").lower()


def provider_keys(provider_id: str | None) -> list[str]:
    """The bill keys a node's spec.providerID can be billed under, most specific first."""
    if not provider_id:
        return []
    scheme, _, rest = provider_id.partition("://")
    parts = [p for p in rest.split("/") if p]
    if scheme == "aws" and parts and parts[-1].startswith("i-"):
        return [aws_key(parts[-1])]
    if scheme == "gce" and len(parts) == 3:
        project, zone, name = parts
        return [gce_key(name, project, zone), gce_key(name)]
    if scheme == "azure" and parts:
        keys = [azure_key("/".join(parts))]
        lower = [p.lower() for p in parts]
        if "virtualmachinescalesets" in lower:  # a scale set's VM: billed as the scale set
            at = lower.index("virtualmachinescalesets")
            keys.append(azure_key("/".join(parts[:at + 2])))
        return keys
    return []


def _cells(row: Sequence[str], col: Mapping[str, int]) -> Callable[[str], str]:
    """The cell of a role in this row ("" where the export lacks the column or the row is
    short)."""
    def get(role: str) -> str:
        i = col.get(role)
        return row[i] if i is not None and i < len(row) else ""

    return get


def _aws_line(row: Sequence[str], col: Mapping[str, int], where: str) -> BillLine | None:
    get = _cells(row, col)
    resource = get("resource").strip()
    kind = get("type").strip()
    if not resource.startswith("i-") or kind in AWS_SKIPPED:
        return None
    cost = _cost(get("cost"), f"{where} cost", blank=0.0)
    if kind == "SavingsPlanCoveredUsage" and "sp_cost" in col:
        cost = _cost(get("sp_cost"), f"{where} savings plan effective cost", blank=0.0)
    elif kind == "DiscountedUsage" and "ri_cost" in col:
        cost = _cost(get("ri_cost"), f"{where} reservation effective cost", blank=0.0)
    amount = _number(get("amount"), f"{where} usage amount", blank=0.0)
    if amount < 0:
        raise InputError(f"{where}: usage amount {amount:g} is negative")
    usage_type = get("usage_type")
    timed = bool(AWS_INSTANCE_TIME.search(usage_type)) if "usage_type" in col else True
    itype = usage_type.rsplit(":", 1)[-1].strip() if timed and ":" in usage_type else None
    start, end = _time(get("start"), f"{where} start"), _time(get("end"), f"{where} end")
    if timed:
        amount = _hours(amount, start, end, f"{where} usage amount")
    return BillLine(aws_key(resource), start, end, cost, amount, timed,
                    get("cluster").strip() or None, itype or None)


def _gcp_line(row: Sequence[str], col: Mapping[str, int], where: str) -> BillLine | None:
    get = _cells(row, col)
    name = get("resource").strip()
    if not name:
        return None
    name = name.rsplit("/", 1)[-1]  # a resource name may come as a path
    cost = _cost(get("cost"), f"{where} cost") + _cost(get("credits"), f"{where} credits",
                                                      blank=0.0)
    start, end = _time(get("start"), f"{where} start"), _time(get("end"), f"{where} end")
    if end < start:
        raise InputError(f"{where}: usage_end_time before usage_start_time")
    return BillLine(gce_key(name, get("project").strip(), get("zone").strip()), start, end,
                    cost, None)


def _azure_line(row: Sequence[str], col: Mapping[str, int], where: str) -> BillLine | None:
    get = _cells(row, col)
    resource = get("resource").strip()
    if "/providers/microsoft.compute/" not in resource.lower():
        return None
    day = _time(get("date"), f"{where} date")
    cost = _cost(get("cost"), f"{where} cost")
    quantity = _number(get("quantity"), f"{where} quantity", blank=0.0)
    if quantity < 0:
        raise InputError(f"{where}: quantity {quantity:g} is negative")
    unit = AZURE_HOURS.match(get("unit") or "1 Hour")
    category = get("category").strip().lower() if "category" in col else "virtual machines"
    timed = unit is not None and category == "virtual machines"
    hours = quantity * int(unit.group(1) or 1) if unit is not None else 0.0
    end = day + dt.timedelta(days=1)
    if timed:
        hours = _hours(hours, day, end, f"{where} quantity")
    return BillLine(azure_key(resource), day, end, cost, hours, timed)


READERS = {AWS: _aws_line, GCP: _gcp_line, AZURE: _azure_line}


def _physical_lines(handle: IO[str], source: str) -> Iterator[str]:
    """The file's lines one at a time, each at most MAX_LINE_CHARS and all together at most
    MAX_BILL_BYTES characters: a bill is never in memory whole."""
    total = 0
    while line := handle.readline(MAX_LINE_CHARS + 1):
        total += len(line)
        if len(line) > MAX_LINE_CHARS:
            raise InputError(f"{source}: a line longer than {MAX_LINE_CHARS:,} characters "
                             "(not a bill export)")
        if total > MAX_BILL_BYTES:
            raise InputError(f"{source} is more than the {MAX_BILL_BYTES:,} bytes a bill "
                             "may have")
        yield line


def _fold(folded: dict[tuple, BillLine], shared: dict[Any, Any], line: BillLine) -> None:
    """Add ``line`` to the one of its resource, interval and kind: every reading of a bill
    sums cost and node-hours over such lines, so the sum is all that needs keeping."""
    key = (line.resource, line.start, line.end, line.cluster, line.instance_type,
           line.hours is None, line.instance_time)
    have = folded.get(key)
    if have is None:
        one = shared.setdefault
        first = BillLine(one(line.resource, line.resource), one(line.start, line.start),
                         one(line.end, line.end), line.cost, line.hours, line.instance_time,
                         one(line.cluster, line.cluster),
                         one(line.instance_type, line.instance_type))
        folded[(first.resource, first.start, first.end, first.cluster, first.instance_type,
                first.hours is None, first.instance_time)] = first
    else:
        hours = None if line.hours is None else (have.hours or 0.0) + line.hours
        folded[key] = replace(have, cost=have.cost + line.cost, hours=hours)


def read_bill(handle: IO[str], source: str = "bill") -> Bill:
    """A bill export's lines (those that bill a VM) in one shape, folded as they are read;
    InputError names the first problem (unknown format, missing column, a cost or time that
    is not one, a field over the csv module's 128 KiB, text that is not UTF-8)."""
    reader = csv.reader(_physical_lines(handle, source))
    try:
        header = next(reader, None)
        if not header:
            raise InputError(f"{source}: empty file (expected a CSV bill export with a header)")
        fmt, col = detect(header, source)
        folded: dict[tuple, BillLine] = {}
        shared: dict[Any, Any] = {}  # one object per resource name and time, not one a row
        read = 0
        currencies: dict[str, int] = {}  # code -> first line that bills in it
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            where = f"{source} line {reader.line_num}"
            line = READERS[fmt](row, col, where)
            if line is not None:
                read += 1
                _fold(folded, shared, line)
                code = _currency(_cells(row, col)("currency"), where)
                if code is not None:
                    currencies.setdefault(code, reader.line_num)
    except csv.Error as exc:
        raise InputError(f"{source} line {reader.line_num}: not CSV ({exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{source} is not a text (UTF-8) file") from None
    if len(currencies) > 1:
        (a, line_a), (b, line_b) = sorted(currencies.items(), key=lambda kv: kv[1])[:2]
        raise InputError(f"{source}: lines in {a} (line {line_a}) and {b} (line {line_b}); "
                         "one answer never sums two currencies: export one currency per bill")
    lines = list(folded.values())
    return Bill(fmt, lines, read, next(iter(currencies), None))


def parse_bill(text: str, source: str = "bill") -> Bill:
    """:func:`read_bill` of a bill held as text."""
    return read_bill(io.StringIO(text.lstrip("\ufeff"), newline=""), source)


def _currency(text: str, where: str) -> str | None:
    """The ISO 4217 code of a line's currency cell (None where blank)."""
    code = text.strip().upper()
    if not code:
        return None
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InputError(f"{where}: currency {text.strip()!r} is not an ISO 4217 code")
    return code


def load_bill(path: str | Path) -> Bill:
    """The bill file, streamed (hub.common's read_text would hold it whole, and the lines
    beside it: a 100 MB bill took about 1 GB)."""
    what = f"bill {path}"
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:  # -sig: a BOM goes
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_BILL_BYTES:
                raise InputError(f"{what} is {size:,} bytes, more than the "
                                 f"{MAX_BILL_BYTES:,} a bill may have")
            return read_bill(handle, what)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None


# -- pricing ---------------------------------------------------------------------------------
def resource_costs(lines: Iterable[BillLine], start: dt.datetime,
                   end: dt.datetime) -> dict[str, tuple[float, float]]:
    """Per bill key: (Σ cost, Σ node-hours) of the lines whose interval meets [start, end)
    (a daily or monthly line counts whole: what matters is its cost per node-hour)."""
    cost: dict[str, float] = {}
    hours: dict[str, float] = {}
    spans: dict[str, set[tuple[dt.datetime, dt.datetime]]] = {}
    for line in lines:
        if not (line.start < end and line.end > start):
            continue
        cost[line.resource] = cost.get(line.resource, 0.0) + line.cost
        hours.setdefault(line.resource, 0.0)
        if line.hours is None:
            spans.setdefault(line.resource, set()).add((line.start, line.end))
        elif line.instance_time:
            hours[line.resource] += line.hours
    for key, covered in spans.items():
        hours[key] += sum((b - a).total_seconds() for a, b in covered) / 3600.0
    return {k: (cost[k], hours[k]) for k in cost}


def tagged_costs(lines: Iterable[BillLine], start: dt.datetime,
                 end: dt.datetime) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (cluster tag, instance type, lower-cased): (Σ cost, Σ node-hours) of the
    instance-time lines that carry both, whose interval meets [start, end)."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for line in lines:
        if (line.cluster and line.instance_type and line.instance_time
                and line.hours is not None and line.start < end and line.end > start):
            key = (line.cluster, line.instance_type.lower())
            cost, hours = out.get(key, (0.0, 0.0))
            out[key] = (cost + line.cost, hours + line.hours)
    return out


@dataclass(frozen=True)
class CloudNode:
    """What the latest reconcile stored about a node of the usage ledger."""

    cluster: str
    node: str  # the inventory's (metrics') spelling, as in the ledger
    instance_type: str | None
    provider_id: str | None
    expected_gpus: int | None


def cloud_nodes(conn: Connection) -> list[CloudNode]:
    """Each node's newest reconcile row that knew its instance type or provider id (kept runs
    only): one grouped query."""
    R = inv.reconcile_results
    known = sa.or_(R.c.instance_type.is_not(None), R.c.provider_id.is_not(None))
    newest = (sa.select(R.c.cluster, R.c.node, sa.func.max(R.c.run_id).label("run_id"))
              .where(known).group_by(R.c.cluster, R.c.node).subquery())
    rows = conn.execute(
        sa.select(R.c.cluster, R.c.node, R.c.metrics_node, R.c.instance_type, R.c.provider_id,
                  R.c.expected_gpus)
        .join(newest, sa.and_(R.c.cluster == newest.c.cluster, R.c.node == newest.c.node,
                              R.c.run_id == newest.c.run_id)))
    return [CloudNode(r.cluster, r.metrics_node or r.node, r.instance_type, r.provider_id,
                      r.expected_gpus) for r in rows]


def gpus_of(node: CloudNode, catalog: Catalog) -> int | None:
    """GPUs a node's price is shared by: its type's count, else what reconcile expected."""
    entry = catalog.get(node.instance_type)
    if entry is not None and entry.gpus > 0:
        return entry.gpus
    return node.expected_gpus if node.expected_gpus else None


def _paid(cost: float) -> float:
    """A sum of costs and credits that cancel is 0, not the -1e-17 float addition leaves
    (which the price check would refuse as negative)."""
    return 0.0 if abs(cost) < 1e-9 else cost


def node_prices(nodes: Iterable[CloudNode], prices: Prices | None, bill: Bill | None,
                start: dt.datetime, end: dt.datetime,
                catalog: Catalog | None = None) -> dict[tuple[str, str], float]:
    """Price per GPU-hour per (cluster, node): from the bill's cost per node-hour where the
    bill names the node (its provider id), else where it tags lines with the node's cluster
    and instance type (that type's rate in the cluster), else from the price file's price of
    its instance type. Nodes none prices are left out (the model prices then apply)."""
    catalog = catalog or shipped_catalog()
    per_key = resource_costs(bill.lines, start, end) if bill is not None else {}
    per_tag = tagged_costs(bill.lines, start, end) if bill is not None else {}
    by_type = {k.lower(): v for k, v in (prices.instance_types if prices else {}).items()}
    out: dict[tuple[str, str], float] = {}
    for node in nodes:
        gpus = gpus_of(node, catalog)
        if not gpus:
            continue
        where = f"the bill's price of node {node.node} in {node.cluster} per GPU-hour"
        for key in provider_keys(node.provider_id):
            cost, hours = per_key.get(key, (0.0, 0.0))
            if hours > 0:
                out[(node.cluster, node.node)] = check_price(_paid(cost) / hours / gpus, where)
                break
        else:
            itype = (node.instance_type or "").lower()
            cost, hours = per_tag.get((node.cluster, itype), (0.0, 0.0))
            hourly = _paid(cost) / hours if hours > 0 else by_type.get(itype)
            if hourly is not None:
                out[(node.cluster, node.node)] = check_price(hourly / gpus, where)
    return out


def showback_currency(prices: Prices | None, bill: Bill | None) -> str | None:
    """The one currency of a showback's costs: the bill's, the price file's, or both where
    they agree. A bill and a price file in two currencies (or one naming its currency and the
    other not) would sum two currencies in one cost: a one-line InputError names both."""
    if bill is None:
        return prices.currency if prices is not None else None
    if prices is None or prices.currency == bill.currency:
        return bill.currency
    bill_says = f"in {bill.currency}" if bill.currency else "without a currency column"
    file_says = (f"in {prices.currency}" if prices.currency
                 else f"names no currency (add `currency: {bill.currency}` if its prices "
                      f"are in {bill.currency})")
    raise InputError(f"the bill is {bill_says} and the price file {file_says}: one answer "
                     "never sums two currencies; give --bill and --prices in one currency, or "
                     "either alone")


def needs_nodes(prices: Prices | None, bill: Bill | None) -> bool:
    return bill is not None or bool(prices is not None and prices.instance_types)


def describe_bill(bill: Bill, priced: Mapping[Any, float]) -> str:
    """One line for stderr: what the bill was read as and how many nodes got a price (none:
    no reconcile stored provider ids that its lines name)."""
    text = (f"{FORMAT_NAMES[bill.format]} with {bill.read} VM lines; "
            f"{len(priced)} node(s) priced per node-hour or instance type")
    if not priced:
        text += (": no node's provider id (stored by `gpufleet reconcile`) matches a line "
                 "of the period")
    return text
