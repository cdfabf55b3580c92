"""The one door to the hub store's Prometheus HTTP API: auth, TLS, timeouts, request counting.

We speak the HTTP API directly over a ``requests.Session`` rather than through
prometheus-api-client's ``PrometheusConnect``: that client drops Thanos ``warnings`` (a partial
response must fail a sync, not look healthy), puts POSTed queries in the URL, and wraps the
store's own error message in a repr. The session is the I/O seam: tests and the service hand in
their own (``session=``), exactly like an httpx transport; :meth:`HubClient.prometheus_connect`
gives report code a ``PrometheusConnect`` on the same session when DataFrames are wanted.

It carries questions and streams answers (:class:`StreamedRows`), and writes no query of its
own: what to ask lives beside it, split by its reader (fields and identities in _fields.py,
dcgm's namings in _naming.py, vendor profiles and the sync's queries in _profiles.py, usage
in _usage.py, allocation in _allocation.py, MIG in _mig.py, ACM's collection paths in
_collection.py, the door for values and labels in _bounds.py).

No secret (token, URL credentials, key) is ever part of an exception message or log line.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import threading
import warnings
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from hub.common import (
    InputError,
    UnavailableError,
    read_text,
    redact,
    register_secret,
    shorten,
)
from hub.store._bounds import Refused, label_problem

TOKEN_ENV = "GPUFLEET_TOKEN"
#: the largest token file read (a JWT with many groups is a few KiB)
SECRET_FILE_BYTES = 64 * 1024
#: how much of a hub's non-JSON answer (an HTML error page, a proxy's text) an error quotes
MAX_DETAIL = 200
#: how much of the store's own JSON "error" field (a PromQL parse error names the position)
MAX_STORE_ERROR = 500

#: Sent with every query. Thanos Query (and so ACM's hub) answers a query that some store could
#: not serve with HTTP 200, fewer series and ``warnings`` unless told not to; a GPU inventory
#: built from such an answer silently loses clusters. With ``partial_response=false`` Thanos
#: fails the query instead; Prometheus ignores the parameter. Callers still fail on warnings,
#: for stores that ignore it.
NO_PARTIAL_RESPONSE = {"partial_response": "false"}


class PromQLError(InputError):
    """The store rejected the query (HTTP 400/422): the user's PromQL is wrong. Exit 2."""


class HubUnavailable(UnavailableError):
    """The store could not answer: unreachable, 5xx, timeout, auth refused. Exit 3."""

class PartialResponse(UnavailableError):
    """The store answered with warnings (Thanos partial response): data may be missing."""


@dataclass
class QueryResult:
    result_type: str
    result: Any
    warnings: list[str] = field(default_factory=list)


def redact_url(url: str) -> str:
    """The URL without user:password, so it can appear in messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        parts = parts._replace(netloc=host)
    return urlunsplit(parts)


def _read_secret_file(path: str, what: str) -> str:
    # bounded and decoded: a binary or huge file is one line (its content never shown)
    return read_text(path, f"{what} file {path}", max_bytes=SECRET_FILE_BYTES).strip()


def check_token(token: str, source: str) -> str:
    """The token if it can be sent as one header value; else a one-line error without it.

    A token file with a second line (a Secret made from a file with a trailing note, two
    tokens pasted together) would otherwise reach ``requests``, whose header check quotes the
    whole value in its exception, into the CLI error, the log and ``sync_runs.error``.
    """
    register_secret(token)
    if re.search(r"[\x00-\x20\x7f]", token):
        kind = ("a line break" if re.search(r"[\r\n]", token)
                else "whitespace or a control character")
        raise InputError(f"the hub token from {source} contains {kind}: a bearer token is one "
                         "line without spaces (the token is not shown)")
    return token


class BearerToken(requests.auth.AuthBase):
    """``Authorization: Bearer`` from a file, re-read whenever the file changes.

    A mounted Secret is replaced in place when it is rotated (kubelet swaps a symlink), so the
    file's identity and modification time are checked before each request: a rotated token is
    used from the next request on, without a restart. Being the session's ``auth`` also keeps
    requests from looking in ``~/.netrc``: with ``trust_env`` it would otherwise replace our
    header with the netrc entry for the hub host (proxies and CA bundle variables still apply).
    """

    def __init__(self, token_file: str | None = None, token: str | None = None) -> None:
        self.token_file = token_file
        self._token = check_token(token, f"${TOKEN_ENV}") if token else None
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        if token_file:
            self.current()  # a bad file fails at start, not at the first query

    def current(self) -> str | None:
        if not self.token_file:
            return self._token
        try:
            st = os.stat(self.token_file)
        except OSError as exc:
            raise InputError(f"cannot read token file {self.token_file}: "
                             f"{exc.strerror}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                token = _read_secret_file(self.token_file, "token")
                self._token = check_token(token, f"token file {self.token_file}")
                self._stamp = stamp
            return self._token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        token = self.current()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        return request


def sanitise(text: str, limit: int = MAX_DETAIL) -> str:
    """A hub's raw answer made fit for a one-line error: printable, short, no secret."""
    text = re.sub(r"<[^>]{0,200}>", " ", text)  # an HTML error page: keep its words
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", " ", text)  # terminal colour codes
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return shorten(redact(" ".join(text.split())), limit)


