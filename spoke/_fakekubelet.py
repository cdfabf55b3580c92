"""A kubelet pod-resources server for tests, the benchmark and demos: real gRPC, unix socket.

Serves ``v1.PodResourcesLister/List`` with whatever bytes ``answer`` returns (a serialized
``ListPodResourcesResponse``), so callers choose how those bytes are made: tests encode them by
hand from api.proto's field numbers, the benchmark uses spoke._podresources' messages.
Imports grpcio: never imported by the exporter itself.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc


class FakeKubelet:
    """``start()``, then point ``KubeletPods`` at ``socket_path``; ``stop()`` when done."""

    def __init__(self, socket_path: Path | str, answer: Callable[[], bytes]) -> None:
        self.answer = answer
        self.calls = 0
        self.socket_path = Path(socket_path)
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=lambda b: b,
                response_serializer=lambda b: b),
        })
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.socket_path}")

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if request != b"":  # ListPodResourcesRequest has no fields
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unexpected request fields")
        self.calls += 1
        return self.answer()

    def start(self) -> FakeKubelet:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(None)
