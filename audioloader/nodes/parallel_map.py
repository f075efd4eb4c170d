"""ParallelMap: a function over a node's items in worker threads or processes, in order, exactly resumable."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchdata.nodes import BaseNode

from .. import checks
from ..errors import CheckpointMismatchError
from ..samples import Failure
from ..stats import HeldBytes, LoaderStats
from ..workers.autotune import Autotuner, initial_guess
from ..workers.pool import PoolClosed, ProcessPool, ThreadPool, WorkerError, available_cores, default_threads
from ..workers.process_worker import run_chunk
from ..workers.recycle import BatchArenas
from .held import RowsHeld, as_keys

BACKENDS = ("thread", "process")

#: ``num_workers`` that sizes a process pool while it runs (`audioloader.workers.autotune`).
AUTO = "auto"

#: Key of the state (the name torchdata's ParallelMapper uses, so its checkpoints load here).
STATE_KEY = "it_state"


@dataclass(frozen=True)
class MapPool:
    """Who runs a `ParallelMap`'s job and how work reaches them, as one group (checked when made).

    ``num_workers``: threads or processes; 0 maps in the calling thread; ``"auto"``: one process per core
    started, and how many get work sized while running by `audioloader.workers.autotune.Autotuner` (with
    threads: 2 a core, at most 8). The count never changes a result or the state. ``backend``: ``"thread"`` or
    ``"process"``. ``chunk_size``: items per task (None: 8 for processes, 4 for threads, 1 inline). ``depth``:
    chunks in flight per worker. ``start_method``: process start method (see
    `audioloader.workers.pool.DEFAULT_START_METHOD`). ``thread_initializer``: run once in each worker thread.
    ``what``: the workers' name in errors and thread names. ``max_bytes_in_flight``: submit no further chunk
    while the chunks in flight hold this many bytes (at least one chunk is always in flight). Only when work is
    handed out depends on it, never the results or the state. None: ``num_workers * depth`` chunks, whatever
    they weigh.
    """

    num_workers: int | str
    backend: str = "thread"
    chunk_size: int | None = None
    depth: int = 2
    start_method: str | None = None
    thread_initializer: Callable[[], None] | None = None
    what: str = "worker"
    max_bytes_in_flight: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: must be one of {BACKENDS}")


@dataclass
class _Chunk:
    """Items pulled together and sent to one worker as one task."""

    seq: int
    start_state: Any  # the source's state before the chunk's first item
    size: int
    nbytes: int = 0  # what its items hold (size_fn), while in flight
    labels: list[Any] = field(default_factory=list)  # what the items are, for error messages
    results: list[Any] | None = None
    error: BaseException | None = None  # raised by the source after the chunk's items
    stream: bool = True  # handed out by next() (else rebuilt by map_all)


class _SourceFailure(Failure):
    """The source raised: after this item the node ends."""


class _InlinePool:
    """``num_workers=0``: chunks run in the consumer's thread, when their result is asked for."""

    def __init__(self, job: Callable[[Any], Any]) -> None:
        self.job = job
        self._chunks: dict[int, list[Any]] = {}

    def start(self) -> None:
        pass

    def submit(self, seq: int, items: list[Any], into: Any = None) -> None:
        self._chunks[seq] = items

    def result(self, seq: int, into: Any = None) -> tuple[list[Any], None]:
        return run_chunk(self.job, self._chunks.pop(seq), lambda: False), None

    def cancel(self) -> None:
        self._chunks.clear()

    def shutdown(self) -> None:
        self.cancel()