@dataclass
class HubSettings:
    """How to reach the hub store; built from CLI options, environment or config file."""

    url: str
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    #: read timeout: how long one answer may take once connected (--read-timeout)
    timeout: float = 60.0
    #: how long the hub may take to accept a connection (--connect-timeout): a hub that is
    #: down or firewalled costs this, not a whole read timeout
    connect_timeout: float = 5.0

    def validate(self) -> None:
        if not self.url:
            raise InputError("no hub URL: pass --hub-url or set GPUFLEET_HUB_URL")
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise InputError(f"invalid hub URL (--hub-url): {exc}") from None
        if not self.timeout > 0:
            raise InputError(f"--read-timeout must be greater than 0 (got {self.timeout:g}s)")
        if not self.connect_timeout > 0:
            raise InputError("--connect-timeout must be greater than 0 "
                             f"(got {self.connect_timeout:g}s)")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"invalid hub URL {redact_url(self.url)!r}: expected http(s)://host[:port]")
        if bool(self.cert_file) != bool(self.key_file):
            raise InputError("--cert-file and --key-file must be given together")
        for path, what in ((self.ca_file, "CA"), (self.cert_file, "certificate"),
                           (self.key_file, "key")):
            if path and not Path(path).is_file():
                raise InputError(f"{what} file not found: {path}")
        self._check_tls_files()

    def _check_tls_files(self) -> None:
        """Load the CA and client certificate once here: a file that is not what its flag
        says is the user's input error (2), not a hub that cannot be reached (3)."""
        import ssl

        if self.ca_file:
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, ValueError, OSError):
                raise InputError(f"--ca-file {self.ca_file} holds no PEM CA certificate") \
                    from None
        if self.cert_file and self.key_file:
            try:
                ssl.create_default_context().load_cert_chain(self.cert_file, self.key_file,
                                                            password=b"")
            except (ssl.SSLError, ValueError, OSError):
                raise InputError(f"--cert-file {self.cert_file} and --key-file {self.key_file} "
                                 "are not a matching PEM certificate and key") from None


def build_session(settings: HubSettings) -> requests.Session:
    """A session carrying the hub's auth and TLS settings."""
    session = requests.Session()
    # Always an auth object, even without a token: it is what keeps ~/.netrc out.
    session.auth = BearerToken(settings.token_file or None,
                               None if settings.token_file
                               else (os.environ.get(TOKEN_ENV) or "").strip() or None)
    parts = urlsplit(settings.url)
    register_secret(parts.password)
    if settings.insecure_skip_verify:
        session.verify = False
        quiet_insecure_warning(parts.hostname or "")
    elif settings.ca_file:
        session.verify = settings.ca_file
    if settings.cert_file and settings.key_file:
        session.cert = (settings.cert_file, settings.key_file)
    session.headers["User-Agent"] = "gpufleet"
    return session


