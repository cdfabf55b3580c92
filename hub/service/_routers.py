"""The service's routes, one router per domain (FastAPI's "bigger applications" layout):
inventory, usage, pages, meta (health, metrics, the description), findings and sign-in.

Every router is a :class:`~hub.service._routing.ConfinedRouter`, and each route declares its
visibility (``public``, ``scoped`` or ``fleet``) where it is added; the app factory
(``hub.service._app.build_app``) includes them. The JSON handlers are plain functions in
``hub.service._api``; what a route needs from the service (health, findings, metrics, the
sign-in) comes in as the arguments of its router's factory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hub.service import _api as api
from hub.service import _detail as detail
from hub.service import _models as models
from hub.service._auth import FULL, Caller, Scope
from hub.service._deps import CallerScope, ReadEngine, identify
from hub.service._detail import DetailPage
from hub.service._errors import database_error, public_error
from hub.service._memo import Memo
from hub.service._page import (
    MAX_SEARCH,
    SectionSource,
    page_data,
    search_text,
    section_source,
    unavailable_data,
    visibility_of,
)
from hub.service._routing import KEEP, ConfinedRouter, Html, Keep, Page, Text
from hub.service._session import MAX_FORM, MAX_TOKEN, Login
from hub.service._wire import Json

NOT_CHECKED = "not checked yet"
#: seconds a client has to send the sign-in form's body once its headers are in
BODY_TIMEOUT = 10.0
Findings = Callable[[], tuple[list[dict[str, Any]], float | None]]


# -- meta ----------------------------------------------------------------------------------------
def meta_router(*, health: Callable[[], tuple[bool, dict[str, Any]]],
                metrics: Callable[[str | None, str | None], tuple[bytes, dict[str, str]]],
                metrics_open: bool,
                describe: Callable[[Request], dict[str, Any]]) -> ConfinedRouter:
    """The service's own endpoints: health, metrics and this description."""
    router = ConfinedRouter()

    async def healthz() -> JSONResponse:
        """Whether the last sync succeeded within two intervals (200) or not (503, with the
        reason)."""
        ok, details = health()
        body = models.HealthBody.model_validate(details).model_dump(mode="json",
                                                                    exclude_unset=True)
        return JSONResponse(body, 200 if ok else 503)

    async def livez() -> JSONResponse:
        """Whether this process answers at all (200): the liveness probe. Answered on the
        event loop itself, so a hung process (stopped, deadlocked, its loop blocked) fails
        it where a TCP probe, which the kernel's listen queue answers, still passes."""
        return JSONResponse({"status": "alive"})

    async def metrics_(request: Request) -> Response:
        """Prometheus metrics of the service and the inventory (OpenMetrics when asked, gzip
        when accepted)."""
        body, headers = await run_in_threadpool(
            metrics, request.headers.get("accept"), request.headers.get("accept-encoding"))
        return Response(body, headers=headers)

    def openapi(request: Request) -> dict[str, Any]:
        """This description (OpenAPI 3.1)."""
        return describe(request)

    router.add("/healthz", healthz, models.HealthBody, visibility="public", errors=(400, 503))
    router.add("/livez", livez, models.LiveBody, visibility="public", errors=(400,))
    router.add("/metrics", metrics_, None, visibility="public" if metrics_open else "fleet",
               response_class=Text, responses={"200": {"description": "OK", "content": {
                   "text/plain": {"schema": {"type": "string"}},
                   "application/openmetrics-text": {"schema": {"type": "string"}}}}})
    router.add("/api/v1/openapi.json", openapi, dict[str, Any], visibility="scoped")
    return router


# -- inventory -----------------------------------------------------------------------------------
def inventory_router() -> ConfinedRouter:
    """Clusters, nodes, GPUs (with their history) and allocations."""
    router = ConfinedRouter()
    add = router.add
    # kept until the inventory changes: fifty dashboards paging the fleet ask the same pages
    add("/api/v1/clusters", api.clusters, models.ClusterList, visibility="scoped",
        errors=(400, 503), keep=KEEP)
    add("/api/v1/nodes", api.nodes, models.NodeList, visibility="scoped", errors=(400, 503),
        keep=KEEP)
    add("/api/v1/gpus", api.gpus, models.GpuList, visibility="scoped", errors=(400, 503),
        keep=KEEP)
    add("/api/v1/gpus/{uuid:path}/history", api.gpu_history, models.GpuHistory,
        visibility="scoped", errors=(400, 404, 503))
    add("/api/v1/gpus/{uuid:path}", api.gpu, models.GpuDetail, visibility="scoped",
        errors=(400, 404, 503), keep=KEEP)
    add("/api/v1/allocations", api.allocations, models.AllocationList, visibility="scoped",
        errors=(400, 503))
    return router


