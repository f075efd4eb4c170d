"""Always-on loader counters: cheap enough for the hot path (a lock and a few adds)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .samples import BadRow, Key

#: How many bad-row records `LoaderStats` keeps for the report (the count is exact regardless).
MAX_REPORTED_BAD_ROWS = 1000
#: Counters `stats()` always reports, 0 until counted (docs/api.md documents them; tests/test_docs.py checks it).
COUNTERS = ("rows_read", "samples_decoded", "samples", "batches", "bad_rows", "skipped_rows")
#: Stages of ``stats()["seconds"]`` always reported, 0.0 until timed; besides them the features' stage
#: (`feature_stage`).
STAGES = ("read", "decode", "resample", "augment", "wait")
#: Gauges always reported (0 until set).
GAUGES = ("shuffle_buffer_fill",)
#: The stages of `bottleneck`'s verdict: what bounds the run now.
BOTTLENECKS = ("consumer", "decode_workers", "storage", "main_process")
#: Stages whose seconds are the decode workers' busy time (summed over workers), besides the features' stage.
_WORKER_STAGES = ("decode", "resample", "augment")
#: The consumer waited less than this share of the wall time for batches: the loader keeps up, the step bounds.
CONSUMER_BOUND_WAIT = 0.10
#: Decode workers busy at least this share of their wall time (all of them together): they bound the run.
WORKERS_BUSY = 0.80
#: The reader busy (reads and the store's throttling) at least this share of the wall time: storage bounds the run.
STORAGE_BUSY = 0.50
#: Seconds a verdict's window lasts at least; a `stats()` call sooner reports the last verdict again.
BOTTLENECK_WINDOW_SECONDS = 1.0


def feature_stage(batch_key: str) -> str:
    """The ``seconds`` stage of computing features whose batch key is ``batch_key``: ``"mel"`` for spectrograms,
    else the key (``"fbank"``, ``"waveform"``)."""
    return {"spectrogram": "mel"}.get(batch_key, batch_key)


class ShuffleQuality:
    """Online figures of how well the stream of samples is mixed, and their full-shuffle references.

    - displacement: for each sample leaving a `ShuffleBuffer`, ``|emitted position -
      arrival position|`` in samples through the buffer (0 without a buffer);
    - per batch: the number of distinct splits (and, in a mix, sources) its
      samples come from.

    References are what a uniformly random draw from one pass of this rank's data
    would give (``configure``): a random permutation of ``N`` rows displaces
    a row by ``N / 3`` on average; a batch of ``B`` uniform draws touches
    ``sum_j 1 - (1 - p_j) ** B`` distinct splits (``p_j``: the split's share of
    the draws). See docs/mixing.md for how to size the buffer from them.
    """

    def __init__(self) -> None:
        self.displacement_sum = 0
        self.displaced = 0
        self.batches = 0
        self.splits_sum = 0
        self.sources_sum = 0
        self._split_starts: list[np.ndarray] | None = None  # per source: sorted first row index of each split
        self.references: dict[str, float] = {}

    def configure(self, split_rows: Sequence[Sequence[tuple[int, int]]], weights: Sequence[float],
                  batch_size: int) -> None:
        """Enable the per-batch split figure: ``split_rows[s]`` = ``[(first index, rows)]`` of source ``s``'s splits.

        ``weights``: each source's share of the draws; ``batch_size``: for the references.
        """
        self._split_starts = [np.sort(np.array([start for start, _ in splits], dtype=np.int64))
                              for splits in split_rows]
        rows = [sum(n for _, n in splits) for splits in split_rows]
        shares = [w * n / r for w, splits, r in zip(weights, split_rows, rows, strict=True) if r for _, n in splits]
        self.references = {
            "full_shuffle_displacement": sum(rows) / 3,
            "full_shuffle_splits_per_batch": float(sum(1 - (1 - p) ** batch_size for p in shares)),
        }
        if len(weights) > 1:
            self.references["full_shuffle_sources_per_batch"] = float(
                sum(1 - (1 - w) ** batch_size for w in weights))

    def add_batch(self, keys: Sequence[Key]) -> None:
        sources = np.fromiter((k.source for k in keys), np.int64, len(keys))
        self.batches += 1
        self.sources_sum += len(np.unique(sources))
        if self._split_starts is None:
            return
        indices = np.fromiter((k.index for k in keys), np.int64, len(keys))
        splits = np.empty(len(keys), np.int64)
        for source in np.unique(sources).tolist():
            here = sources == source
            splits[here] = np.searchsorted(self._split_starts[source], indices[here], side="right")
        self.splits_sum += len(np.unique(sources << 40 | splits))

    def summary(self, mixed: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"displaced_samples": self.displaced, "batches": self.batches}
        if self.displaced:
            out["mean_displacement"] = self.displacement_sum / self.displaced
        if self.batches and self._split_starts is not None:
            out["splits_per_batch"] = self.splits_sum / self.batches
        if self.batches and mixed:
            out["sources_per_batch"] = self.sources_sum / self.batches
        out.update(self.references)
        return out


class Holding:
    """What one node holds: rows and bytes now, and the most bytes it held (see `HeldBytes`).

    ``info``: the node's own figures for the report (its limits, what stopped it growing...).
    """

    __slots__ = ("budgeted", "bytes", "info", "owner", "peak_bytes", "rows")

    def __init__(self, owner: HeldBytes, budgeted: bool = True) -> None:
        self.owner = owner
        self.budgeted = budgeted  # part of the total the budget bounds (else only reported)
        self.rows = self.bytes = self.peak_bytes = 0
        self.info: dict[str, Any] = {}

    def add(self, nbytes: int, rows: int = 1) -> None:
        """``rows`` rows of ``nbytes`` bytes in all came in (negative: went out)."""
        self.rows += rows
        self.bytes += nbytes
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes
        if self.budgeted:
            self.owner.changed(nbytes)

    def clear(self) -> None:
        """Everything held went away (a reset)."""
        if self.budgeted:
            self.owner.changed(-self.bytes)
        self.rows = self.bytes = 0

    def report(self) -> dict[str, Any]:
        return {"rows": self.rows, "bytes": self.bytes, "peak_bytes": self.peak_bytes, **self.info}


class HeldBytes:
    """The bytes of audio held ahead of the decode stage, per holder (``"shuffle_buffer"``, ``"bucketer"``).

    The holders of one chain share it: the total is what a `ShuffleBuffer`'s byte
    budget (``limit``) bounds. Updated only by the thread that pulls the chain
    (nothing here depends on timing), read by `LoaderStats.snapshot` from any thread.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.total = self.peak = 0
        self.holdings: dict[str, Holding] = {}
        self.notes: dict[str, Any] = {}  # the loader's own figures for the report (its whole budget, the lanes)

    def holding(self, name: str, budgeted: bool = True) -> Holding:
        """The `Holding` of the holder ``name`` (made at the first call); ``budgeted=False``: reported beside the
        total, not in it (the decode stage's rows in flight: when they come back depends on timing)."""
        if name not in self.holdings:
            self.holdings[name] = Holding(self, budgeted)
        return self.holdings[name]

    def changed(self, delta: int) -> None:
        self.total += delta
        if self.total > self.peak:
            self.peak = self.total

    def report(self) -> dict[str, Any]:
        """``{"budget_bytes", "held_bytes", "peak_bytes", <holder>: {"rows", "bytes", "peak_bytes", ...}}``."""
        out: dict[str, Any] = {"budget_bytes": self.limit, "held_bytes": self.total, "peak_bytes": self.peak,
                               **self.notes}
        out.update({name: holding.report() for name, holding in list(self.holdings.items())})
        return out


