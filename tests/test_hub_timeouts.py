"""A dead hub costs the connect timeout (5 s by default), not a whole read timeout; a hub that
accepts and then never answers costs the read timeout. Both are options (and environment)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support.clirun import gpufleet


@pytest.fixture
def unaccepting_port() -> Iterator[int]:
    """A loopback port whose accept queue is full: the kernel drops further SYNs, so a
    connect hangs like one to a firewalled or powered-off hub."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # the handshake completes in the kernel
            c.connect(("127.0.0.1", port))
        fillers.append(c)
    try:
        yield port
    finally:
        for c in fillers:
            c.close()
        server.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_connect_timeout_fails_fast_whatever_the_read_timeout(unaccepting_port):
    started = time.monotonic()
    result = gpufleet("query", "up", "--hub-url", f"http://127.0.0.1:{unaccepting_port}",
                      "--connect-timeout", "0.5s", "--read-timeout", "60s")
    took = time.monotonic() - started
    assert result.exit_code == 3
    assert "did not accept a connection within 0.5s (--connect-timeout)" in result.stderr
    assert took < 10, took


def test_connect_timeout_from_the_environment(unaccepting_port):
    env = {"GPUFLEET_HUB_URL": f"http://127.0.0.1:{unaccepting_port}",
           "GPUFLEET_CONNECT_TIMEOUT": "0.3s"}
    result = gpufleet("query", "up", env=env)
    assert result.exit_code == 3
    assert "within 0.3s (--connect-timeout)" in result.stderr


@pytest.mark.parametrize("option", ["--read-timeout", "--timeout"])
def test_read_timeout_bounds_an_answer_that_never_comes(silent_port, option):
    result = gpufleet("query", "up", "--hub-url", f"http://127.0.0.1:{silent_port}",
                      option, "0.5s")
    assert result.exit_code == 3
    assert "did not answer within 0.5s (--read-timeout)" in result.stderr


@pytest.mark.parametrize("option", ["--connect-timeout", "--read-timeout"])
def test_a_timeout_must_be_positive(option):
    result = gpufleet("query", "up", "--hub-url", "http://127.0.0.1:1", option, "0s")
    assert result.exit_code == 2
    assert f"{option} must be greater than 0" in result.stderr


def test_both_timeouts_from_a_config_file(unaccepting_port, silent_port, tmp_path):
    config = tmp_path / "gpufleet.yaml"
    config.write_text(f"hub-url: http://127.0.0.1:{unaccepting_port}\n"
                      "connect-timeout: 0.3s\nread-timeout: 7s\n")
    result = gpufleet("query", "up", "--config", str(config))
    assert result.exit_code == 3
    assert "within 0.3s (--connect-timeout)" in result.stderr
    # the older name is a config key too
    config.write_text(f"hub-url: http://127.0.0.1:{silent_port}\ntimeout: 0.4s\n")
    result = gpufleet("query", "up", "--config", str(config))
    assert result.exit_code == 3
    assert "did not answer within 0.4s (--read-timeout)" in result.stderr
