"""The API's TLS: a certificate and key read from files, read again when they change.

cert-manager (or a Secret update) rewrites the mounted files in place; the service must serve
the new certificate without a restart. Each TLS handshake (uvicorn's context calls back on
every one, hub/service/_serve.py) compares the files' modification stamps with the ones
loaded (two ``stat`` calls) and builds a fresh context when they differ.
A pair that does not load (a rotation caught half-way: new cert, old key) keeps the previous
context and is tried again on the next connection.

A certificate outside its validity (expired, or not valid yet: a clock or a rotation gone
wrong) is refused at start, as every client would refuse it; one rotated in later is not
taken (the log says why) and the previous one keeps serving.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hub.common import InputError

log = logging.getLogger("gpufleet.tls")


class TlsFiles:
    def __init__(self, cert_file: str | Path, key_file: str | Path, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.clock = clock
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self.not_after: float | None = None
        try:
            self._context = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"cannot load the TLS certificate {self.cert_file} and key "
                             f"{self.key_file}: {getattr(exc, 'strerror', None) or exc}"
                             ) from None
        except ValueError as exc:
            raise InputError(f"TLS certificate {self.cert_file}: {exc}") from None

    def _stamps(self) -> tuple[int, int]:
        return os.stat(self.cert_file).st_mtime_ns, os.stat(self.key_file).st_mtime_ns

    def _load(self) -> ssl.SSLContext:
        stamp = self._stamps()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        self._check_validity()
        self._stamp = stamp
        return context

    def _check_validity(self) -> None:
        """ValueError when the (first) certificate is expired or not valid yet."""
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        now = self.clock()
        after = cert.not_valid_after_utc.timestamp()
        before = cert.not_valid_before_utc.timestamp()
        if now >= after:
            raise ValueError(f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
                             "every client refuses it (renew it)")
        if now < before:
            raise ValueError(f"not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
                             "UTC (check this host's clock or the certificate)")
        self.not_after = after

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                if self._stamps() != self._stamp:
                    self._context = self._load()
                    log.info("TLS certificate reloaded from %s", self.cert_file)
            except (OSError, ssl.SSLError, ValueError) as exc:
                log.warning("TLS certificate not reloaded (keeping the previous one): %s", exc)
            return self._context