def history_router() -> ConfinedRouter:
    """What happened to the inventory: events and sync runs."""
    router = ConfinedRouter()
    router.add("/api/v1/events", api.events, models.EventList, visibility="scoped",
               errors=(400, 503))
    router.add("/api/v1/sync-runs", api.sync_runs, models.SyncRunList, visibility="scoped",
               errors=(400, 503))
    return router


# -- findings ------------------------------------------------------------------------------------
def findings_router(findings: Findings,
                    check_failure: Callable[[], tuple[float, str] | None]) -> ConfinedRouter:
    """Findings of the latest checks, kept by the scheduler."""
    router = ConfinedRouter()

    async def findings_(scope: CallerScope,
                  severity: Annotated[typing.Literal[models.SEVERITIES] | None,  # type: ignore[valid-type]
                                      api.Query(description="Only this severity.")] = None,
                  cluster: api.ClusterParam = None, limit: api.LimitParam = api.DEFAULT_LIMIT,
                  continue_: api.ContinueParam = None) -> Json:
        """Findings of the latest checks (empty until checks are configured); paged."""
        # async: the scheduler's copy in memory, no database read to wait for
        cluster = api.scoped_cluster(cluster, scope)
        items, generated = findings()
        selected = api.visible_findings(items, scope, severity=severity, cluster=cluster)
        when = dt.datetime.fromtimestamp(generated, dt.UTC) if generated is not None else None
        failed = check_failure()
        last_failure = None if failed is None else {  # no hub URL or driver text to callers
            "at": dt.datetime.fromtimestamp(failed[0], dt.UTC),
            "error": public_error(failed[1])}
        # namespace: the model's default where the checks name none
        page = api.page_items([{"namespace": None, **f, "checked_at": when} for f in selected],
                              api.text_key("cluster", "node", "gpu", "check", "message"),
                              continue_, limit, "f1", 5)
        return Json({**page, "generated_at": when, "last_check_failed": last_failure,
                     "checks": "checked" if when is not None else NOT_CHECKED})

    router.add("/api/v1/findings", findings_, models.FindingList, visibility="scoped")
    return router


# -- usage ---------------------------------------------------------------------------------------
def usage_router() -> ConfinedRouter:
    """GPU-hours, idle allocated GPUs and capacity, from the usage ledger."""
    router = ConfinedRouter()
    # a usage or capacity row carries the keys of its grouping only, not the others as null
    router.add("/api/v1/usage", api.usage, models.UsageList, visibility="scoped",
               errors=(400, 503), response_model_exclude_unset=True)
    router.add("/api/v1/idle", api.idle, models.IdleList, visibility="scoped",
               errors=(400, 503))
    router.add("/api/v1/capacity", api.capacity, models.CapacityList, visibility="scoped",
               errors=(400, 503), response_model_exclude_unset=True, keep=KEEP)
    router.add("/api/v1/placement-scores", api.placement_scores, models.PlacementScoreList,
               visibility="scoped", errors=(400, 503))
    # a GPU's life (issue 38): a states row carries the keys of its grouping only
    router.add("/api/v1/states", api.states, models.StateList, visibility="scoped",
               errors=(400, 503), response_model_exclude_unset=True)
    router.add("/api/v1/lemons", api.lemons, models.LemonList, visibility="scoped",
               errors=(400, 503), response_model_exclude_unset=True)
    return router


