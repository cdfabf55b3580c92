"""Fleet queries in shards of whole clusters, asked in parallel, with what they return set
aside on disk: the one way the sync and the usage ledger ask a fleet too large for one answer.

Both ask a fixed set of queries per shard (``cluster=~"a|b"`` added to every selector), fold
each answer as it arrives, and keep a finished shard's records on disk until the write reads
them back; a failure anywhere fails the whole run and says which clusters it was asking
about. Written once here, so the two cannot drift apart in how many requests they keep in
flight, what a failure cancels or what its message names.
"""

from __future__ import annotations

import json
import pickle
import re
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, Any, Generic, TypeVar

from hub.common import GpufleetError

T = TypeVar("T")

#: how many cluster names a failed shard's message lists before "and N more"
CLUSTERS_SHOWN = 10


#: characters RE2 reads as syntax; every other character of a cluster name is itself
_RE2_SYNTAX = re.compile(r"[\\.+*?()|\[\]{}^$]")


def _re2_literal(match: re.Match[str]) -> str:
    # braces as hex escapes: no brace reaches the query text, where the selector templates
    # (str.format) would read it
    char = match.group()
    return f"\\x{ord(char):02X}" if char in "{}" else "\\" + char


def promql_string(text: str) -> str:
    """``text`` as a PromQL double-quoted string literal (Go's escapes: JSON's are a subset)."""
    return json.dumps(text, ensure_ascii=False)


def shard_matcher(cluster_label: str, clusters: Iterable[str], *, exclude: bool = False
                  ) -> str:
    """The exact matcher of a shard of clusters: ``cluster=~"a|b\\.c"``, each name a literal
    (RE2 syntax escaped; Prometheus anchors the regex whole). ``exclude`` gives the
    complement, ``cluster!~"..."``: every other cluster, clusters that appeared since the
    shard plan and series without the label included (the empty value matches no name)."""
    names = "|".join(_RE2_SYNTAX.sub(_re2_literal, c) for c in clusters)
    return f"{cluster_label}{'!~' if exclude else '=~'}{promql_string(names)}"


@dataclass(frozen=True)
class Shard:
    """Whole clusters asked for together: ``matcher`` (empty: the whole fleet) is added to
    every selector of the query set. The last shard of a plan is the complement of the
    others (``rest``): it has whatever the plan could not name."""

    clusters: tuple[str, ...]
    gpus: int
    matcher: str = ""
    rest: bool = True

    def describe(self) -> str:
        names = ", ".join(self.clusters[:CLUSTERS_SHOWN])
        if len(self.clusters) > CLUSTERS_SHOWN:
            names += f" and {len(self.clusters) - CLUSTERS_SHOWN} more"
        if self.rest:
            names = (f"{names}, " if names else "") + "and any cluster not in another shard"
        return f"shard of clusters {names}"


def plan_shards(counts: dict[str, int], shard_size: int, cluster_label: str) -> list[Shard]:
    """Whole clusters, in name order, packed into shards of at most ``shard_size`` GPUs (a
    larger cluster is a shard of its own: a shard never splits a cluster, so every place a
    GPU reports from within a cluster is in one shard). Series without the label
    (counted under ``""``) are left to the last shard, the complement of the others."""
    names = sorted(c for c in counts if c)
    groups: list[list[str]] = []
    sizes: list[int] = []
    for name in names:
        n = max(0, counts[name])
        if groups and sizes[-1] + n <= shard_size:
            groups[-1].append(name)
            sizes[-1] += n
        else:
            groups.append([name])
            sizes.append(n)
    if len(groups) <= 1:
        return [Shard(tuple(names), sum(sizes))]
    shards = [Shard(tuple(g), n, shard_matcher(cluster_label, g), rest=False)
              for g, n in zip(groups[:-1], sizes[:-1], strict=True)]
    others = [c for g in groups[:-1] for c in g]
    shards.append(Shard(tuple(groups[-1]), sizes[-1],
                        shard_matcher(cluster_label, others, exclude=True)))
    return shards


