"""Serving the app: uvicorn on its own thread, with the limits a public port needs.

uvicorn's event loop holds any number of idle or slow connections for the cost of a few
kilobytes each, so a slow client cannot take a slot a probe needs (the old thread-per-
connection server had 32). What uvicorn lacks, :class:`GuardedH11` adds:

* a request must arrive whole (request line and headers) within ``HEADER_TIMEOUT`` of the
  connection opening or of the previous answer, or the connection is closed: 300 half-sent
  requests hold nothing for long (uvicorn only times out *idle* keep-alive connections);
* a request head still incomplete beyond ``MAX_HEADER_BYTES`` is refused by h11 (a
  complete one by the app's guard), bodies beyond the app's ``MAX_BODY``;
* a malformed request gets a JSON 400 like every other error, not uvicorn's text.

TLS: uvicorn builds one ``SSLContext`` at start. Ours names an SNI callback that swaps in
:meth:`TlsFiles.context` on every handshake, which reloads the certificate when its files
change (cert-manager's rotation) without a restart.

Stopping (SIGTERM) is graceful: no new connections, answers in flight finish (at most
``GRACE`` seconds), idle keep-alive connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import threading
from typing import Any

import anyio
import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from hub.service._app import MAX_HEADER_BYTES
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
#: open connections at most; beyond, new ones get 503 (far above what a probe meets)
MAX_CONNECTIONS = 2000


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on the request head and JSON errors."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(HEADER_TIMEOUT, self._too_slow)

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

    def on_response_complete(self) -> None:
        super().on_response_complete()  # uvicorn's idle timer runs until the next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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
                 tls: TlsFiles | None = None, sock: socket.socket | None = None) -> None:
        self.app = app
        self.tls = tls
        # a socket bound by the parent of several workers: each accepts from it
        self.socket = sock if sock is not None else bind(host, port)
        self.address = self.socket.getsockname()  # still known once the socket is closed
        config = uvicorn.Config(
            app, http=GuardedH11, ws="none", lifespan="off", log_config=None,
            access_log=False, server_header=False, headers=[("server", "gpufleet")],
            timeout_keep_alive=KEEP_ALIVE, timeout_graceful_shutdown=GRACE,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            limit_concurrency=MAX_CONNECTIONS,
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
