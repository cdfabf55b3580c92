"""The API's response models: what each endpoint answers, typed, so the OpenAPI document is
generated from the same classes that shape every answer. Most answers are checked against
them on the way out; the hot routes' (hub/service/_wire.py) are sent as they are, and
tests/test_service_wire.py checks that each is what its model would send.

The item models are built from the inventory's own column lists (``GPU_COLUMNS`` and the
like), in their order, every field required (null where the column may be empty): an item has
exactly the fields ``gpufleet inventory ... -o json`` prints, and a column added to the
inventory appears in the API and its description at once. Times are ISO-8601 UTC with a
``Z`` (``hub.common.iso``), as the CLI writes them.

Usage rows allow fields beyond the declared ones: a group's keys depend on ``by``, and the
ledger grows figures (a cost column) without the API having to follow in the same change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, create_model

from hub import inventory as inv
from hub import usage
from hub.common import iso
from hub.store import PROFILES

STATES = (inv.ACTIVE, inv.STALE)
SEVERITIES = ("error", "warning", "info")
VENDORS = tuple(p.vendor for p in PROFILES)
HEALTH_LEVELS = tuple(inv.HEALTH_LEVELS)

Time = Annotated[dt.datetime | None, PlainSerializer(iso, return_type=str | None),
                 WithJsonSchema({"type": ["string", "null"], "format": "date-time"})]
Number = float | None
Text = str | None

State = Literal[STATES]  # type: ignore[valid-type]
Vendor = Literal[VENDORS]  # type: ignore[valid-type]
Health = Literal[HEALTH_LEVELS]  # type: ignore[valid-type]
Severity = Literal[SEVERITIES]  # type: ignore[valid-type]
EventType = Literal[tuple(inv.EVENT_TYPES)]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _model(name: str, columns: Sequence[str], types: Mapping[str, Any],
           doc: str, base: type[BaseModel] = Strict) -> type[BaseModel]:
    fields: dict[str, Any] = {c: (types.get(c, Text), ...) for c in columns}
    model = create_model(name, __base__=base, **fields)
    model.__doc__ = doc
    return model


_COUNTED = {"nodes": int, "known_nodes": int, "gpus": int, "stale_gpus": int, "state": State,
            "last_seen": Time, "last_sample_at": Time, "cluster": str, "node": str,
            # which dcgm naming a cluster's NVIDIA GPUs send (None: no NVIDIA GPU synced)
            "naming": Literal["legacy", "dcgm-4.7", "both"] | None,
            "naming_since": Time,
            # what its GPUs are seen through (store.seen_through), cards node-exporter counts
            "seen_through": str, "cards": int | None,
            "acm": Literal["managed", "maintenance"] | None}
_GPU_TYPES: dict[str, Any] = {
    "cluster": str, "node": str, "uuid": str, "index": int | None, "vendor": Vendor,
    "state": State, "first_seen": Time, "last_seen": Time, "last_sample_at": Time,
    "memory_total_mib": Number, "memory_used_mib": Number, "utilisation_pct": Number,
    "power_w": Number, "temperature_c": Number, "mig_instance": int | None,
    "health": Health | None,
}

Cluster = _model("Cluster", inv.CLUSTER_COLUMNS, {**_COUNTED, "state": State | None},
                 "A cluster: active nodes and physical GPUs, state, newest sample.")
Node = _model("Node", inv.NODE_COLUMNS, _COUNTED, "A node: its GPUs, state, newest sample.")
Gpu = _model("Gpu", inv.GPU_COLUMNS, _GPU_TYPES,
             "A physical GPU or a MIG slice (mig_profile set), as the inventory holds it.")
Allocation = _model("Allocation", inv.ALLOCATION_COLUMNS, {
    "cluster": str, "node": str, "uuid": str, "namespace": str, "first_seen": Time,
    "last_seen": Time}, "A pod on a GPU; another team's shows namespace 'other' and no pod.")
SyncRun = _model("SyncRun", list(inv.sync_runs.c.keys()), {
    "id": int, "started_at": Time, "finished_at": Time, "status": Literal["ok", "failed"],
    "requests": int, "shards": int | None, "clusters": int | None, "nodes": int | None,
    "gpus": int | None},
    "One sync attempt (its error without URLs or driver text).")
Event = _model("Event", inv.EVENT_COLUMNS, {"at": Time, "type": EventType,
                                            "details": dict[str, Any]},
               "An inventory event (appeared, stale, returned, moved, changed, pruned).")


def _usage_models() -> tuple[type[BaseModel], type[BaseModel], type[BaseModel]]:
    # field definitions are pydantic type forms, which mypy cannot describe: dict[str, Any]
    keys: dict[str, Any] = {c: (Text, None)
                            for c in ["cluster", "namespace", "model", "node", "uuid", "slice"]}
    figures: dict[str, Any] = {c: (Number, ...) for c in usage.USAGE_FIGURES
                               if c != "allocation_basis"}
    # how exact the allocated hours are: the least exact basis of the group's allocated rows
    figures["allocation_basis"] = (Literal["interval", "estimated", "sampled"] | None, None)
    # showback, when the service has prices (serve --prices): null cost = a model unpriced
    costs: dict[str, Any] = {c: (Number, None) for c in usage.COST_FIGURES}
    costs["currency"] = (Text, None)  # the price file's ISO 4217 code, null: it names none
    usage_row = create_model("Usage", __config__=ConfigDict(extra="allow"), **keys, **figures,
                             **costs)
    usage_row.__doc__ = ("GPU-hours of one group: the 'by' keys, then the figures "
                         "(docs/usage.md).")
    idle_types = {**dict.fromkeys(["idle_since", "idle_until"], Time),
                  **dict.fromkeys(["idle_hours", "wasted_gpu_hours", "avg_utilisation_pct"],
                                  Number)}
    idle_row = _model("Idle", usage.IDLE_COLUMNS, idle_types,
                      "An allocated GPU or slice idle for at least 'for' in a row.")
    cap_keys: dict[str, Any] = {c: (Text, None) for c in ["model", "cluster", "node"]}
    cap_figures: dict[str, Any] = {c: (Number, ...) for c in usage.CAPACITY_FIGURES}
    capacity_row = create_model("Capacity", __base__=Strict, **cap_keys, **cap_figures)
    capacity_row.__doc__ = "GPU-equivalents of one group now."
    return usage_row, idle_row, capacity_row


Usage, Idle, Capacity = _usage_models()


class Place(Strict):
    """Another node a GPU uuid was seen on."""

    cluster: str
    node: str
    state: State
    last_seen: Time


class GpuDetail(Strict):
    """One GPU with its MIG slices and the other places its uuid was seen."""

    gpu: Gpu | None  # type: ignore[valid-type]
    slices: list[Gpu]  # type: ignore[valid-type]
    also_seen_on: list[Place]


class Placement(Strict):
    """Where a physical GPU sat, from when until when (null: it is there now)."""

    cluster: str
    node: str
    slot: Text
    from_: Time = Field(..., alias="from")
    until: Time

    model_config = ConfigDict(extra="forbid", populate_by_name=True,
                              serialize_by_alias=True)


class HealthChange(Strict):
    """A change of a GPU's health: old, new and the reasons (XID, ECC, row remap, ...)."""

    at: Time
    cluster: Text
    node: Text
    old: Health | None
    new: Health | None
    reasons: Text