# -- pages ---------------------------------------------------------------------------------------
def pages_router(*, findings: Findings, page_sections: Sequence[SectionSource], memo: Memo,
                 signed_in: bool, login: Login | None) -> ConfinedRouter:
    """The live page and the cluster, node and GPU pages (HTML)."""
    router = ConfinedRouter()
    add = router.add
    page_sections = [_kept(source, memo) for source in page_sections]

    def page(engine: ReadEngine, scope: CallerScope, request: Request,
             caller: Annotated[Caller, Depends(identify)],
             q: Annotated[str | None, api.Query(
                 description="A GPU UUID (or its start), a node or a namespace to look up.",
                 max_length=MAX_SEARCH + 64, pattern=api.TEXT_PATTERN)] = None) -> Page:
        """The live page of the fleet (HTML, read-only): clusters and their freshness, stale
        GPUs, GPUs with findings, findings; search with q."""
        search = search_text({"q": [q]} if q is not None else {})
        items, generated = findings()
        who = _who(request, caller)
        try:
            # a page view is a dozen reads and a few folds of the whole inventory: its data
            # is shared by every caller of the scope, its HTML (kept by the route) by every
            # caller of the scope with the same name on it
            with engine.connect() as conn:
                data = memo.get(conn, ("page", scope, search, generated, len(items)),
                                lambda: page_data(engine, search=search, findings=items,
                                                  findings_at=generated, extra=page_sections,
                                                  scope=scope))
        except sa.exc.SQLAlchemyError as exc:  # the page says so, rather than a JSON 503
            return Page({**unavailable_data(search, database_error(exc)), **who}, 503)
        return Page({**data, **who})

    def _who(request: Request, caller: Caller | None) -> dict[str, Any]:
        """The name on the page and its sign-out button: part of what the page shows."""
        return {"signed_in": caller.name if signed_in and caller is not None else None,
                "can_sign_out": bool(getattr(request.state, "by_session", False))}

    def varies(request: Request, caller: Caller | None) -> tuple[Any, ...]:
        """Beyond q and the scope, the kept page is the findings' and the name's on it."""
        items, generated = findings()
        return generated, len(items), tuple(_who(request, caller).items())

    html = {"content": {"text/html": {"schema": {"type": "string"}}}}
    # kept until the inventory or the findings change (or 30 s)
    add("/", page, None, visibility="scoped", errors=(400, 503), response_class=Html,
        keep=Keep(vary=varies),
        responses={"200": {"description": "OK", **html},
                   **({"303": _see_other("A browser (Accept: text/html) without a session: "
                                         "to /login.", False)} if login else {})})
    return router


def detail_pages_router(findings: Findings = lambda: ([], None)) -> ConfinedRouter:
    """One cluster, node or GPU as a page of its own (HTML), with the findings of the
    latest checks about it (``findings``: the service's, as the live page reads them)."""
    router = ConfinedRouter()

    def cluster_page(engine: ReadEngine, scope: CallerScope,
                     cluster: Annotated[str, Path(pattern=api.TEXT_PATTERN)],
                     continue_: api.ContinueParam = None) -> DetailPage:
        """One cluster: its findings, unhealthy GPUs, nodes and GPUs a page at a time
        (HTML), the JSON one click away."""
        after = api.decode_token(continue_) if continue_ else None
        with engine.connect() as conn:
            return detail.cluster_page(conn, cluster, scope, findings(), after=after)

    def node_page(engine: ReadEngine, scope: CallerScope,
                  cluster: Annotated[str, Path(pattern=api.TEXT_PATTERN)],
                  node: Annotated[str, Path(pattern=api.TEXT_PATTERN)]) -> DetailPage:
        """One node: its findings, Kubernetes' GPU count, its GPUs and the pods on them
        (HTML), the JSON one click away."""
        with engine.connect() as conn:
            return detail.node_page(conn, cluster, node, scope, findings())

    def gpu_page(request: Request, engine: ReadEngine, scope: CallerScope,
                 uuid: api.UuidPath) -> DetailPage:
        """One GPU: where it is, its health, findings, idle time, slices, pods, usage and
        events (HTML), the JSON one click away."""
        with engine.connect() as conn:
            return detail.gpu_page(conn, uuid, scope, findings(),
                                   rule=getattr(request.app.state, "idle_rule", None))

    # browser pages: in the app (and its scope step), not in the API's description
    for path, endpoint in (("/clusters/{cluster}", cluster_page),
                           ("/nodes/{cluster}/{node}", node_page),
                           ("/gpus/{uuid:path}", gpu_page)):
        router.add(path, endpoint, None, visibility="scoped", errors=(400, 404, 503),
                   response_class=Html, include_in_schema=False)
    return router


