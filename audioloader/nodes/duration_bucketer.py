"""DurationBucketer: batches of rows of similar duration (and tokens), within budgets, resumable by keys."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from .. import checks
from ..dsp.audio import probe_seconds, span_seconds
from ..dsp.config import Segments
from ..errors import DecodeError
from ..samples import BatchEnd, Key, RawSample, held_bytes, item_key
from ..stats import HeldBytes, LoaderStats
from .bucket_rules import (  # noqa: F401  (the rules' names, re-exported where they were)
    BucketLimits,
    BucketSchedule,
    estimate_boundaries,
    fit_bucket_count,
    plan,
)
from .held import ROW_ITEMS, ItemFns, RowsHeld, as_keys
from .shuffle_buffer import verify_checksums

#: Rebuilds held rows from their keys, in the same order (a random-access read).
RestoreFn = Callable[[Sequence[Key]], Sequence[Any]]


def row_seconds(raw: RawSample, duration_column: str | None = None, segments: Segments | None = None) -> float:
    """A row's duration in seconds: its segment's length (``segments``: from its window columns), else
    its ``duration_column`` value when it has one, else its audio header.

    A row whose header cannot be read counts as 0 s (the decode stage reports it as a bad row).
    """
    span = None if segments is None else segments.span(raw.extras)
    if span is not None:
        try:
            return span_seconds(span, raw.audio)
        except DecodeError:
            return 0.0
    if duration_column is not None:
        value = raw.extras.get(duration_column)
        if value is not None:
            return float(value)
    try:
        return probe_seconds(raw.audio)
    except DecodeError:
        return 0.0


class _Buckets:
    """The rows held per bucket: the open batch (items, durations, tokens, its cost and tokens summed, the
    indices for ``distinct``), the closed batches waiting for their turn (ranks in step), and the bytes of both."""

    def __init__(self, count: int) -> None:
        self.items: list[list[Any]] = [[] for _ in range(count)]
        self.seconds: list[list[float]] = [[] for _ in range(count)]
        self.tokens: list[list[float]] = [[] for _ in range(count)]
        self.costs = [0.0] * count
        self.token_totals = [0.0] * count
        self.bytes = [0] * count
        self.indices: list[set[int]] = [set() for _ in range(count)]
        # Closed batches of each bucket, oldest first: (items, seconds, tokens) each.
        self.queued: list[deque[tuple[list[Any], list[float], list[float]]]] = [deque() for _ in range(count)]

    def add(self, bucket: int, item: Any, seconds: float, tokens: float, cost: float, size: int, index: int) -> None:
        self.items[bucket].append(item)
        self.seconds[bucket].append(seconds)
        self.tokens[bucket].append(tokens)
        self.costs[bucket] += cost
        self.token_totals[bucket] += tokens
        self.bytes[bucket] += size
        self.indices[bucket].add(index)

    def close(self, bucket: int) -> tuple[list[Any], list[float], list[float]]:
        """The open batch of ``bucket``, emptied (its bytes stay counted until `release`)."""
        batch = (self.items[bucket], self.seconds[bucket], self.tokens[bucket])
        self.items[bucket], self.seconds[bucket], self.tokens[bucket] = [], [], []
        self.costs[bucket], self.token_totals[bucket], self.indices[bucket] = 0.0, 0.0, set()
        return batch


class DurationBucketer(BaseNode):
    """Groups rows into batches of similar duration (and tokens per second), as Lhotse's DynamicBucketingSampler
    and NeMo's 2-D bucketing do.

    Each incoming row goes to a bucket (`BucketLimits.bucket_of`: ``boundaries``, the upper duration edges, see
    `estimate_boundaries`; with ``token_boundaries``, also by its tokens per second). A bucket becomes a batch when
    the next row would take it past a budget (``max_duration`` seconds, each row counting ``d + d²/Q`` with
    ``quadratic_duration``; ``max_tokens``; the bucket is closed first and the row starts the next batch) or when
    it holds its batch size (``batch_sizes[b]``, else ``max_batch_size``). A batch leaves as its rows, in arrival
    order, then a `BatchEnd` marker, which the decode stage passes through and the `Batcher` closes the batch at.

    Without a ``schedule`` a batch leaves as soon as it is closed; when the source ends (an evaluation pass), the
    partly filled buckets leave too, in bucket order (``drop_last`` drops them). With a ``schedule`` (ranks in
    step, `BucketSchedule`) step ``i``'s batch comes from the bucket ``schedule.bucket_at(i)``, the same on every
    rank: the node reads rows until that bucket has a closed batch (closed batches of other buckets wait for
    their turn), or, at the end of the source, takes its open one. When it has neither (the source ended, or
    reading on would hold more than ``max_bytes``), it takes the bucket with the most batches waiting instead
    (counted in ``stats()["memory"]["bucketer"]["off_schedule"]``); the rows then waiting drain at their
    buckets' turns. Each step yields exactly one batch, on every rank.

    Two more rules bound what it holds, both functions of the rows only:
    ``max_bytes``: without a schedule, when the rows held take more bytes than this (``size_fn``), the
    bucket holding the most bytes leaves at once, as a smaller batch (counted in
    ``stats()["memory"]["bucketer"]["early_batches"]``); ``distinct``: a row whose
    index its bucket's open batch already holds (the same utterance from another pass) closes
    that batch first, so no batch holds an utterance twice.

    ``probe`` (``Bucketing(first="largest")``): a fresh run's first batch is these rows (read through
    ``restore``), the most expensive batch a bucket can make, so that an out-of-memory error shows at step 0;
    the batches after it are those without it.

    Batches are a pure function of the input order: put a seeded `ShuffleBuffer`
    before this node for random batches in training. Rows from similar-duration
    buckets pad little: with 16 buckets more than 90 % of a padded batch is audio
    (tested; see docs/benchmarks.md).

    State: the keys, durations (and tokens) of the rows held in buckets and of the batch
    being handed out, their audio checksums (taken when each row was read), the schedule's step, and the
    source's state; ``reset(state)`` reads the rows back through ``restore(keys)``
    (e.g. ``reader.fetch``) and checks their checksums. A few kilobytes.

    Args:
        source: node of rows (``RawSample`` before decoding, or anything ``duration_fn`` measures).
        limits: the budgets, edges, batch sizes, schedule and probe as one checked group (`BucketLimits`;
            `AudioLoader` settles its own before the chain is built).
        restore: ``keys -> items`` for resuming (and for ``probe``); required to resume.
        drop_last: drop the partly filled batches at the end of the source.
        stats: optional `LoaderStats`: counts ``bucketed_batches``; what is held goes to
            ``stats.memory`` (holder ``"bucketer"``, shared with a `ShuffleBuffer` before this node given the same
            stats).
        duration_fn: ``item -> seconds`` (default: `row_seconds`).
        items: how the rows are read (`ItemFns`): ``key`` (default ``item.key``), ``checksum`` (default
            `item_checksum`) and ``size``, the bytes a row keeps alive (default `held_bytes`).

    `of` takes the first limits one by one (``max_duration``, ``boundaries``, ``max_batch_size``, ``max_bytes``,
    ``distinct``) and the item functions as ``key_fn`` and ``size_fn``.
    """

    HOLDER = "bucketer"

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode, limits: BucketLimits | None = None, *, restore: RestoreFn | None = None,
                 drop_last: bool = False, stats: LoaderStats | None = None,
                 duration_fn: Callable[[Any], float] = row_seconds, items: ItemFns = ROW_ITEMS,
                 **fields: Any) -> None:
        if fields or not isinstance(limits, BucketLimits):
            raise checks.node_fields("DurationBucketer", "its settings as one BucketLimits(max_duration, ...)", fields)
        super().__init__()
        if limits.probe and restore is None:
            raise ValueError("BucketLimits(probe=...) reads its rows by key: build the bucketer with restore= "
                             "(e.g. reader.fetch)")
        self.source = source
        self.limits = limits
        self.max_duration, self.boundaries = limits.max_duration, list(limits.boundaries)
        self.max_batch_size, self.max_bytes, self.distinct = limits.max_batch_size, limits.max_bytes, limits.distinct
        self.schedule = limits.schedule
        self.duration_fn = duration_fn
        self.restore = restore
        self.drop_last = bool(drop_last)
        self.items = items
        self.key_fn, self.size_fn, self.checksum_fn = items.key, items.size, items.checksum
        self.stats = stats
        held = stats.memory if stats is not None else HeldBytes()
        self._holding = held.holding(self.HOLDER)
        # The limits in the report (``stats()["memory"]["bucketer"]``), fixed for the node's life.
        self._holding.info.update(early_batches=0, max_bytes=self.max_bytes, distinct=self.distinct)
        if self.schedule is not None:
            self._holding.info.update(off_schedule=0, steps_per_round=self.schedule.steps_per_round)
        self._clear()

    @classmethod
    def of(cls, source: BaseNode, *, max_duration: float | None = None, boundaries: Sequence[float] = (),
           max_batch_size: int | None = None, duration_fn: Callable[[Any], float] = row_seconds,
           restore: RestoreFn | None = None, drop_last: bool = False,
           key_fn: Callable[[Any], Key] = item_key, stats: LoaderStats | None = None,
           max_bytes: int | None = None, distinct: bool = False,
           size_fn: Callable[[Any], int] = held_bytes) -> DurationBucketer:
        """A bucketer built from its settings one by one: ``max_duration``, ``boundaries``, ``max_batch_size``,
        ``max_bytes`` and ``distinct`` make its `BucketLimits` (the newer settings are only in the group),
        ``key_fn`` and ``size_fn`` its `ItemFns`; the rest as the constructor's."""
        limits = BucketLimits(max_duration, tuple(boundaries), max_batch_size, max_bytes, distinct)
        return cls(source, limits, restore=restore, drop_last=drop_last, stats=stats, duration_fn=duration_fn,
                   items=ItemFns(key=key_fn, size=size_fn))

    def _clear(self) -> None:
        self._holding.clear()
        self._buckets = _Buckets(self.limits.count)
        self._ready: deque[Any] = deque()  # rows and BatchEnd markers being handed out
        self._batches = 0
        self._step = 0  # with a schedule: the steps taken (batches handed out, the probe batch aside)
        self._probe_left = 0  # rows of the probe batch at the head of ``_ready``
        self._exhausted = False

    # ------------------------------------------------------------------ BaseNode

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._clear()
        if initial_state is None:
            self.source.reset(None)
            self._start_with_probe()
            return
        self._restore(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY])

    def next(self) -> Any:
        while not self._ready:
            if self.schedule is not None:
                if not self._take_step():
                    raise StopIteration
                continue
            if self._exhausted:
                if not self._flush_one():
                    raise StopIteration
                continue
            try:
                item = next(self.source)
            except StopIteration:
                self._exhausted = True
                continue
            self._add(item)
        item = self._ready.popleft()
        if not isinstance(item, BatchEnd):
            self._holding.add(-int(self.size_fn(item)), -1)
            self._probe_left = max(0, self._probe_left - 1)
        return item

    def get_state(self) -> dict[str, Any]:
        b = self._buckets
        held, seconds, tokens, queued = [], [], [], []
        for k in range(len(b.items)):
            for items, secs, toks in b.queued[k]:
                held += items
                seconds += secs
                tokens += toks
            held += b.items[k]
            seconds += b.seconds[k]
            tokens += b.tokens[k]
            queued.append([len(batch[0]) for batch in b.queued[k]])
        keys = [self.key_fn(item) for item in held]
        ready = [None if isinstance(item, BatchEnd) else self.key_fn(item) for item in self._ready]
        state = {
            self.SOURCE_KEY: self.source.state_dict(),
            "bucket_sizes": [len(bucket) for bucket in b.items],
            "indices": [k.index for k in keys], "passes": [k.pass_index for k in keys],
            "seconds": seconds,
            "ready": [None if k is None else [k.index, k.pass_index] for k in ready],
            # Each row's checksum was taken when it was read (`item_checksum` only fetches it).
            "checksums": [self.checksum_fn(item) for item in held]
                         + [self.checksum_fn(item) for item in self._ready if not isinstance(item, BatchEnd)],
            "batches": self._batches, "exhausted": self._exhausted,
        }
        # Newer fields only where used: a state of 0.3's options is as 0.3 wrote it.
        if self.limits.token_column is not None:
            state["tokens"] = tokens
        if self.schedule is not None:
            state.update(step=self._step, queued=queued)
        if self._probe_left:
            state["probe_left"] = self._probe_left
        return state

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """The rows in its buckets, then those of the batch it is handing out, less the probe batch's (a copy of
        rows read for it, not rows of the pass: see `audioloader.nodes.held`)."""
        held = as_keys(zip(state["indices"], state["passes"], strict=True))
        ready = [k for k in state["ready"] if k is not None]
        held += as_keys(ready[state.get("probe_left", 0):])
        return RowsHeld(state[cls.SOURCE_KEY], held)

    # ------------------------------------------------------------------ batching

    def _tokens(self, item: Any) -> float:
        column = self.limits.token_column
        if column is None:
            return 0.0
        value = item.extras.get(column)
        return 0.0 if value is None else float(value)

    def _add(self, item: Any) -> None:
        seconds, tokens = float(self.duration_fn(item)), self._tokens(item)
        limits, buckets = self.limits, self._buckets
        b = limits.bucket_of(seconds, tokens)
        cost = limits.cost(seconds)
        index = int(self.key_fn(item)[0])
        if self.distinct and index in buckets.indices[b]:
            self._close(b)  # the same utterance of another pass: not twice in one batch
        if limits.overflows(len(buckets.items[b]), buckets.costs[b], buckets.token_totals[b], cost, tokens):
            self._close(b)
        self._hold(b, item, seconds, tokens)
        limit = limits.size_limit(b)
        if limit is not None and len(buckets.items[b]) >= limit:
            self._close(b)
        while self.schedule is None and self.max_bytes is not None and sum(buckets.bytes) > self.max_bytes:
            fullest = max(range(len(buckets.bytes)), key=lambda k: (buckets.bytes[k], -k))
            self._close(fullest)
            self._holding.info["early_batches"] += 1

    def _hold(self, bucket: int, item: Any, seconds: float, tokens: float) -> None:
        size = int(self.size_fn(item))
        self._buckets.add(bucket, item, seconds, tokens, self.limits.cost(seconds), size, int(self.key_fn(item)[0]))
        self._holding.add(size)

    def _close(self, bucket: int) -> None:
        """The open batch of ``bucket`` is complete: it leaves now, or, ranks in step, waits for its turn."""
        batch = self._buckets.close(bucket)
        if self.schedule is not None:
            self._buckets.queued[bucket].append(batch)
        else:
            self._hand_out(bucket, batch[0])

    def _hand_out(self, bucket: int, items: list[Any]) -> None:
        self._buckets.bytes[bucket] -= sum(int(self.size_fn(item)) for item in items)
        self._ready.extend(items)
        self._ready.append(BatchEnd(self._batches))
        self._batches += 1
        if self.stats is not None:
            self.stats.count("bucketed_batches")

    def _flush_one(self) -> bool:
        """At the end of the source: hand out the first non-empty bucket (or drop it); False when none is left."""
        for b, items in enumerate(self._buckets.items):
            if items:
                if self.drop_last:
                    self._buckets.bytes[b] = 0
                    self._holding.add(-sum(int(self.size_fn(item)) for item in items), -len(items))
                    self._buckets.close(b)
                else:
                    self._close(b)
                return True
        return False

    def _take_step(self) -> bool:
        """Ranks in step: hand out step ``_step``'s batch (see the class doc); False when nothing is left."""
        buckets = self._buckets
        b = self.schedule.bucket_at(self._step)
        while not buckets.queued[b] and not self._exhausted and not self._over_budget():
            try:
                item = next(self.source)
            except StopIteration:
                self._exhausted = True
                break
            self._add(item)
        if not buckets.queued[b] and not (self._exhausted and buckets.items[b]):
            b = self._instead()
            if b is None:
                return False
            self._holding.info["off_schedule"] += 1
        if buckets.queued[b]:
            items = buckets.queued[b].popleft()[0]
        elif self.drop_last and self._exhausted:  # what is left at the end: partly filled batches
            for k, rows in enumerate(buckets.items):
                self._holding.add(-sum(int(self.size_fn(item)) for item in rows), -len(rows))
                buckets.bytes[k] = 0
                buckets.close(k)
            return False
        else:
            items = buckets.close(b)[0]
        self._step += 1
        self._hand_out(b, items)
        return True

    def _over_budget(self) -> bool:
        return self.max_bytes is not None and sum(self._buckets.bytes) > self.max_bytes

    def _instead(self) -> int | None:
        """The bucket a step takes when its own has no batch: the one with the most closed batches waiting, else
        (the source ended, or the byte budget is reached) the open batch holding the most bytes; None: empty."""
        buckets = self._buckets
        waiting = max(range(len(buckets.queued)), key=lambda k: (len(buckets.queued[k]), -k))
        if buckets.queued[waiting]:
            return waiting
        fullest = max(range(len(buckets.items)), key=lambda k: (buckets.bytes[k], len(buckets.items[k]), -k))
        return fullest if buckets.items[fullest] else None

    def _start_with_probe(self) -> None:
        """A fresh run with ``probe`` rows: they are its first batch."""
        if not self.limits.probe:
            return
        rows = list(self.restore([Key(int(i), 0) for i in self.limits.probe]))
        for row in rows:
            self._holding.add(int(self.size_fn(row)))
        self._ready.extend(rows)
        self._ready.append(BatchEnd(self._batches))
        self._batches += 1
        self._probe_left = len(rows)

    def _restore(self, state: dict[str, Any]) -> None:
        held = [Key(i, p) for i, p in zip(state["indices"], state["passes"], strict=True)]
        ready = [None if k is None else Key(*k) for k in state["ready"]]
        wanted = held + [k for k in ready if k is not None]
        if wanted and self.restore is None:
            raise ValueError("this DurationBucketer state holds keys; build the bucketer with restore= "
                             "(e.g. reader.fetch) to resume from it")
        items = list(self.restore(wanted)) if wanted else []
        if [self.key_fn(item) for item in items] != wanted:
            raise RuntimeError("DurationBucketer restore returned rows whose keys differ from the checkpoint's; "
                               "the data changed since the checkpoint was taken")
        verify_checksums(items, state.get("checksums"), self.checksum_fn, "duration bucketer")
        rows = iter(items)
        seconds = iter(state["seconds"])
        tokens = iter(state.get("tokens") or [0.0] * len(held))
        queued = state.get("queued") or [[] for _ in state["bucket_sizes"]]
        for b, (waiting, size) in enumerate(zip(queued, state["bucket_sizes"], strict=True)):
            for length in [*waiting, None]:
                for _ in range(size if length is None else length):
                    self._hold(b, next(rows), next(seconds), next(tokens))
                if length is not None:
                    self._buckets.queued[b].append(self._buckets.close(b))
        marker = state["batches"] - sum(k is None for k in ready)
        for k in ready:
            if k is None:
                self._ready.append(BatchEnd(marker))
                marker += 1
            else:
                row = next(rows)
                self._ready.append(row)
                self._holding.add(int(self.size_fn(row)))
        self._batches = state["batches"]
        self._exhausted = state["exhausted"]
        self._step = state.get("step", 0)
        self._probe_left = state.get("probe_left", 0)