def quiet_insecure_warning(host: str) -> None:
    """Silence urllib3's "unverified HTTPS request" warning for the hub host only.

    ``urllib3.disable_warnings`` would silence it for every HTTPS call of the process (the
    Kubernetes API, an OIDC issuer); the warning names the host, so a filter on that message
    keeps the operator's explicit --insecure-skip-verify quiet and every other host loud.
    """
    warnings.filterwarnings(
        "ignore", message=f"Unverified HTTPS request is being made to host '{re.escape(host)}'",
        category=urllib3.exceptions.InsecureRequestWarning)


class HubClient:
    """Prometheus-API client for the hub store (Prometheus, Thanos Query, ACM query proxy)."""

    def __init__(self, url: str, *, session: requests.Session | None = None,
                 timeout: float = 60.0, connect_timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.session = session or requests.Session()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        #: number of HTTP requests made: a sync records it, and it must not grow with the fleet
        self.requests = 0
        self._count_lock = threading.Lock()  # a sync asks from several threads

    @classmethod
    def from_settings(cls, settings: HubSettings) -> HubClient:
        settings.validate()
        return cls(settings.url, session=build_session(settings), timeout=settings.timeout,
                   connect_timeout=settings.connect_timeout)

    @property
    def safe_url(self) -> str:
        return redact_url(self.url)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> HubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API ------------------------------------------------------------------------------
    def query(self, promql: str, time: float | None = None, *,
              stream: bool = False, cluster_label: str = "cluster") -> QueryResult:
        """Instant query. POSTed as a form so long PromQL never hits URL length limits.

        With ``stream`` the result is a :class:`StreamedRows`: decoded one row at a time as
        it is iterated, so a 100,000-series answer never exists as 100,000 decoded dicts at
        once (~200 MB); its ``warnings`` are known once it has been iterated. A streamed
        answer holds only series whose labels can be stored (hub.store._bounds): the others
        are left out and counted in its ``refused``, under their ``cluster_label``.
        """
        return self._post("/api/v1/query", _instant(promql, time), stream=stream,
                          cluster_label=cluster_label)

    def query_newest(self, promql: str, time: float | None = None, *,
                     stream: bool = False, cluster_label: str = "cluster") -> QueryResult:
        """Instant query of a range selector (``name[10m]``), each series cut to its newest
        sample, returned as an instant vector (``value`` = [sample time, value]).

        A range selector is the one PromQL answer that carries every sample's own time; the
        sync only needs the newest, so the raw answer (tens of samples per series) is trimmed
        before it is decoded: decoded, 1.5 million samples would cost ~200 MB of Python
        objects. In JSON a ``"values":[`` outside a string can only open a series' samples
        (inside label strings the quotes are escaped), and samples hold no brackets.
        """
        return self._post("/api/v1/query", _instant(promql, time), rewrite=_newest_sample,
                          stream=stream, cluster_label=cluster_label)

    def metric_names(self, start: float, end: float) -> frozenset[str] | None:
        """The metric names the store holds series of between ``start`` and ``end`` (its
        label-values API, answered from the index: no sample is read), or None where the
        store does not offer that API (404, 405 or 501) or its proxy refuses the path (403):
        every name is then asked for.

        A superset, never less: Prometheus and Thanos list the names of every block or
        head overlapping the period. A query over names the store does not hold costs it
        the lookup of every other matcher's postings, once per selector and shard (at
        100,000 GPUs a sync's presence arms cost 2.3 s of store CPU to answer nothing), so
        the sync leaves those names out of its queries."""
        try:
            result = self._send("get", "/api/v1/label/__name__/values",
                                {"start": f"{start:.3f}", "end": f"{end:.3f}",
                                 **NO_PARTIAL_RESPONSE})
        except HubUnavailable as exc:
            # not offered, or a proxy that lets queries through but not this path (the
            # sync's planning request, asked before, already proved the token good)
            if exc.http_status in (403, 404, 405, 501):
                return None
            raise
        if not isinstance(result.result, list):
            raise HubUnavailable(f"hub {self.safe_url} sent a malformed list of names")
        return frozenset(str(n) for n in result.result)

    def query_range(self, promql: str, start: float, end: float, step: float) -> QueryResult:
        data = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}",
                **NO_PARTIAL_RESPONSE}
        return self._post("/api/v1/query_range", data)

    def prometheus_connect(self):  # -> prometheus_api_client.PrometheusConnect
        """prometheus-api-client on the same session (token, CA, client certificate) and
        timeouts, for interactive PromQL and DataFrames (``gpufleet query``, notebooks).

        Pass ``params=NO_PARTIAL_RESPONSE`` to its queries: it does not send it by itself,
        and it drops Thanos warnings, so the sync never goes through it.
        """
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(self.url, session=self.session, disable_ssl=False,
                                 timeout=(self.connect_timeout, self.timeout))  # type: ignore[arg-type]

    # -- transport ------------------------------------------------------------------------
    def _post(self, path: str, data: dict[str, Any],
              rewrite: Callable[[str], str] | None = None,
              stream: bool = False, cluster_label: str = "cluster") -> QueryResult:
        return self._send("post", path, data, rewrite, stream, cluster_label)

    def _send(self, method: str, path: str, data: dict[str, Any],
              rewrite: Callable[[str], str] | None = None,
              stream: bool = False, cluster_label: str = "cluster") -> QueryResult:
        """One request (a form POST, or a GET with ``data`` as its parameters), its answer
        checked and decoded; every failure is one of the hub's errors, named."""
        for value in data.values():
            try:
                str(value).encode("utf-8")
            except UnicodeEncodeError:
                # A shell argument with bytes that are not UTF-8 arrives as surrogates.
                raise PromQLError("PromQL error: the expression holds bytes that are not "
                                  "valid UTF-8") from None
        with self._count_lock:
            self.requests += 1
        try:
            # verify/cert per request: requests lets REQUESTS_CA_BUNDLE in the environment
            # override a session's own `verify`, which would silently ignore --ca-file.
            post = method == "post"
            resp = self.session.request(method, self.url + path, data=data if post else None,
                                        params=None if post else data,
                                        timeout=(self.connect_timeout, self.timeout),
                                        verify=self.session.verify, cert=self.session.cert,
                                        stream=stream)
        except requests.ConnectTimeout:
            raise HubUnavailable(
                f"hub {self.safe_url} did not accept a connection within "
                f"{self.connect_timeout:g}s (--connect-timeout)"
            ) from None
        except requests.Timeout:
            raise HubUnavailable(
                f"hub {self.safe_url} did not answer within {self.timeout:g}s (--read-timeout)"
            ) from None
        except requests.exceptions.SSLError as exc:
            raise HubUnavailable(
                f"TLS error talking to hub {self.safe_url}: {_reason(exc)}"
            ) from None
        except requests.ConnectionError as exc:
            raise HubUnavailable(f"hub {self.safe_url} unreachable: {_reason(exc)}") from None
        except OSError as exc:  # e.g. unreadable client certificate
            raise HubUnavailable(
                f"cannot talk to hub {self.safe_url}: {exc.strerror or exc}"
            ) from None
        rows: StreamedRows | None = None
        try:
            if stream and resp.status_code == 200:
                body, rows = self._stream(resp, rewrite, cluster_label)
            else:
                text = resp.content.decode()  # invalid UTF-8: a ValueError, as below
                if rewrite is not None and resp.status_code == 200:
                    text = rewrite(text)
                body = json.loads(text)
                del text
        except ValueError:
            body = None
        if resp.status_code in (400, 422) and isinstance(body, dict) and _store_failure(body):
            raise PartialResponse(
                f"hub {self.safe_url} could not read all its stores: {body.get('error')}"
            )
        if resp.status_code in (400, 422) and isinstance(body, dict):
            reason = sanitise(str(body.get("error") or resp.reason), MAX_STORE_ERROR)
            raise PromQLError(f"PromQL error: {reason}")
        if resp.status_code in (401, 403):
            refused = HubUnavailable(
                f"hub {self.safe_url} refused the request ({resp.status_code} {resp.reason}): "
                "check the token or client certificate")
            refused.http_status = resp.status_code
            raise refused
        if resp.status_code >= 400 or not isinstance(body, dict):
            detail = (sanitise(str(body.get("error") or ""), MAX_STORE_ERROR)
                      if isinstance(body, dict) else sanitise(resp.text))
            failed = HubUnavailable(
                f"hub {self.safe_url} answered {resp.status_code} {resp.reason}"
                + (f": {detail}" if detail else ""))
            failed.http_status = resp.status_code
            raise failed
        if body.get("status") != "success":
            raise HubUnavailable(
                f"hub {self.safe_url} failed: "
                f"{sanitise(str(body.get('error') or 'no detail'), MAX_STORE_ERROR)}")
        data_ = body.get("data") or {}
        if isinstance(data_, list):  # a list API's answer (label values)
            return QueryResult(result_type="list", result=data_, warnings=[
                sanitise(str(w), MAX_STORE_ERROR) for w in body.get("warnings") or []])
        return QueryResult(
            result_type=data_.get("resultType", ""),
            result=data_.get("result", []) if rows is None else rows,
            warnings=[sanitise(str(w), MAX_STORE_ERROR) for w in body.get("warnings") or []],
        )


    def _stream(self, resp: requests.Response, rewrite: Callable[[str], str] | None,
                cluster_label: str = "cluster") -> tuple[Any, StreamedRows | None]:
        """The envelope of a 200 answer, and its rows left on the socket for the caller.

        The body is read in chunks and never held whole: a 100,000-GPU answer is 40 to 80 MB
        of JSON, which as bytes, a trimmed copy and a str would cost ~150 MB at once.
        """
        chunks = _chunks(resp, self.safe_url)
        head = ""
        try:
            for chunk in chunks:
                head += chunk
                start = head.find('"result":[')
                if start >= 0:
                    body = json.loads(head[:start] + '"result":[]}}')
                    return body, StreamedRows(head, start + len('"result":['), chunks, rewrite,
                                              f"hub {self.safe_url}", cluster_label)
                if len(head) > MAX_ENVELOPE:
                    break
            head += "".join(chunks)  # no result array (an error, a scalar): small, read whole
            return json.loads(rewrite(head) if rewrite else head), None
        except ValueError:
            # the body is read: past here there is no resp.text to quote
            raise HubUnavailable(f"hub {self.safe_url} sent a malformed or incomplete "
                                 "answer") from None