def shard_error(exc: GpufleetError, shard: Shard, shards: Sequence[Shard],
                consequence: str) -> GpufleetError:
    """The same error (so the same exit code), naming the shard's clusters, then what it
    means (``consequence``: the sync's "inventory left unchanged", the ledger's own). A
    fleet asked as one shard names none: the error is about the whole fleet."""
    if len(shards) == 1:
        return exc
    text = exc.format_message().removesuffix(f"; {consequence}") if consequence \
        else exc.format_message()
    tail = f"; {consequence}" if consequence else ""
    return type(exc)(f"{text} ({shard.describe()}, "
                     f"{list(shards).index(shard) + 1} of {len(shards)}){tail}")


def run_shards(shards: Sequence[Shard], jobs: Callable[[Shard], Iterable[Callable[[], T]]],
               fold: Callable[[Shard, T], None], *, concurrency: int, consequence: str,
               done: Callable[[Shard], None] = lambda shard: None,
               name: str = "shard") -> None:
    """Run every shard's ``jobs`` (each a request, or a shard's whole chain of them), at
    most ``concurrency`` in flight across shards, in plan order; hand each result to
    ``fold`` in the caller's thread as soon as it is in (not in plan order: a slow shard
    never holds a finished one's answer in memory), and call ``done`` once a shard's last
    result is folded, so the caller can set the shard aside and drop its records.

    The first failure (a job's, or ``fold``'s or ``done``'s GpufleetError) starts nothing
    more, cancels what has not started, waits for what is running and raises the error
    naming its shard (shard_error with ``consequence``): the caller writes nothing."""
    queue = deque((shard, job) for shard in shards for job in jobs(shard))
    left = Counter(id(shard) for shard, _ in queue)
    for shard in shards:  # nothing to ask: finished as it starts
        if not left[id(shard)]:
            done(shard)
    if not queue:
        return
    width = max(1, min(concurrency, len(queue)))
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix=name) as pool:
        pending: dict[Future[T], Shard] = {}

        def submit() -> None:
            while queue and len(pending) < width:
                shard, job = queue.popleft()
                pending[pool.submit(job)] = shard

        submit()
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                while finished:
                    future = finished.pop()
                    shard = pending.pop(future)
                    try:
                        fold(shard, future.result())
                        left[id(shard)] -= 1
                        if not left[id(shard)]:
                            done(shard)
                    except GpufleetError as exc:
                        raise shard_error(exc, shard, shards, consequence) from None
                    del future  # it holds the answer: gone before the next is waited for
                    submit()
        finally:
            queue.clear()
            for future in pending:
                future.cancel()


class Spill(Generic[T]):
    """Batches of rows set aside in an unnamed temporary file as each shard finishes, read
    back in the order they came, one batch in memory at a time: what a run holds follows
    the shard, not the fleet. ``encode`` turns a batch into what is pickled (plain tuples
    and dicts pickle several times faster than objects), ``decode`` turns it back.
    ``on_disk=False`` keeps the batches as they are, in memory (a fleet of one shard:
    nothing to gain by writing it out). The file has no name on disk (gone with the
    process, whatever happens) and is closed by :meth:`close`, which every caller calls in
    a ``finally``."""

    def __init__(self, prefix: str = "gpufleet-", *, on_disk: bool = True,
                 encode: Callable[[list[T]], object] = lambda batch: batch,
                 decode: Callable[[Any], list[T]] = lambda pickled: pickled,
                 dir: str | None = None) -> None:
        self._prefix, self._dir, self._on_disk = prefix, dir, on_disk
        self._encode, self._decode = encode, decode
        self._file: IO[bytes] | None = None
        self._kept: list[list[T]] = []
        self._batches = 0  # on disk
        #: rows added, over every batch
        self.rows = 0

    def add(self, batch: list[T]) -> None:
        self.rows += len(batch)
        if not self._on_disk:
            self._kept.append(batch)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(  # noqa: SIM115 (closed by close())
                prefix=self._prefix, dir=self._dir)
        pickle.dump(self._encode(batch), self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._batches += 1

    def batches(self) -> Iterator[list[T]]:
        """Each batch in the order added (kept ones are let go as they are read)."""
        while self._kept:
            yield self._kept.pop(0)
        if self._file is not None:
            self._file.seek(0)
            for _ in range(self._batches):
                yield self._decode(pickle.load(self._file))

    def __iter__(self) -> Iterator[T]:
        for batch in self.batches():
            yield from batch

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._kept.clear()
