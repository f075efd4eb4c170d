"""The rules a `DurationBucketer` batches by, without audio, and the estimates its settings are made from.

Which bucket a row goes to (its duration, and with a token column its tokens per second: 2-D buckets), what a
row costs against each budget (``d + d²/Q`` seconds, tokens), when a bucket becomes a batch (a budget, or its
own batch size), which bucket every rank takes its batch from at a step when ranks are kept in step
(`BucketSchedule`), and what `chain.settle` estimates from a sample of rows: edges over duration and over tokens
per second, the batches each bucket gives one rank's pass, and the most expensive batch a bucket can make.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import checks
from ..dsp.hashing import SALT_SYNC, permutation
from ..samples import Key
from .rows import fetch_rows

#: The most duration buckets `Bucketing` uses when ``num_buckets`` is None (fewer on small data, see
#: `FULL_BATCHES_PER_BUCKET`). Measured: on 1-20 s utterances, batches of 200 s pad 0.959 of their frames with
#: 32 buckets against 0.926 with 16 (docs/benchmarks.md, speech).
DEFAULT_NUM_BUCKETS = 32
#: With ``num_buckets`` None, the buckets are as many as let each get this many full batches of one rank's pass
#: (at most `DEFAULT_NUM_BUCKETS`, at least 1). 32 buckets over 112 s of audio got 3.5 s each, and gave batches of
#: one or two utterances where ``max_duration=200`` asked for 200 s. Measured (1-20 s utterances, 200 s batches,
#: train, one pass in the buffer): on 595 s, 32 buckets filled batches to 0.09 of 200 s, 2 (this rule) to 0.81, 4
#: to 0.74; on 6,237 s, 32 buckets filled them to 0.89 and 0.955 of their frames were audio, 31 (this rule) 0.84
#: and 0.953, where 4 batches a bucket (7 buckets) would give only 0.862. One batch a bucket keeps large data at 32.
FULL_BATCHES_PER_BUCKET = 1


@dataclass(frozen=True)
class BucketSchedule:
    """Ranks in step: the bucket every rank takes its batch from at each step, a pure function of (seed, round,
    step), the same on every rank without communication.

    ``counts[b]``: the batches bucket ``b`` gives one rank's pass (estimated from a sample of rows, the same on
    every rank, `expected_batches`). A round is ``sum(counts)`` steps; in round ``k`` the buckets come in a seeded
    random order of that multiset, which is drawing each step's bucket with probability proportional to the
    batches each bucket still has to give in the round (what the buckets still hold, as every rank knows it).
    """

    counts: tuple[int, ...]
    seed: int

    def __post_init__(self) -> None:
        counts = tuple(int(c) for c in self.counts)
        if not counts or min(counts) < 0 or sum(counts) == 0:
            raise ValueError(f"BucketSchedule.counts={list(self.counts)!r}: must be batches >= 0, not all 0")
        object.__setattr__(self, "counts", counts)

    @property
    def steps_per_round(self) -> int:
        return sum(self.counts)

    def bucket_at(self, step: int) -> int:
        """The bucket of step ``step`` (0-based, counted from the start of the stream)."""
        round_index, position = divmod(int(step), self.steps_per_round)
        return int(_round_order(self.counts, self.seed, round_index)[position])


@functools.lru_cache(maxsize=8)
def _round_order(counts: tuple[int, ...], seed: int, round_index: int) -> np.ndarray:
    """The buckets of round ``round_index`` in order: each bucket ``counts[b]`` times, seeded."""
    buckets = np.repeat(np.arange(len(counts)), counts)
    return buckets[permutation(len(buckets), seed, SALT_SYNC, round_index)]


@dataclass(frozen=True)
class BucketLimits:
    """A `DurationBucketer`'s settings, checked once, here.

    ``max_duration``: seconds a batch (its rows' costs summed; None: no such budget); ``boundaries``: the
    duration edges in seconds, ascending; ``max_batch_size``: rows a batch at most (None: no limit);
    ``max_bytes``: bytes of rows held (None: no bound); ``distinct``: no batch holds an index twice.
    ``quadratic_duration`` Q: a row of ``d`` seconds costs ``d + d²/Q`` against ``max_duration`` (None: ``d``);
    ``max_tokens``: tokens a batch (summed; None: no such budget); ``token_column``: the rows' integer column
    of tokens (read from ``RawSample.extras``); ``token_boundaries``: with a token column, one tuple of
    tokens-per-second edges per duration bucket, all of one length (2-D buckets, numbered duration-major);
    ``batch_sizes``: a batch size per bucket (the rows a batch of that bucket holds at most, beside the
    budgets); ``schedule``: ranks in step (`BucketSchedule`; None: each bucket leaves when it is full);
    ``probe``: global indices of the rows of a first, most expensive batch (``Bucketing(first="largest")``).
    """

    max_duration: float | None
    boundaries: tuple[float, ...] = ()
    max_batch_size: int | None = None
    max_bytes: int | None = None
    distinct: bool = False
    quadratic_duration: float | None = None
    max_tokens: int | None = None
    token_column: str | None = None
    token_boundaries: tuple[tuple[float, ...], ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    schedule: BucketSchedule | None = None
    probe: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_duration is not None:
            ok = isinstance(self.max_duration, (int, float)) and math.isfinite(self.max_duration)
            if not (ok and self.max_duration > 0):
                raise ValueError(f"max_duration={self.max_duration!r}: must be a positive number of seconds")
            object.__setattr__(self, "max_duration", float(self.max_duration))
        checks.count("max_batch_size", self.max_batch_size, allow_none=True)
        edges = tuple(float(b) for b in self.boundaries)
        if list(edges) != sorted(edges):
            raise ValueError(f"boundaries={list(self.boundaries)!r}: must be ascending")
        checks.count("max_bytes", self.max_bytes, allow_none=True)
        checks.positive_number("quadratic_duration", self.quadratic_duration, allow_none=True, unit="seconds")
        checks.count("max_tokens", self.max_tokens, allow_none=True)
        object.__setattr__(self, "boundaries", edges)
        object.__setattr__(self, "distinct", bool(self.distinct))
        if self.token_boundaries is not None:
            grid = tuple(tuple(float(e) for e in row) for row in self.token_boundaries)
            if len(grid) != len(edges) + 1 or len({len(row) for row in grid}) != 1:
                raise ValueError(f"token_boundaries: one tuple of tokens-per-second edges per duration bucket "
                                 f"({len(edges) + 1}), all of one length; got {len(grid)} of lengths "
                                 f"{sorted({len(row) for row in grid})}")
            if any(list(row) != sorted(row) for row in grid):
                raise ValueError("token_boundaries: each duration bucket's edges must be ascending")
            object.__setattr__(self, "token_boundaries", grid)
        if self.batch_sizes is not None:
            sizes = tuple(checks.count("batch_sizes[]", s) for s in self.batch_sizes)
            if len(sizes) != self.count:
                raise ValueError(f"batch_sizes has {len(sizes)} sizes for {self.count} buckets: give one per bucket")
            object.__setattr__(self, "batch_sizes", sizes)
        if self.max_duration is None and self.max_tokens is None and self.batch_sizes is None \
                and self.max_batch_size is None:
            raise ValueError("a bucketer needs a limit: max_duration, max_tokens, batch_sizes or max_batch_size")
        if self.schedule is not None and len(self.schedule.counts) != self.count:
            raise ValueError(f"schedule has counts for {len(self.schedule.counts)} buckets, not {self.count}")

    @property
    def per_duration(self) -> int:
        """Buckets per duration bucket: the tokens-per-second buckets (1 without a token column)."""
        return 1 if self.token_boundaries is None else len(self.token_boundaries[0]) + 1

    @property
    def count(self) -> int:
        """Buckets in all."""
        return (len(self.boundaries) + 1) * self.per_duration

    def cost(self, seconds: float) -> float:
        """What a row of ``seconds`` counts against ``max_duration``: ``d + d²/Q`` (Lhotse's quadratic_duration)."""
        q = self.quadratic_duration
        return seconds if q is None else seconds + seconds * seconds / q

    def bucket_of(self, seconds: float, tokens: float = 0.0) -> int:
        """The bucket of a row: its duration's, and within it (2-D) its tokens per second's."""
        d = bisect.bisect_right(self.boundaries, seconds)
        if self.token_boundaries is None:
            return d
        rate = tokens / seconds if seconds > 0 else 0.0
        return d * self.per_duration + bisect.bisect_right(self.token_boundaries[d], rate)

    def size_limit(self, bucket: int) -> int | None:
        """The most rows a batch of ``bucket`` holds: its batch size, else ``max_batch_size`` (None: no limit)."""
        if self.batch_sizes is not None:
            size = self.batch_sizes[bucket]
            return size if self.max_batch_size is None else min(size, self.max_batch_size)
        return self.max_batch_size

    def overflows(self, rows: int, cost: float, tokens: float, row_cost: float, row_tokens: float) -> bool:
        """Whether a batch of ``rows`` rows costing ``cost`` s and holding ``tokens`` would pass a budget with one more
        row (``row_cost``, ``row_tokens``). An empty batch takes any row (a row over a budget is a batch alone)."""
        if not rows:
            return False
        if self.max_duration is not None and cost + row_cost > self.max_duration:
            return True
        return self.max_tokens is not None and tokens + row_tokens > self.max_tokens


def plan(durations: Iterable[float], boundaries: Sequence[float] = (), max_duration: float | None = None,
         max_batch_size: int | None = None, drop_last: bool = False, *, limits: BucketLimits | None = None,
         tokens: Iterable[float] | None = None) -> list[int]:
    """Batch sizes `DurationBucketer` forms from rows of these durations (and ``tokens``), in this order, to the
    end, with each bucket leaving when full (no schedule).

    The same rules as the node, without audio: used to know in advance how many batches each rank's evaluation
    pass has. ``limits`` (a `BucketLimits`) instead of ``boundaries``, ``max_duration`` and ``max_batch_size``.
    """
    if limits is None:
        limits = BucketLimits(max_duration, tuple(boundaries), max_batch_size)
    sizes: list[int] = []
    n = limits.count
    counts, costs, held_tokens = [0] * n, [0.0] * n, [0.0] * n
    token_values = iter(tokens) if tokens is not None else None
    for seconds in durations:
        row_tokens = float(next(token_values)) if token_values is not None else 0.0
        b = limits.bucket_of(seconds, row_tokens)
        row_cost = limits.cost(seconds)
        if limits.overflows(counts[b], costs[b], held_tokens[b], row_cost, row_tokens):
            sizes.append(counts[b])
            counts[b], costs[b], held_tokens[b] = 0, 0.0, 0.0
        counts[b] += 1
        costs[b] += row_cost
        held_tokens[b] += row_tokens
        limit = limits.size_limit(b)
        if limit is not None and counts[b] >= limit:
            sizes.append(counts[b])
            counts[b], costs[b], held_tokens[b] = 0, 0.0, 0.0
    if not drop_last:
        sizes.extend(c for c in counts if c)
    return sizes


# -- estimates from a sample of rows (`chain.settle`) ----------------------------------------------------------


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


def estimate_token_boundaries(durations: Sequence[float], tokens: Sequence[float], boundaries: Sequence[float],
                              per_duration: int) -> tuple[tuple[float, ...], ...]:
    """Tokens-per-second edges within each duration bucket (NeMo's ``estimate_duration_bins_2d`` idea): each
    duration bucket's sampled rows, by tokens per second, split into ``per_duration`` parts of equal total tokens
    (as durations are split into equal total duration), so the few dense transcripts, which hold many tokens,
    get a bucket of their own and pad no batch of sparse ones. One tuple of ``per_duration - 1`` ascending edges
    per duration bucket (a duration bucket with no sampled row: +inf, all its rows in its first part)."""
    seconds = np.asarray(durations, dtype=np.float64)
    counts = np.asarray(tokens, dtype=np.float64)
    rates = counts / np.maximum(seconds, 1e-9)
    which = np.searchsorted(np.asarray(boundaries, dtype=np.float64), seconds, side="right")
    grid = []
    for d in range(len(boundaries) + 1):
        order = np.argsort(rates[which == d], kind="stable")
        mine, held = rates[which == d][order], counts[which == d][order]
        if len(mine) == 0 or per_duration <= 1 or held.sum() <= 0:
            grid.append(tuple([math.inf] * (per_duration - 1)))
            continue
        cumulative = np.cumsum(held)
        targets = cumulative[-1] * np.arange(1, per_duration) / per_duration
        cuts = mine[np.searchsorted(cumulative, targets, side="left").clip(0, len(mine) - 1)]
        grid.append(tuple(float(c) for c in cuts))
    return tuple(grid)


def fit_bucket_count(durations: Sequence[float], pass_seconds: float, max_duration: float | None,
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
    limits = [x for x in (max_duration, None if max_batch_size is None else max_batch_size * mean) if x is not None]
    batch_seconds = min(limits) if limits else 0.0
    if batch_seconds <= 0:
        return 1
    return max(1, min(most, int(pass_seconds // (full_batches * batch_seconds))))


def rows_per_batch(limits: BucketLimits, bucket: int, seconds: np.ndarray, tokens: np.ndarray) -> float:
    """About how many rows a batch of ``bucket`` holds, given sampled rows of it (``seconds``, ``tokens``): its
    size limit or what its budgets take of the mean row, whichever is fewer; at least 1."""
    bounds = [math.inf]
    limit = limits.size_limit(bucket)
    if limit is not None:
        bounds.append(limit)
    if limits.max_duration is not None and len(seconds):
        cost = float(np.mean([limits.cost(s) for s in seconds]))
        bounds.append(max(1.0, math.floor(limits.max_duration / max(cost, 1e-9))))
    if limits.max_tokens is not None and len(tokens) and float(np.mean(tokens)) > 0:
        bounds.append(max(1.0, math.floor(limits.max_tokens / float(np.mean(tokens)))))
    return max(1.0, min(bounds)) if min(bounds) < math.inf else 1.0


def expected_batches(limits: BucketLimits, durations: Sequence[float], tokens: Sequence[float],
                     rank_rows: float) -> tuple[int, ...]:
    """The batches each bucket gives one rank's pass of ``rank_rows`` rows, estimated from a sample of rows
    (``durations``, ``tokens``: the same on every rank); a bucket that holds any sampled row gives at least 1."""
    seconds = np.asarray(durations, dtype=np.float64)
    toks = np.asarray(tokens, dtype=np.float64) if len(tokens) else np.zeros_like(seconds)
    which = np.array([limits.bucket_of(s, t) for s, t in zip(seconds, toks, strict=True)], dtype=np.int64)
    counts = []
    for b in range(limits.count):
        mine = which == b
        sampled = int(mine.sum())
        if not sampled:
            counts.append(0)
            continue
        rows = rank_rows * sampled / len(seconds)
        counts.append(max(1, round(rows / rows_per_batch(limits, b, seconds[mine], toks[mine]))))
    if sum(counts) == 0:
        counts[0] = 1
    return tuple(counts)


def largest_batch(limits: BucketLimits, indices: Sequence[int], durations: Sequence[float],
                  tokens: Sequence[float]) -> tuple[int, ...]:
    """The rows (global indices, from a sample) of the most expensive batch a bucket can make: for each bucket,
    its sampled rows, most expensive first, as many as its limits take (cycled when the sample holds fewer rows
    than its batch size); the one whose padded audio (rows × longest) is largest, with its tokens breaking ties."""
    seconds = np.asarray(durations, dtype=np.float64)
    toks = np.asarray(tokens, dtype=np.float64) if len(tokens) else np.zeros_like(seconds)
    which = [limits.bucket_of(s, t) for s, t in zip(seconds, toks, strict=True)]
    best: tuple[float, float, tuple[int, ...]] = (-1.0, -1.0, ())
    for b in range(limits.count):
        mine = sorted((k for k in range(len(which)) if which[k] == b),
                      key=lambda k: (-limits.cost(seconds[k]), -toks[k], indices[k]))
        if not mine:
            continue
        rows, cost, held = [], 0.0, 0.0
        limit = limits.size_limit(b)
        while limit is None or len(rows) < limit:
            k = mine[len(rows) % len(mine)]
            if limits.overflows(len(rows), cost, held, limits.cost(seconds[k]), toks[k]):
                break
            if limit is None and len(rows) >= len(mine):
                break  # no size limit: each sampled row once
            rows.append(k)
            cost += limits.cost(seconds[k])
            held += toks[k]
        padded = len(rows) * max(seconds[k] for k in rows)
        padded_tokens = len(rows) * max(toks[k] for k in rows)
        if (padded, padded_tokens) > best[:2]:
            best = (padded, padded_tokens, tuple(int(indices[k]) for k in rows))
    return best[2]


def bucket_shares(limits: BucketLimits, durations: Sequence[float], tokens: Sequence[float]) -> tuple[float, ...]:
    """Each bucket's share of the sampled rows (``stats()[\"bucketing\"][\"shares\"]``)."""
    counts = np.zeros(limits.count)
    toks = tokens if len(tokens) else [0.0] * len(durations)
    for seconds, row_tokens in zip(durations, toks, strict=True):
        counts[limits.bucket_of(seconds, row_tokens)] += 1
    return tuple(float(c) for c in counts / max(1, len(durations)))


# -- the settled buckets of a loader (`chain.settle`; ``settings``: its `options.Settings`, ``sources``: its
# `chain.Sources`) ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Buckets:
    """The buckets of a loader with bucketing (`chain.duration_buckets`).

    ``count``: duration buckets asked for (the edges may be fewer: equal durations merge); ``boundaries``: their
    edges in seconds; ``fitted``: the count was fitted to the data (``Bucketing(num_buckets=None)``);
    ``pass_seconds``: the estimated seconds of audio in one pass of a rank (None when the edges were given).
    With a token column: ``token_boundaries``, the tokens-per-second edges within each duration bucket. ``shares``:
    each bucket's share of the sampled rows; ``schedule``: ranks in step, the batches each bucket gives a rank's
    pass (`nodes.bucket_rules.BucketSchedule.counts`; None: not in step); ``probe``: the rows of the first batch
    (``first="largest"``).
    """

    count: int
    boundaries: list[float]
    fitted: bool = False
    pass_seconds: float | None = None
    token_boundaries: tuple[tuple[float, ...], ...] | None = None
    shares: tuple[float, ...] = ()
    schedule: tuple[int, ...] | None = None
    probe: tuple[int, ...] = ()

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint records of these buckets beyond 0.3's count and edges, only where used: the
        tokens-per-second edges, that ranks are in step, the first batch."""
        out: dict[str, Any] = {}
        if self.token_boundaries is not None:
            out["token_boundaries"] = [list(row) for row in self.token_boundaries]
        if self.schedule is not None:  # its counts follow from the data and the world size, both recorded
            out["sync_buckets"] = True
        if self.probe:
            out["first_batch"] = list(self.probe)
        return out

    def report(self, max_duration: float | None) -> dict[str, Any]:
        """``stats()["bucketing"]``: the count, the edges (the grid, 2-D), each bucket's share, and, when fitted,
        why that many."""
        out: dict[str, Any] = {"num_buckets": self.count, "boundaries": list(self.boundaries),
                               "fitted": self.fitted, "pass_seconds": self.pass_seconds}
        if self.token_boundaries is not None:
            out["token_boundaries"] = [list(row) for row in self.token_boundaries]
        if self.shares:
            out["shares"] = [round(share, 4) for share in self.shares]
        if self.schedule is not None:
            out["sync_buckets"] = {"batches_per_round": list(self.schedule), "steps_per_round": sum(self.schedule)}
        if self.pass_seconds is None or max_duration is None:
            return out
        if self.fitted and self.count < DEFAULT_NUM_BUCKETS:
            out["why"] = (f"{self.count} bucket(s), not {DEFAULT_NUM_BUCKETS}: a pass of this rank holds about "
                          f"{self.pass_seconds:.0f} s of audio, and each bucket should get at least "
                          f"{FULL_BATCHES_PER_BUCKET} batch(es) of {max_duration:g} s of it; more buckets would cut "
                          "batches small (Bucketing(num_buckets=...) sets the count)")
        elif self.pass_seconds / self.count < max_duration:
            out["why"] = (f"each of the {self.count} buckets gets about {self.pass_seconds / self.count:.1f} s of a "
                          f"pass of this rank, less than a batch of {max_duration:g} s: batches leave smaller. Fewer "
                          "buckets make them fuller (a count given, or a checkpoint's: on a new run, "
                          "Bucketing(num_buckets=None) fits the count to the data)")
        return out


def duration_buckets(settings: Any, sources: Any) -> Buckets:
    """The bucketing's `Buckets`: the edges given, or estimated from rows spread evenly over the source (the same
    on every rank) into ``Bucketing.num_buckets`` buckets, or, when that is None, as many as fit the data
    (`fit_bucket_count`: each bucket holds a few full batches of a rank's pass); with a token column, the
    tokens-per-second edges within each; the sampled rows' shares of the buckets, and from them, ranks in step,
    the batches each bucket gives a rank's pass, and with ``first="largest"`` the rows of the first batch."""
    batching = settings.batching
    in_step, probe = sync_buckets(settings), batching.first == "largest" and settings.train
    if batching.boundaries is not None and not (in_step or probe or batching.token_column is not None):
        return Buckets(batching.buckets, list(batching.boundaries))
    indices, durations, tokens = bucket_sample(settings, sources)
    n = len(sources.datasets[0].kept_indices())
    if batching.boundaries is not None:
        count, boundaries, fitted, pass_seconds = batching.buckets, list(batching.boundaries), False, None
    else:
        pass_seconds = float(np.mean(durations)) * n / settings.storage.world_size if durations else 0.0
        count, fitted = batching.num_buckets, batching.num_buckets is None
        if fitted:
            count = fit_bucket_count(durations, pass_seconds, batching.max_duration, batching.max_batch_size,
                                     most=DEFAULT_NUM_BUCKETS // batching.per_duration,
                                     full_batches=FULL_BATCHES_PER_BUCKET * batching.per_duration)
        boundaries = estimate_boundaries(durations, count)
    grid = batching.token_boundaries
    if grid is None and batching.token_column is not None:
        grid = estimate_token_boundaries(durations, tokens, boundaries, batching.per_duration)
    limits = dataclasses.replace(bucket_limits(settings, None, False, boundaries, grid), schedule=None, probe=())
    shares = bucket_shares(limits, durations, tokens)
    schedule = expected_batches(limits, durations, tokens, n / settings.storage.world_size) if in_step else None
    first = largest_batch(limits, indices, durations, tokens) if probe else ()
    return Buckets(count, boundaries, fitted, pass_seconds, grid, shares, schedule, first)


def bucket_sample(settings: Any, sources: Any) -> tuple[list[int], list[float], list[float]]:
    """Rows spread evenly over the source (``Bucketing.estimate_rows``, the same on every rank): their global
    indices, durations (s) and tokens (0 without a token column)."""
    batching, dataset = settings.batching, sources.datasets[0]
    kept = dataset.kept_indices()
    n = len(kept)
    picks = kept[np.unique(np.linspace(0, n - 1, min(n, batching.estimate_rows)).round().astype(np.int64))]
    seconds: list[Any] = [None] * len(picks)
    if settings.duration_column is not None and sources.segments is None:  # no audio read before the first batch
        seconds = dataset.read_column(settings.duration_column, picks.tolist())
    missing = [k for k, value in enumerate(seconds) if value is None]
    for k, row in zip(missing, fetch_rows(dataset, [Key(int(picks[k]), 0) for k in missing]), strict=True):
        seconds[k] = settings.seconds_of(row, sources.segments)
    tokens = [0.0] * len(picks)
    if batching.token_column is not None:
        tokens = [0.0 if t is None else float(t) for t in dataset.read_column(batching.token_column, picks.tolist())]
    return [int(i) for i in picks], [float(x) for x in seconds], tokens


def sync_buckets(settings: Any) -> bool:
    """Whether ranks take their batches in step (`Bucketing.sync_buckets`; None: on several ranks), in training."""
    wanted = settings.batching.sync_buckets
    return settings.train and (settings.storage.world_size > 1 if wanted is None else wanted)


def buckets_out_of_step(settings: Any, theirs: dict[str, Any]) -> bool:
    """A checkpoint (fingerprint ``theirs``) taken by a loader whose ranks were not in step, where this one's are by
    default: one of 0.3, which had no ``sync_buckets``."""
    taken = theirs.get("batching")
    return (settings.batching is not None and settings.batching.sync_buckets is None and settings.buckets is not None
            and settings.buckets.schedule is not None and isinstance(taken, dict) and "sync_buckets" not in taken)


def in_step_ignored(settings: Any, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``fingerprint`` without whether ranks were in step where ``Bucketing(sync_buckets=None)`` left that to the
    world size (an elastic resume changes it)."""
    batching = fingerprint.get("batching")
    if settings.batching is None or settings.batching.sync_buckets is not None or not isinstance(batching, dict):
        return fingerprint
    return {**fingerprint, "batching": {k: v for k, v in batching.items() if k != "sync_buckets"}}


def bucket_limits(settings: Any, max_bytes: int | None, distinct: bool, boundaries: Sequence[float] | None = None,
                  token_boundaries: Any = None) -> BucketLimits:
    """The bucketer's `BucketLimits` from ``settings.batching`` and the settled ``settings.buckets`` (or the edges
    given, while they are being settled)."""
    b, settled = settings.batching, settings.buckets
    if boundaries is None:
        boundaries, token_boundaries = settled.boundaries, settled.token_boundaries
    schedule = probe = None
    if settled is not None:
        schedule = None if settled.schedule is None else BucketSchedule(settled.schedule, settings.seed)
        probe = settled.probe
    return BucketLimits(b.max_duration, tuple(boundaries), b.max_batch_size, max_bytes, distinct,
                        quadratic_duration=b.quadratic_duration, max_tokens=b.max_tokens, token_column=b.token_column,
                        token_boundaries=token_boundaries, batch_sizes=b.batch_sizes, schedule=schedule,
                        probe=probe or ())