def prometheus_connect(hub_url: str | None = None, *, token_file: str | None = None,
                       ca_file: str | None = None, cert_file: str | None = None,
                       key_file: str | None = None, insecure_skip_verify: bool | None = None,
                       connect_timeout: float = 5.0, read_timeout: float = 60.0):
    """A prometheus-api-client ``PrometheusConnect`` to the hub with gpufleet's hub auth: the
    notebook door to the same store ``gpufleet query`` asks.

    Each argument left out comes from the environment the CLI reads (``GPUFLEET_HUB_URL``,
    ``GPUFLEET_TOKEN_FILE`` or ``GPUFLEET_TOKEN``, ``GPUFLEET_CA_FILE``,
    ``GPUFLEET_CERT_FILE`` / ``GPUFLEET_KEY_FILE``, ``GPUFLEET_INSECURE_SKIP_VERIFY``), so a
    notebook started beside a configured CLI needs no arguments. Bad settings raise the CLI's
    one-line InputError; the token is re-read when its file changes and never printed::

        from hub.store import prometheus_connect
        prom = prometheus_connect()
        prom.custom_query("count by (cluster) (DCGM_FI_DEV_GPU_UTIL)")
    """
    def pick(value: Any, name: str) -> Any:
        return value if value is not None else (os.environ.get(f"GPUFLEET_{name}") or None)

    insecure = pick(insecure_skip_verify, "INSECURE_SKIP_VERIFY")
    settings = HubSettings(
        url=pick(hub_url, "HUB_URL") or "", token_file=pick(token_file, "TOKEN_FILE"),
        ca_file=pick(ca_file, "CA_FILE"), cert_file=pick(cert_file, "CERT_FILE"),
        key_file=pick(key_file, "KEY_FILE"),
        insecure_skip_verify=insecure if isinstance(insecure, bool)
        else str(insecure or "").lower() in ("1", "true", "yes", "on"),
        timeout=read_timeout, connect_timeout=connect_timeout)
    return HubClient.from_settings(settings).prometheus_connect()


