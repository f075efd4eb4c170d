"""Augmentations: small frozen dataclasses, composable in a list, each a pure function of ``(seed, key)``.

``AudioLoader(..., augment=[al.SpeedPerturb(), al.Gain(-6, 6), al.AddNoise("noise/", snr_db=(5, 20)),
al.Reverb("rirs/"), my_fn, al.SpecAugment(), al.Mixup(0.2)])``

Every parameter (a gain, a noise row, its offset, an SNR, a speed factor, an
impulse response, a mask, a mixup weight) is drawn with `audioloader.dsp.hashing`
from the seed, a salt naming the choice, the augmentation's position in the
list and the sample's key, never from a worker's RNG: the output is the same for
any ``num_workers`` and worker type, and after a resume. The list runs in
stages, in this order, and must be written in it:

1. ``SpeedPerturb``: while the clip is cut (it changes the length), in the decode workers;
2. waveform augmentations, in list order, in the decode workers: ``Gain``,
   ``AddNoise``, ``Reverb`` and your own ``fn(waveform, rng) -> waveform``
   (``rng``: a ``numpy.random.Generator`` seeded from ``(seed, key)``);
3. ``SpecAugment`` on the features: in the decode workers, or per batch on the
   feature device (``device=``) with the same masks;
4. ``Mixup`` on the batch.

Noise and impulse-response rows are chosen by a pure function of the key and
read by random access inside the worker, by the reader each such augmentation is
given (``open_rows``: `audioloader.shards.dataset.augment_rows.AugmentRows`; this module
opens no files); a noise or impulse-response row that cannot be read makes the
sample a bad row (counted and reported, naming that row), never a silent change.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .. import checks
from ..checks import field_error
from ..errors import DecodeError
from ..samples import Key
from . import hashing as H
from .audio import load_clip
from .augment_math import add_at_snr, apply_masks, reverberate
from .config import FbankConfig, MelSpectrogramConfig

# Stages, in the order they run (see the module docstring).
SPEED, WAVEFORM, FEATURES, BATCH = 0, 1, 2, 3
_STAGE_NAMES = {SPEED: "SpeedPerturb", WAVEFORM: "waveform augmentations (Gain, AddNoise, Reverb, functions)",
                FEATURES: "SpecAugment", BATCH: "Mixup"}

UserAugment = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def _check_p(config: Any) -> None:
    if isinstance(config.p, bool) or not isinstance(config.p, (int, float)) or not 0.0 <= config.p <= 1.0:
        raise field_error(config, "p", "must be a probability in [0, 1]")


def _check_range(config: Any, name: str, low: float, high: float) -> None:
    value = getattr(config, name)
    ok = (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, float)) and math.isfinite(v)
                                                             for v in value) and value[0] <= value[1])
    if not ok or not (low <= value[0] and value[1] <= high):
        raise field_error(config, name, f"must be a (low, high) pair of numbers with {low} <= low <= high <= {high}")


@dataclass(frozen=True)
class Gain:
    """Multiply the waveform by ``10 ** (g / 20)``, ``g`` uniform in ``[min_db, max_db]`` dB, with probability ``p``."""

    min_db: float = -6.0
    max_db: float = 6.0
    p: float = 1.0
    stage: ClassVar[int] = WAVEFORM

    def __post_init__(self) -> None:
        for name in ("min_db", "max_db"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise field_error(self, name, "must be a finite number of dB")
        if self.min_db > self.max_db:
            raise field_error(self, "min_db", f"is above max_db={self.max_db}")
        _check_p(self)


@dataclass(frozen=True)
class AddNoise:
    """Add a noise clip from another set of shards at a signal-to-noise ratio drawn in ``snr_db``.

    The noise row, the window of it that is used (noise shorter than the clip
    is repeated) and the SNR are drawn from the key. The noise is scaled so that
    ``10 log10(mean(clip ** 2) / mean(noise ** 2))`` is the drawn SNR exactly
    (power over the clip as cut, padding included). A silent clip or noise is
    left unchanged (no SNR exists).

    Attributes:
        source: the noise shards (folder, glob, file, URL, a list, or a `ShardDataset`);
            Arrow IPC shards are best (one row is a zero-copy read).
        snr_db: ``(low, high)`` in dB.
        p: probability that a sample gets noise.
        audio_column: the noise shards' audio column.
    """

    source: Any
    snr_db: tuple[float, float] = (5.0, 20.0)
    p: float = 1.0
    audio_column: str = "audio"
    stage: ClassVar[int] = WAVEFORM

    def __post_init__(self) -> None:
        object.__setattr__(self, "snr_db", tuple(self.snr_db) if isinstance(self.snr_db, list) else self.snr_db)
        _check_range(self, "snr_db", -100.0, 200.0)
        _check_p(self)


@dataclass(frozen=True)
class Reverb:
    """Convolve the waveform with an impulse response from another set of shards, with probability ``p``.

    The impulse-response row is drawn from the key; it is resampled to the
    features' rate and convolved (FFT), and the result is cut to the clip's
    length (``(clip * ir)[:len(clip)]``). With ``normalize`` the result is scaled
    to the clip's RMS, so reverberation does not change the level.

    Attributes:
        source: the impulse-response shards (see `AddNoise`).
        p: probability.
        normalize: keep the clip's RMS.
        audio_column: the shards' audio column.
    """

    source: Any
    p: float = 1.0
    normalize: bool = True
    audio_column: str = "audio"
    stage: ClassVar[int] = WAVEFORM

    def __post_init__(self) -> None:
        _check_p(self)


@dataclass(frozen=True)
class SpeedPerturb:
    """Speed perturbation as speech recipes (Kaldi, ESPnet) do it: resample by a factor drawn from ``factors``.

    A factor ``f`` plays the clip ``f`` times faster (pitch up by ``f``, length
    divided by ``f``): the signal is taken as sampled at ``f * rate`` and
    resampled to ``rate`` with soxr. Whole utterances get ``round(len / f)``
    samples; a fixed-length crop is cut ``f`` times longer from the source,
    then perturbed back to the crop length. Must be the first of the list.
    """

    factors: tuple[float, ...] = (0.9, 1.0, 1.1)
    p: float = 1.0
    stage: ClassVar[int] = SPEED

    def __post_init__(self) -> None:
        factors = tuple(self.factors) if isinstance(self.factors, (list, tuple)) else self.factors
        object.__setattr__(self, "factors", factors)
        if not (isinstance(factors, tuple) and factors and all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0.25 <= f <= 4.0 for f in factors)):
            raise field_error(self, "factors", "must be a non-empty tuple of speed factors in [0.25, 4]")
        _check_p(self)


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment (Park et al. 2019) frequency and time masks on the features, with probability ``p``.

    ``freq_masks`` bands of ``0..max_freq_width`` bins and ``time_masks`` bands of
    ``0..max_time_width`` frames, each width and start drawn from the key (time
    masks within the sample's frames), are set to ``fill``: ``"mean"`` (the
    sample's mean over its unpadded features, computed before masking, as ESPnet
    does) or ``"zero"``. The same masks whether the features are computed in the
    decode workers or per batch on a device (``device=``).
    """

    freq_masks: int = 2
    max_freq_width: int = 15
    time_masks: int = 2
    max_time_width: int = 20
    fill: str = "mean"
    p: float = 1.0
    stage: ClassVar[int] = FEATURES

    def __post_init__(self) -> None:
        for name in ("freq_masks", "max_freq_width", "time_masks", "max_time_width"):
            checks.field_count(self, name, minimum=0)
        if self.fill not in ("mean", "zero"):
            raise field_error(self, "fill", "must be 'mean' or 'zero'")
        _check_p(self)


