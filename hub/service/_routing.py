"""How a route joins the service: the caller, its visibility and the confine step, for every
route of every router.

A route's visibility is declared where it is added, never inferred from its handler:

* ``public``: no caller asked for (/healthz, the sign-in forms, /metrics when open);
* ``scoped``: any caller, the answer confined to the caller's scope (hub/service/_confine.py);
* ``fleet``: whole-fleet callers only, 403 for a scoped one. The default, so a route added
  without a thought answers no team until it is declared ``scoped``.

:class:`ConfinedRouter` is the only router the service uses: its ``add_api_route`` (which
``@router.get`` goes through as well) wraps every handler in :func:`_guarded`, which attaches
the caller dependency and the guard's caller checks (``admit`` and ``confined``,
hub/service/_guard.py), so no route can skip them; :func:`include` puts a router's routes in
the app.

Caching is a route option too, declared beside the visibility: a route added with
``keep=KEEP`` (or a :class:`Keep` saying what else its answer varies by) has its answers kept
as bytes per route, parameters, caller's scope and inventory version (:func:`kept`):
confined, then encoded, then kept, so a kept answer is only ever one scope's and the confine
step is still the wrapper's. Its handler is the plain function it would be uncached,
returning its answer; the one pipeline looks the answer up before calling it.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hub.service._api import METRICS_CONTENT_TYPE
from hub.service._auth import FULL, Caller
from hub.service._deps import engine_of, identify, scope_of
from hub.service._detail import DetailPage
from hub.service._guard import Visibility, admit, confined
from hub.service._memo import read_version
from hub.service._page import render_page
from hub.service._wire import Json, Stored

#: set on a guarded handler: include_router hands it over again, and it is wrapped once
_GUARDED = "__gpufleet_guarded__"
#: set on a request whose engine is an override's: its answers are neither kept nor found
OVERRIDDEN = "engine_overridden"


@dataclass
class Page:
    """What the live page shows (confined like any answer), rendered after."""

    data: dict[str, Any]
    status: int = 200

    def response(self) -> Response:
        return render_page(self.data, self.status)


class Html(Response):
    media_type = "text/html"


class Text(Response):
    media_type = METRICS_CONTENT_TYPE.split(";")[0]


@dataclass(frozen=True)
class Keep:
    """Route option: keep the route's answers until the inventory changes (or the memo's
    TTL). The key is the route, its parameters as the handler receives them (not the
    engine, scope, caller or request) and the caller's scope; ``vary`` adds what else an
    answer depends on (the live page: the findings' time, the name on it), read on the event
    loop from the request and the caller, so it must not touch the database. Only a 200 is
    kept; a database that cannot say its version gets the handler's answer, uncached."""

    vary: Callable[[Request, Caller | None], Hashable] | None = None


#: keep by the route's parameters and the caller's scope alone
KEEP = Keep()


class _Unkept(Exception):
    """An answer not to keep (not a 200): it leaves the memo through this."""

    def __init__(self, stored: Stored) -> None:
        super().__init__(stored.status)
        self.stored = stored


@dataclass(frozen=True)
class RouteInfo:
    """What the description says beyond the response model: errors and visibility."""

    public: bool
    errors: tuple[int, ...]


def _guarded(endpoint: Callable[..., Any], visibility: Visibility,
             keep: Keep | None = None) -> Callable[..., Any]:
    """The endpoint as the app serves it: with the caller dependency (unless public), closed
    to scoped callers unless declared ``scoped``, its answer confined to the caller's scope
    and, with ``keep``, kept. FastAPI reads the signature, so the wrapper shows the
    endpoint's own parameters plus ``_caller``."""
    if getattr(endpoint, _GUARDED, False):
        return endpoint
    if keep is not None and inspect.iscoroutinefunction(endpoint):
        raise TypeError(f"{endpoint.__name__}: keep is for synchronous handlers (a missing "
                        "answer is computed in the thread pool)")
    hints = typing.get_type_hints(endpoint, include_extras=True)
    signature = inspect.signature(endpoint)
    parameters = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in signature.parameters.values()]
    # the caller, its scope and the engine come from the wrapper's own caller and the app,
    # not from a FastAPI dependency each (solving them was a fifth of a cheap request);
    # ``app.dependency_overrides`` of scope_of and engine_of still apply (:func:`_overridden`)
    supplied = {} if visibility == "public" else {
        p.name: what for p in parameters if (what := _supplied(p.annotation)) is not None}
    parameters = [p for p in parameters if p.name not in supplied]
    #: what a kept answer's key is made of: the request's own parameters
    keyed = [p.name for p in parameters if p.annotation is not Request]
    if visibility != "public":
        parameters.append(inspect.Parameter("_caller", inspect.Parameter.KEYWORD_ONLY,
                                            annotation=Annotated[Caller, Depends(identify)]))
    # the request, for the app's kept answers: the endpoint's own Request parameter if it
    # has one (FastAPI hands the request to one parameter only)
    own = next((p.name for p in parameters if p.annotation is Request), None)
    if own is None:
        parameters.append(inspect.Parameter("_request", inspect.Parameter.KEYWORD_ONLY,
                                            annotation=Request))

    async def take(kwargs: dict[str, Any]) -> tuple[Caller | None, Request]:
        caller = kwargs.pop("_caller", None)
        request = kwargs[own] if own is not None else kwargs.pop("_request")
        engine = request.app.state.engine
        if request.app.dependency_overrides and visibility != "public":
            caller, engine = await _overridden(request, caller, engine)
        admit(caller, visibility)
        for name, what in supplied.items():
            kwargs[name] = (caller if what == "caller" else caller.scope if what == "scope"
                            else engine)
        return caller, request

    if inspect.iscoroutinefunction(endpoint):
        async def wrapper(**kwargs: Any) -> Any:
            caller, _ = await take(kwargs)
            return finish(caller, await endpoint(**kwargs))
    elif keep is not None:
        # The kept answer is looked up on the event loop (SQLite's WAL reads never wait;
        # PostgreSQL's are awaited) before the handler is called, and only a missing one is
        # computed in the thread pool (the trip there and back was a third of a kept
        # answer's cost)
        async def wrapper(**kwargs: Any) -> Any:  # type: ignore[misc]
            caller, request = await take(kwargs)

            def call() -> Any:
                return endpoint(**kwargs)

            if getattr(request.state, OVERRIDDEN, False):  # not the app's database: not kept
                return await run_in_threadpool(lambda: finish(caller, call()))
            key = (endpoint, tuple(kwargs[name] for name in keyed),
                   keep.vary(request, caller) if keep.vary is not None else None)
            found = await kept_now(caller, request, key)
            if found is not None:
                return found
            return await run_in_threadpool(kept, caller, request, key, call)
    else:
        # A synchronous handler (a database read) runs in the thread pool, its answer
        # confined (and encoded, or kept) there too; the wrapper itself is async so that
        # FastAPI checks a plain answer against its model on the way out without another
        # trip through the pool.
        async def wrapper(**kwargs: Any) -> Any:  # type: ignore[misc]
            caller, _ = await take(kwargs)
            return await run_in_threadpool(lambda: finish(caller, endpoint(**kwargs)))

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty)
    wrapper.__name__ = endpoint.__name__
    wrapper.__doc__ = endpoint.__doc__
    setattr(wrapper, _GUARDED, True)
    return wrapper