class ParallelMap(BaseNode):
    """``job(item)`` for every item of ``source``, computed ahead in ``num_workers`` threads or processes.

    Output order is the source's order, whatever the number or kind of workers.
    Items travel in chunks of ``chunk_size`` (one task per chunk: a few hand-offs
    per chunk instead of per item); each worker has ``depth`` chunks in flight.

    Exceptions: an exception raised by ``job`` or by the source is raised by
    ``next()`` at its place in the order, with its original type (from a worker
    process: unpickled, its traceback text as ``__cause__``). After an exception
    from ``job`` the next call goes on with the next item; after one from the
    source the node ends until the next ``reset()``.

    State: ``{"it_state": {"snapshot": <source state>, "steps_since_snapshot": k,
    "emitted": [[index, pass], ...]}}``: resume resets the source to the snapshot
    and skips ``k`` items (read, not mapped again); ``emitted`` names those items
    (their keys, at most a chunk's), so a resume with another world size knows
    which rows after the snapshot were already delivered (`audioloader.elastic`).
    The snapshot is taken once per chunk, so a costly source ``get_state()`` (a
    large shuffle buffer) is paid once per ``chunk_size`` items. The format is
    torchdata ``ParallelMapper``'s (plus ``emitted``), whose states this node
    also accepts.

    Args:
        source: the upstream node, pulled in the thread that calls ``next()``.
        job: ``job(item) -> result``; for ``backend="process"`` it must pickle
            (see `audioloader.workers.pool` for its optional ``encode``/``prepare`` hooks).
        pool: who runs it and how work reaches them (`MapPool`: ``num_workers``, ``backend``, ``chunk_size``,
            ``depth``, ``start_method``, ``thread_initializer``, ``what``, ``max_bytes_in_flight``).
        stats: `LoaderStats` that receives the counters worker processes report; with ``size_fn``, the
            bytes of the items in flight go to ``stats.memory`` (holder ``"decode_in_flight"``, reported
            beside the budgeted total: when results come back depends on timing).
        size_fn: ``item -> bytes`` it holds (e.g. `held_bytes`); None: not counted.
        collate_into: `BatchArenas` that a process pool's workers write the stream's results into (or the pool
            copies them into), so that a `Batcher` reading this node's items in order (and nothing else)
            collates them without a copy.

    `of` takes the pool's fields one by one (``num_workers=``, ``backend=``, ...).
    """

    def __init__(self, source: BaseNode, job: Callable[[Any], Any], pool: MapPool | None = None, *,
                 stats: LoaderStats | None = None, size_fn: Callable[[Any], int] | None = None,
                 collate_into: BatchArenas | None = None, **fields: Any) -> None:
        if fields or not isinstance(pool, MapPool):
            raise checks.node_fields("ParallelMap", "its workers as one MapPool(num_workers, backend=...)", fields)
        super().__init__()
        self.pool = pool
        num_workers, backend, chunk_size, depth = pool.num_workers, pool.backend, pool.chunk_size, pool.depth
        max_bytes_in_flight, what = pool.max_bytes_in_flight, pool.what
        self.source = source
        self.job = job
        self._tuner: Autotuner | None = None
        if num_workers == AUTO:
            num_workers = available_cores() if backend == "process" else default_threads()
            if backend == "process":
                self._tuner = Autotuner(num_workers, initial_guess(num_workers))
        self.num_workers = num_workers
        self.backend = backend if num_workers > 0 else "inline"
        default_chunk = {"process": 8, "thread": 4, "inline": 1}[self.backend]
        self.chunk_size = default_chunk if chunk_size is None else chunk_size
        self.depth = depth
        self.stats = stats
        if num_workers == 0:
            self._pool: Any = _InlinePool(job)
        elif backend == "thread":
            self._pool = ThreadPool(job, num_workers, initializer=pool.thread_initializer, name=f"audioloader-{what}")
        else:
            self._pool = ProcessPool(job, num_workers, depth=depth, start_method=pool.start_method, what=what,
                                     arenas=collate_into)
        self._capacity = max(1, num_workers) * depth
        if self._tuner is not None:
            self.set_count(self._tuner.count)
        if stats is not None:
            stats.workers.update(kind=self.backend, started=num_workers, count=self.count,
                                 autotune=[] if self._tuner is not None else None)
        self.size_fn = size_fn
        self.max_bytes_in_flight = max_bytes_in_flight
        self._flight = (stats.memory if stats is not None else HeldBytes()).holding("decode_in_flight", budgeted=False)
        self._flight.info["max_bytes"] = max_bytes_in_flight
        self.collate_into = collate_into
        self._owner_pid = os.getpid()
        self._seq = 0
        self._chunks: deque[_Chunk] = deque()
        self._in_flight: deque[_Chunk] = deque()  # submitted, result not read yet (a subset of _chunks)
        self._clear(None, 0)

    @classmethod
    def of(cls, source: BaseNode, job: Callable[[Any], Any], *, num_workers: int | str, backend: str = "thread",
           chunk_size: int | None = None, depth: int = 2, start_method: str | None = None,
           thread_initializer: Callable[[], None] | None = None, stats: LoaderStats | None = None,
           what: str = "worker", size_fn: Callable[[Any], int] | None = None,
           max_bytes_in_flight: int | None = None, collate_into: BatchArenas | None = None) -> ParallelMap:
        """A map built from its settings one by one: the pool's fields make its `MapPool`; ``stats``,
        ``size_fn`` and ``collate_into`` as the constructor's."""
        pool = MapPool(num_workers, backend, chunk_size, depth, start_method, thread_initializer, what,
                       max_bytes_in_flight)
        return cls(source, job, pool, stats=stats, size_fn=size_fn, collate_into=collate_into)

    @property
    def count(self) -> int:
        """Workers that get work now (``num_workers`` unless autotuned, or changed by `set_count`)."""
        return self._pool.active if self.backend == "process" else self.num_workers

    def set_count(self, count: int) -> None:
        """Hand new chunks to ``count`` (1 to ``num_workers``) of the started worker processes, from now on.

        Results, their order and the state stay what they are with any count: each
        result is computed from its item alone, and results are read in the order the
        items were pulled, whichever worker computed them.
        """
        if self.backend != "process":
            raise ValueError(f"set_count() needs worker processes; this node runs on {self.backend!r}")
        self._pool.set_active(count)
        self._capacity = count * self.depth
        if self.stats is not None:
            self.stats.workers["count"] = count
            if self._tuner is not None:
                self.stats.workers["autotune"] = self._tuner.report()["autotune"]

    def _clear(self, snapshot: Any, steps: int) -> None:
        self._flight.clear()
        self._chunks.clear()
        self._in_flight.clear()
        self._results: list[Any] = []
        self._labels: list[Any] = []  # keys of the current chunk's items
        self._skipped: list[Any] = []  # keys of the items skipped by a resume, before the first chunk
        self._pos = 0
        self._source_done = False
        self._failed = False
        self._snapshot, self._steps = snapshot, steps

    # ------------------------------------------------------------------ BaseNode

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._pool.cancel()
        self._pool.start()  # here, in the resetting thread; after shutdown() only a reset starts workers again
        if self.stats is not None:
            self.stats.describe_workers(self._workers_report())
        snapshot, steps = _position(initial_state)
        if self.collate_into is not None:
            self.collate_into.restart()  # the next sample handed out starts a batch
        self.source.reset(snapshot)
        # Items already emitted before the checkpoint: read, not mapped.
        skipped = [getattr(next(self.source), "key", None) for _ in range(steps)]
        self._clear(snapshot if snapshot is not None else self.source.state_dict(), steps)
        self._skipped = skipped
        if self._tuner is not None:
            self._tuner.start(time.monotonic())

    def next(self) -> Any:
        if os.getpid() != self._owner_pid:
            raise RuntimeError(f"this node was started in another process (pid {self._owner_pid}); a forked "
                               "process cannot use its workers: build the loader in the process that iterates it")
        while self._pos >= len(self._results):
            if self._failed or not self._advance():
                raise StopIteration
        item = self._results[self._pos]
        self._pos += 1
        self._steps += 1
        if isinstance(item, Failure):
            self._failed = isinstance(item, _SourceFailure)
            raise item.error
        return item

    def get_state(self) -> dict[str, Any]:
        emitted = [[int(key[0]), int(key[1])] for key in (*self._skipped, *self._labels[:self._pos]) if key is not None]
        return {STATE_KEY: {"snapshot": self._snapshot, "steps_since_snapshot": self._steps, "emitted": emitted}}

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """The items in flight: its source's snapshot, less the items it passed on since (their keys are its
        state's ``emitted``; see `audioloader.nodes.held`)."""
        inner = state[STATE_KEY]
        if "source" in inner:  # torchdata's inline form: nothing in flight
            return RowsHeld(inner["source"])
        steps = int(inner["steps_since_snapshot"])
        if steps and "emitted" not in inner:
            raise CheckpointMismatchError(
                "this checkpoint does not say which rows its decode stage delivered after its last snapshot (it was "
                "saved by an audioloader without elastic resume), so it cannot be resumed exactly on another world "
                "size; resume it with the world size it was saved with", {"decode_in_flight": (steps, None)})
        return RowsHeld(inner["snapshot"], emitted=as_keys(inner.get("emitted", ())))

    def _workers_report(self) -> dict[str, Any]:
        """``stats()["workers"]``: the kind and number of workers, and how processes were started and why."""
        report: dict[str, Any] = {"kind": self.backend, "num_workers": self.num_workers}
        method = getattr(self._pool, "method_used", None)
        if method is not None:
            report.update(start_method=method, start_method_reason=self._pool.start_reason)
        return report

    # ------------------------------------------------------------------ the pipeline

    def _advance(self) -> bool:
        """Make the next chunk's results current; False at the end of the source."""
        self._top_up()
        if not self._chunks:
            return False
        chunk = self._chunks.popleft()
        if chunk.results is None:
            self._collect(chunk)
        self._flight.add(-chunk.nbytes, -chunk.size)
        if self._tuner is not None:
            self._retune(chunk.size)
        self._results, self._labels, self._pos, self._skipped = chunk.results, chunk.labels, 0, []
        self._snapshot, self._steps = chunk.start_state, 0
        if chunk.error is not None:
            self._results = [*chunk.results, _SourceFailure(chunk.error)]
        self._top_up()  # the worker that answered has room again
        return True

    def _retune(self, items: int) -> None:
        """Tell the tuner what the consumer took and waited for; apply the count it decides."""
        self._tuner.record(items, self._pool.take_waited())
        count = self._tuner.tick(time.monotonic())
        if count is not None:
            self.set_count(count)

    def _top_up(self) -> None:
        """Pull and submit chunks until every worker has ``depth`` in flight or the source ends."""
        if self._source_done:
            return
        while len(self._in_flight) < self._capacity and not self._source_done and not self._heavy():
            chunk = _Chunk(self._seq, self.source.state_dict(), 0)
            items: list[Any] = []
            try:
                while len(items) < self.chunk_size:
                    items.append(next(self.source))
            except StopIteration:
                self._source_done = True
            except Exception as error:  # raised in order, after the items before it
                self._source_done = True
                chunk.error = error
            if not items and chunk.error is None:
                return
            chunk.size = len(items)
            chunk.labels = [getattr(item, "key", None) for item in items]
            if self.size_fn is not None:
                chunk.nbytes = sum(self.size_fn(item) for item in items)
            self._flight.add(chunk.nbytes, chunk.size)
            self._submit(chunk, items)

    def _heavy(self) -> bool:
        """The chunks in flight hold ``max_bytes_in_flight`` bytes or more (never true with none in flight)."""
        return (self.max_bytes_in_flight is not None and bool(self._chunks)
                and self._flight.bytes >= self.max_bytes_in_flight)

    def _submit(self, chunk: _Chunk, items: list[Any]) -> None:
        self._seq += 1
        self._chunks.append(chunk)
        if not items:
            chunk.results = []
            return
        try:
            self._pool.submit(chunk.seq, items, self.collate_into)  # its rows reserved in the batch arenas
        except PoolClosed:  # shut down from another thread: the stream ends
            chunk.results, chunk.error, self._source_done = [], None, True
            return
        self._in_flight.append(chunk)

    def _collect(self, chunk: _Chunk) -> None:
        """Read ``chunk``'s results (and those of every chunk submitted before it)."""
        while chunk.results is None:
            oldest = self._in_flight.popleft()
            try:
                # Stream chunks only: their samples go to the batcher in order.
                into = self.collate_into if oldest.stream else None
                results, delta = self._pool.result(oldest.seq, into)
            except PoolClosed:
                oldest.results, self._source_done, self._failed = [], True, True
                continue
            except WorkerError as error:
                rows = ", ".join(str(label) for label in oldest.labels[:8] if label is not None)
                raise WorkerError(f"{error}; it was working on {oldest.size} items"
                                  + (f" (keys {rows})" if rows else "")) from None
            if delta and self.stats is not None:
                self.stats.merge(delta)
            oldest.results = results

    # ------------------------------------------------------------------ outside the stream

    def map_all(self, items: Sequence[Any]) -> list[Any]:
        """``job`` over ``items`` on the same workers, in order, outside the stream (e.g. to rebuild a buffer).

        The stream's chunks in flight are read first and kept. Raises the first
        exception a job raised.
        """
        for chunk in list(self._in_flight):
            self._collect(chunk)
        self._pool.start()
        pending: deque[_Chunk] = deque()
        out: list[Any] = []
        for start in range(0, len(items), self.chunk_size):
            part = list(items[start:start + self.chunk_size])
            if len(pending) >= self._capacity:
                out.extend(self._take(pending.popleft()))
            chunk = _Chunk(self._seq, None, len(part), labels=[getattr(i, "key", None) for i in part], stream=False)
            self._seq += 1
            self._pool.submit(chunk.seq, part)
            self._in_flight.append(chunk)
            pending.append(chunk)
        while pending:
            out.extend(self._take(pending.popleft()))
        return out

    def _take(self, chunk: _Chunk) -> list[Any]:
        self._collect(chunk)
        for result in chunk.results:
            if isinstance(result, Failure):
                raise result.error
        if len(chunk.results) != chunk.size:
            raise RuntimeError("the workers were stopped while rebuilding items")
        return chunk.results

    def shutdown(self) -> None:
        """Stop the workers now; ``get_state()`` still describes the last item returned."""
        self._pool.shutdown()
        self._chunks.clear()
        self._in_flight.clear()
        self._flight.clear()
        self._source_done = True


def _position(state: dict[str, Any] | None) -> tuple[Any, int]:
    """``(source state, items to skip)`` from this node's state or torchdata ParallelMapper's (inline or threaded)."""
    if state is None:
        return None, 0
    inner = state[STATE_KEY]
    if "source" in inner:  # torchdata's inline form (num_workers=0)
        return inner["source"], 0
    return inner["snapshot"], int(inner["steps_since_snapshot"])
