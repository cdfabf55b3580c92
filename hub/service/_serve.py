"""Serving the app: uvicorn on its own thread, with the limits a public port needs.

uvicorn's event loop holds any number of idle or slow connections for the cost of a few
kilobytes each, so a slow client cannot take a slot a probe needs (the old thread-per-
connection server had 32). What uvicorn lacks, :class:`GuardedH11` adds:

* a request must arrive whole (request line and headers) within ``HEADER_TIMEOUT`` of the
  connection opening or of the previous answer, or the connection is closed: 300 half-sent
  requests hold nothing for long (uvicorn only times out *idle* keep-alive connections);
  one that has sent nothing yet gets 80-100 % of it, at random, so thousands opened at
  once are not closed, and re-opened, in one burst;
* a request head still incomplete beyond ``MAX_HEADER_BYTES`` is refused by h11 (a
  complete one by the app's guard), bodies beyond the app's ``MAX_BODY``;
* a malformed request gets a JSON 400 like every other error, not uvicorn's text;
* open connections are bounded without ever turning the service away (:class:`ConnectionGuard`):
  idle and slow ones (no request in flight) at most ``MAX_IDLE_PER_CLIENT`` per client
  address and ``MAX_CONNECTIONS`` in all (never above what the file-descriptor limit
  allows); past either, the *oldest idle* connection is closed to make room, so a new
  caller (a probe's /healthz, a person with a token) always gets in, and a flood of idle
  connections costs its sender reconnects. uvicorn's own ``limit_concurrency`` is not used:
  it counts open connections and answers 503 to every request, /healthz included, once
  2,000 idle ones are held;
* proxy headers (``X-Forwarded-For``/``-Proto``) are believed only from the addresses in
  ``forwarded_allow_ips`` (`serve --forwarded-allow-ips`; none by default, not even
  loopback, where uvicorn would trust 127.0.0.1): otherwise any client could pick the
  address the sign-in limit and the log see.

TLS: uvicorn builds one ``SSLContext`` at start. Ours names an SNI callback that swaps in
:meth:`TlsFiles.context` on every handshake, which reloads the certificate when its files
change (cert-manager's rotation) without a restart.

Stopping (SIGTERM) is graceful: no new connections, answers in flight finish (at most
``GRACE`` seconds), idle keep-alive connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import random
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import h11
import uvicorn
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from uvicorn.protocols.http.h11_impl import H11Protocol

from hub.service._guard import MAX_HEADER_BYTES
from hub.service._tls import TlsFiles

log = logging.getLogger("gpufleet.service")

#: seconds to send a whole request head (line and headers) on a connection
HEADER_TIMEOUT = 10.0
#: seconds an idle keep-alive connection stays open
KEEP_ALIVE = 15
#: seconds answers in flight may take to finish when the service stops
GRACE = 5
#: threads running synchronous handlers (database reads) at once
THREADS = 8
#: connections the kernel queues for accept
BACKLOG = 1024
#: open connections at most (and at most the file-descriptor limit less FD_RESERVE):
#: beyond, the oldest idle one is closed for each new one
MAX_CONNECTIONS = 8192
#: idle or slow connections one client address may hold; its oldest idle go beyond
MAX_IDLE_PER_CLIENT = 4096
#: descriptors kept for everything but connections (database, files, the listener)
FD_RESERVE = 128
#: seconds between two log lines about connections shed
SHED_LOG_EVERY = 60.0


def connection_budget(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, lowered to what the file-descriptor limit leaves: past it accept() fails
    (EMFILE) and asyncio stops accepting for a second, /healthz included. The soft limit is
    raised to the hard one first (a container's is often 1,024 soft, 1,048,576 hard)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    except ImportError:  # not on POSIX
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE))


class ConnectionGuard:
    """The open connections of one server, idle ones in the order they went idle.

    Runs on the event loop's thread only (protocol callbacks), so it needs no lock. A
    connection is *idle* from when it opens, or its answer completes, until a whole request
    head is in: that covers kept-alive, never-used and slow (half-sent head) connections,
    which is what a flood holds. A connection with a request in flight is never closed here,
    nor one whose next bytes already wait in the kernel unread: when a flood keeps the loop
    behind, a caller's request sent from the flood's own address (behind one router, every
    caller shares it) would otherwise be closed for being old before the loop read it.
    """

    def __init__(self, total: int = MAX_CONNECTIONS,
                 per_client: int = MAX_IDLE_PER_CLIENT) -> None:
        self.total = total
        self.per_client = per_client
        self.open: dict[Any, str] = {}
        self.idle: dict[Any, None] = {}  # insertion order: oldest idle first
        self.idle_of: dict[str, dict[Any, None]] = {}
        self.opened_total = 0
        self.shed = 0
        self._logged = 0.0

    def opened(self, conn: Any, client: str) -> None:
        self.opened_total += 1
        self.open[conn] = client
        self.went_idle(conn)
        while len(self.open) > self.total:
            victim = _oldest_quiet(self.idle, but=conn)
            if victim is None:
                self._shed(conn)  # every other one has a request in flight
                break
            self._shed(victim)

    def went_idle(self, conn: Any) -> None:
        client = self.open.get(conn)
        if client is None:
            return
        self.idle.pop(conn, None)
        self.idle[conn] = None
        mine = self.idle_of.setdefault(client, {})
        mine.pop(conn, None)
        mine[conn] = None
        while len(mine) > self.per_client:  # on opening, or an answer done: oldest go
            victim = _oldest_quiet(mine)
            if victim is None:  # each has a request waiting: over the bound, for a moment
                break
            self._shed(victim)

    def went_busy(self, conn: Any) -> None:
        client = self.open.get(conn)
        if client is None or conn not in self.idle:
            return
        del self.idle[conn]
        mine = self.idle_of[client]
        mine.pop(conn, None)
        if not mine:
            del self.idle_of[client]

    def closed(self, conn: Any) -> None:
        self.went_busy(conn)
        self.open.pop(conn, None)

    def _shed(self, conn: Any) -> None:
        client = self.open.get(conn, "?")
        self.closed(conn)
        self.shed += 1
        now = time.monotonic()
        if now - self._logged >= SHED_LOG_EVERY:
            self._logged = now
            log.warning("connections: closing the oldest idle ones (%d open, %d idle from "
                        "%s; %d closed so far) to make room for new callers",
                        len(self.open), len(self.idle_of.get(client, ())), client,
                        self.shed)
        transport = getattr(conn, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.close()


def _oldest_quiet(idle: dict[Any, None], but: Any = None) -> Any:
    """The oldest idle connection with nothing unread in the kernel, or None."""
    return next((c for c in idle if c is not but and not _unread(c)), None)


def _unread(conn: Any) -> bool:
    """Whether bytes wait on the connection's socket that the loop has not read yet (one
    ioctl, asked only of a connection about to be closed)."""
    transport = getattr(conn, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):  # closed meanwhile: nothing to keep
        return False
    return bool(struct.unpack("i", waiting)[0])


class ServerCollector(Collector):
    """The server's side of /metrics, read at scrape time: connections open and closed to
    make room (a flood shows here before anywhere else), and when the served certificate
    expires (an alert a week ahead beats a refused start after a missed rotation)."""

    def __init__(self, guard: ConnectionGuard, tls: TlsFiles | None) -> None:
        self.guard = guard
        self.tls = tls

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        opened = GaugeMetricFamily("gpufleet_api_connections_open",
                                   "HTTP connections open now (idle ones included).")
        opened.add_metric([], len(self.guard.open))
        yield opened
        shed = CounterMetricFamily(
            "gpufleet_api_connections_shed", "Idle connections closed to make room for new "
            "ones (past the per-address or overall bound).")
        shed.add_metric([], self.guard.shed)
        yield shed
        if self.tls is not None and self.tls.not_after is not None:
            expiry = GaugeMetricFamily("gpufleet_tls_certificate_expiry_timestamp_seconds",
                                       "Unix time the served TLS certificate expires.")
            expiry.add_metric([], self.tls.not_after)
            yield expiry


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on the request head, JSON errors and
    the connection bounds of its server's :class:`ConnectionGuard` (``guard``: each
    :class:`Server` makes a subclass with its own)."""

    _head_timer: asyncio.TimerHandle | None = None
    guard: ConnectionGuard | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # a connection that has said nothing yet: its deadline spread over the last fifth,
        # so a flood opened at once is not closed (and re-opened) at once
        self._arm(HEADER_TIMEOUT * (1.0 - 0.2 * random.random()))
        if self.guard is not None:
            self.guard.opened(self, self.client[0] if self.client else "")

    def _arm(self, seconds: float = HEADER_TIMEOUT) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if (self.cycle is None or self.cycle.response_complete) \
                and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self._head_timer is None:
            self._arm()  # the first byte of a next request on a kept-alive connection
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the head is in: the app has it now
            if self.guard is not None:
                self.guard.went_busy(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # uvicorn's idle timer runs until the next request
        if self.guard is not None:
            self.guard.went_idle(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.guard is not None:
            self.guard.closed(self)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        body = (json.dumps({"error": f"bad request: {msg}"}) + "\n").encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers,
                                                             reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass
        self.transport.close()


def bind(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """The listening socket, bound now so a port in use fails at once (OSError). Without
    ``listen`` it listens from Server.start on: workers forked with it refuse connections
    until one serves, rather than leaving them queued unanswered while they start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # inherited by every accepted connection: an answer written in two pieces (head,
        # body) must not wait for the client's delayed ACK (40 ms a keep-alive request)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        if listen:
            sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def reloading_context(tls: TlsFiles) -> ssl.SSLContext:
    """A server context whose every handshake uses the certificate files as they are now."""
    base = tls.context()

    def swap(conn: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        current = tls.context()
        if current is not context:
            conn.context = current

    base.sni_callback = swap
    return base


class Server:
    """The app on uvicorn in a background thread; bound at construction, started by
    :meth:`start`, stopped gracefully by :meth:`stop`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 tls: TlsFiles | None = None, forwarded_allow_ips: Sequence[str] = (),
                 max_connections: int = MAX_CONNECTIONS,
                 max_idle_per_client: int = MAX_IDLE_PER_CLIENT,
                 sock: socket.socket | None = None) -> None:
        self.app = app
        self.tls = tls
        # a socket bound by the parent of several workers: each accepts from it
        self.socket = sock if sock is not None else bind(host, port)
        self.address = self.socket.getsockname()  # still known once the socket is closed
        self.guard = ConnectionGuard(connection_budget(max_connections), max_idle_per_client)
        protocol = type("GuardedH11", (GuardedH11,), {"guard": self.guard})
        config = uvicorn.Config(
            app, http=protocol, ws="none", lifespan="off", log_config=None,
            access_log=False, server_header=False, headers=[("server", "gpufleet")],
            timeout_keep_alive=KEEP_ALIVE, timeout_graceful_shutdown=GRACE,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            limit_concurrency=None,  # ConnectionGuard bounds connections without a 503
            proxy_headers=bool(forwarded_allow_ips),
            forwarded_allow_ips=list(forwarded_allow_ips) or None,
            ssl_context_factory=(lambda config, default: reloading_context(tls))
            if tls is not None else None)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.address[1])

    @property
    def url(self) -> str:
        host = str(self.address[0])
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1" if self.socket.family == socket.AF_INET else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.port}"

    def start(self) -> Server:
        """Serve from a thread; returns once the port answers (or raises why it cannot)."""
        failed: list[BaseException] = []

        self.socket.listen(BACKLOG)  # again, harmless; a worker's first: now it serves

        async def serve() -> None:
            # handlers hold the GIL while they fold rows: a few threads keep both cores
            # busy, forty only queue the event loop (and /healthz) behind them
            anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
            await self._server.serve(sockets=[self.socket])

        def run() -> None:
            try:  # uvicorn leaves signals alone off the main thread: the command owns them
                asyncio.run(serve())
            except BaseException as exc:
                failed.append(exc)

        self._thread = threading.Thread(target=run, name="api-http", daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.01)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        """No new connections, answers in flight finish (GRACE at most), then it ends."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACE + 5)
            self._thread = None
        self.close()

    def close(self) -> None:
        """Close the listening socket of a server never started."""
        with contextlib.suppress(OSError):
            self.socket.close()