async def _overridden(request: Request, caller: Caller | None, engine: Any
                      ) -> tuple[Caller | None, Any]:
    """The caller and engine with ``app.dependency_overrides`` of :func:`scope_of` and
    :func:`engine_of` applied, as FastAPI would apply them to a route that declared them
    (``identify``'s is FastAPI's own: the wrapper declares it). An overridden scope is the
    caller's everywhere: the handler's ``scope``, the confine step and the kept answers'
    key, so the route answers exactly as it would to a token of that scope."""
    overrides = request.app.dependency_overrides
    if scope_of in overrides and caller is not None:
        scope = await _call(overrides[scope_of], request, caller)
        caller = dataclasses.replace(caller, scope=scope)
    if engine_of in overrides:
        engine = await _call(overrides[engine_of], request, caller)
        setattr(request.state, OVERRIDDEN, True)  # the kept answers are the app's engine's
    return caller, engine


async def _call(override: Callable[..., Any], request: Request, caller: Caller | None
                ) -> Any:
    """An override called as a dependency: with the request and the caller where its
    parameters ask for them (by annotation), nothing else."""
    try:
        hints = typing.get_type_hints(override, include_extras=True)
    except (NameError, TypeError):  # a name its module does not hold (imported locally)
        hints = {}
    kwargs: dict[str, Any] = {}
    for parameter in inspect.signature(override).parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        if typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
        if annotation in (Request, "Request"):
            kwargs[parameter.name] = request
        elif annotation in (Caller, "Caller"):
            kwargs[parameter.name] = caller
        elif parameter.default is inspect.Parameter.empty:
            raise TypeError(f"dependency override {override!r}: parameter {parameter.name!r} "
                            "must be the Request or the Caller")
    value = override(**kwargs)
    return await value if inspect.isawaitable(value) else value


def _supplied(annotation: Any) -> str | None:
    """Which of the wrapper's own values a parameter takes: ``caller``, ``scope`` or
    ``engine`` (declared with the dependencies of hub/service/_deps.py), or None."""
    if typing.get_origin(annotation) is not Annotated:
        return None
    for meta in typing.get_args(annotation)[1:]:
        dependency = getattr(meta, "dependency", None)
        for what, known in (("caller", identify), ("scope", scope_of), ("engine", engine_of)):
            if dependency is known:
                return what
    return None


def finish(caller: Caller | None, result: Any) -> Any:
    """The answer confined to the caller's scope; a page rendered, JSON of ours encoded."""
    result = confined(caller, result)
    return result.response() if isinstance(result, (Page, DetailPage, Json)) else result


