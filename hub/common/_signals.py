"""SIGTERM handling shared by the long-running commands (exporter, serve, demo).

Kubernetes stops a pod with SIGTERM; each command turns it into its own clean shutdown. Only
the main thread may install a handler, so elsewhere (tests running a command in a thread)
this does nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def on_sigterm(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Run ``handler`` on SIGTERM inside the block; the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