def bottleneck(before: dict[str, Any], after: dict[str, Any], seconds: float, num_workers: int) -> dict[str, Any]:
    """Which stage bounds the run over a window of ``seconds`` wall seconds between two `LoaderStats.snapshot`s.

    From counters the loader keeps anyway: ``seconds["wait"]`` (the consumer waiting in ``next()``), the decode
    stages' seconds (the workers busy, summed over ``num_workers`` workers), ``seconds["read"]`` and
    ``["throttle_wait"]`` (the reader). In this order: the consumer waited under `CONSUMER_BOUND_WAIT` of the
    time: ``"consumer"`` (the training step; the loader is ahead); the workers were busy `WORKERS_BUSY` of
    theirs: ``"decode_workers"``; the reader `STORAGE_BUSY` of the time: ``"storage"``; else the workers
    idled while the consumer waited: ``"main_process"`` (the hand-off: reading, shuffling, collating and moving
    results in the consuming process). Returns ``{"stage", "reason", "window_s", "samples_per_s",
    "consumer_wait", "workers_busy", "storage_busy", "num_workers"}`` (shares in [0, 1]; ``stage`` None
    before the first batch of the window).
    """
    def delta(kind: str, name: str) -> float:
        return after[kind].get(name, 0) - before[kind].get(name, 0)

    busy_stages = set(_WORKER_STAGES) | (set(after["seconds"]) - set(STAGES) - {"throttle_wait"})
    workers_busy = sum(delta("seconds", name) for name in busy_stages) / (max(1, num_workers) * seconds)
    storage_busy = (delta("seconds", "read") + delta("seconds", "throttle_wait")) / seconds
    wait = delta("seconds", "wait") / seconds
    samples = delta("counters", "samples")
    out: dict[str, Any] = {"stage": None, "reason": "no batch in the window yet", "window_s": seconds,
                           "samples_per_s": samples / seconds, "consumer_wait": min(1.0, wait),
                           "workers_busy": min(1.0, workers_busy), "storage_busy": min(1.0, storage_busy),
                           "num_workers": num_workers}
    if delta("counters", "batches") <= 0:
        return out
    figures = (f"the consumer waited {wait:.0%} of the time for batches, the {num_workers} decode workers were "
               f"busy {workers_busy:.0%}, the reader {storage_busy:.0%}")
    if wait < CONSUMER_BOUND_WAIT:
        out.update(stage="consumer", reason=f"the training step: {figures}; more loader speed would not help")
    elif workers_busy >= WORKERS_BUSY:
        out.update(stage="decode_workers", reason=f"decoding: {figures}; more workers (cores), lighter per-sample "
                   "work or features on the GPU would lift it (`audioloader doctor` says by how much)")
    elif storage_busy >= STORAGE_BUSY:
        out.update(stage="storage", reason=f"storage: {figures}; read ahead more (Storage(...)), a closer or "
                   "faster store, or a local cache")
    else:
        out.update(stage="main_process", reason=f"the main-process hand-off: {figures}; the workers idle while "
                   "the consumer waits (the consuming process's Python is busy: a busy training loop's threads, "
                   "or too small chunks)")
    return out


