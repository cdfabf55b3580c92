"""A hub that behaves like Red Hat ACM Observability's, for the tests and the demo.

A plain Prometheus agent pushing to a plain Prometheus flatters the hub service: a sample every
second, staleness markers the moment a target goes, a 5-minute look-back, no query proxy. ACM
differs on every point, and each difference can hide a bug from tests that do not have it:

* its metrics-collector pushes **one sample per series every 300 s** and sends **no staleness
  markers** (:class:`MetricsCollector`, our own small remote-write client: a Prometheus agent
  writes staleness markers as soon as a scrape fails, so it cannot play this part);
* Thanos Query looks back **600 s** (``--query.lookback-delta``, :func:`hub_args`), so a series
  that stopped stays visible to instant queries for up to 10 minutes;
* every series carries ``cluster`` **and** ``clusterID`` (and whatever else ACM adds);
* the **rbac-query-proxy** adds ``cluster`` / ``namespace`` matchers to every selector for a
  token that may not see everything, and says nothing about it (:class:`RbacQueryProxy`).

Tests scale the times down and keep the ratios (push every 3 s, look back 6 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import requests
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from prometheus_client.parser import text_string_to_metric_families

from hub.common import BackgroundHTTPServer, UnavailableError

#: ACM's defaults: metrics-collector interval, and Thanos Query's look-back (twice the interval).
ACM_PUSH_INTERVAL = 300.0
ACM_LOOKBACK = 600.0


def hub_args(lookback: float) -> list[str]:
    """Extra flags that give a Prometheus hub Thanos-under-ACM's look-back."""
    return [f"--query.lookback-delta={lookback:g}s"]


