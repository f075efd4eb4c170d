"""DurationBucketer: batches of rows of similar duration, up to a total duration, resumable by keys."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from .. import checks
from ..dsp.audio import probe_seconds, span_seconds
from ..dsp.config import Segments
from ..dsp.hashing import item_checksum
from ..errors import DecodeError
from ..samples import BatchEnd, Key, RawSample, held_bytes, item_key
from ..stats import HeldBytes, LoaderStats
from .held import RowsHeld, as_keys
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


def estimate_boundaries(durations: Iterable[float], num_buckets: int) -> list[float]:
    """``num_buckets - 1`` duration boundaries that split ``durations`` into buckets of equal total duration.

    Deterministic (sorted durations, cumulative sums); every rank computes the
    same from the same rows. Duplicate boundaries (many equal durations) are merged.
    """
    values = np.sort(np.asarray(list(durations), dtype=np.float64))
    if len(values) == 0 or num_buckets <= 1:
        return []
    cumulative = np.cumsum(values)
    targets = cumulative[-1] * np.arange(1, num_buckets) / num_buckets
    cuts = values[np.searchsorted(cumulative, targets, side="left").clip(0, len(values) - 1)]
    return sorted({float(c) for c in cuts})


def fit_bucket_count(durations: Sequence[float], pass_seconds: float, max_duration: float,
                     max_batch_size: int | None, most: int, full_batches: int) -> int:
    """The number of duration buckets that lets each hold ``full_batches`` full batches of one pass, at most ``most``.

    ``durations``: a sample of the rows' durations (s); ``pass_seconds``: the audio in one pass of a rank (s). A
    full batch holds ``max_duration`` seconds, or ``max_batch_size`` rows of the mean duration when fewer. With
    more buckets than that, a bucket gets less than a batch per pass, and batches leave small: at the end of an
    evaluation pass, or when a row comes back for the next pass (``distinct``). At least 1.
    """
    if len(durations) == 0 or pass_seconds <= 0:
        return 1
    mean = float(np.mean(durations))
    batch_seconds = max_duration if max_batch_size is None else min(max_duration, max_batch_size * mean)
    if batch_seconds <= 0:
        return 1
    return max(1, min(most, int(pass_seconds // (full_batches * batch_seconds))))


class _Buckets:
    """The rows held per bucket: the items, their durations, their bytes and (for ``distinct``) their indices."""

    def __init__(self, count: int) -> None:
        self.items: list[list[Any]] = [[] for _ in range(count)]
        self.seconds: list[list[float]] = [[] for _ in range(count)]
        self.totals = [0.0] * count
        self.bytes = [0] * count
        self.indices: list[set[int]] = [set() for _ in range(count)]

    def add(self, bucket: int, item: Any, seconds: float, size: int, index: int) -> None:
        self.items[bucket].append(item)
        self.seconds[bucket].append(seconds)
        self.totals[bucket] += seconds
        self.bytes[bucket] += size
        self.indices[bucket].add(index)

    def take(self, bucket: int) -> list[Any]:
        items = self.items[bucket]
        self.items[bucket], self.seconds[bucket], self.totals[bucket] = [], [], 0.0
        self.bytes[bucket], self.indices[bucket] = 0, set()
        return items


def plan(durations: Iterable[float], boundaries: Sequence[float], max_duration: float,
         max_batch_size: int | None, drop_last: bool = False) -> list[int]:
    """Batch sizes `DurationBucketer` forms from rows of these durations, in this order, to the end.

    The same rules as the node, without audio: used to know in advance how
    many batches each rank's evaluation pass has.
    """
    sizes: list[int] = []
    counts = [0] * (len(boundaries) + 1)
    totals = [0.0] * (len(boundaries) + 1)
    for seconds in durations:
        b = bisect.bisect_right(boundaries, seconds)
        if counts[b] and totals[b] + seconds > max_duration:
            sizes.append(counts[b])
            counts[b], totals[b] = 0, 0.0
        counts[b] += 1
        totals[b] += seconds
        if max_batch_size is not None and counts[b] >= max_batch_size:
            sizes.append(counts[b])
            counts[b], totals[b] = 0, 0.0
    if not drop_last:
        sizes.extend(c for c in counts if c)
    return sizes


@dataclass(frozen=True)
class BucketLimits:
    """A `DurationBucketer`'s settings, checked once, here: ``max_duration`` seconds of audio a batch (> 0);
    ``boundaries`` the bucket edges in seconds, ascending; ``max_batch_size`` rows a batch at most (None: no
    limit); ``max_bytes`` of rows held in buckets (None: no byte bound); ``distinct``: no batch holds an index
    twice (see `DurationBucketer`)."""

    max_duration: float
    boundaries: tuple[float, ...] = ()
    max_batch_size: int | None = None
    max_bytes: int | None = None
    distinct: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.max_duration, (int, float)) and self.max_duration > 0):
            raise ValueError(f"max_duration={self.max_duration!r}: must be a positive number of seconds")
        checks.count("max_batch_size", self.max_batch_size, allow_none=True)
        edges = tuple(float(b) for b in self.boundaries)
        if list(edges) != sorted(edges):
            raise ValueError(f"boundaries={list(self.boundaries)!r}: must be ascending")
        checks.count("max_bytes", self.max_bytes, allow_none=True)
        object.__setattr__(self, "max_duration", float(self.max_duration))
        object.__setattr__(self, "boundaries", edges)
        object.__setattr__(self, "distinct", bool(self.distinct))


class DurationBucketer(BaseNode):
    """Groups rows into batches of similar duration, as Lhotse's DynamicBucketingSampler does.

    Each incoming row goes to the bucket of its duration (``boundaries``: the
    upper edges, see `estimate_boundaries`). A bucket becomes a batch when the
    next row would take its total duration past ``max_duration`` seconds (the
    bucket is emitted first and the row starts the next batch) or when it holds
    ``max_batch_size`` rows. A batch leaves as its rows, in arrival order, then a
    `BatchEnd` marker, which the decode stage passes through and the `Batcher`
    closes the batch at. When the source ends (an evaluation pass), the partly
    filled buckets leave too, in bucket order (``drop_last`` drops them).

    Two more rules bound what it holds, both functions of the rows only:
    ``max_bytes``: when the rows held take more bytes than this (``size_fn``), the
    bucket holding the most bytes leaves at once, as a smaller batch (counted in
    ``stats()["memory"]["bucketer"]["early_batches"]``); ``distinct``: a row whose
    index its bucket already holds (the same utterance from another pass) closes
    that bucket first, so no batch holds an utterance twice.

    Batches are a pure function of the input order: put a seeded `ShuffleBuffer`
    before this node for random batches in training. Rows from similar-duration
    buckets pad little: with 16 buckets more than 90 % of a padded batch is audio
    (tested; see docs/benchmarks.md).

    State: the keys and durations of the rows held in buckets and of the batch
    being handed out, their audio checksums (taken when each row was read), and the
    source's state; ``reset(state)`` reads the rows back through ``restore(keys)``
    (e.g. ``reader.fetch``) and checks their checksums. A few kilobytes.

    Args:
        source: node of rows (``RawSample`` before decoding, or anything ``duration_fn`` measures).
        max_duration: seconds of audio per batch (the sum of the rows' durations).
        boundaries: bucket edges in seconds, ascending.
        max_batch_size: most rows per batch (None: no limit).
        duration_fn: ``item -> seconds`` (default: `row_seconds`).
        restore: ``keys -> items`` for resuming; required to resume.
        drop_last: drop the partly filled batches at the end of the source.
        key_fn: ``item -> Key`` (default ``item.key``).
        stats: optional `LoaderStats`: counts ``bucketed_batches``; what is held goes to
            ``stats.memory`` (holder ``"bucketer"``) unless ``held`` is given.
        max_bytes: most bytes of rows held in buckets (None: no byte bound; see above).
        distinct: close a bucket before it would hold an index twice (see above).
        size_fn: ``item -> bytes`` it keeps alive (default `held_bytes`).
        held: the `HeldBytes` to record into (shared with a `ShuffleBuffer` before this node).
        limits: ``max_duration``, ``boundaries``, ``max_batch_size``, ``max_bytes`` and ``distinct`` as one checked
            group (`BucketLimits`; `AudioLoader` settles its own before the chain is built), instead of one by one.
    """

    HOLDER = "bucketer"

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode, *, max_duration: float | None = None, boundaries: Sequence[float] = (),
                 max_batch_size: int | None = None, duration_fn: Callable[[Any], float] = row_seconds,
                 restore: RestoreFn | None = None, drop_last: bool = False,
                 key_fn: Callable[[Any], Key] = item_key, stats: LoaderStats | None = None,
                 max_bytes: int | None = None, distinct: bool = False, size_fn: Callable[[Any], int] = held_bytes,
                 held: HeldBytes | None = None, limits: BucketLimits | None = None) -> None:
        super().__init__()
        if limits is None:
            limits = BucketLimits(max_duration, tuple(boundaries), max_batch_size, max_bytes, distinct)
        elif (max_duration, tuple(boundaries), max_batch_size, max_bytes, distinct) != (None, (), None, None, False):
            raise ValueError("DurationBucketer(limits=..., max_duration=/boundaries=/max_batch_size=/max_bytes=/"
                             "distinct=...): give each once, in BucketLimits(...)")
        self.source = source
        self.limits = limits
        self.max_duration, self.boundaries = limits.max_duration, list(limits.boundaries)
        self.max_batch_size, self.max_bytes, self.distinct = limits.max_batch_size, limits.max_bytes, limits.distinct
        self.duration_fn = duration_fn
        self.restore = restore
        self.drop_last = bool(drop_last)
        self.key_fn = key_fn
        self.stats = stats
        self.size_fn = size_fn
        if held is None:
            held = stats.memory if stats is not None else HeldBytes()
        self._holding = held.holding(self.HOLDER)
        # The limits in the report (``stats()["memory"]["bucketer"]``), fixed for the node's life.
        self._holding.info.update(early_batches=0, max_bytes=self.max_bytes, distinct=self.distinct)
        self._clear()

    def _clear(self) -> None:
        self._holding.clear()
        self._buckets = _Buckets(len(self.boundaries) + 1)
        self._ready: deque[Any] = deque()  # rows and BatchEnd markers being handed out
        self._batches = 0
        self._exhausted = False

    # ------------------------------------------------------------------ BaseNode

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._clear()
        if initial_state is None:
            self.source.reset(None)
            return
        self._restore(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY])

    def next(self) -> Any:
        while not self._ready:
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
        return item

    def get_state(self) -> dict[str, Any]:
        held = [item for bucket in self._buckets.items for item in bucket]
        keys = [self.key_fn(item) for item in held]
        ready = [None if isinstance(item, BatchEnd) else self.key_fn(item) for item in self._ready]
        return {
            self.SOURCE_KEY: self.source.state_dict(),
            "bucket_sizes": [len(bucket) for bucket in self._buckets.items],
            "indices": [k.index for k in keys], "passes": [k.pass_index for k in keys],
            "seconds": [s for bucket in self._buckets.seconds for s in bucket],
            "ready": [None if k is None else [k.index, k.pass_index] for k in ready],
            # Each row's checksum was taken when it was read (`item_checksum` only fetches it).
            "checksums": [item_checksum(item) for item in held]
                         + [item_checksum(item) for item in self._ready if not isinstance(item, BatchEnd)],
            "batches": self._batches, "exhausted": self._exhausted,
        }

    def rows_held(self, state: dict[str, Any]) -> RowsHeld:
        """The rows in its buckets, then those of the batch it is handing out (see `audioloader.nodes.held`)."""
        held = as_keys(zip(state["indices"], state["passes"], strict=True))
        held += as_keys([k for k in state["ready"] if k is not None])
        return RowsHeld(self.source, state[self.SOURCE_KEY], held)

    # ------------------------------------------------------------------ batching

    def _add(self, item: Any) -> None:
        seconds = float(self.duration_fn(item))
        b = bisect.bisect_right(self.boundaries, seconds)
        index = int(self.key_fn(item)[0])
        if self.distinct and index in self._buckets.indices[b]:
            self._emit(b)  # the same utterance of another pass: not twice in one batch
        if self._buckets.items[b] and self._buckets.totals[b] + seconds > self.max_duration:
            self._emit(b)
        self._hold(b, item, seconds)
        if self.max_batch_size is not None and len(self._buckets.items[b]) >= self.max_batch_size:
            self._emit(b)
        while self.max_bytes is not None and sum(self._buckets.bytes) > self.max_bytes:
            fullest = max(range(len(self._buckets.bytes)), key=lambda k: (self._buckets.bytes[k], -k))
            self._emit(fullest)
            self._holding.info["early_batches"] += 1

    def _hold(self, bucket: int, item: Any, seconds: float) -> None:
        size = int(self.size_fn(item))
        self._buckets.add(bucket, item, seconds, size, int(self.key_fn(item)[0]))
        self._holding.add(size)

    def _emit(self, bucket: int) -> None:
        self._ready.extend(self._buckets.take(bucket))
        self._ready.append(BatchEnd(self._batches))
        self._batches += 1
        if self.stats is not None:
            self.stats.count("bucketed_batches")

    def _flush_one(self) -> bool:
        """At the end of the source: hand out the first non-empty bucket (or drop it); False when none is left."""
        for b, items in enumerate(self._buckets.items):
            if items:
                if self.drop_last:
                    self._buckets.take(b)
                else:
                    self._emit(b)
                return True
        return False

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
        verify_checksums(items, state.get("checksums"), item_checksum, "duration bucketer")
        rows = iter(items)
        seconds = iter(state["seconds"])
        for b, size in enumerate(state["bucket_sizes"]):
            for _ in range(size):
                self._hold(b, next(rows), next(seconds))
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