def _kept(source: SectionSource, memo: Memo) -> SectionSource:
    """A page section kept in ``memo`` until the inventory changes (per scope): the usage
    sections fold the whole ledger and inventory on every page view otherwise."""
    visibility = visibility_of(source)

    @section_source(visibility=visibility)  # the same declaration as the source's
    def kept(conn: Any, *, scope: Scope = FULL) -> Any:
        key = ("section", source, scope)
        if visibility == "scoped":
            return memo.get(conn, key, lambda: source(conn, scope=scope))
        return memo.get(conn, key, lambda: source(conn))

    kept.__name__ = getattr(source, "__name__", "section")
    return kept



# -- sign-in -------------------------------------------------------------------------------------
def _see_other(description: str, cookie: bool) -> dict[str, Any]:
    headers: dict[str, Any] = {"Location": {"schema": {"type": "string"}, "required": True}}
    if cookie:
        headers["Set-Cookie"] = {"schema": {"type": "string"}, "required": True,
                                 "description": "The session cookie (HttpOnly, "
                                                "SameSite=Strict), or its removal."}
    return {"description": description, "headers": headers,
            "content": {"text/html": {"schema": {"type": "string"}}}}


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/html": {"schema": {
        "type": "string"}}}}


TOKEN_FORM = {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": {
    "type": "object", "required": ["token"], "additionalProperties": False,
    "properties": {"token": {
        "type": "string", "minLength": 1, "maxLength": MAX_TOKEN,
        "pattern": "^[^\\u0000-\\u001f\\u007f]*$",
        "description": "A static token or an OIDC access or ID token."}}}}}}


async def read_body(request: Request) -> bytes | None:
    """The request body, at most MAX_FORM bytes within BODY_TIMEOUT; None otherwise (a
    trickle or a flood is not read to its end)."""
    chunks: list[bytes] = []
    size = 0

    async def collect() -> bool:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_FORM:
                return False
            chunks.append(chunk)
        return True

    try:
        whole = await asyncio.wait_for(collect(), BODY_TIMEOUT)
    except TimeoutError:
        whole = False
    return b"".join(chunks) if whole else None


def signin_router(login: Login) -> ConfinedRouter:
    """Sign-in and sign-out for browsers: HTML forms and redirects, no JSON."""
    router = ConfinedRouter()
    add = router.add

    def form(request: Request) -> Response:
        """The sign-in form (HTML): paste a token; the browser then keeps a session cookie,
        never the token."""
        return login.form(request)

    async def submit(request: Request) -> Response:
        """Sign in with a token (form post): on success a session cookie and 303 to the
        page; a bad token answers the form again with 'sign-in failed' (401)."""
        body = await read_body(request)
        client = request.client.host if request.client is not None else ""
        response = await run_in_threadpool(login.submit, body, request.headers, client)
        if body is None:
            response.headers["Connection"] = "close"
        return response

    def logout(request: Request) -> Response:
        """Sign out (form post): the session ends, its cookie is removed; 303 to /login."""
        return login.logout(request.headers)

    add("/login", form, None, visibility="public", errors=(), response_class=Html,
        responses={"200": {"description": "The form.", **_html("")},
                   "400": _html("Parameters given (a token never goes in a URL).")})
    add("/login", submit, None, visibility="public", errors=(), method="POST", response_class=Html,
        openapi_extra={"requestBody": TOKEN_FORM}, responses={
            "303": _see_other("Signed in: the session cookie, and to /.", True),
            "400": _html("The form could not be read."),
            "401": _html("Sign-in failed (the same answer for any bad token)."),
            "403": _html("A form sent from another site, or a token whose groups map to no "
                         "scope."),
            "429": _html("Too many sign-in attempts from this client in a minute."),
            "503": _html("As many sessions live as the service keeps; try again later."),
            "413": {"description": "A body larger than the form can be.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}})
    add("/logout", logout, None, visibility="public", errors=(), method="POST", response_class=Html,
        responses={"303": _see_other("Signed out: to /login.", True),
                   "403": _html("A form sent from another site.")})
    return router
