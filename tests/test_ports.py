"""Ports for the real servers the tests start, without the bind-close-rebind race: a port
from free_port() is not handed to anyone else meanwhile, and a Prometheus whose port was
taken after all starts again on another one."""

from __future__ import annotations

import socket

from hub.devstack import PrometheusProcess, free_port, hub_config


def test_a_reserved_port_is_not_handed_out_again():
    reserved = {free_port() for _ in range(50)}
    handed_out = set()
    for _ in range(5000):  # what other workers' bind(port 0) calls get meanwhile
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            handed_out.add(s.getsockname()[1])
    assert not reserved & handed_out


def test_a_reserved_port_binds_at_once_for_a_server_that_reuses_addresses():
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()


def test_prometheus_moves_to_another_port_when_its_own_was_taken(tmp_path):
    hub = PrometheusProcess(tmp_path / "hub", hub_config())
    taken = hub.port
    with socket.socket() as squatter:  # another program took the port after all
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        hub.start()
        try:
            assert hub.port != taken
            assert hub.proc is not None and hub.proc.poll() is None
        finally:
            hub.stop()