def cluster_id(cluster: str) -> str:
    """A stable UUID-shaped clusterID per name, like the one ACM adds beside ``cluster``."""
    h = hashlib.sha256(cluster.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# -- remote write ---------------------------------------------------------------------------------
# Prometheus' remote-write body is a snappy-compressed (block format) protobuf WriteRequest. The
# messages are built at import from a descriptor of the fields remote write 1.0 sends (as in
# prompb/types.proto and remote.proto), like spoke/_podresources.py does: the protobuf runtime
# (already a dependency) without generated code. Snappy comes from cramjam (maintained, wheels
# everywhere, no C library to install as python-snappy needs).
_PROMPB: dict[str, list[tuple[str, int, str]]] = {
    "Label": [("name", 1, "string"), ("value", 2, "string")],
    "Sample": [("value", 1, "double"), ("timestamp", 2, "int64")],
    "TimeSeries": [("labels", 1, "Label[]"), ("samples", 2, "Sample[]")],
    "WriteRequest": [("timeseries", 1, "TimeSeries[]")],
}


def _write_request_class() -> Any:
    proto = descriptor_pb2.FieldDescriptorProto
    scalars = {"string": proto.TYPE_STRING, "double": proto.TYPE_DOUBLE,
               "int64": proto.TYPE_INT64}
    file = descriptor_pb2.FileDescriptorProto(name="gpufleet/prompb/remote.proto",
                                              package="prometheus", syntax="proto3")
    for message, fields in _PROMPB.items():
        m = file.message_type.add(name=message)
        for name, number, kind in fields:
            if kind.endswith("[]"):
                m.field.add(name=name, number=number, label=proto.LABEL_REPEATED,
                            type=proto.TYPE_MESSAGE, type_name=f".prometheus.{kind[:-2]}")
            else:
                m.field.add(name=name, number=number, label=proto.LABEL_OPTIONAL,
                            type=scalars[kind])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


WriteRequest = _write_request_class()


def encode_write_request(series: Iterable[tuple[Mapping[str, str], float, int]]) -> bytes:
    """A WriteRequest of one sample per series: (labels, value, timestamp in ms)."""
    request = WriteRequest()
    for labels, value, ts_ms in series:
        ts = request.timeseries.add()
        for name in sorted(labels):  # the receiver expects labels sorted by name
            ts.labels.add(name=name, value=labels[name])
        ts.samples.add(value=value, timestamp=ts_ms)
    return request.SerializeToString()


Source = Callable[[], str] | str  # exporter text, a function giving it, or an exporter's URL


def _snappy(data: bytes) -> bytes:
    """Raw snappy, as remote-write wants it. cramjam is the demo's dependency only (the
    ``demo`` extra): a hub or exporter install does not carry it."""
    try:
        import cramjam
    except ImportError:
        raise UnavailableError("the demo's ACM emulator needs cramjam: "
                               "pip install 'gpufleet[demo]'") from None
    return bytes(cramjam.snappy.compress_raw(data))


@dataclass
class MetricsCollector:
    """ACM's metrics-collector in miniature: every ``interval`` seconds it reads each source
    and pushes one sample per series, stamped with the push time and labelled with ``cluster``,
    ``clusterID`` and ``extra_labels``. A source that fails (raises, or answers non-200) is
    skipped for that round: its series simply stop, with no staleness marker."""

    hub_url: str
    cluster: str
    sources: list[Source]
    interval: float = ACM_PUSH_INTERVAL
    extra_labels: dict[str, str] = field(default_factory=dict)
    #: wall-clock time (s) stamped on the last accepted push that carried source i's samples
    last_pushed: dict[int, float] = field(default_factory=dict)
    pushes: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = requests.Session()

    def _read(self, source: Source) -> str | None:
        try:
            if callable(source):
                return source()
            if not source.startswith(("http://", "https://")):
                return source  # exporter text itself
            r = self._session.get(source, timeout=max(1.0, self.interval / 2))
            return r.text if r.status_code == 200 else None
        except Exception:  # a failing exporter is skipped, as the collector's federate would
            return None

    def collect(self) -> tuple[list[tuple[dict[str, str], float, int]], set[int]]:
        """One snapshot of every source: the series to push, and which sources answered."""
        now_ms = int(time.time() * 1000)
        base = {"cluster": self.cluster, "clusterID": cluster_id(self.cluster),
                **self.extra_labels}
        out: list[tuple[dict[str, str], float, int]] = []
        answered: set[int] = set()
        for i, source in enumerate(self.sources):
            text = self._read(source)
            try:
                families = list(text_string_to_metric_families(text or ""))
            except ValueError:
                continue  # unparsable output: skipped like an unreachable exporter
            for family in families:
                for sample in family.samples:
                    if math.isnan(sample.value):
                        continue  # never anything that could read as a staleness marker
                    labels = {**sample.labels, "__name__": sample.name, "job": "gpu-exporter",
                              "instance": f"source-{i}", **base}
                    out.append((labels, float(sample.value), now_ms))
                    answered.add(i)
        return out, answered

    def push_once(self) -> int:
        series, answered = self.collect()
        if series:
            body = _snappy(encode_write_request(series))
            r = self._session.post(
                f"{self.hub_url}/api/v1/write", data=bytes(body), timeout=10,
                headers={"Content-Encoding": "snappy",
                         "Content-Type": "application/x-protobuf",
                         "X-Prometheus-Remote-Write-Version": "0.1.0"})
            r.raise_for_status()
            for i in answered:
                self.last_pushed[i] = series[0][2] / 1000
        self.pushes += 1
        return len(series)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            # a hub that refuses a push loses that round, as with ACM's collector
            with contextlib.suppress(requests.RequestException):
                self.push_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def start(self) -> MetricsCollector:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._session.close()


# -- rbac-query-proxy -----------------------------------------------------------------------------
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9.][0-9A-Za-z._]*)")
#: identifiers that are never metric names when not followed by "("
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan", "start", "end",
             # aggregation operators, reserved words even before "by (...)"
             "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
             "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
#: a "(" after these opens a list of label names, not an expression
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def _string_end(text: str, i: int) -> int:
    quote = text[i]
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" and quote != "`" else 1
    return j + 1


def _block_end(text: str, i: int, close: str) -> int:
    """Index after the ``close`` matching the opener at ``i``, skipping quoted strings."""
    j = i + 1
    while j < len(text) and text[j] != close:
        j = _string_end(text, j) if text[j] in "\"'`" else j + 1
    return j + 1