def range_frame(result: list[dict[str, Any]]):  # -> pandas.DataFrame
    """A range query's matrix as prometheus-api-client's ``MetricRangeDataFrame``: one row
    per sample, the labels as columns, ``time`` (ISO 8601, UTC) and a numeric ``value``; what
    ``gpufleet query --range -o csv`` writes and a notebook analyses further."""
    import pandas as pd
    from prometheus_api_client import MetricRangeDataFrame

    if not result:
        return pd.DataFrame(columns=["time", "value"])
    with warnings.catch_warnings():  # its own pandas deprecations: not the user's business
        warnings.simplefilter("ignore")
        frame = MetricRangeDataFrame(result).reset_index()
    frame["time"] = frame.pop("timestamp").dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = sorted(c for c in frame.columns if c not in ("time", "value", "__name__"))
    name = ["__name__"] if "__name__" in frame.columns else []
    return frame[[*name, *labels, "time", "value"]]


#: how much of an answer may come before its result array (status, resultType: ~60 bytes)
MAX_ENVELOPE = 1 << 16
#: read size of a streamed answer: large enough that Python's per-chunk cost is noise
CHUNK = 1 << 18
#: no result row is this long (a GPU series is ~1 kB): past it, the answer is malformed
MAX_ROW = 1 << 22


