"""DecodeSpectrogram: encoded audio rows -> log-mel samples, in worker threads or processes."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from .. import checks
from ..dsp import hashing
from ..dsp.audio import fit, load_clip, probe_seconds, span_seconds
from ..dsp.augment import Augmentations
from ..dsp.augment_math import change_speed
from ..dsp.config import FeatureConfig, LengthPolicy, Segments
from ..dsp.features import compute_features, prepare
from ..errors import DecodeError, ErrorBudgetExceeded, OnError
from ..samples import BadRow, BatchEnd, Key, RawSample, Sample, held_bytes
from ..shards.dataset.augment_rows import AugmentRows
from ..shards.storage.changes import check_local
from ..stats import MAX_REPORTED_BAD_ROWS, LoaderStats, feature_stage
from ..workers import Workers, memory
from ..workers.recycle import BatchArenas
from ..workers.threads import pin_worker_to_one_thread
from .decode_config import (
    DEFAULT_DECODE,
    DEFAULT_FEATURES,
    DEFAULT_LENGTH,
    DEFAULT_WORKERS,
    DecodeConfig,
    check_fields,
    check_node_arguments,
    decoding_workers,
    error_policy,
)
from .held import RowsHeld
from .parallel_map import AUTO, MapPool, ParallelMap

#: ``fetch(keys) -> [RawSample]``: random access to rows by key (see `ArrowShardReader.fetch`).
Fetch = Callable[[Sequence[Key]], Sequence[RawSample]]


@dataclass(frozen=True)
class _LengthRule:
    """A `LengthPolicy` resolved for one feature config and mode, in samples."""

    policy: LengthPolicy
    random: bool  # random crop (else centre)
    clip: int | None  # fixed crop length, or None for whole utterances
    max: int | None  # whole utterances: the longest kept
    min: int

    @classmethod
    def of(cls, policy: LengthPolicy, features: FeatureConfig, train: bool) -> _LengthRule:
        rate = features.sample_rate
        return cls(policy, policy.random_crop(train),
                   None if policy.variable_length else policy.clip_samples(features),
                   None if policy.max_seconds is None else round(policy.max_seconds * rate),
                   max(round(policy.min_seconds * rate), 0))


class SampleDecoder:
    """The per-row function of `DecodeSpectrogram`: ``RawSample -> Sample | BadRow``.

    A pure function of the row and the constructor's arguments, safe in any
    thread, and picklable, so worker processes run exactly the same code.

    ``fetch``: when given, a row sent to a worker process travels as its key
    and the worker reads it itself (``prepare``): for memory-mapped shards that
    is a zero-copy read there instead of a copy of the encoded audio here.

    ``length``: one `LengthPolicy`, or one per source of a mix (indexed by ``key.source``).
    ``augment``: `Augmentations` (or None): speed while cutting, then the waveform
    augmentations, SpecAugment on the features, and the draws of the per-batch stage.
    A row of a memory-mapped shard (``RawSample.mapped``) is checked first: `ShardReadError` when its file
    changed since the loader scanned it, before the row's bytes are touched (touching the missing pages of a
    truncated map is a SIGBUS). ``guard``: an extra ``guard(path)`` run next on each row with audio.
    ``segments``: rows are windows of their audio, read from these columns of ``RawSample.extras``.
    ``decoder``: the decoder backend (`audioloader.dsp.ffmpeg`), one, or one per source of a mix.
    """

    def __init__(self, features: FeatureConfig, *, seed: int, train: bool, window: bool,
                 augment: Augmentations | None, stats: LoaderStats, fetch: Fetch | None = None,
                 compute_features: bool = True, length: LengthPolicy | Sequence[LengthPolicy] = DEFAULT_LENGTH,
                 guard: Callable[[str], None] | None = None, segments: Segments | None = None,
                 decoder: str | Sequence[str] = "auto") -> None:
        self.features = features
        self.decoders = [decoder] if isinstance(decoder, str) else list(decoder)
        self.segments = segments
        self.guard = guard
        self.seed = seed
        self.train = train
        self.window = window
        self.augment = augment
        self.stats = stats
        self.fetch = fetch
        self.compute_features = compute_features
        policies = [length] if isinstance(length, LengthPolicy) else list(length)
        self._rules = [_LengthRule.of(policy, features, train) for policy in policies]
        self._stage = feature_stage(features.batch_key)  # stats' stage name

    def _rule(self, key: Key) -> _LengthRule:
        if len(self._rules) == 1:
            return self._rules[0]
        if key.source >= len(self._rules):
            raise ValueError(f"row {key} is of source {key.source}, but the decoder has length policies for "
                             f"{len(self._rules)} sources; give one LengthPolicy, or one per source")
        return self._rules[key.source]

    def _backend(self, key: Key) -> str:
        return self.decoders[0] if len(self.decoders) == 1 else self.decoders[key.source]

    def __call__(self, raw: RawSample | BatchEnd) -> Sample | BadRow | BatchEnd:
        if isinstance(raw, BatchEnd):
            return raw  # a batch boundary from a DurationBucketer: passed on as is
        if raw.audio is not None:
            if raw.mapped is not None:  # a view of a memory map: its file as it was (a truncated map is a SIGBUS)
                check_local(raw.file, *raw.mapped)
            if self.guard is not None:
                self.guard(raw.file)
        key = raw.key
        if raw.problem is not None or raw.audio is None:
            return BadRow(key, raw.file, raw.row, raw.problem or "audio is null")
        rule = self._rule(key)
        speed = self.augment.speed_factor(key) if self.augment is not None else 1.0
        try:
            skip = self._skip_by_header(raw, rule, speed)
            if skip is not None:
                return BadRow(key, raw.file, raw.row, skip, skipped=True)
            clip = self._cut(raw, rule, speed)
            non_finite = _non_finite_reason(clip)
            if non_finite is not None:
                return BadRow(key, raw.file, raw.row, non_finite)
            skip = self._skip_by_length(len(clip), rule)
            if skip is not None:
                return BadRow(key, raw.file, raw.row, skip, skipped=True)
            if self.augment is not None:
                start = time.perf_counter()
                clip = self.augment.waveform(clip, key)  # a noise or IR row that cannot be read: DecodeError
                self.stats.add_seconds("augment", time.perf_counter() - start)
        except DecodeError as error:
            return BadRow(key, raw.file, raw.row, error.reason or str(error))
        params = None
        if self.compute_features:
            start = time.perf_counter()
            features = compute_features(clip, self.features, self._dither(key))
            self.stats.add_seconds(self._stage, time.perf_counter() - start)
            if self.augment is not None:
                features = self.augment.on_features(features, key)
        else:
            features = torch.from_numpy(clip)
        if self.augment is not None:
            params = self.augment.batch_params(key, len(clip))
        memory.after_decode()
        return Sample(key, features, raw.label, raw.extras, raw.file, raw.row, params, hashing.item_checksum(raw))

    def _span(self, raw: RawSample) -> tuple[float | None, float | None] | None:
        """The row's segment ``(start, end)`` in seconds, or None for the whole audio."""
        if self.segments is None:
            return None
        missing = [c for c in self.segments.columns if c not in raw.extras]
        if missing:
            raise ValueError(f"row {raw.row} of {raw.file!r} lacks the segment column(s) {missing}: the reader must "
                             f"read them (ArrowShardReader(columns=[..., {', '.join(map(repr, missing))}]))")
        return self.segments.span(raw.extras)

    def _cut(self, raw: RawSample, rule: _LengthRule, speed: float) -> np.ndarray:
        """Decode, resample and cut the row's clip (its segment's): float32 ``[samples]``, ``speed`` times faster."""
        key = raw.key
        span = self._span(raw)

        def draw(n: int) -> int:
            return hashing.uniform_int(n, self.seed, hashing.SALT_CROP, *key.parts())

        rate = self.features.sample_rate
        wanted = rule.clip if rule.clip else rule.max
        if speed == 1.0:
            return load_clip(raw.audio, rate, wanted, train=rule.random, draw=draw, window=self.window,
                             timer=self.stats.add_seconds, pad=rule.clip is not None, span=span,
                             backend=self._backend(key))
        # Cut `speed` times as much source, play it `speed` times faster: the crop's length again.
        source = None if wanted is None else math.ceil(wanted * speed)
        clip = load_clip(raw.audio, rate, source, train=rule.random, draw=draw, window=self.window,
                         timer=self.stats.add_seconds, pad=False, span=span, backend=self._backend(key))
        start = time.perf_counter()
        clip = change_speed(clip, speed, rate)
        self.stats.add_seconds("augment", time.perf_counter() - start)
        if rule.clip is not None:
            return fit(clip, rule.clip, 0, train=rule.random)
        return clip[:rule.max] if rule.max is not None else clip

    # -- the length policy -----------------------------------------------------------------

    def _skip_by_header(self, raw: RawSample, rule: _LengthRule, speed: float = 1.0) -> str | None:
        """Why the row is left out, judged from its header before decoding, or None."""
        too_long_skips = rule.max is not None and rule.policy.too_long == "skip" and rule.clip is None
        if rule.min == 0 and not too_long_skips:
            return None
        span = self._span(raw)
        seconds = (probe_seconds(raw.audio) if span is None else span_seconds(span, raw.audio)) / speed
        return self._length_reason(seconds, too_long_skips, rule.policy)

    def _skip_by_length(self, samples: int, rule: _LengthRule) -> str | None:
        """Why a decoded clip of ``samples`` samples is left out (headers can be approximate), or None."""
        rate = self.features.sample_rate
        if rule.clip is None:
            too_long_skips = rule.max is not None and rule.policy.too_long == "skip"
            reason = self._length_reason(samples / rate, too_long_skips, rule.policy)
            if reason is not None:
                return reason
        if samples < self.features.min_samples():
            return (f"too short for the features: {samples} samples at {rate} Hz, "
                    f"{type(self.features).__name__} needs at least {self.features.min_samples()}")
        return None

    @staticmethod
    def _length_reason(seconds: float, too_long_skips: bool, length: LengthPolicy) -> str | None:
        if seconds < length.min_seconds:
            return f"too short: {seconds:.3f} s < min_seconds={length.min_seconds}"
        if too_long_skips and seconds > length.max_seconds:
            return f"too long: {seconds:.3f} s > max_seconds={length.max_seconds}"
        return None

    def _dither(self, key: Key) -> torch.Generator | None:
        """The fbank's dither noise source, seeded by the row's key (None when there is no dither)."""
        if not getattr(self.features, "dither", 0.0):
            return None
        generator = torch.Generator()
        generator.manual_seed(hashing.mix(self.seed, hashing.SALT_DITHER, *key.parts()) >> 1)
        return generator

    # -- hooks of the process pool (see audioloader.workers.pool) -------------------------------------

    def encode(self, raw: RawSample) -> RawSample | Key:
        """Consumer side: a readable row travels as its key."""
        if self.fetch is not None and isinstance(raw, RawSample) and raw.problem is None and raw.audio is not None:
            return raw.key
        return raw

    def prepare(self, items: list[RawSample | Key]) -> list[RawSample]:
        """Worker side: read the rows that came as keys, in one random-access call."""
        keys = [item for item in items if isinstance(item, Key)]
        if not keys:
            return items
        fetched = iter(self.fetch(keys))
        return [next(fetched) if isinstance(item, Key) else item for item in items]