def kept(caller: Caller | None, request: Request, key: Hashable,
         call: Callable[[], Any]) -> Any:
    """The kept answer for the route's key and the caller's scope at the inventory's
    version, or the one ``call`` (the handler) gives now, confined and encoded before it is
    kept (a 200 only). A database that cannot say its version gets the handler's answer as
    it is (the handler says what it means: the API's 503, the page's own notice)."""
    state = request.app.state

    def compute() -> Stored:
        response = finish(caller, call())
        if not isinstance(response, Response):
            response = Json(response).response()
        stored = Stored.of(response)
        if stored.status != 200:
            raise _Unkept(stored)
        return stored

    try:
        version = read_version(state.engine)
    except sa.exc.SQLAlchemyError:
        return finish(caller, call())
    scope = caller.scope if caller is not None else FULL
    try:
        return state.answers.get_at(version, (key, scope), compute).response()
    except _Unkept as unkept:
        return unkept.stored.response()


async def kept_now(caller: Caller | None, request: Request, key: Hashable
                   ) -> Response | None:
    """The kept answer if there is one now, its version read without leaving the event loop
    (hub/service/_memo.py LoopVersion: SQLite's file, or PostgreSQL awaited on a connection
    of the loop's own); None otherwise (any error: :func:`kept` in the pool says it)."""
    state = request.app.state
    version = await state.loop_version.read_async()
    if version is None:
        return None
    found = state.answers.peek(version, (key, caller.scope if caller is not None else FULL))
    return found.response() if found is not None else None


def _summary(endpoint: Callable[..., Any]) -> str | None:
    return " ".join((endpoint.__doc__ or "").split("\n\n")[0].split()) or None


class ConfinedRouter(APIRouter):
    """An APIRouter whose every route goes through :func:`_guarded`, its summary from the
    handler's docstring, its errors and visibility kept for the description (``infos``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.infos: dict[tuple[str, str], RouteInfo] = {}

    def add_api_route(self, path: str, endpoint: Callable[..., Any], *,  # type: ignore[override]
                      visibility: Visibility = "fleet", errors: tuple[int, ...] = (400,),
                      keep: Keep | None = None, **kwargs: Any) -> None:
        for method in kwargs.get("methods") or ["GET"]:
            self.infos[(path.replace(":path}", "}"), method.lower())] = RouteInfo(
                visibility == "public", errors)
        if kwargs.get("summary") is None:
            kwargs["summary"] = _summary(endpoint)
        super().add_api_route(path, _guarded(endpoint, visibility, keep), **kwargs)

    def add(self, path: str, endpoint: Callable[..., Any], model: Any, *,
            visibility: Visibility = "fleet", errors: tuple[int, ...] = (400,),
            method: str = "GET", keep: Keep | None = None, **options: Any) -> None:
        """One route: ``model`` its response model; ``keep`` (:data:`KEEP` or a
        :class:`Keep`): its answers kept until the inventory changes."""
        self.add_api_route(path, endpoint, visibility=visibility, errors=errors,
                           methods=[method], response_model=model, keep=keep, **options)


def include(app: FastAPI, router: ConfinedRouter) -> None:
    """The router's routes in the app (already guarded: not wrapped again), their errors and
    visibility in the app's description.

    Added route by route, as ``include_router`` did before FastAPI 0.165 (it now nests the
    router, lazily): the strict-query step, the 405's Allow header and the description read
    the app's routes flat, as do the route walks of the tests.
    """
    for r in router.routes:
        if not isinstance(r, APIRoute):
            raise TypeError(f"{r!r}: a ConfinedRouter holds API routes only")
        app.router.add_api_route(
            r.path, r.endpoint, response_model=r.response_model, status_code=r.status_code,
            tags=r.tags, dependencies=r.dependencies, summary=r.summary,
            description=r.description, response_description=r.response_description,
            responses=r.responses, deprecated=r.deprecated, methods=r.methods,
            operation_id=r.operation_id,
            response_model_include=r.response_model_include,
            response_model_exclude=r.response_model_exclude,
            response_model_by_alias=r.response_model_by_alias,
            response_model_exclude_unset=r.response_model_exclude_unset,
            response_model_exclude_defaults=r.response_model_exclude_defaults,
            response_model_exclude_none=r.response_model_exclude_none,
            include_in_schema=r.include_in_schema, response_class=r.response_class,
            name=r.name, callbacks=r.callbacks, openapi_extra=r.openapi_extra,
            generate_unique_id_function=r.generate_unique_id_function)
    app.state.routes.update(router.infos)
    app.state.openapi = None  # described again on the next ask


def route(app: FastAPI, path: str, endpoint: Callable[..., Any], model: Any, *,
          visibility: Visibility = "fleet", errors: tuple[int, ...] = (400,),
          method: str = "GET", keep: Keep | None = None, **options: Any) -> None:
    """One more route on a built app (a router of one), as every route joins it."""
    router = ConfinedRouter()
    router.add(path, endpoint, model, visibility=visibility, errors=errors, method=method,
               keep=keep, **options)
    include(app, router)