def _chunks(resp: requests.Response, safe_url: str) -> Iterator[str]:
    """The body of ``resp`` as text, chunk by chunk; a connection lost on the way is the hub
    being unavailable (exit 3), like one lost before the answer."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        pieces: list[bytes] = []
        size = 0
        # urllib3 hands a chunked, compressed answer over in pieces of a few kB: joined to
        # CHUNK, the per-piece work (a row cut at each boundary, re-scanned) stays rare
        for piece in resp.iter_content(CHUNK):
            pieces.append(piece)
            size += len(piece)
            if size >= CHUNK:
                yield decoder.decode(b"".join(pieces))
                pieces, size = [], 0
        yield decoder.decode(b"".join(pieces), final=True)
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise HubUnavailable(f"hub {safe_url} broke off its answer: {_reason(exc)}") from None
    except UnicodeDecodeError:
        raise HubUnavailable(f"hub {safe_url} answered with bytes that are not UTF-8") \
            from None
    finally:
        resp.close()


def _store_failure(body: dict[str, Any]) -> bool:
    """Whether a 4xx error is Thanos refusing a partial answer, not the user's PromQL.

    With ``partial_response=false`` Thanos Query reports a store it could not read as an
    "execution" error (HTTP 422, like a PromQL evaluation error), with the store's gRPC error in
    the text: that is the hub being unavailable in part (exit 3), never a query to fix (exit 2).
    """
    error = str(body.get("error") or "")
    # ... and a Prometheus whose storage is closing under the query (shut down mid-sync)
    # says so the same way: its head or blocks could not be read
    return body.get("errorType") == "execution" and any(
        marker in error for marker in ("expanding series", "rpc error", "store",
                                       "closed head", "block querier", "chunk reader"))



_DECODER = json.JSONDecoder()


class StreamedRows:
    """The ``result`` array of an answer, decoded one element at a time (iterate once).

    ``text`` holds the answer from its start (or a first part of it, the rest following in
    ``more``); the rows begin at ``start``. Rows are decoded as the text arrives, so neither
    the answer nor its decoded rows ever exist whole. ``cut`` is applied to each complete
    stretch of text before it is decoded (the newest-sample trim). The Thanos ``warnings``
    follow the array in the body, so they are read when the iteration ends: a caller must
    check :attr:`warnings` after consuming the rows.

    This is the door every series the hub stores comes through: a row whose labels cannot
    be stored (a NUL byte, a control character, a value longer than its column:
    hub.store._bounds.label_problem) is left out here and counted in :attr:`refused` under
    its ``cluster_label``, so one spoke's malformed series never reach a database that
    would refuse the whole sync or bucket over it.
    """

    def __init__(self, text: str, start: int, more: Iterable[str] = (),
                 cut: Callable[[str], str] | None = None, source: str = "the hub",
                 cluster_label: str = "cluster") -> None:
        self._text: str | None = text[start:]
        self._more = iter(more)
        self._cut = cut
        self._source = source
        self.warnings: list[str] = []
        self.refused = Refused(cluster_label)
        #: (cluster, metric name) pairs, when keyed() is asked for them (names_of)
        self.names: set[tuple[str, str]] = set()
        #: the label text keyed() last decoded for the door, and its labels (labels())
        self._met: tuple[str, Any] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        refuse = self._refuse
        for row, _ in self._rows(keyed=False):
            if not refuse(row.get("metric")):  # type: ignore[union-attr]
                yield row  # type: ignore[misc]

    def _refuse(self, labels: Any) -> bool:
        """Whether a row's labels are refused (and counted); a row without labels passes."""
        if not labels:
            return False
        try:
            problem = label_problem(labels)
        except (TypeError, AttributeError):  # not a flat object of strings
            problem = "its labels are not a set of strings"
            labels = {}
        if problem is None:
            return False
        self.refused.series(labels, problem)
        return True

    def keyed(self, known: Container[int] = (), names_of: str | None = None
              ) -> Iterator[tuple[str, str, str]]:
        """The rows as (labels, time, value): ``labels`` the series' label set as the answer
        spells it (JSON, without ``__name__``), time and value as written.

        Decoding a row's labels costs more than everything else a sync does with it; a
        series' labels are the same text in every answer of one store, so the text itself
        is the join key and only a series not seen before needs its labels decoded
        (``json.loads(labels)``). A row of another shape is decoded whole instead.

        The door checks a series' labels the first time it meets them: ``known`` holds the
        ``hash`` of label texts the caller has met (and so the door has checked) before.

        ``names_of`` (a device label, e.g. ``UUID``): :attr:`names` gets the (cluster, metric
        name) of every row let through whose device label and cluster label are set (a
        range selector's rows keep ``__name__``): which names each cluster's devices send,
        read off the answer's text without another request or decoding a known series.
        """
        refuse = self._refuse
        tally = names_of is not None
        if tally:
            device = f'"{names_of}":"'
            cluster = f'"{self.refused.cluster_label}":"'
        for row, labels in self._rows(keyed=True):
            if labels is None:  # decoded whole (an odd row, e.g. a histogram): no value
                metric = row.get("metric") or {}  # type: ignore[union-attr]
                if not refuse(metric):
                    if tally and isinstance(metric, dict):
                        self._tally(metric.get(names_of), metric.get(self.refused.cluster_label),
                                    metric.get("__name__"))
                    yield json.dumps(metric, separators=(",", ":")), "", ""
                continue
            bare = _without_name(labels)
            if hash(bare) in known or not refuse(self._met_labels(bare)):
                if tally and (at := labels.find(device)) >= 0 \
                        and labels[at + len(device)] != '"':  # the device label is set
                    self._tally(True, _label_value(labels, cluster),
                                _label_value(labels, _NAME_KEY))
                yield bare, *row  # type: ignore[misc]

    def _met_labels(self, text: str) -> Any:
        decoded = _labels_of(text)
        self._met = (text, decoded)
        return decoded

    def labels(self, text: str) -> Any:
        """The labels of a text keyed() has just yielded, decoded. A series met for the
        first time was decoded by the door a moment before: its labels are handed on, not
        decoded a second time (at 100,000 GPUs, 101,250 label objects a sync)."""
        met = self._met
        if met is not None and met[0] is text:
            self._met = None
            return met[1]
        return json.loads(text)

    def _tally(self, device: object, cluster: object, name: object) -> None:
        if device and cluster and name:
            self.names.add((str(cluster), str(name)))

    def _rows(self, keyed: bool) -> Iterator[tuple[Any, str | None]]:
        text, more, cut = self._text, self._more, self._cut
        if text is None:
            raise RuntimeError("the rows of a streamed answer can be read once")
        self._text = None
        if cut is not None:
            text = cut(text)
        decode = _DECODER.raw_decode
        fast, exact = _PLAIN_ROW.match, _VECTOR_ROW.match
        j, end = 0, len(text)
        while True:
            while j < end and text[j] in " \t\r\n,":
                j += 1
            if j < end and text[j] == "]":
                break
            if keyed and (m := fast(text, j) or exact(text, j)):
                labels, ts, value = m.groups()
                yield (ts, value), labels  # keyed() takes the name off
                j = m.end()
                continue
            try:
                if j == end:
                    raise ValueError("need more")
                row, j = decode(text, j)
            except ValueError:  # a row cut by the chunk boundary: read on
                chunk = next(more, None)
                if chunk is None or end - j > MAX_ROW:
                    raise HubUnavailable(f"{self._source} sent a malformed or incomplete "
                                         "answer") from None
                text = text[j:] + chunk
                if cut is not None:
                    text = cut(text)
                j, end = 0, len(text)
                continue
            yield row, None
        try:
            tail = json.loads('{"data":{"result":[]' + text[j + 1:] + "".join(more))
        except ValueError:
            raise HubUnavailable(f"{self._source} sent a malformed answer") from None
        self.warnings = [sanitise(str(w), MAX_STORE_ERROR) for w in tail.get("warnings") or []]