class GpuHistory(Strict):
    """One GPU's story: where it is, where it sat, its health history, its slices, events,
    allocations and recent usage."""

    gpu: Gpu  # type: ignore[valid-type]
    slices: list[Gpu]  # type: ignore[valid-type]
    placements: list[Placement]
    health: list[HealthChange]
    events: list[Event]  # type: ignore[valid-type]
    allocations: list[dict[str, Any]]
    usage: list[dict[str, Any]]


class Finding(Strict):
    """A finding of the latest checks; ``checked_at`` is when those checks ran."""

    severity: Severity
    check: str
    cluster: Text
    node: Text
    gpu: Text
    message: str
    checked_at: Time
    namespace: Text = Field(None, description="The namespace of the pod the message names, "
                                              "if it names one.")


class CheckFailure(Strict):
    at: Time
    error: Text


class LastSync(Strict):
    clusters: int
    nodes: int
    gpus: int
    requests: int


class HealthBody(Strict):
    """The service's health: ok while the last sync succeeded within two intervals."""

    status: Literal["ok", "unavailable"]
    interval_seconds: float
    last_success: Time
    last_success_age_seconds: Number
    last_error: Text
    consecutive_failures: int
    last_sync: LastSync | None = None
    reason: str | None = None


class LiveBody(Strict):
    """The process answers: its event loop runs (the liveness probe)."""

    status: Literal["alive"]


