"""Everything a route may ask FastAPI for: the dependencies (the read-only engine, the caller,
its scope, the idle rule, the prices) and the typed query and path parameters with their
OpenAPI description and bounds.

One module, so a handler's signature reads as what it takes, and a test swaps any of them
through ``app.dependency_overrides`` (e.g. ``{identify: lambda: a_team_caller}``,
``{scope_of: lambda: a_scope}``, ``{engine_of: lambda: another_engine}``): the routes depend
on these very functions. (The route wrapper supplies the scope and the engine itself, for
speed, and applies their overrides as FastAPI would: hub/service/_routing.py.) They read
the app's state, set once by the app factory (``hub.service._app.build_app``); none of them
checks anything beyond what it reads (the request's guard is ``hub.service._guard``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from hub import usage
from hub.service._auth import Caller, Scope

DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
#: a continue token is a few keys; anything longer is not one of ours (and is not decoded)
MAX_TOKEN = 2048
#: No control characters (NUL above all: PostgreSQL refuses it in a text parameter).
TEXT_PATTERN = "^[^\\u0000-\\u001f\\u007f]*$"


async def engine_of(request: Request) -> Engine:
    """The app's read-only inventory engine. (async: a trivial dependency need not take a
    trip through the thread pool)"""
    return request.app.state.engine


async def identify(request: Request) -> Caller:
    """Who asks: the one dependency every non-public route has (the app's gate decides).
    Named at once where that waits on nothing: no access configured, or a bearer token with
    static tokens only (a hash and a stat of the tokens file); otherwise in the thread pool:
    a browser session is a database read and an OIDC token may need its issuer's keys
    fetched, and the event loop must never wait for either. (The trip through the pool
    was a tenth of a request that finds its answer kept.)"""
    gate = request.app.state.gate
    if not gate.auth.enabled or (gate.auth.oidc is None
                                 and "authorization" in request.headers):
        return gate.caller(request)
    return await run_in_threadpool(gate.caller, request)


async def scope_of(caller: Annotated[Caller, Depends(identify)]) -> Scope:
    return caller.scope


async def idle_rule_of(request: Request) -> Any:
    """The service's idle rule (hub.usage.IdleRule): `serve --idle-threshold/--idle-for`."""
    return getattr(request.app.state, "idle_rule", None) or usage.IdleRule()


async def prices_of(request: Request) -> Any:
    """The service's showback prices (hub.usage.Prices), None without `serve --prices`."""
    return getattr(request.app.state, "prices", None)


ReadEngine = Annotated[Engine, Depends(engine_of)]
CallerScope = Annotated[Scope, Depends(scope_of)]


def text_param(description: str, **extra: Any) -> Any:
    return Query(description=description, pattern=TEXT_PATTERN, **extra)


ClusterParam = Annotated[str | None, text_param("Only this cluster.")]
LimitParam = Annotated[int, Query(ge=1, le=MAX_LIMIT,
                                  description=f"Page size (1-{MAX_LIMIT}).")]
ContinueParam = Annotated[str | None, Query(
    alias="continue", max_length=MAX_TOKEN, pattern=TEXT_PATTERN,
    description="The 'continue' token of the previous page.")]
SinceParam = Annotated[str | None, text_param("The last DURATION (default 24h).",
                                              max_length=64)]
FromParam = Annotated[str | None, Query(alias="from", pattern=TEXT_PATTERN, max_length=64,
                                        description="Start (ISO-8601, UTC), instead of since.")]
UntilParam = Annotated[str | None, text_param("End (ISO-8601, UTC).", max_length=64)]
UuidPath = Annotated[str, Path(description="GPU uuid, percent-encoded ('/' as %2F).",
                               pattern=TEXT_PATTERN)]