class DecodeSpectrogram(BaseNode[Sample]):
    """Decode, resample, crop/pad and log-mel each `RawSample` in ``num_workers`` threads or processes.

    Output: `Sample` with ``features`` (also ``spectrogram``) float32
    ``[n_mels, n_frames]`` (see `MelSpectrogramConfig`), or with
    ``compute_features=False`` the cropped waveform float32 ``[clip_samples]``
    (for features computed per batch, e.g. on a GPU: `BatchFeatures`). Items
    come in the source's order whatever the worker count or kind. The crop
    offset (train) and the augmentation RNG are pure functions of ``(seed, key)``,
    so results do not depend on ``num_workers`` or ``worker_type``.

    Args:
        source: node of `RawSample`.
        config: what each row becomes (`DecodeConfig`: features, seed, train, augment, on_error, length, ...;
            `AudioLoader` settles its own before the chain is built).
        workers: who decodes (`Workers` with ``kind`` ``"thread"`` or ``"process"`` and ``num_workers`` decided:
            threads or processes, 0 decodes inline in the calling thread, ``"auto"``: as many processes as the
            consumer needs, sized while running, `audioloader.workers.autotune`); default 4 threads. Threads:
            libsndfile, soxr and torch release the GIL, no start-up cost; processes: no GIL, scale with cores,
            leave the training loop's Python alone (rows and results travel through shared memory; the start
            method defaults to a fork server, see `audioloader.workers.pool`).
        stats: shared counters (a fresh `LoaderStats` if None); receives
            ``samples_decoded``, bad rows, and seconds for "decode", "resample",
            "mel" (and "augment").
        fetch: ``fetch(keys) -> [RawSample]``, random access to the source's rows;
            with processes, rows travel as keys and workers read them (worth it for
            memory-mapped shards).
        collate_into: `BatchArenas` shared with the `Batcher` that reads this node's samples in order (processes
            only): the features are copied out of the workers straight into batch memory.

    `of` takes the settings one by one (``features``, ``seed=``, ``num_workers=``, ``worker_type=``, ...).

    State: ``{"mapper": <ParallelMap state>, "rows_seen": n, "bad_rows": k}``;
    the same for every ``num_workers`` and ``worker_type``.
    """

    MAPPER_KEY = "mapper"
    ROWS_SEEN_KEY = "rows_seen"
    BAD_ROWS_KEY = "bad_rows"

    def __init__(self, source: BaseNode[RawSample], config: DecodeConfig = DEFAULT_DECODE,
                 workers: Workers = DEFAULT_WORKERS, *, stats: LoaderStats | None = None, fetch: Fetch | None = None,
                 collate_into: BatchArenas | None = None, **fields: Any) -> None:
        if fields or not isinstance(config, DecodeConfig):
            raise checks.node_fields("DecodeSpectrogram", "what each row becomes as one DecodeConfig(features, "
                                     "seed=..., ...) and who decodes as one Workers(num_workers=..., kind=...)", fields)
        super().__init__()
        workers = decoding_workers(workers)
        check_node_arguments(source, stats, fetch)
        c = self.config = config
        self.source = source
        self.workers = workers
        self.features = c.features
        self.seed = c.seed
        self.train = c.train
        self.num_workers = workers.num_workers if workers.num_workers == AUTO else int(workers.num_workers)
        self.worker_type = workers.kind
        self.augment = Augmentations.of(c.augment, c.seed, c.features, per_batch_features=not c.compute_features,
                                        open_rows=AugmentRows)
        self.on_error = c.on_error.action
        self.max_error_fraction = float(c.on_error.max_fraction)
        self.error_budget_min_rows = int(c.on_error.min_rows)
        self.stats = stats if stats is not None else LoaderStats()
        self.window = c.window
        self._user_threads = torch.get_num_threads()
        self.length = c.length
        prepare(c.features)  # build the cached filterbanks once, here, not in every thread
        self._decoder = SampleDecoder(c.features, seed=self.seed, train=self.train, window=self.window,
                                      augment=self.augment, stats=self.stats, fetch=fetch,
                                      compute_features=c.compute_features, length=c.length, guard=c.guard,
                                      segments=c.segments, decoder=c.decoder)
        pool = MapPool(self.num_workers, workers.kind, c.chunk_size, start_method=workers.start_method,
                       thread_initializer=self._pin_thread, what="decode worker",
                       max_bytes_in_flight=c.max_bytes_in_flight)
        self._mapper = ParallelMap(source, self._decoder, pool, stats=self.stats, size_fn=held_bytes,
                                   collate_into=collate_into)
        self._rows_seen = 0
        self._bad_rows = 0
        self._reports: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)

    @classmethod
    def of(cls, source: BaseNode[RawSample], features: FeatureConfig = DEFAULT_FEATURES, *,
           seed: int = 0, train: bool = True, num_workers: int | str | None = None, augment: Any = None,
           on_error: str | OnError = "skip", max_error_fraction: float | None = None,
           error_budget_min_rows: int | None = None,
           stats: LoaderStats | None = None, snapshot_frequency: int = 1, window: bool = True,
           worker_type: str | None = None, fetch: Fetch | None = None, start_method: str | None = None,
           chunk_size: int | None = None, compute_features: bool = True,
           length: LengthPolicy | Sequence[LengthPolicy] = DEFAULT_LENGTH,
           guard: Callable[[str], None] | None = None, segments: Segments | None = None,
           max_bytes_in_flight: int | None = None, collate_into: BatchArenas | None = None,
           decoder: str | Sequence[str] = "auto") -> DecodeSpectrogram:
        """A decode node built from its settings one by one: they make its `DecodeConfig` (see there for each)
        and its `Workers`; ``stats``, ``fetch`` and ``collate_into`` as the constructor's.

        ``num_workers`` (None: 4), ``worker_type`` (``"thread"``, the default, or ``"process"``) and
        ``start_method`` make the `Workers`. ``on_error`` is an `OnError` or its action; with an action,
        ``max_error_fraction`` (None: 0.01, `OnError`'s) and ``error_budget_min_rows`` (None: 100) set its
        budget. ``snapshot_frequency``: accepted for compatibility with torchdata's ParallelMapper and ignored:
        the state is exact at every item and a resume never decodes an item twice.
        """
        num_workers, worker_type = 4 if num_workers is None else num_workers, worker_type or "thread"
        check_fields(source, features, seed, num_workers, on_error, max_error_fraction, error_budget_min_rows,
                     stats, snapshot_frequency, worker_type, fetch)
        config = DecodeConfig(features, seed, train, augment, error_policy(on_error, max_error_fraction,
                                                                           error_budget_min_rows),
                              window, compute_features, length, segments, decoder, guard, chunk_size,
                              max_bytes_in_flight)
        workers = Workers(num_workers=num_workers, kind=worker_type, start_method=start_method)
        return cls(source, config, workers, stats=stats, fetch=fetch, collate_into=collate_into)

    def _pin_thread(self) -> None:
        pin_worker_to_one_thread(self._user_threads)

    # -- the per-sample function -------------------------------------------

    def decode(self, raw: RawSample) -> Sample | BadRow:
        """Decode one row: a `Sample`, or a `BadRow` when its audio cannot be used.

        Pure function of ``raw`` and the constructor's arguments; safe in any
        thread. Exceptions other than bad audio (e.g. from ``augment``) propagate.
        """
        return self._decoder(raw)

    def decode_many(self, raws: Sequence[RawSample]) -> list[Sample | BadRow]:
        """`decode` each row on this node's workers; results in input order.

        Used to rebuild items on resume (e.g. a shuffle buffer's). Exceptions
        other than bad audio propagate (the first one, in input order).
        """
        if self.num_workers == 0 or len(raws) <= 1:
            return [self.decode(raw) for raw in raws]
        return self._mapper.map_all(list(raws))

    # -- BaseNode ----------------------------------------------------------

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._reports.clear()
        if initial_state is not None:
            self._rows_seen = int(initial_state[self.ROWS_SEEN_KEY])
            self._bad_rows = int(initial_state[self.BAD_ROWS_KEY])
            self._mapper.reset(initial_state[self.MAPPER_KEY])
        else:
            self._rows_seen = 0
            self._bad_rows = 0
            self._mapper.reset(None)
        self._pass: int | None = None  # the latest pass a row came from (the end of a pass is reported)

    def next(self) -> Sample:
        while True:
            self._check_budget()
            try:
                item = next(self._mapper)
            except StopIteration:
                self.stats.end_pass(self._pass or 0)
                raise
            if isinstance(item, BatchEnd):
                return item
            self._note_pass(item.key.pass_index)
            self._rows_seen += 1
            if isinstance(item, BadRow):
                self._on_bad_row(item)
                continue
            self.stats.count("samples_decoded")
            return item

    def get_state(self) -> dict[str, Any]:
        return {self.MAPPER_KEY: self._mapper.get_state(), self.ROWS_SEEN_KEY: self._rows_seen,
                self.BAD_ROWS_KEY: self._bad_rows}

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """What its `ParallelMap` holds, whose state it keeps under ``MAPPER_KEY`` (the map pulls from this node's
        source; see `audioloader.nodes.held`)."""
        return ParallelMap.rows_held(state[cls.MAPPER_KEY])

    def shutdown(self) -> None:
        """Stop the decode workers now (they start again on the next reset)."""
        self._mapper.shutdown()

    # -- bad rows ----------------------------------------------------------

    def _on_bad_row(self, bad: BadRow) -> None:
        if bad.skipped:  # left out by the length policy: reported, not an error
            self.stats.record_skipped_row(bad)
            return
        self._bad_rows += 1
        self.stats.record_bad_row(bad)
        self._reports.append(bad.report())
        if self.on_error == "raise":
            raise DecodeError(
                f"cannot decode the audio of row {bad.row} of {bad.file!r} (index {bad.key.index}, "
                f"pass {bad.key.pass_index}): {bad.reason}. Pass on_error='skip' to skip and count such rows.",
                file=bad.file, row=bad.row, index=bad.key.index, reason=bad.reason)

    def _note_pass(self, pass_index: int) -> None:
        """A row of a later pass ends the one before (for the loader's summary of bad rows by pass)."""
        if self._pass is not None and pass_index > self._pass:
            self.stats.end_pass(self._pass)
        self._pass = pass_index if self._pass is None else max(self._pass, pass_index)

    def _check_budget(self) -> None:
        """Raise when too many rows were bad; checked before each pull so no good sample is lost."""
        seen, bad = self._rows_seen, self._bad_rows
        if self.on_error != "skip" or bad == 0 or seen < self.error_budget_min_rows:
            return
        if bad / seen <= self.max_error_fraction:
            return
        reasons = "; ".join(f"{r['file']} row {r['row']}: {r['reason']}" for r in list(self._reports)[-3:])
        raise ErrorBudgetExceeded(
            f"{bad} of {seen} rows ({bad / seen:.2%}) could not be decoded, more than "
            f"max_error_fraction={self.max_error_fraction}. Latest: {reasons}. If this much bad audio is "
            "expected, raise the budget: AudioLoader(..., on_error=al.OnError(max_fraction=..., min_rows=...)) "
            "(on a hand-built DecodeSpectrogram: DecodeConfig(on_error=al.OnError(...)), or DecodeSpectrogram.of(..., "
            "max_error_fraction=..., error_budget_min_rows=...)); "
            "loader.stats()['bad_rows'] lists every reason.",
            report=list(self._reports))


def _non_finite_reason(clip: np.ndarray) -> str | None:
    """Why a decoded clip (float32 ``[samples]``) is unusable because of NaN/inf samples, or None.

    One sum is the hot-path test: NaN and inf propagate through it, so a finite
    sum means every sample is finite (measured: 27 us for a 5 s clip at 32 kHz,
    ~3 % of the fastest decode, PCM16 at the target rate, under 1 % of a FLAC one;
    benchmarks/pipeline/bench_non_finite.py). Only a non-finite sum pays for the
    count, which can also come from huge finite samples whose sum overflows:
    those are let through (the count is 0).
    """
    if np.isfinite(np.add.reduce(clip)):
        return None
    bad = ~np.isfinite(clip)
    count = int(np.count_nonzero(bad))
    if count == 0:
        return None
    first = int(np.argmax(bad))
    return (f"audio has {count} non-finite samples (NaN or inf) of {len(clip)} in the clip, the first at sample "
            f"{first}: a float WAV/FLAC written from bad data")
