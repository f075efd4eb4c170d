"""Grouped options of `AudioLoader`: how batches are formed, shuffled and computed.

Each group is a small frozen dataclass; ``None`` fields take the mode's preset
(see `AudioLoader`). What the samples look like (features, length) is in
`audioloader.dsp.config`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

WORKER_KINDS = ("auto", "thread", "process")
START_METHODS = ("fork", "forkserver", "spawn")


def _bad(group: Any, name: str, why: str) -> ValueError:
    return ValueError(f"{type(group).__name__}.{name}={getattr(group, name)!r}: {why}")


def _positive_int_or_none(group: Any, name: str, minimum: int = 1, allow_none: bool = True) -> None:
    value = getattr(group, name)
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(group, name, f"must be an integer >= {minimum}" + (" or None" if allow_none else ""))


@dataclass(frozen=True)
class Bucketing:
    """Batches by total duration, from buckets of rows of similar duration (`DurationBucketer`).

    For whole utterances (``LengthPolicy(crop=None)``): instead of ``batch_size``
    samples, a batch holds up to ``max_duration`` seconds of audio, taken from
    one of ``num_buckets`` duration buckets, so it pads little. Like Lhotse's
    ``DynamicBucketingSampler``; a pure function of the seed and the input order,
    and resumable exactly.

    Attributes:
        max_duration: seconds of audio per batch (the sum of its rows' durations).
        max_batch_size: most rows per batch (None: no limit).
        num_buckets: duration buckets; their edges split the rows' durations into
            parts of equal total duration.
        boundaries: explicit bucket edges in seconds (ascending), instead of estimating them.
        estimate_rows: rows, evenly spread over the source, whose durations estimate the edges.
        duration_column: a float column of durations in seconds used where the
            shards have it (``audioloader pack`` writes ``duration``); otherwise
            each row's duration comes from its audio header (no decoding).
    """

    max_duration: float
    max_batch_size: int | None = None
    num_buckets: int = 16
    boundaries: tuple[float, ...] | None = None
    estimate_rows: int = 2000
    duration_column: str | None = "duration"

    def __post_init__(self) -> None:
        if not (isinstance(self.max_duration, (int, float)) and math.isfinite(self.max_duration)
                and self.max_duration > 0):
            raise _bad(self, "max_duration", "must be a positive number of seconds")
        _positive_int_or_none(self, "max_batch_size")
        if isinstance(self.num_buckets, bool) or not isinstance(self.num_buckets, int) or self.num_buckets < 1:
            raise _bad(self, "num_buckets", "must be an integer >= 1")
        if self.boundaries is not None:
            edges = list(self.boundaries)
            if edges != sorted(edges) or any(not math.isfinite(e) or e <= 0 for e in edges):
                raise _bad(self, "boundaries", "must be ascending positive seconds")
            object.__setattr__(self, "boundaries", tuple(float(e) for e in edges))
        _positive_int_or_none(self, "estimate_rows")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Shuffle:
    """The shuffle buffer: how much it holds, in rows and in bytes, and how soon the first batch leaves.

    ``buffer_size``: most rows held; ``max_bytes``: most bytes held by the buffer and
    a bucketer after it together (raw rows count their own audio copies, none for
    memory-mapped Arrow IPC shards; decoded samples their features; see
    docs/concepts.md, "Memory"). ``min_size`` rows or ``min_bytes`` bytes, whichever
    comes first, are held before the first item leaves (the first batch waits for no
    more). None takes the mode's preset: train 10000 rows / 256 MiB, first fill 8000
    rows / 32 MiB; eval 1 / 0 (no shuffle). A buffer never holds two passes (one source,
    training): a corpus smaller than the buffer is shuffled whole each pass.

    ``before_decode``: hold raw rows and decode after the buffer (far less memory,
    fast resume, same batches); None: yes for local Arrow IPC shards, remote shards,
    and with ``batching=`` (the bucketer groups rows before they are decoded).

    ``interleave``: splits the reader reads at once, taking one row of each in turn
    (a seeded order each round; `ArrowShardReader`), so that consecutive rows rarely
    come from one split and a small buffer mixes far better (docs/lakehouse.md,
    "Interleaving"). 1: one split after the other. None: the preset (4 with
    ``batching=``, else 1). Costs a record batch / row group / stripe in memory per
    split read at once (nothing for memory-mapped IPC shards).
    """

    buffer_size: int | None = None
    min_size: int | None = None
    before_decode: bool | None = None
    interleave: int | None = None
    max_bytes: int | None = None
    min_bytes: int | None = None

    def __post_init__(self) -> None:
        _positive_int_or_none(self, "buffer_size")
        _positive_int_or_none(self, "min_size", minimum=0)
        _positive_int_or_none(self, "interleave")
        _positive_int_or_none(self, "max_bytes")
        _positive_int_or_none(self, "min_bytes", minimum=0)


@dataclass(frozen=True)
class Workers:
    """Who decodes: ``num_workers`` workers of ``kind`` ``"process"``, ``"thread"`` or ``"auto"``.

    ``"auto"``: processes on machines with 2 cores or more (threads when
    ``augment`` cannot be pickled). ``num_workers`` None: one per core for
    processes; threads 2 per core up to the preset (8 train, 4 eval).
    ``start_method``: how processes start (None: a fork while no other Python
    thread runs, else a fork server). ``prefetch_batches``: batches prepared ahead.
    """

    num_workers: int | None = None
    kind: str = "auto"
    start_method: str | None = None
    prefetch_batches: int = 2

    def __post_init__(self) -> None:
        _positive_int_or_none(self, "num_workers", minimum=0)
        if self.kind not in WORKER_KINDS:
            raise _bad(self, "kind", f"must be one of {WORKER_KINDS}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise _bad(self, "start_method", f"must be one of {START_METHODS} or None")
        _positive_int_or_none(self, "prefetch_batches")


def merge(group: Any, **legacy: Any) -> Any:
    """``group`` with the fields given as individual keyword arguments (not None) filled in.

    A field given both ways with different values is a ``ValueError`` naming both.
    """
    changes = {}
    for field, value in legacy.items():
        if value is None:
            continue
        current = getattr(group, field)
        default = next(f.default for f in dataclasses.fields(group) if f.name == field)
        if current != default and current != value:
            raise ValueError(f"{field}={value!r} conflicts with {type(group).__name__}({field}={current!r}); "
                             "give it once")
        changes[field] = value
    return dataclasses.replace(group, **changes) if changes else group
