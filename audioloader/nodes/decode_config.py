"""DecodeConfig: what `DecodeSpectrogram` makes of each row and how it hands rows to its workers, as one group.

`AudioLoader` settles it (with the loader's `Workers`) before the chain is built; a
hand-built chain gives it whole, or its fields one by one to `DecodeSpectrogram.of`,
whose keyword checks are here too (`check_fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from .. import checks
from ..dsp.config import FeatureConfig, LengthPolicy, MelSpectrogramConfig, Segments, check_features
from ..errors import ON_ERROR_ACTIONS, OnError
from ..stats import LoaderStats
from ..workers import Workers
from .parallel_map import AUTO, BACKENDS

#: The default feature configuration (``MelSpectrogramConfig()``; frozen, so safe to share).
DEFAULT_FEATURES = MelSpectrogramConfig()

#: The default length policy: a fixed crop of the features' ``clip_seconds`` (random in training).
DEFAULT_LENGTH = LengthPolicy()

#: What a bad row does by default: skipped, within `OnError`'s budget.
SKIP_BAD_ROWS = OnError()

#: Who decodes when nobody says: 4 threads.
DEFAULT_WORKERS = Workers(num_workers=4, kind="thread")


@dataclass(frozen=True)
class DecodeConfig:
    """What `DecodeSpectrogram` makes of each row, checked once, here.

    Fields:
        features: the spectrogram parameters (a `FeatureConfig`).
        seed: seeds the crop offsets and the augmentation RNGs.
        train: random crop + end padding; else centre crop + centred padding.
        augment: optional ``augment(waveform float32 [clip_samples], rng) -> array [clip_samples]``
            applied to the cropped waveform before the mel; ``rng`` is a
            ``numpy.random.Generator`` seeded from ``(seed, key)``. Its exceptions
            reach the caller with their type and attributes (from a thread, with the
            original traceback; from a process, with its text as ``__cause__``).
            With worker processes it must be importable (a module-level function).
            Or a list of augmentations (`audioloader.dsp.augment`) and such functions;
            the per-batch ones (`Mixup`, and `SpecAugment` when ``compute_features``
            is False) are only drawn here, into ``Sample.batch_params``, and applied by `BatchAugment`.
        on_error: an `OnError` (the action and its error budget), or its action (``"skip"``: bad rows are
            counted, reported in ``stats`` and dropped, within the error budget; ``"raise"``: `DecodeError` at
            the first), kept as an `OnError`.
        window: decode only the crop window where the format allows (same result,
            less work); False always decodes whole files (the reference path).
        compute_features: False yields the cropped waveform instead of the log-mel.
        length: one `LengthPolicy`, or one per source of a mix (indexed by ``Key.source``; kept as a tuple).
        segments: `Segments`: each row is the window of its audio named by two of its
            extra columns (the source must read them), decoded alone (None: whole rows).
        decoder: the decoder backend, ``"auto"``, ``"sndfile"`` or ``"ffmpeg"`` (`audioloader.dsp.ffmpeg`), or one
            per source of a mix (indexed by ``Key.source``; kept as a tuple).
        guard: ``guard(path)``, run before a row's audio is touched; raises when the
            shard changed under the reader (memory-mapped rows are checked in any case: `RawSample.mapped`).
        chunk_size: rows per task handed to a worker (None: 8 for processes, 4 for threads).
        max_bytes_in_flight: hand out no further chunk while the rows in flight hold this many bytes
            (`held_bytes`; at least one chunk is always in flight); None: ``num_workers`` x 2 chunks whatever
            they weigh. The bytes in flight are reported in ``stats()["memory"]["decode_in_flight"]``.
    """

    features: FeatureConfig = DEFAULT_FEATURES
    seed: int = 0
    train: bool = True
    augment: Any = None
    on_error: OnError | str = SKIP_BAD_ROWS
    window: bool = True
    compute_features: bool = True
    length: LengthPolicy | Sequence[LengthPolicy] = DEFAULT_LENGTH
    segments: Segments | None = None
    decoder: str | Sequence[str] = "auto"
    guard: Callable[[str], None] | None = None
    chunk_size: int | None = None
    max_bytes_in_flight: int | None = None

    def __post_init__(self) -> None:
        check_features(self.features)
        check_seed_and_action(self.seed, self.on_error)
        if self.segments is not None and not isinstance(self.segments, Segments):
            raise TypeError(f"segments must be a Segments or None, got {type(self.segments).__name__}")
        length = self.length
        if not isinstance(length, LengthPolicy):
            policies = tuple(length) if isinstance(length, Sequence) else ()
            if not policies or not all(isinstance(p, LengthPolicy) for p in policies):
                raise TypeError(f"length must be a LengthPolicy or a list of them (one per source), got {length!r}")
            object.__setattr__(self, "length", policies)
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "train", bool(self.train))
        object.__setattr__(self, "window", bool(self.window))
        object.__setattr__(self, "compute_features", bool(self.compute_features))
        if not isinstance(self.on_error, OnError):
            object.__setattr__(self, "on_error", OnError(self.on_error))
        if not isinstance(self.decoder, str):
            object.__setattr__(self, "decoder", tuple(self.decoder))


def check_seed_and_action(seed: Any, on_error: Any) -> None:
    """The seed is an integer; ``on_error`` an `OnError` or one of its actions."""
    if not checks.is_integer(seed):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    if not isinstance(on_error, OnError) and on_error not in ON_ERROR_ACTIONS:
        raise ValueError(f"on_error={on_error!r}: must be one of {ON_ERROR_ACTIONS} or an OnError")


def decoding_workers(workers: Any) -> Workers:
    """``workers`` checked for a `DecodeSpectrogram`: a `Workers` whose kind and count are decided."""
    if not isinstance(workers, Workers):
        raise TypeError(f"workers must be an audioloader.Workers, got {type(workers).__name__}")
    if workers.kind == "auto" or workers.num_workers is None:
        raise ValueError(f"{workers}: a DecodeSpectrogram needs kind='thread' or 'process' and a num_workers "
                         "(AudioLoader decides 'auto' and None for the machine)")
    return workers


def check_node_arguments(source: Any, stats: Any, fetch: Any) -> None:
    """The arguments a `DecodeSpectrogram` takes beside its groups."""
    if not isinstance(source, BaseNode):
        raise TypeError(f"DecodeSpectrogram source must be a torchdata BaseNode, got {type(source).__name__}")
    if stats is not None and not isinstance(stats, LoaderStats):
        raise TypeError(f"stats must be a LoaderStats or None, got {type(stats).__name__}")
    if fetch is not None and not callable(fetch):
        raise TypeError(f"fetch must be callable(keys) -> rows, or None, got {type(fetch).__name__}")


def check_fields(source: Any, features: Any, seed: Any, num_workers: Any, on_error: Any,
                 max_error_fraction: Any, error_budget_min_rows: Any, stats: Any, snapshot_frequency: Any,
                 worker_type: Any, fetch: Any) -> None:
    """`DecodeSpectrogram.of`'s keyword checks; each error names the argument."""
    check_node_arguments(source, stats, fetch)
    check_features(features)
    check_seed_and_action(seed, on_error)
    if num_workers != AUTO:
        if isinstance(num_workers, str):
            raise ValueError(f"num_workers={num_workers!r}: must be an integer >= 0 (0 decodes inline) or "
                             f"{AUTO!r} (processes that size themselves)")
        checks.count("num_workers", num_workers, minimum=0, hint=" (0 decodes inline)")
    if isinstance(on_error, OnError) and (max_error_fraction is not None or error_budget_min_rows is not None):
        raise ValueError("on_error=OnError(...) holds the error budget: give max_fraction= and min_rows= there, "
                         "not max_error_fraction= / error_budget_min_rows= beside it")
    if max_error_fraction is not None and (
            isinstance(max_error_fraction, bool) or not isinstance(max_error_fraction, (int, float))
            or not 0.0 <= max_error_fraction <= 1.0):
        raise ValueError(f"max_error_fraction={max_error_fraction!r}: must be a number in [0, 1]")
    if error_budget_min_rows is not None:
        checks.count("error_budget_min_rows", error_budget_min_rows)
    checks.count("snapshot_frequency", snapshot_frequency, minimum=0)
    if worker_type not in BACKENDS:
        raise ValueError(f"worker_type={worker_type!r}: must be one of {BACKENDS}")


def error_policy(on_error: str | OnError, max_error_fraction: float | None,
                 error_budget_min_rows: int | None) -> OnError:
    """``on_error`` as an `OnError`: the group as given, or the action with the budget given beside it (checked by
    `check_fields`; a field left None takes `OnError`'s default)."""
    if isinstance(on_error, OnError):
        return on_error
    budget = {"max_fraction": max_error_fraction, "min_rows": error_budget_min_rows}
    return OnError(on_error, **{name: value for name, value in budget.items() if value is not None})


#: `DecodeConfig`'s defaults: log-mels of `MelSpectrogramConfig()`, training crops, seed 0, bad rows skipped.
DEFAULT_DECODE = DecodeConfig()