def inject_matchers(promql: str, matchers: str) -> str:
    """Add ``matchers`` (e.g. ``cluster=~"a|b"``) to every vector selector of ``promql``.

    Minimal on purpose, like a proxy needs: it tells selectors from functions, keywords, label
    lists (``by (...)``), strings, numbers and durations; it does not check the query, which
    the store behind it still does. (The Python PromQL parsers on PyPI build an AST they cannot
    write back, so they cannot rewrite a query.)
    """
    out: list[str] = []
    label_list: list[bool] = []  # for each open "(": does it hold label names?
    previous = ""
    i, n = 0, len(promql)
    while i < n:
        c = promql[i]
        if c.isspace():
            out.append(c)
            i += 1
        elif c in "\"'`":
            j = _string_end(promql, i)
            out.append(promql[i:j])
            i = j
        elif c == "[":
            j = _block_end(promql, i, "]")
            out.append(promql[i:j])
            i = j
        elif c == "(":
            label_list.append(previous in _LABEL_LISTS)
            out.append(c)
            previous = c
            i += 1
        elif c == ")":
            if label_list:
                label_list.pop()
            out.append(c)
            previous = c
            i += 1
        elif c == "{":
            j = _block_end(promql, i, "}")
            out.append(_with_matchers(promql[i:j], matchers))
            previous = "}"
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and promql[i + 1].isdigit()):
            m = _NUMBER.match(promql, i)
            assert m is not None
            out.append(m.group(0))
            previous = m.group(0)
            i = m.end()
        elif (m := _IDENT.match(promql, i)) is not None:
            word = m.group(0)
            i = m.end()
            rest = promql[i:].lstrip()
            out.append(word)
            previous = word
            if label_list and label_list[-1]:
                continue  # a label name in by (...) / on (...)
            if rest.startswith("(") or word.lower() in _KEYWORDS:
                continue  # a function, an aggregation or an operator keyword
            if not rest.startswith("{"):
                out.append("{" + matchers + "}")
                previous = "}"
        else:
            out.append(c)
            previous = c
            i += 1
    return "".join(out)


def _with_matchers(block: str, matchers: str) -> str:
    inner = block[1:-1].strip().rstrip(",").strip()
    return "{" + (f"{inner}, {matchers}" if inner else matchers) + "}"


@dataclass(frozen=True)
class Scope:
    """What a token may see: ``None`` for all clusters (or all namespaces)."""

    clusters: tuple[str, ...] | None = None
    namespaces: tuple[str, ...] | None = None

    def matchers(self, cluster_label: str) -> str | None:
        """The matchers ACM's proxy adds for this scope; None when it sees everything."""
        parts = [f'{label}=~"{"|".join(re.escape(v) for v in values) or "^$"}"'
                 for label, values in ((cluster_label, self.clusters),
                                       ("namespace", self.namespaces))
                 if values is not None]
        return ", ".join(parts) or None


def scope(value: Scope | Iterable[str] | None) -> Scope:
    """A Scope from a Scope, a list of clusters, or None (everything)."""
    if value is None or isinstance(value, Scope):
        return value or Scope()
    return Scope(clusters=tuple(sorted(value)))


class RbacQueryProxy(BackgroundHTTPServer):
    """ACM's rbac-query-proxy on loopback: a bearer token maps to what it may see (a
    :class:`Scope`, a list of clusters, or ``None`` for everything). Queries of a limited token
    get ``cluster=~"..."`` and/or ``namespace=~"..."`` on every selector; the answer says
    nothing about it. An unknown token is refused (401). A namespace-scoped user therefore sees
    only series carrying one of its namespaces: GPU series without a pod (or whose workload
    namespace sits in ``exported_namespace``) vanish for it."""

    thread_name = "rbac-query-proxy"

    def __init__(self, upstream: str, tokens: Mapping[str, Scope | Iterable[str] | None],
                 cluster_label: str = "cluster") -> None:
        outer = self
        self.upstream = upstream.rstrip("/")
        self.tokens = {t: scope(v) for t, v in tokens.items()}
        self.cluster_label = cluster_label
        self.seen: list[str] = []  # the rewritten queries, for tests

        class _H(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                outer._handle(self)

            do_GET = do_POST = _serve

            def log_message(self, *args: object) -> None:
                return

        super().__init__("127.0.0.1", 0, _H)

    def rewrite(self, promql: str, allowed: Scope) -> str:
        matchers = allowed.matchers(self.cluster_label)
        return promql if matchers is None else inject_matchers(promql, matchers)

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        auth = h.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if token not in self.tokens:
            self._reply(h, 401, b'{"status":"error","error":"unauthorized"}')
            return
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        form = parse_qs(parts.query, keep_blank_values=True)
        if h.command == "POST":
            form.update(parse_qs(h.rfile.read(length).decode(), keep_blank_values=True))
        allowed = self.tokens[token]
        for key in ("query", "match[]"):
            if key in form:
                form[key] = [self.rewrite(q, allowed) for q in form[key]]
                self.seen.extend(form[key])
        try:
            r = requests.post(self.upstream + parts.path, data=urlencode(form, doseq=True),
                              timeout=30,
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        except requests.RequestException:
            self._reply(h, 502, b'{"status":"error","error":"upstream unreachable"}')
            return
        self._reply(h, r.status_code, r.content)

    @staticmethod
    def _reply(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
