"""Idle connections on loopback, each opened again after the server closes it: the
connection flood of the hardening probe, run as a process of its own (python -m
tests.support.flood PORT COUNT SECONDS [REOPEN]) so its event loop does not share the
service's GIL in the test process. Prints "ready" once COUNT connections were opened, and
at the end one JSON line: connections opened and how many the server closed."""

from __future__ import annotations

import asyncio
import json
import resource
import sys


class Flood:
    def __init__(self, port: int, count: int, seconds: float, reopen: float) -> None:
        self.port, self.count, self.seconds, self.reopen = port, count, seconds, reopen
        self.opened = 0
        self.closed_by_server = 0
        self.ready = False

    async def _one(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(self.reopen)
                continue
            self.opened += 1
            if self.opened >= self.count and not self.ready:
                self.ready = True
                print("ready", flush=True)
            try:
                await reader.read()  # b"" once the server closes it; it never sends a byte
                self.closed_by_server += 1
            except OSError:
                pass
            finally:
                writer.close()
            await asyncio.sleep(self.reopen)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._one()) for _ in range(self.count)]
        await asyncio.sleep(self.seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    reopen = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    flood = Flood(port, count, seconds, reopen)
    asyncio.run(flood.run())
    print(json.dumps({"opened": flood.opened, "closed_by_server": flood.closed_by_server}),
          flush=True)


if __name__ == "__main__":
    main()