class Error(Strict):
    """Every refusal and failure: one line naming the problem."""

    error: str


def listing(item: Any, name: str, **extra: Any) -> type[BaseModel]:
    """``{items: [...], continue: token|null}``: every listing pages alike."""
    fields: dict[str, Any] = {
        "items": (list[item], ...),
        "continue": (str | None, Field(..., description="Token of the next page; null on "
                                                        "the last page.")),
        **extra}
    return create_model(name, __base__=Strict, **fields)


ClusterList = listing(Cluster, "ClusterList")
NodeList = listing(Node, "NodeList")
GpuList = listing(Gpu, "GpuList")
AllocationList = listing(Allocation, "AllocationList")
SyncRunList = listing(SyncRun, "SyncRunList")
UsageList = listing(Usage, "UsageList")
IdleList = listing(Idle, "IdleList")


class States(BaseModel):
    """Physical GPUs of one group: delivered ⊇ healthy, reserved; reserved ⊇ active."""

    model_config = ConfigDict(extra="forbid")
    cluster: Text = None
    model: Text = None
    namespace: Text = None
    delivered: int
    healthy: int
    reserved: int
    active: int


class LemonEvidence(Strict):
    """One failure behind a lemon row."""

    at: Time
    uuid: str
    cluster: Text
    node: Text
    what: str
    namespaces: list[str]


class Lemon(BaseModel):
    """A GPU, node, slot or model with its failures per GPU-month in service."""

    model_config = ConfigDict(extra="forbid")
    uuid: Text = None
    model: Text = None
    cluster: Text = None
    node: Text = None
    slot: Text = None
    gpus: int
    gpu_months: float
    failures: int
    health: int
    replaced: int
    stale_allocated: int
    per_gpu_month: float
    evidence: list[LemonEvidence]


StateList = listing(States, "StateList")
LemonList = listing(Lemon, "LemonList")
EventList = listing(Event, "EventList")
_totals: dict[str, Any] = {c: (float, ...) for c in usage.CAPACITY_FIGURES}
CapacityTotals = create_model("CapacityTotals", __base__=Strict, **_totals)


class CapacityFit(Strict):
    """Where a job of N GPUs (or slices) fits in one cluster now (``capacity?fits=N``)."""

    cluster: str
    status: Literal[usage.FITS_STATUSES]  # type: ignore[valid-type]
    free: int = Field(..., description="Healthy free GPUs (or slices) of the kind asked.")
    largest_on_one_node: int = Field(..., description="The most of them on one node.")
    reclaimable: int = Field(..., description="Allocated ones idle by the idle rule (not "
                                              "counted as free).")
    nodes: list[str] = Field(..., description="The nodes that can take the job (fits).")


CapacityList = listing(Capacity | CapacityFit, "CapacityList", fleet=(
    CapacityTotals | None, Field(..., description="Fleet-wide totals (numbers, no names) for a "
                           "caller whose scope allows fleet counts; null otherwise.")))


class Score(Strict):
    """One score of an AddOnPlacementScore."""

    name: str
    value: int = Field(..., ge=-100, le=100)


class PlacementScore(Strict):
    """A cluster's ACM placement scores (the AddOnPlacementScore ``name`` in its namespace
    on the hub)."""

    cluster: str
    name: str
    scores: list[Score]
    valid_until: str


PlacementScoreList = listing(PlacementScore, "PlacementScoreList")
FindingList = listing(Finding, "FindingList", generated_at=(Time, ...),
                      checks=(Literal["checked", "not checked yet"], Field(
                          ..., description="'not checked yet' until the checks first ran "
                                           "(an empty list then means nothing, not 'all "
                                           "well'); 'checked' after.")),
                      last_check_failed=(CheckFailure | None, Field(
                          ..., description="When and why the latest checks could not run "
                                           "(the hub unreachable, ...); null when they ran "
                                           "since.")))
