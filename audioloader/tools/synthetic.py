"""A seeded synthetic sound-classification dataset, written straight to shards.

Ten classes of synthetic sounds that a small CNN on log-mel spectrograms tells
apart easily, yet with enough per-clip variety (random frequencies, rates,
gains, background noise, durations, sample rates, codecs, channels) to exercise
everything the loader does: decoding WAV and FLAC, resampling from several
rates, mixing stereo down to mono, random crops of long clips and padding of
short ones.

=================  ==========================================================
class              what a clip holds
=================  ==========================================================
``tone``           one steady sine, 150-3000 Hz
``chirp``          repeated frequency sweeps (up or down), 0.25-1 s each
``band_noise``     noise through a band-pass, 30-80 % relative bandwidth
``click_train``    short clicks at 4-25 per second
``am_tone``        a sine whose loudness pulses at 3-15 Hz
``fm_tone``        a sine whose pitch wobbles (vibrato) at 2-8 Hz
``harmonic``       a harmonic stack (fundamental 100-400 Hz, 6-12 partials)
``noise_bursts``   short bursts of white noise, 2-6 per second, silence between
``pink_noise``     steady broadband 1/f noise
``tone_pips``      short tone pips at a new random pitch each, 2-5 per second
=================  ==========================================================

Everything is a pure function of ``seed``: clip ``j`` of class ``c`` draws its
parameters from ``numpy.random.default_rng([seed, c, j])``, so the bytes of a
dataset do not depend on ``workers`` or on the machine. Rows are stored in a
seeded permutation (the classes are mixed within every shard and record batch).

Shards are Arrow IPC files written with `audioloader.shards.formats.writer.ShardWriter`:
columns ``audio`` (binary, encoded WAV/FLAC), ``label`` (int64), ``path``
(string, e.g. ``"chirp/00017.flac"``), ``duration`` (float64 seconds),
``sample_rate`` (int64 Hz), ``channels`` (int64); class names in the schema
metadata. The folder also gets ``labels.json`` (``{name: id}``, like
``audioloader pack``) and, written last, ``dataset.json`` (the parameters and
row count): its presence marks a complete dataset (see `is_complete`).

Example::

    from audioloader.tools.synthetic import make_classification_dataset
    folder = make_classification_dataset("data/synth", clips_per_class=50, seed=0)
    loader = audioloader.AudioLoader(folder, batch_size=32)
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import soundfile as sf

from audioloader.shards.formats.writer import ShardWriter

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_CODECS",
    "DEFAULT_SAMPLE_RATES",
    "SyntheticClip",
    "is_complete",
    "make_classification_dataset",
    "make_clip",
    "read_description",
    "remove_dataset",
]

#: Sample rates (Hz) a clip is stored at, chosen per clip.
DEFAULT_SAMPLE_RATES = (16000, 22050, 32000, 44100, 48000)
#: Codecs a clip is encoded with, chosen per clip: 16-bit PCM WAV and 16-bit FLAC.
DEFAULT_CODECS = ("wav", "flac")
#: Name of the completion marker written last into the output folder.
DESCRIPTION = "dataset.json"
#: Bumped whenever the generated audio changes, so stale caches are rebuilt.
GENERATOR_VERSION = 1

_SUBTYPE = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16")}
# Every class keeps its energy below this (Hz), so it survives resampling to 16 kHz.
_MAX_HZ = 6000.0


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _sine_from_frequency(freq: np.ndarray, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """A sine whose instantaneous frequency (Hz, per sample) is ``freq``; random start phase."""
    phase = 2 * np.pi * np.cumsum(freq) / sample_rate + rng.uniform(0, 2 * np.pi)
    return np.sin(phase)


def _band_limited(noise: np.ndarray, sample_rate: int, low: float, high: float) -> np.ndarray:
    """``noise`` with everything outside ``[low, high]`` Hz removed (FFT mask)."""
    spectrum = np.fft.rfft(noise)
    freqs = np.fft.rfftfreq(len(noise), 1.0 / sample_rate)
    spectrum[(freqs < low) | (freqs > high)] = 0
    out = np.fft.irfft(spectrum, n=len(noise))
    return out / (np.max(np.abs(out)) + 1e-12)


def _events(n: int, sample_rate: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Start samples of events at ``rate`` per second: a regular grid with +-30 % jitter.

    Regular-ish rather than Poisson so that every 2 s window of a clip holds some.
    """
    period = sample_rate / rate
    starts = np.arange(rng.uniform(0, period), n, period)
    starts += rng.uniform(-0.3, 0.3, len(starts)) * period
    return np.clip(starts, 0, n - 1).astype(np.int64)