@dataclass(frozen=True)
class Mixup:
    """Mixup (Zhang et al. 2018) within each batch: ``x_i <- w x_i + (1 - w) x_j``.

    Each sample draws its weight ``w ~ Beta(alpha, alpha)`` (with probability
    ``1 - p`` it is not mixed: ``w = 1``) and a pairing number, both from its key;
    the batch's samples, ordered by pairing number, are each mixed with the next
    (a cycle), so the pairs are a pure function of the batch. The batch gains
    ``mixup_weights`` float32 ``[B, 2]`` (``w``, ``1 - w``: they sum to 1),
    ``mixup_partner`` int64 ``[B]`` (the partner's position in the batch) and,
    with labels, ``mixup_labels`` int64 ``[B, 2]`` (own and partner's label);
    `mixup_targets` turns them into soft targets. Fixed-length crops only.
    """

    alpha: float = 0.2
    p: float = 1.0
    stage: ClassVar[int] = BATCH

    def __post_init__(self) -> None:
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise field_error(self, "alpha", "must be a positive number (Beta(alpha, alpha))")
        _check_p(self)


AUGMENTATIONS = (Gain, AddNoise, Reverb, SpeedPerturb, SpecAugment, Mixup)


# ---------------------------------------------------------------------------------- the ops, bound to a seed


