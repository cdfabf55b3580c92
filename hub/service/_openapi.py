"""The OpenAPI 3.1 description of the API, built from the routes and the inventory columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hub import __version__
from hub import inventory as inv
from hub.service._api import HEALTH_LEVELS, SEVERITIES, STATES, VENDORS

if TYPE_CHECKING:
    from hub.service._routes import Route


def _param(name: str, description: str, schema: dict[str, Any] | None = None,
           where: str = "query") -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path",
            "description": description, "schema": schema or TEXT_PARAM}


#: Any text but control characters (NUL above all), which no name in the inventory holds.
TEXT_PARAM = {"type": "string", "pattern": "^[^\\u0000-\\u001f\\u007f]*$"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list_of(name: str) -> dict[str, Any]:
    return {"type": "object", "required": ["items", "continue"], "properties": {
        "items": {"type": "array", "items": _ref(name)},
        "continue": {"type": ["string", "null"],
                     "description": "Token of the next page; null on the last page."},
    }}


_TIME = {"type": ["string", "null"], "format": "date-time"}
_NUMBER = {"type": ["number", "null"]}
_TEXT = {"type": ["string", "null"]}
_GPU_TYPES: dict[str, dict[str, Any]] = {
    "cluster": {"type": "string"}, "node": {"type": "string"}, "uuid": {"type": "string"},
    "index": {"type": ["integer", "null"]}, "vendor": {"type": "string", "enum": list(VENDORS)},
    "state": {"type": "string", "enum": list(STATES)}, "first_seen": _TIME,
    "last_seen": _TIME, "last_sample_at": _TIME, "memory_total_mib": _NUMBER,
    "memory_used_mib": _NUMBER, "utilisation_pct": _NUMBER, "power_w": _NUMBER,
    "temperature_c": _NUMBER, "mig_instance": {"type": ["integer", "null"]},
    "health": {"type": ["string", "null"], "enum": [*HEALTH_LEVELS, None]},
    "health_reasons": {"type": ["string", "null"]},
}


def _object(columns: Sequence[str], types: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "required": list(columns),
            "properties": {c: types.get(c, _TEXT) for c in columns}}


def _schemas() -> dict[str, Any]:
    counted = {"nodes": {"type": "integer"}, "gpus": {"type": "integer"},
               "stale_gpus": {"type": "integer"},
               "state": _GPU_TYPES["state"], "last_seen": _TIME, "last_sample_at": _TIME,
               "cluster": {"type": "string"}, "node": {"type": "string"}}
    place = _object(["cluster", "node", "state", "last_seen"], counted)
    runs = {"id": {"type": "integer"}, "started_at": _TIME, "finished_at": _TIME,
            "status": {"type": "string", "enum": ["ok", "failed"]},
            "requests": {"type": "integer"}, "clusters": {"type": ["integer", "null"]},
            "nodes": {"type": ["integer", "null"]}, "gpus": {"type": ["integer", "null"]}}
    return {
        "Cluster": _object(inv.CLUSTER_COLUMNS, counted),
        "Node": _object(inv.NODE_COLUMNS, counted),
        "Gpu": _object(inv.GPU_COLUMNS, _GPU_TYPES),
        "GpuDetail": {"type": "object", "required": ["gpu", "slices", "also_seen_on"],
                      "properties": {
                          "gpu": {"oneOf": [_ref("Gpu"), {"type": "null"}]},
                          "slices": {"type": "array", "items": _ref("Gpu")},
                          "also_seen_on": {"type": "array", "items": place}}},
        "Allocation": _object(inv.ALLOCATION_COLUMNS, {
            "cluster": {"type": "string"}, "node": {"type": "string"},
            "uuid": {"type": "string"}, "namespace": {"type": "string"},
            "first_seen": _TIME, "last_seen": _TIME}),
        "SyncRun": _object(list(inv.sync_runs.c.keys()), runs),
        **_usage_schemas(),
        "Finding": _object(["severity", "check", "cluster", "node", "gpu", "message",
                            "checked_at"],
                           {"severity": {"type": "string", "enum": list(SEVERITIES)},
                            "check": {"type": "string"}, "message": {"type": "string"},
                            "checked_at": _TIME}),
        "Health": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "reason": {"type": "string"}, "last_success": _TIME,
            "last_success_age_seconds": _NUMBER, "last_error": _TEXT,
            "consecutive_failures": {"type": "integer"},
            "interval_seconds": {"type": "number"}}},
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "string"}}},
    }


def _usage_schemas() -> dict[str, Any]:
    from hub import usage

    numbers = dict.fromkeys([*usage.USAGE_FIGURES, *usage.CAPACITY_FIGURES, "idle_hours",
                             "wasted_gpu_hours", "gpu_hours", "avg_utilisation_pct",
                             "energy_wh", "coverage"], _NUMBER)
    times = dict.fromkeys(["idle_since", "idle_until", "bucket_start", "at"], _TIME)
    types = {**numbers, **times, "details": {"type": "object"},
             "type": {"type": "string", "enum": list(inv.EVENT_TYPES)}}
    return {
        "Usage": {"type": "object", "description": "Group keys (the 'by' columns) and figures",
                  "required": list(usage.USAGE_FIGURES), "properties": {
                      **{c: _TEXT for c in ["cluster", "namespace", "model", "node", "uuid",
                                            "slice"]},
                      **{c: types[c] for c in usage.USAGE_FIGURES}}},
        "Idle": _object(usage.IDLE_COLUMNS, types),
        "Capacity": {"type": "object", "required": list(usage.CAPACITY_FIGURES),
                     "properties": {**{c: _TEXT for c in ["model", "cluster", "node"]},
                                    **{c: types[c] for c in usage.CAPACITY_FIGURES}}},
        "Event": _object(inv.EVENT_COLUMNS, types),
        "GpuHistory": {"type": "object",
                       "required": ["gpu", "slices", "events", "allocations", "usage"],
                       "properties": {
                           "gpu": _ref("Gpu"), "slices": {"type": "array", "items": _ref("Gpu")},
                           "events": {"type": "array", "items": _ref("Event")},
                           "allocations": {"type": "array", "items": {"type": "object"}},
                           "usage": {"type": "array", "items": {"type": "object"}}}},
    }


_STATUS_TEXT = {400: "Bad query parameters", 404: "Not found",
                401: "No valid bearer token", 403: "Outside the caller's scope",
                503: "Not available (inventory database or service not healthy)"}


def openapi_document(routes: Sequence[Route], *, secured: bool = False,
                     metrics_open: bool = True) -> dict[str, Any]:
    """OpenAPI 3.1 built from the route table itself, so no path goes undocumented.

    With authentication configured every operation but the public ones names the bearer
    scheme and its 401/403; without, none does (nothing would answer them).
    """
    paths: dict[str, Any] = {}
    for route in routes:
        public = route.public or (route.path == "/metrics" and metrics_open)
        errors = route.errors + ((401, 403) if secured and not public else ())
        responses: dict[str, Any] = {} if route.response is None else {"200": {
            "description": "OK", "content": {
                route.content_type.split(";")[0]: {"schema": route.response}}}}
        for status in errors:
            responses[str(status)] = {"description": _STATUS_TEXT[status], "content": {
                "application/json": {"schema": _ref("Health" if route.path == "/healthz"
                                                     and status == 503 else "Error")}}}
        responses.update(route.responses or {})
        operation = {"summary": route.summary,
                     "operationId": _operation_id(route.method, route.path),
                     "parameters": list(route.parameters),
                     "responses": responses}
        if route.request_body is not None:
            operation["requestBody"] = route.request_body
        if secured and not public:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpufleet hub service", "version": __version__,
                 "description": "Read-only view of the GPU inventory: GET and HEAD, and "
                                "form posts to sign a browser in and out."},
        "paths": paths,
        "components": {"schemas": _schemas(), **({"securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "A static token or an OIDC access token."}}} if secured else {})},
    }


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.replace(".", "/").replace("-", "/").split("/") if w]
    name = "".join(w[:1].upper() + w[1:] for w in words if w not in ("api", "v1"))
    return method + (name or "Page")