def _tone(n, sr, rng):
    return _sine_from_frequency(np.full(n, _log_uniform(rng, 150, 3000)), sr, rng)


def _chirp(n, sr, rng):
    # Repeated sweeps, so any crop of a long clip still shows whole sweeps.
    f0 = _log_uniform(rng, 200, 1200)
    f1 = f0 * _log_uniform(rng, 3, min(5000 / f0, 12))
    if rng.random() < 0.5:
        f0, f1 = f1, f0
    period = rng.uniform(0.25, 1.0)
    position = (np.arange(n) / sr / period) % 1.0  # 0..1 within each sweep
    freq = f0 * (f1 / f0) ** position  # exponential sweep
    return _sine_from_frequency(freq, sr, rng)


def _band_noise(n, sr, rng):
    center = _log_uniform(rng, 400, 4000)
    width = center * rng.uniform(0.3, 0.8)
    return _band_limited(rng.standard_normal(n), sr, center - width / 2, min(center + width / 2, _MAX_HZ))


def _click_train(n, sr, rng):
    out = np.zeros(n)
    click_len = max(8, int(0.002 * sr))
    click = rng.standard_normal(click_len) * np.exp(-np.arange(click_len) / (0.3 * click_len))
    for start in _events(n, sr, rng.uniform(4, 25), rng):
        end = min(n, start + click_len)
        out[start:end] += click[: end - start]
    return out


def _am_tone(n, sr, rng):
    carrier = _sine_from_frequency(np.full(n, _log_uniform(rng, 300, 3000)), sr, rng)
    depth = rng.uniform(0.7, 1.0)
    envelope = 1 - depth * 0.5 * (1 + _sine_from_frequency(np.full(n, rng.uniform(3, 15)), sr, rng))
    return carrier * envelope


def _fm_tone(n, sr, rng):
    carrier = _log_uniform(rng, 400, 3000)
    deviation = carrier * rng.uniform(0.1, 0.3)
    vibrato = _sine_from_frequency(np.full(n, rng.uniform(2, 8)), sr, rng)
    return _sine_from_frequency(carrier + deviation * vibrato, sr, rng)


def _harmonic(n, sr, rng):
    f0 = _log_uniform(rng, 100, 400)
    partials = int(rng.integers(6, 13))
    rolloff = rng.uniform(0.5, 1.5)
    out = np.zeros(n)
    for k in range(1, partials + 1):
        if k * f0 < _MAX_HZ:
            out += _sine_from_frequency(np.full(n, k * f0), sr, rng) / k**rolloff
    return out


def _noise_bursts(n, sr, rng):
    out = np.zeros(n)
    for start in _events(n, sr, rng.uniform(2, 6), rng):
        length = int(rng.uniform(0.03, 0.15) * sr)
        end = min(n, start + length)
        out[start:end] = rng.standard_normal(end - start) * np.hanning(length)[: end - start]
    return out


def _pink_noise(n, sr, rng):
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1.0 / sr)
    spectrum /= np.sqrt(np.maximum(freqs, 20.0))  # power ~ 1/f
    spectrum[freqs > _MAX_HZ] = 0
    out = np.fft.irfft(spectrum, n=n)
    return out / (np.max(np.abs(out)) + 1e-12)


def _tone_pips(n, sr, rng):
    out = np.zeros(n)
    for start in _events(n, sr, rng.uniform(2, 5), rng):
        length = int(rng.uniform(0.06, 0.15) * sr)
        end = min(n, start + length)
        pip = np.sin(2 * np.pi * _log_uniform(rng, 300, 4000) * np.arange(length) / sr) * np.hanning(length)
        out[start:end] = pip[: end - start]
    return out