class _Op:
    """One augmentation of a list, bound to the seed and its position: draws parameters, applies them."""

    def __init__(self, config: Any, position: int, seed: int) -> None:
        self.config, self.position, self.seed = config, position, seed

    @property
    def stage(self) -> int:
        return self.config.stage

    def _u(self, salt: int, parts: tuple[int, ...]) -> float:
        return H.uniform(self.seed, H.salt_at(salt, self.position), *parts)

    def _int(self, n: int, salt: int, parts: tuple[int, ...]) -> int:
        return H.uniform_int(n, self.seed, H.salt_at(salt, self.position), *parts)

    def applies(self, parts: tuple[int, ...]) -> bool:
        p = getattr(self.config, "p", 1.0)
        return p >= 1.0 or self._u(H.SALT_APPLY, parts) < p

    def draw(self, key: Key) -> dict[str, Any]:
        """This augmentation's parameters for ``key`` ({} when it does not apply)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Plain data identifying the augmentation (for checkpoint fingerprints)."""
        return {"type": type(self.config).__name__, **dataclasses.asdict(self.config)}


class _Gain(_Op):
    def draw(self, key: Key) -> dict[str, Any]:
        parts = key.parts()
        if not self.applies(parts):
            return {}
        low, high = self.config.min_db, self.config.max_db
        return {"gain_db": low + (high - low) * self._u(H.SALT_GAIN, parts)}

    def apply(self, wave: np.ndarray, key: Key, rate: int) -> np.ndarray:
        params = self.draw(key)
        if not params:
            return wave
        return wave * np.float32(10.0 ** (params["gain_db"] / 20.0))


class _RowOp(_Op):
    """An augmentation that draws rows of its own shards (noise, impulse responses), read by ``rows``: an object
    with ``num_rows`` and ``read(row) -> (encoded audio, file, row in file)`` (`AugmentRows`)."""

    def __init__(self, config: Any, position: int, seed: int, rows: Any) -> None:
        super().__init__(config, position, seed)
        self.rows = rows

    @property
    def dataset(self) -> Any:
        """The shards the rows come from (their files' identity goes into checkpoint fingerprints)."""
        return self.rows.dataset

    def _read(self, row: int, rate: int, samples: int | None, parts: tuple[int, ...]) -> np.ndarray:
        """Row ``row`` decoded at ``rate``: a window of ``samples`` drawn from the key (shorter rows whole), or all."""
        audio, file, file_row = self.rows.read(row)

        def offset(n: int) -> int:
            return self._int(n, H.SALT_NOISE_OFFSET, parts)

        try:
            return load_clip(audio, rate, samples, train=True, draw=offset, pad=False)
        except DecodeError as error:
            what = f"{type(self.config).__name__}: row {row} of its shards"
            reason = f"{what} (row {file_row} of {file}): {error.reason}"
            raise DecodeError(reason, reason=reason) from error

    def describe(self) -> dict[str, Any]:
        # Without the source's location: what the draws depend on is its rows (the loader
        # adds the files' identity, as it does for the sources it reads).
        fields = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config) if f.name != "source"}
        return {"type": type(self.config).__name__, **fields}


