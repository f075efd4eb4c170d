"""DecodeSpectrogram: encoded audio rows -> log-mel samples, in threads."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode, ParallelMapper

from .. import _hashing, _memory
from .._threads import pin_worker_to_one_thread, restore_default_threads, shutdown_mapper
from ..audio import load_clip
from ..config import MelSpectrogramConfig
from ..errors import DecodeError, ErrorBudgetExceeded
from ..features import log_mel, mel_filterbank
from ..samples import BadRow, Failure, RawSample, Sample
from ..stats import MAX_REPORTED_BAD_ROWS, LoaderStats
from .catch_failures import CatchFailures, raise_failure

Augment = Callable[[np.ndarray, np.random.Generator], np.ndarray]

ON_ERROR_CHOICES = ("skip", "raise")

#: Key of torchdata ParallelMapper's state under which its iterator's state sits.
_MAPPER_STATE_KEY = "it_state"

#: The default feature configuration (``MelSpectrogramConfig()``; frozen, so safe to share).
DEFAULT_FEATURES = MelSpectrogramConfig()


class DecodeSpectrogram(BaseNode[Sample]):
    """Decode, resample, crop/pad and log-mel each `RawSample` in ``num_workers`` threads.

    Output: `Sample` with ``spectrogram`` float32 ``[n_mels, n_frames]`` (see
    `MelSpectrogramConfig`), in the source's order (``in_order=True``), whatever
    the thread count. The crop offset (train) and the augmentation RNG are pure
    functions of ``(seed, key)``, so results do not depend on ``num_workers``.

    Args:
        source: node of `RawSample`.
        features: the spectrogram parameters.
        seed: seeds the crop offsets and the augmentation RNGs.
        train: random crop + end padding; else centre crop + centred padding.
        num_workers: decode threads; 0 decodes inline in the calling thread.
        augment: optional ``augment(waveform float32 [clip_samples], rng) -> array [clip_samples]``
            applied to the cropped waveform before the mel; ``rng`` is a
            ``numpy.random.Generator`` seeded from ``(seed, key)``. Its exceptions
            reach the caller unchanged (type, attributes, traceback).
        on_error: ``"skip"``: bad rows are counted, reported in ``stats`` and
            dropped, within the error budget; ``"raise"``: `DecodeError` at the first.
        max_error_fraction: with ``"skip"``, raise `ErrorBudgetExceeded` once more
            than this fraction of the rows seen were bad ...
        error_budget_min_rows: ... and at least this many rows have been seen.
        stats: shared counters (a fresh `LoaderStats` if None); receives
            ``samples_decoded``, bad rows, and seconds for "decode", "resample",
            "mel" (and "augment").
        snapshot_frequency: torchdata ParallelMapper's; resume re-decodes up to
            ``snapshot_frequency - 1`` rows.
        window: decode only the crop window where the format allows (same result,
            less work); False always decodes whole files (the reference path).

    State: ``{"mapper": <ParallelMapper state>, "rows_seen": n, "bad_rows": k}``.
    """

    MAPPER_KEY = "mapper"
    ROWS_SEEN_KEY = "rows_seen"
    BAD_ROWS_KEY = "bad_rows"

    def __init__(self, source: BaseNode[RawSample], features: MelSpectrogramConfig = DEFAULT_FEATURES, *,
                 seed: int = 0, train: bool = True, num_workers: int = 4, augment: Augment | None = None,
                 on_error: str = "skip", max_error_fraction: float = 0.01, error_budget_min_rows: int = 100,
                 stats: LoaderStats | None = None, snapshot_frequency: int = 1, window: bool = True) -> None:
        super().__init__()
        _validate(source, features, seed, num_workers, augment, on_error, max_error_fraction,
                  error_budget_min_rows, stats, snapshot_frequency)
        self.source = source
        self.features = features
        self.seed = int(seed)
        self.train = bool(train)
        self.num_workers = int(num_workers)
        self.augment = augment
        self.on_error = on_error
        self.max_error_fraction = float(max_error_fraction)
        self.error_budget_min_rows = int(error_budget_min_rows)
        self.stats = stats if stats is not None else LoaderStats()
        self.window = bool(window)
        # torchdata's thread workers call torch.set_num_threads(1), which also
        # changes the process default; this is the value we put back.
        self._user_threads = torch.get_num_threads()
        mel_filterbank(features)  # build the cached filterbank once, here, not in every thread
        self._mapper = ParallelMapper(CatchFailures(source), self._map, num_workers=self.num_workers,
                                      method="thread", in_order=True, snapshot_frequency=snapshot_frequency)
        self._rows_seen = 0
        self._bad_rows = 0
        self._reports: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)

    # -- the per-sample function -------------------------------------------

    def decode(self, raw: RawSample) -> Sample | BadRow:
        """Decode one row: a `Sample`, or a `BadRow` when its audio cannot be used.

        Pure function of ``raw`` and the constructor's arguments; safe in any
        thread. Exceptions other than bad audio (e.g. from ``augment``) propagate.
        """
        key = raw.key
        if raw.problem is not None or raw.audio is None:
            return BadRow(key, raw.file, raw.row, raw.problem or "audio is null")
        cfg = self.features

        def draw(n: int) -> int:
            return _hashing.uniform_int(n, self.seed, _hashing.SALT_CROP, key.index, key.pass_index)

        try:
            clip = load_clip(raw.audio, cfg.sample_rate, cfg.clip_samples, train=self.train, draw=draw,
                             window=self.window, timer=self.stats.add_seconds)
        except DecodeError as error:
            return BadRow(key, raw.file, raw.row, error.reason or str(error))
        if self.augment is not None:
            start = time.perf_counter()
            clip = self._augmented(clip, key)
            self.stats.add_seconds("augment", time.perf_counter() - start)
        start = time.perf_counter()
        spectrogram = log_mel(clip, cfg)
        self.stats.add_seconds("mel", time.perf_counter() - start)
        _memory.after_decode()
        return Sample(key, spectrogram, raw.label, raw.extras, raw.file, raw.row)

    def _augmented(self, clip: np.ndarray, key: Any) -> np.ndarray:
        rng = _hashing.generator(self.seed, _hashing.SALT_AUGMENT, key.index, key.pass_index)
        out = np.asarray(self.augment(clip, rng), dtype=np.float32)
        if out.shape != (self.features.clip_samples,):
            raise ValueError(f"augment returned shape {out.shape}, expected ({self.features.clip_samples},): "
                             "it must return a waveform of the same length as its input")
        if not (out.flags.c_contiguous and out.flags.writeable):  # torch.from_numpy needs both
            out = out.copy()
        return out

    def decode_many(self, raws: Sequence[RawSample]) -> list[Sample | BadRow]:
        """`decode` each row, in parallel on ``num_workers`` threads; results in input order.

        Used to rebuild items on resume (e.g. a shuffle buffer's). Exceptions
        other than bad audio propagate (the first one, in input order).
        """
        if self.num_workers == 0 or len(raws) <= 1:
            return [self.decode(raw) for raw in raws]
        workers = min(self.num_workers, len(raws))
        with ThreadPoolExecutor(workers, thread_name_prefix="audioloader-decode",
                                initializer=pin_worker_to_one_thread, initargs=(self._user_threads,)) as pool:
            return list(pool.map(self.decode, raws))

    def _map(self, item: RawSample | Failure) -> Sample | BadRow | Failure:
        """The ParallelMapper's function: never raises, never returns None."""
        if isinstance(item, Failure):
            return item
        try:
            if self.num_workers > 0:
                pin_worker_to_one_thread(self._user_threads)
            return self.decode(item)
        except Exception as error:  # carried as an item, raised in the consumer's thread
            return Failure(error)

    # -- BaseNode ----------------------------------------------------------

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        # Stop the previous epoch's threads before resetting the source: a reader
        # thread still inside source.next() would otherwise race with it.
        shutdown_mapper(self._mapper)
        restore_default_threads(self._user_threads)
        self._reports.clear()
        if initial_state is not None:
            self._rows_seen = int(initial_state[self.ROWS_SEEN_KEY])
            self._bad_rows = int(initial_state[self.BAD_ROWS_KEY])
            self._reset_mapper(initial_state[self.MAPPER_KEY])
        else:
            self._rows_seen = 0
            self._bad_rows = 0
            self._mapper.reset(None)

    # torchdata's mapper state differs between num_workers == 0 ({"source": s}) and
    # > 0 ({"snapshot": s, "steps_since_snapshot": k}). We always save the threaded
    # form, so a checkpoint resumes with any num_workers, as the batches are the same.

    def _reset_mapper(self, state: dict[str, Any]) -> None:
        inner = state[_MAPPER_STATE_KEY]
        if self.num_workers > 0:
            if "source" in inner:  # saved inline by an older version
                inner = {"snapshot": inner["source"], "steps_since_snapshot": 0}
            self._mapper.reset({_MAPPER_STATE_KEY: inner})
            return
        if "source" in inner:
            self._mapper.reset(state)
            return
        self._mapper.reset({_MAPPER_STATE_KEY: {"source": inner["snapshot"]}})
        for _ in range(inner["steps_since_snapshot"]):  # the threaded mapper's fast-forward
            next(self._mapper)

    def _mapper_state(self) -> dict[str, Any]:
        state = self._mapper.state_dict()
        inner = state[_MAPPER_STATE_KEY]
        if "source" in inner:
            return {_MAPPER_STATE_KEY: {"snapshot": inner["source"], "steps_since_snapshot": 0}}
        return state

    def next(self) -> Sample:
        while True:
            self._check_budget()
            try:
                item = next(self._mapper)
            except StopIteration:
                restore_default_threads(self._user_threads)
                raise
            raise_failure(item)
            self._rows_seen += 1
            if isinstance(item, BadRow):
                self._on_bad_row(item)
                continue
            self.stats.count("samples_decoded")
            return item

    def get_state(self) -> dict[str, Any]:
        return {self.MAPPER_KEY: self._mapper_state(), self.ROWS_SEEN_KEY: self._rows_seen,
                self.BAD_ROWS_KEY: self._bad_rows}

    def shutdown(self) -> None:
        """Stop the decode threads now (they also stop at the end of an epoch and on reset)."""
        shutdown_mapper(self._mapper)
        restore_default_threads(self._user_threads)

    # -- bad rows ----------------------------------------------------------

    def _on_bad_row(self, bad: BadRow) -> None:
        self._bad_rows += 1
        self.stats.record_bad_row(bad)
        self._reports.append(bad.report())
        if self.on_error == "raise":
            raise DecodeError(
                f"cannot decode the audio of row {bad.row} of {bad.file!r} (index {bad.key.index}, "
                f"pass {bad.key.pass_index}): {bad.reason}. Pass on_error='skip' to skip and count such rows.",
                file=bad.file, row=bad.row, index=bad.key.index, reason=bad.reason)

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
            "expected, raise the budget (max_error_fraction=..., error_budget_min_rows=...); "
            "see stats.bad_rows for every reason.",
            report=list(self._reports))