#: The generators, in label-id order: ``fn(num_samples, sample_rate, rng) -> float64 [num_samples]``.
_GENERATORS: dict[str, Callable[[int, int, np.random.Generator], np.ndarray]] = {
    "tone": _tone,
    "chirp": _chirp,
    "band_noise": _band_noise,
    "click_train": _click_train,
    "am_tone": _am_tone,
    "fm_tone": _fm_tone,
    "harmonic": _harmonic,
    "noise_bursts": _noise_bursts,
    "pink_noise": _pink_noise,
    "tone_pips": _tone_pips,
}
#: Class names in label-id order (``CLASS_NAMES[label]``).
CLASS_NAMES: tuple[str, ...] = tuple(_GENERATORS)


@dataclass(frozen=True)
class SyntheticClip:
    """One generated clip.

    Attributes:
        audio: the encoded file (WAV or FLAC bytes).
        label: class id (index into `CLASS_NAMES`).
        path: a descriptive name, ``"<class>/<clip:05d>.<wav|flac>"``.
        duration: seconds.
        sample_rate: Hz, as stored in the file.
        channels: 1 (mono) or 2 (stereo).
    """

    audio: bytes
    label: int
    path: str
    duration: float
    sample_rate: int
    channels: int


def make_clip(label: int, clip: int, *, seed: int = 0, min_seconds: float = 1.0, max_seconds: float = 8.0,
              sample_rates: Sequence[int] = DEFAULT_SAMPLE_RATES, codecs: Sequence[str] = DEFAULT_CODECS,
              stereo_fraction: float = 0.1) -> SyntheticClip:
    """Generate and encode clip number ``clip`` of class ``label``; a pure function of its arguments.

    The signal is the class's sound at a random gain (-20 to -2 dBFS peak),
    plus white background noise 25-45 dB below it, with 5 ms fades at both
    ends. A stereo clip holds the same sound in both channels at different
    gains with independent background noise, so it mixes down to mono cleanly.

    Args:
        label: class id in ``range(len(CLASS_NAMES))``.
        clip: clip number within the class (any int >= 0).
        seed: dataset seed.
        min_seconds, max_seconds: the duration is uniform in this range (seconds).
        sample_rates: the stored rate is chosen uniformly from these (Hz; each >= 16000,
            so every class's content, below 6 kHz, survives).
        codecs: chosen uniformly from ``"wav"`` (PCM16) and ``"flac"`` (16 bit).
        stereo_fraction: probability that a clip is stereo.
    """
    name = CLASS_NAMES[label]
    rng = np.random.default_rng([int(seed), int(label), int(clip)])
    sample_rate = int(sample_rates[int(rng.integers(len(sample_rates)))])
    codec = codecs[int(rng.integers(len(codecs)))]
    stereo = bool(rng.random() < stereo_fraction)
    duration = float(rng.uniform(min_seconds, max_seconds))
    n = max(1, round(duration * sample_rate))

    signal = _GENERATORS[name](n, sample_rate, rng)
    signal = signal / (np.max(np.abs(signal)) + 1e-12) * 10 ** (rng.uniform(-20, -2) / 20)
    noise_level = np.max(np.abs(signal)) * 10 ** (-rng.uniform(25, 45) / 20)
    fade = np.ones(n)
    ramp = min(n // 2, int(0.005 * sample_rate))
    if ramp:
        fade[:ramp] = np.linspace(0, 1, ramp)
        fade[n - ramp:] = np.linspace(1, 0, ramp)
    if stereo:
        gains = rng.uniform(0.6, 1.0, 2)
        frames = np.stack([signal * g + noise_level * rng.standard_normal(n) for g in gains], axis=1)
        frames *= fade[:, None]
    else:
        frames = (signal + noise_level * rng.standard_normal(n)) * fade
    fmt, subtype = _SUBTYPE[codec]
    buf = io.BytesIO()
    sf.write(buf, np.clip(frames, -1, 1).astype(np.float32), sample_rate, format=fmt, subtype=subtype)
    return SyntheticClip(buf.getvalue(), label, f"{name}/{clip:05d}.{codec}", n / sample_rate, sample_rate,
                         2 if stereo else 1)


def _check(name: str, ok: bool, why: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r}: {why}")


def _ordered_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> Iterator[Any]:
    """``map(fn, items)`` on ``workers`` threads, in order, at most ``2 * workers`` results in memory."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="audioloader-synth") as pool:
        pending = []
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


def _parameters(**kwargs: Any) -> dict[str, Any]:
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    params["generator_version"] = GENERATOR_VERSION
    return params


def read_description(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``dataset.json`` of a generated folder (parameters, rows, shards), or None if absent/unreadable."""
    try:
        return json.loads((Path(folder) / DESCRIPTION).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(folder: str | os.PathLike[str], **parameters: Any) -> bool:
    """Whether ``folder`` holds a finished dataset made with these `make_classification_dataset` arguments.

    Checks its description, dataset.json (written last), and that each shard it lists exists with its recorded size.
    Arguments left out are not compared.
    """
    description = read_description(folder)
    if description is None:
        return False
    wanted = _parameters(**parameters)
    if any(description["parameters"].get(k) != v for k, v in wanted.items()):
        return False
    for shard in description["shards"]:
        path = Path(folder) / shard["name"]
        if not path.is_file() or path.stat().st_size != shard["bytes"]:
            return False
    return True


def make_classification_dataset(
    out_dir: str | os.PathLike[str],
    clips_per_class: int = 50,
    *,
    seed: int = 0,
    num_shards: int = 4,
    min_seconds: float = 1.0,
    max_seconds: float = 8.0,
    sample_rates: Sequence[int] = DEFAULT_SAMPLE_RATES,
    codecs: Sequence[str] = DEFAULT_CODECS,
    stereo_fraction: float = 0.1,
    num_classes: int | None = None,
    first_clip: int = 0,
    rows_per_batch: int = 16,
    workers: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a labeled synthetic dataset to ``out_dir`` as Arrow IPC shards; returns ``out_dir`` as a Path.

    Args:
        out_dir: output folder (created). Gets ``shard-00000.arrow`` ... ``labels.json``, ``dataset.json``.
        clips_per_class: clips of each class; rows = ``clips_per_class * num_classes``.
        seed: everything (parameters, noise, codec, rate, row order) is a pure function of it.
        num_shards: shard files (<= rows); rows are spread evenly over them.
        min_seconds, max_seconds: clip durations are uniform in this range (seconds). The default
            1-8 s gives clips both shorter and longer than a typical 2-5 s training crop.
        sample_rates: stored sample rates (Hz, each >= 16000), chosen per clip.
        codecs: ``"wav"`` (PCM16) and/or ``"flac"``, chosen per clip.
        stereo_fraction: probability that a clip is stereo (0 = all mono).
        num_classes: use only the first ``num_classes`` of `CLASS_NAMES` (default all ten).
        first_clip: number of the first clip of each class. Two datasets with the same
            seed and disjoint clip ranges hold different clips: e.g. train = clips 0-99,
            eval = ``first_clip=100``.
        rows_per_batch: rows per Arrow record batch (the reader's I/O unit and smallest split).
        workers: threads that synthesize and encode (numpy and libsndfile release the GIL);
            default ``min(4, os.cpu_count())``. The output does not depend on it.
        overwrite: replace an existing dataset in ``out_dir``; otherwise a folder that already
            holds shards or a dataset.json is an error.

    Returns:
        ``Path(out_dir)``.

    Raises:
        ValueError: a bad argument (the message names it), or ``out_dir`` holds a dataset and
            ``overwrite`` is false.
    """
    num_classes = len(CLASS_NAMES) if num_classes is None else num_classes
    _check("clips_per_class", isinstance(clips_per_class, int) and clips_per_class >= 1, "must be an int >= 1",
           clips_per_class)
    _check("num_classes", isinstance(num_classes, int) and 2 <= num_classes <= len(CLASS_NAMES),
           f"must be an int in [2, {len(CLASS_NAMES)}]", num_classes)
    _check("num_shards", isinstance(num_shards, int) and 1 <= num_shards <= clips_per_class * num_classes,
           "must be an int in [1, rows]", num_shards)
    _check("min_seconds", 0 < min_seconds <= max_seconds, "need 0 < min_seconds <= max_seconds", min_seconds)
    _check("sample_rates", len(sample_rates) > 0 and all(int(r) >= 16000 for r in sample_rates),
           "need at least one rate, each >= 16000 Hz", sample_rates)
    _check("codecs", len(codecs) > 0 and all(c in _SUBTYPE for c in codecs),
           f"need at least one of {sorted(_SUBTYPE)}", codecs)
    _check("stereo_fraction", 0.0 <= stereo_fraction <= 1.0, "must be in [0, 1]", stereo_fraction)
    _check("first_clip", isinstance(first_clip, int) and first_clip >= 0, "must be an int >= 0", first_clip)
    workers = min(4, os.cpu_count() or 1) if workers is None else workers
    _check("workers", isinstance(workers, int) and workers >= 1, "must be an int >= 1", workers)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob("shard-*.arrow"))
    if (existing or (out / DESCRIPTION).exists()) and not overwrite:
        raise ValueError(f"out_dir={str(out)!r} already holds a dataset; pass overwrite=True to replace it")
    # The description (dataset.json) goes first, so an interrupted rewrite never looks complete.
    (out / DESCRIPTION).unlink(missing_ok=True)
    for path in existing:
        path.unlink()

    names = list(CLASS_NAMES[:num_classes])
    jobs = [(label, first_clip + j) for label in range(num_classes) for j in range(clips_per_class)]
    order = np.random.default_rng([int(seed), 0x5EED]).permutation(len(jobs))  # mix classes in every shard
    jobs = [jobs[i] for i in order]
    clip_args = dict(seed=seed, min_seconds=min_seconds, max_seconds=max_seconds, sample_rates=tuple(sample_rates),
                     codecs=tuple(codecs), stereo_fraction=stereo_fraction)

    extra = {"path": pa.string(), "duration": pa.float64(), "sample_rate": pa.int64(), "channels": pa.int64()}
    bounds = np.linspace(0, len(jobs), num_shards + 1).round().astype(int)
    clips = _ordered_map(lambda job: make_clip(*job, **clip_args), jobs, workers)
    shards = []
    for s in range(num_shards):
        path = out / f"shard-{s:05d}.arrow"
        with ShardWriter(path, label_names=names, extra_columns=extra, rows_per_batch=rows_per_batch) as writer:
            for _ in range(bounds[s], bounds[s + 1]):
                c = next(clips)
                writer.write(c.audio, c.label, path=c.path, duration=c.duration, sample_rate=c.sample_rate,
                             channels=c.channels)
        shards.append({"name": path.name, "rows": int(bounds[s + 1] - bounds[s]), "bytes": path.stat().st_size})

    with open(out / "labels.json", "w", encoding="utf-8") as f:
        json.dump({name: i for i, name in enumerate(names)}, f, indent=1)
    description = {
        "parameters": _parameters(clips_per_class=clips_per_class, seed=seed, num_shards=num_shards,
                                  min_seconds=min_seconds, max_seconds=max_seconds, sample_rates=tuple(sample_rates),
                                  codecs=tuple(codecs), stereo_fraction=stereo_fraction, num_classes=num_classes,
                                  first_clip=first_clip, rows_per_batch=rows_per_batch),
        "label_names": names,
        "rows": len(jobs),
        "shards": shards,
    }
    tmp = out / f".{DESCRIPTION}.tmp"
    tmp.write_text(json.dumps(description, indent=1), encoding="utf-8")
    os.replace(tmp, out / DESCRIPTION)
    return out


def remove_dataset(folder: str | os.PathLike[str]) -> None:
    """Delete what `make_classification_dataset` wrote in ``folder`` (and the folder, if then empty)."""
    out = Path(folder)
    for path in [out / DESCRIPTION, out / "labels.json", *out.glob("shard-*.arrow")]:
        path.unlink(missing_ok=True)
    if out.is_dir() and not any(out.iterdir()):
        shutil.rmtree(out)