#: one vector row as Prometheus writes it: a flat label object (strings only, quotes inside
#: them escaped), then [time, "value"]. Unrolled (no per-character alternation): fast in re.
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_VECTOR_ROW = re.compile(r'\{"metric":(\{(?:' + _STRING + r'[:,]?)*\}),'
                         r'"value":\[([^,\]]*),"([^"]*)"\]\}')
#: the same for labels without a "}" (nearly all): seven times faster, and never wrong (a
#: "}" inside a value ends the object early, and then `,"value":[` cannot follow unescaped)
_PLAIN_ROW = re.compile(r'\{"metric":(\{[^}]*\}),"value":\[([^,\]]*),"([^"]*)"\]\}')
_NAME_KEY = '"__name__":"'


_QUOTED = re.compile(_STRING)


def _label_value(labels: str, key: str) -> str:
    """The value of the label whose ``"name":"`` is ``key`` in a label object's text ("":
    none). Inside a value every quote is escaped, so ``key`` cannot start in one. Plain
    string searches: this runs once a row of the sample-time answers."""
    at = labels.find(key)
    if at < 0:
        return ""
    start = at + len(key)
    end = labels.find('"', start)
    if end < 0:
        return ""
    if labels[end - 1] != "\\":
        return labels[start:end]
    quoted = _QUOTED.match(labels, start - 1)  # an escape inside: read it exactly
    return str(json.loads(quoted.group())) if quoted else ""