def _validate(source: Any, features: Any, seed: Any, num_workers: Any, augment: Any, on_error: Any,
              max_error_fraction: Any, error_budget_min_rows: Any, stats: Any, snapshot_frequency: Any) -> None:
    """Argument checks; each error names the argument."""
    def is_int(value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    if not isinstance(source, BaseNode):
        raise TypeError(f"DecodeSpectrogram source must be a torchdata BaseNode, got {type(source).__name__}")
    if not isinstance(features, MelSpectrogramConfig):
        raise TypeError(f"features must be a MelSpectrogramConfig, got {type(features).__name__}")
    if not is_int(seed):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    if not is_int(num_workers) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r}: must be an integer >= 0 (0 decodes inline)")
    if augment is not None and not callable(augment):
        raise TypeError(f"augment must be callable(waveform, rng) or None, got {type(augment).__name__}")
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error={on_error!r}: must be one of {ON_ERROR_CHOICES}")
    if (isinstance(max_error_fraction, bool) or not isinstance(max_error_fraction, (int, float))
            or not 0.0 <= max_error_fraction <= 1.0):
        raise ValueError(f"max_error_fraction={max_error_fraction!r}: must be a number in [0, 1]")
    if not is_int(error_budget_min_rows) or error_budget_min_rows < 1:
        raise ValueError(f"error_budget_min_rows={error_budget_min_rows!r}: must be an integer >= 1")
    if stats is not None and not isinstance(stats, LoaderStats):
        raise TypeError(f"stats must be a LoaderStats or None, got {type(stats).__name__}")
    if not is_int(snapshot_frequency) or snapshot_frequency < 0:
        raise ValueError(f"snapshot_frequency={snapshot_frequency!r}: must be an integer >= 0")