def bottleneck_line(verdict: dict[str, Any]) -> str:
    """One line of a `bottleneck` verdict, for a progress bar or a log."""
    if verdict["stage"] is None:
        return "audioloader: bottleneck not known yet (no batch)"
    return (f"audioloader: {verdict['samples_per_s']:.0f} samples/s, bound by {verdict['stage']} "
            f"(consumer waiting {verdict['consumer_wait']:.0%}, workers busy {verdict['workers_busy']:.0%}, "
            f"reader busy {verdict['storage_busy']:.0%})")


class LoaderStats:
    """Thread-safe counters shared by the nodes of one chain.

    ``counters``: named integers (``samples``, ``batches``, ``rows_read`` ...).
    ``seconds``: wall seconds spent per stage (``read``, ``decode``, ``resample``,
    ``mel``, ``wait``), summed over threads, so they can exceed elapsed time.
    ``bad_rows``: the most recent `MAX_REPORTED_BAD_ROWS` reports of rows that could
    not be decoded; ``skipped_rows``: of rows the length policy left out.
    ``shuffle``: the `ShuffleQuality` figures. ``memory``: the `HeldBytes` of the
    shuffle buffer and the bucketer. ``sources``: per source of a mix
    (`describe_sources`), its weight and counters (``samples`` batched,
    ``rows_read``, ``passes`` started). ``workers``: who decodes (`describe_workers`).
    """

    def __init__(self, features_stage: str = "mel") -> None:
        self._lock = threading.Lock()
        # Every documented key is there from the start, so that a script can read `stats()["counters"]["bad_rows"]`
        # before the first bad row.
        self.counters: dict[str, int] = defaultdict(int, dict.fromkeys(COUNTERS, 0))
        self.seconds: dict[str, float] = defaultdict(float, dict.fromkeys((*STAGES, features_stage), 0.0))
        self.gauges: dict[str, Any] = dict.fromkeys(GAUGES, 0)
        self.bad_rows: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)
        self.skipped_rows: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)
        self.shuffle = ShuffleQuality()
        self.memory = HeldBytes()
        self.bucketing: dict[str, Any] | None = None  # the duration buckets, with bucketing (`chain.Buckets.report`)
        self.source_names: list[str] = []
        self.source_weights: list[float] = []
        self.source_counters: list[dict[str, int]] = []
        self.workers: dict[str, Any] = {}
        self._bad_since_pass_end = 0  # bad rows since the last `end_pass`: the next pass summary's count
        self._pass_notes: list[dict[str, int]] = []  # summaries of passes that had bad rows, not yet taken
        # (start, counters and seconds) of the bottleneck verdict's window: the first one starts here
        self._window: tuple[float, dict[str, Any]] = (time.perf_counter(), {"counters": {}, "seconds": {}})
        self._verdict: dict[str, Any] | None = None

    def bottleneck(self) -> dict[str, Any]:
        """What bounds the run now (`bottleneck`): over the time since the previous verdict (at least
        `BOTTLENECK_WINDOW_SECONDS`; sooner, that verdict again), the first one since this object was made."""
        now = time.perf_counter()
        with self._lock:
            current = {"counters": dict(self.counters), "seconds": dict(self.seconds)}
            # The workers getting chunks now (fewer than started while `Workers(num_workers="auto")` holds some back).
            workers = self.workers.get("count", self.workers.get("num_workers"))
            workers = workers if isinstance(workers, int) and workers > 0 else 1
            started, before = self._window
            if self._verdict is not None and now - started < BOTTLENECK_WINDOW_SECONDS:
                return dict(self._verdict)
            verdict = bottleneck(before, current, max(now - started, 1e-9), workers)
            if verdict["stage"] is not None:  # a window without a batch goes on growing
                self._window, self._verdict = (now, current), verdict
            return dict(verdict)

    def describe_workers(self, report: dict[str, Any]) -> None:
        """Who decodes: ``{"kind", "num_workers"}``, for processes also ``"start_method"`` and the reason for it."""
        with self._lock:
            self.workers.update(report)

    def describe_sources(self, names: Sequence[str], weights: Sequence[float]) -> None:
        """Name the sources of a mix (in key order) and their weights: ``stats()`` then reports per source."""
        self.source_names = list(names)
        self.source_weights = [float(w) for w in weights]
        self.source_counters = [defaultdict(int) for _ in names]

    def count_source(self, source: int, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` of source ``source`` (a no-op outside a mix)."""
        if self.source_counters:
            with self._lock:
                self.source_counters[source][name] += n

    def record_displacement(self, displacement: int) -> None:
        """One sample left the shuffle buffer ``displacement`` positions from where it arrived."""
        with self._lock:
            self.shuffle.displacement_sum += displacement
            self.shuffle.displaced += 1

    def record_batch(self, keys: Sequence[Key]) -> None:
        """The keys of one batch's real samples: splits and sources per batch, samples per source."""
        if not keys:
            return
        with self._lock:
            self.shuffle.add_batch(keys)
            if self.source_counters:
                for key in keys:
                    self.source_counters[key.source]["samples"] += 1

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def count_request(self, nbytes: int) -> None:
        """One remote request of ``nbytes`` bytes (``remote_requests``, ``remote_bytes``)."""
        with self._lock:
            self.counters["remote_requests"] += 1
            self.counters["remote_bytes"] += nbytes

    def count_throttle(self, refused: bool, seconds: float) -> None:
        """A request the store refused for going too fast (``refused``), and ``seconds`` waited for its slot."""
        with self._lock:
            self.counters["throttled_requests"] += int(refused)
            self.seconds["throttle_wait"] += seconds

    def add_seconds(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] += seconds

    def set_gauge(self, name: str, value: Any) -> None:
        self.gauges[name] = value

    @contextmanager
    def timed(self, stage: str):
        """``with stats.timed("decode"): ...`` adds the block's wall time to ``stage``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_seconds(stage, time.perf_counter() - start)

    def record_bad_row(self, bad: BadRow) -> None:
        with self._lock:
            self.counters["bad_rows"] += 1
            self.bad_rows.append(bad.report())
            self._bad_since_pass_end += 1

    def end_pass(self, pass_index: int) -> None:
        """The decode stage saw the end of pass ``pass_index``: note how many bad rows it had (when any), for the
        loader to report (`take_pass_notes`)."""
        with self._lock:
            if self._bad_since_pass_end:
                self._pass_notes.append({"pass": pass_index, "bad_rows": self._bad_since_pass_end})
                self._bad_since_pass_end = 0

    def take_pass_notes(self) -> list[dict[str, int]]:
        """The passes that ended with bad rows since the last call: ``[{"pass", "bad_rows"}]``."""
        with self._lock:
            notes, self._pass_notes = self._pass_notes, []
        return notes

    def record_skipped_row(self, skipped: BadRow) -> None:
        """A row the length policy left out (not an error): counted and reported apart from bad rows."""
        with self._lock:
            self.counters["skipped_rows"] += 1
            self.skipped_rows.append(skipped.report())

    def drain(self) -> dict[str, Any]:
        """Counters and seconds gathered since the last drain, and start again from zero.

        A worker process's stats are drained after each chunk and `merge` d into the
        consumer's.
        """
        with self._lock:
            delta = {"counters": {k: n for k, n in self.counters.items() if n},
                     "seconds": {k: t for k, t in self.seconds.items() if t}}
            self.counters.clear()
            self.seconds.clear()
        return delta

    def merge(self, delta: dict[str, Any]) -> None:
        """Add a `drain` result from another process."""
        with self._lock:
            for name, n in delta.get("counters", {}).items():
                self.counters[name] += n
            for stage, seconds in delta.get("seconds", {}).items():
                self.seconds[stage] += seconds

    def __reduce__(self):
        # Sent to a worker process as part of a job: there it starts empty (see `drain`).
        return (LoaderStats, ())

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy: ``{"counters", "seconds", "gauges", "bad_rows", "skipped_rows", "shuffle", "memory",
        "workers", "bottleneck"}`` (``bottleneck``: `LoaderStats.bottleneck`),
        and ``"sources"`` for a mix: ``{name: {"weight", "share", "samples", "rows_read", "passes"}}``
        (``share``: the fraction of the batched samples that came from the source)."""
        with self._lock:
            out = {
                "counters": dict(self.counters),
                "seconds": dict(self.seconds),
                "gauges": dict(self.gauges),
                "bad_rows": list(self.bad_rows),
                "skipped_rows": list(self.skipped_rows),
                "shuffle": self.shuffle.summary(mixed=bool(self.source_names)),
                "memory": self.memory.report(),
                "workers": {name: list(value) if isinstance(value, list) else value
                            for name, value in self.workers.items()},
            }
            if self.bucketing is not None:
                out["bucketing"] = dict(self.bucketing)
            if self.source_names:
                total = sum(c["samples"] for c in self.source_counters)
                out["sources"] = {
                    name: {"weight": weight, "share": counters["samples"] / total if total else 0.0,
                           "samples": counters["samples"], "rows_read": counters["rows_read"],
                           "passes": counters["passes"]}
                    for name, weight, counters in zip(self.source_names, self.source_weights,
                                                      self.source_counters, strict=True)}
        out["bottleneck"] = self.bottleneck()
        return out