def _labels_of(text: str) -> Any:
    """A label object's text decoded (for the door's check); anything else: refused."""
    try:
        return json.loads(text)
    except ValueError:
        return [text]


def _without_name(labels: str) -> str:
    """A label object's text without its ``__name__`` (a metric name holds no quote)."""
    at = labels.find(_NAME_KEY)
    if at < 0:
        return labels
    end = labels.index('"', at + len(_NAME_KEY)) + 1
    if labels[end] == ",":
        return labels[:at] + labels[end + 1:]
    if labels[at - 1] == ",":
        return labels[:at - 1] + labels[end:]
    return labels[:at] + labels[end:]


def _instant(promql: str, time: float | None) -> dict[str, Any]:
    data: dict[str, Any] = {"query": promql, **NO_PARTIAL_RESPONSE}
    if time is not None:
        data["time"] = f"{time:.3f}"
    return data


_SAMPLES = re.compile(r'"values":\[(?:\[[^\]]*\],)*(\[[^\]]*\])\]')


def _newest_sample(text: str) -> str:
    """A matrix answer with each series' samples cut to the last (newest) one. On part of a
    streamed answer, a series whose samples are not all there yet is left as it is (the
    pattern needs their closing bracket) and cut once the next chunk completes it."""
    return _SAMPLES.sub(r'"value":\1', text)


def _reason(exc: Exception) -> str:
    """A short reason without the request (which may carry credentials in the URL)."""
    text = str(exc.args[0]) if exc.args else str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "certificate verify failed", "No route to host", "Connection reset",
                   "Remote end closed connection"):
        if marker in text:
            return marker.lower()
    ssl = re.search(r"\[SSL: [A-Z0-9_]+\] ([a-z0-9 ,_-]+)", text)
    if ssl:  # e.g. "wrong version number" (plain HTTP answered a TLS hello)
        return ssl.group(1).strip()
    inner = re.search(r"\(Caused by (\w+)\(", text)
    if inner:  # the cause's type, whole: never a message cut at its first colon
        return inner.group(1)
    return type(exc).__name__

