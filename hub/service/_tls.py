"""The API's TLS: a certificate and key read from files, read again when they change.

cert-manager (or a Secret update) rewrites the mounted files in place; the service must serve
the new certificate without a restart. Each TLS handshake (uvicorn's context calls back on
every one, hub/service/_serve.py) compares the files' modification stamps with the ones
loaded (two ``stat`` calls) and builds a fresh context when they differ.
A pair that does not load (a rotation caught half-way: new cert, old key) keeps the previous
context and is tried again on the next connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path

from hub.common import InputError

log = logging.getLogger("gpufleet.tls")


class TlsFiles:
    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        try:
            self._context = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"cannot load the TLS certificate {self.cert_file} and key "
                             f"{self.key_file}: {getattr(exc, 'strerror', None) or exc}"
                             ) from None

    def _stamps(self) -> tuple[int, int]:
        return os.stat(self.cert_file).st_mtime_ns, os.stat(self.key_file).st_mtime_ns

    def _load(self) -> ssl.SSLContext:
        stamp = self._stamps()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        self._stamp = stamp
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                if self._stamps() != self._stamp:
                    self._context = self._load()
                    log.info("TLS certificate reloaded from %s", self.cert_file)
            except (OSError, ssl.SSLError) as exc:
                log.warning("TLS certificate not reloaded (keeping the previous one): %s", exc)
            return self._context