class _AddNoise(_RowOp):
    def draw(self, key: Key) -> dict[str, Any]:
        parts = key.parts()
        if not self.applies(parts):
            return {}
        low, high = self.config.snr_db
        return {"noise_row": self._int(self.rows.num_rows, H.SALT_NOISE_ROW, parts),
                "snr_db": low + (high - low) * self._u(H.SALT_NOISE_SNR, parts)}

    def apply(self, wave: np.ndarray, key: Key, rate: int) -> np.ndarray:
        params = self.draw(key)
        if not params or len(wave) == 0:
            return wave
        noise = self._read(params["noise_row"], rate, len(wave), key.parts())
        if len(noise) < len(wave):
            noise = np.resize(noise, len(wave))  # repeat a short noise over the clip
        return add_at_snr(wave, noise, params["snr_db"])


class _Reverb(_RowOp):
    def draw(self, key: Key) -> dict[str, Any]:
        parts = key.parts()
        if not self.applies(parts):
            return {}
        return {"ir_row": self._int(self.rows.num_rows, H.SALT_REVERB_ROW, parts)}

    def apply(self, wave: np.ndarray, key: Key, rate: int) -> np.ndarray:
        params = self.draw(key)
        if not params or len(wave) == 0:
            return wave
        ir = self._read(params["ir_row"], rate, None, key.parts())
        return reverberate(wave, ir, normalize=self.config.normalize)


class _SpeedPerturb(_Op):
    def draw(self, key: Key) -> dict[str, Any]:
        parts = key.parts()
        if not self.applies(parts):
            return {}
        factors = self.config.factors
        return {"speed": float(factors[self._int(len(factors), H.SALT_SPEED, parts)])}


class _SpecAugment(_Op):
    def draw(self, key: Key, bins: int = 0, frames: int = 0) -> dict[str, Any]:
        """Masks for ``bins`` x ``frames`` features: ``{"masks": int64 [masks, 2]}``, rows of (start, width)."""
        cfg, parts = self.config, key.parts()
        masks = np.zeros((cfg.freq_masks + cfg.time_masks, 2), dtype=np.int64)
        if not self.applies(parts):
            return {"masks": masks}
        plan = [(bins, cfg.max_freq_width, H.SALT_FREQ_MASK)] * cfg.freq_masks + \
               [(frames, cfg.max_time_width, H.SALT_TIME_MASK)] * cfg.time_masks
        for m, (size, widest, salt) in enumerate(plan):
            width = min(self._int(widest + 1, salt, (*parts, 2 * m)), size)
            masks[m] = (self._int(size - width + 1, salt, (*parts, 2 * m + 1)), width)
        return {"masks": masks}


class _Mixup(_Op):
    def draw(self, key: Key) -> dict[str, Any]:
        parts = key.parts()
        pairing = self._u(H.SALT_MIXUP_PAIR, parts)
        if not self.applies(parts):
            return {"mixup": np.array([1.0, pairing])}
        rng = H.generator(self.seed, H.salt_at(H.SALT_MIXUP, self.position), *parts)
        return {"mixup": np.array([rng.beta(self.config.alpha, self.config.alpha), pairing])}


