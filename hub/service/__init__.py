"""`gpufleet serve`: the scheduler that syncs and checks on a schedule, its health and
metrics, and the read-only JSON API over the inventory (FastAPI on uvicorn).

Two wings: the runtime (hub/service/runtime: the schedule, its leadership and the jobs that
write) and the HTTP readers (the app, routers, handlers, pages, sign-in), which answer from
what the runtime wrote to the database (hub/service/_status.py), so every worker and replica
answers alike.
"""

from __future__ import annotations

from hub.inventory import read_only_engine
from hub.service._app import build_app
from hub.service._auth import (
    FULL,
    Authenticator,
    OidcVerifier,
    Scope,
    TokenFile,
    load_group_scopes,
    new_token,
    token_entry,
)
from hub.service._confine import confine
from hub.service._health import describe_error
from hub.service._page import USAGE_SECTIONS
from hub.service._scheduler import Jobs, Service, build_service
from hub.service._session import (
    MAX_PER_PERSON,
    MAX_PER_TOKEN,
    MAX_SESSIONS,
    DbSessions,
    DbSignInLimit,
    Sessions,
    SessionsFull,
    SignInLimit,
)
from hub.service._settings import (
    ServeSettings,
    access,
    serve_settings,
)
from hub.service._tls import TlsFiles
from hub.service._workers import serve
from hub.service.runtime import service_jobs

__all__ = [
    "FULL",
    "MAX_PER_PERSON",
    "MAX_PER_TOKEN",
    "MAX_SESSIONS",
    "USAGE_SECTIONS",
    "Authenticator",
    "DbSessions",
    "DbSignInLimit",
    "Jobs",
    "OidcVerifier",
    "Scope",
    "ServeSettings",
    "Service",
    "Sessions",
    "SessionsFull",
    "SignInLimit",
    "TlsFiles",
    "TokenFile",
    "access",
    "build_app",
    "build_service",
    "confine",
    "describe_error",
    "load_group_scopes",
    "new_token",
    "read_only_engine",
    "serve",
    "serve_settings",
    "service_jobs",
    "token_entry",
]