class _UserFunction(_Op):
    """``fn(waveform, rng)``: ``rng`` seeded from (seed, key); at position 0 exactly as the old ``augment=fn``."""

    @property
    def stage(self) -> int:
        return WAVEFORM

    def apply(self, wave: np.ndarray, key: Key, rate: int) -> np.ndarray:
        rng = H.generator(self.seed, H.salt_at(H.SALT_AUGMENT, self.position), *key.parts())
        out = np.asarray(self.config(wave, rng), dtype=np.float32)
        if out.shape != wave.shape:
            raise ValueError(f"augment returned shape {out.shape}, expected {wave.shape}: "
                             "it must return a waveform of the same length as its input")
        if not (out.flags.c_contiguous and out.flags.writeable):  # torch.from_numpy needs both
            out = out.copy()
        return out

    def describe(self) -> dict[str, Any]:
        fn = self.config
        return {"type": "function", "name": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"}


_OPS = {Gain: _Gain, AddNoise: _AddNoise, Reverb: _Reverb, SpeedPerturb: _SpeedPerturb, SpecAugment: _SpecAugment,
        Mixup: _Mixup}


# ---------------------------------------------------------------------------------- the list


class Augmentations:
    """An ``augment=`` list bound to a seed and a feature config: what the workers and the batch stage run.

    Picklable (worker processes get a copy; noise and impulse-response shards
    are reopened there).

    Args:
        items: the list (or one item): augmentation dataclasses and ``fn(waveform, rng)`` functions.
        seed: the loader's seed.
        features: the feature config (SpecAugment needs a spectrogram-like one).
        per_batch_features: features are computed per batch (``device=``): SpecAugment's
            masks are then drawn in the workers and applied per batch.
        open_rows: ``open_rows(config)`` -> the reader of an `AddNoise` / `Reverb`'s rows
            (`audioloader.shards.dataset.augment_rows.AugmentRows`); needed when the list holds one.
    """

    @classmethod
    def of(cls, augment: Any, seed: int, features: Any, *, per_batch_features: bool = False,
           open_rows: Callable[[Any], Any] | None = None) -> Augmentations | None:
        """``augment=`` as given (a function, a list, or already `Augmentations`) bound to the seed; None for none."""
        if augment is None or isinstance(augment, Augmentations):
            return augment
        if isinstance(augment, (list, tuple)) and not augment:
            return None
        return cls(augment, seed, features, per_batch_features=per_batch_features, open_rows=open_rows)

    def __init__(self, items: Any, seed: int, features: Any, *, per_batch_features: bool = False,
                 open_rows: Callable[[Any], Any] | None = None) -> None:
        items = list(items) if isinstance(items, (list, tuple)) else [items]
        self.seed = int(seed)
        self.features = features
        self.per_batch_features = bool(per_batch_features)
        self.ops = [_bind(item, position, self.seed, open_rows) for position, item in enumerate(items)]
        _check_order(self.ops)
        self._speed = _only(self.ops, SPEED)
        self._waveform = [op for op in self.ops if op.stage == WAVEFORM]
        self.spec = _only(self.ops, FEATURES)
        self.mixup = _only(self.ops, BATCH)
        if self.spec is not None and not isinstance(features, (MelSpectrogramConfig, FbankConfig)):
            raise ValueError(f"SpecAugment masks spectrogram features; {type(features).__name__} has none: use "
                             "MelSpectrogramConfig or FbankConfig, or leave SpecAugment out")

    @property
    def builtin(self) -> bool:
        """Whether the list holds any of the library's augmentations (not only user functions)."""
        return any(not isinstance(op, _UserFunction) for op in self.ops)

    @property
    def per_batch(self) -> bool:
        """Whether anything runs per batch, after the decode workers (`BatchAugment`)."""
        return self.mixup is not None or (self.spec is not None and self.per_batch_features)

    def describe(self) -> list[dict[str, Any]]:
        """Plain data identifying each augmentation (without the files of noise/impulse-response sources)."""
        return [op.describe() for op in self.ops]

    def datasets(self) -> list[Any]:
        """Per augmentation, the shards it reads rows from (`AddNoise`, `Reverb`), else None."""
        return [getattr(op, "dataset", None) for op in self.ops]

    def draws(self, key: Key, frames: int = 0) -> list[dict[str, Any]]:
        """Every augmentation's parameters for ``key``, in list order (for inspection and tests)."""
        return [op.draw(key, _freq_bins(self.features), frames) if op is self.spec else op.draw(key)
                for op in self.ops]

    # -- in the decode workers -----------------------------------------------------------

    def speed_factor(self, key: Key) -> float:
        """The speed factor of ``key`` (1.0 without `SpeedPerturb`)."""
        if self._speed is None:
            return 1.0
        return self._speed.draw(key).get("speed", 1.0)

    def waveform(self, wave: np.ndarray, key: Key) -> np.ndarray:
        """The waveform augmentations in list order: float32 ``[samples]`` at the features' rate -> same shape."""
        rate = self.features.sample_rate
        for op in self._waveform:
            wave = op.apply(wave, key, rate)
        return np.ascontiguousarray(wave, dtype=np.float32)

    def on_features(self, features: torch.Tensor, key: Key) -> torch.Tensor:
        """SpecAugment on one sample's features (when they are computed in the worker)."""
        if self.spec is None or self.per_batch_features:
            return features
        time_axis = self.features.time_axis
        masks = self.spec.draw(key, features.shape[1 - time_axis], features.shape[time_axis])["masks"]
        return apply_masks(features[None], torch.from_numpy(masks)[None], self.spec.config.freq_masks,
                           time_axis, self.spec.config.fill)[0]

    def batch_params(self, key: Key, samples: int) -> dict[str, np.ndarray] | None:
        """Parameters for the batch stage of a sample of ``samples`` waveform samples (None: nothing per batch)."""
        params: dict[str, np.ndarray] = {}
        if self.spec is not None and self.per_batch_features:
            frames = self.features.num_frames(samples)
            params.update(self.spec.draw(key, _freq_bins(self.features), frames))
        if self.mixup is not None:
            params.update(self.mixup.draw(key))
        return params or None


def _bind(item: Any, position: int, seed: int, open_rows: Callable[[Any], Any] | None) -> _Op:
    op = _OPS.get(type(item))
    if op is not None and issubclass(op, _RowOp):
        if open_rows is None:
            raise TypeError(f"augment[{position}] ({type(item).__name__}) reads rows of its shards: bind the list "
                            "with open_rows=audioloader.shards.dataset.augment_rows.AugmentRows")
        return op(item, position, seed, open_rows(item))
    if op is not None:
        return op(item, position, seed)
    if callable(item) and not isinstance(item, type):
        return _UserFunction(item, position, seed)
    names = ", ".join(cls.__name__ for cls in AUGMENTATIONS)
    raise TypeError(f"augment[{position}] is a {type(item).__name__}; expected one of {names} or a function "
                    "fn(waveform, rng) -> waveform")


def _check_order(ops: Sequence[_Op]) -> None:
    for before, after in itertools.pairwise(ops):
        if after.stage < before.stage:
            raise ValueError(
                f"augment[{after.position}] ({type(after.config).__name__}) comes after augment[{before.position}] "
                f"({type(before.config).__name__}) but runs before it: list {_STAGE_NAMES[after.stage]} before "
                f"{_STAGE_NAMES[before.stage]} (the order is SpeedPerturb, waveform augmentations, SpecAugment, "
                "Mixup)")


def _only(ops: Sequence[_Op], stage: int) -> Any:
    found = [op for op in ops if op.stage == stage]
    if len(found) > 1:
        raise ValueError(f"augment lists {type(found[0].config).__name__} {len(found)} times (at "
                         f"{[op.position for op in found]}); give it once")
    return found[0] if found else None


def _freq_bins(features: Any) -> int:
    if isinstance(features, MelSpectrogramConfig):
        return features.n_mels
    if isinstance(features, FbankConfig):
        return features.num_features
    return 0
