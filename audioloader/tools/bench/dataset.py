"""The standard benchmark dataset: synthetic but realistic clips, packed into shards with the project's `pack`.

Every benchmark of the project (loader, decode, reader) uses these shards so
that numbers are comparable. The default is the audio of a typical training
set as it is stored today: ``clips`` clips of 10 s, 44.1 kHz mono FLAC (16
bit), each row of an Arrow IPC *file* shard holding one original file's bytes.

Content: every clip is a mixture of 2-5 harmonic "notes" (fundamentals 60 Hz -
2 kHz, 3-8 harmonics with a decaying spectrum, vibrato, attack/decay
envelopes that start and stop during the clip), percussive bursts (decaying
noise), and a pink-ish noise floor 25-45 dB below the signal. The point is the
*encoded size and decode cost*: silence or a pure tone would compress to almost
nothing in FLAC and make decoding unrealistically cheap. The generated FLAC
comes out at about 55-70 % of 16-bit PCM, like real music or field recordings.

Everything is a pure function of the `DatasetSpec` (seeded per clip), so a
dataset is generated once and then reused from the cache folder, keyed by the
spec: by default ``bench/`` under the machine cache folder
(`audioloader.shards.storage.machine_cache.cache_root`: ``$AUDIOLOADER_CACHE``, else
``$XDG_CACHE_HOME/audioloader``, else ``~/.cache/audioloader``), never the working
directory. `clear_cache` (``audioloader bench --clear-cache``) removes the datasets.

Layout of one cached dataset::

    ~/.cache/audioloader/bench/flac-44100hz-10s-1ch-n1000-c10-r256-s0-v1/
        src/class_03/clip_000123.flac      the original files (input of `pack`)
        shards/shard-00000.arrow ...       pack(src) -- original bytes, untouched
        packed-32000hz-flac/...            pack(src, sample_rate=32000, codec="flac")
        packed-32000hz-pcm16/...           pack(src, sample_rate=32000, codec="pcm16")
        spec.json                          the spec, written last (marks the folder complete)

Command line (prints the shards folder)::

    python -m audioloader.tools.bench.dataset --clips 1000 --seconds 10 --codec flac
    python -m audioloader.tools.bench.dataset --clips 1000 --packed 32000:pcm16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import checks

__all__ = ["CODECS", "DatasetSpec", "cache_usage", "clear_cache", "default_cache_dir", "encode_clip", "packed_dataset",
           "standard_dataset", "synth_clip"]

#: Bump when the generated content changes, so old caches are not reused.
GENERATOR_VERSION = 1

#: A dataset folder of the cache (`DatasetSpec.key`), or one being built (``.KEY.XXXXXXXX.tmp``): the only
#: names `clear_cache` removes, so that a mistaken ``--cache-dir`` never loses anything else.
_DATASET_NAME = re.compile(r"\.?(?:flac|wav|ogg|mp3)-\d+hz-[0-9pe+-]+s-\dch-n\d+-c\d+-r\d+-s-?\d+-v\d+"
                           r"(?:\.[0-9a-f]{8}\.tmp)?")


def default_cache_dir() -> Path:
    """``bench/`` under the machine cache folder (`audioloader.shards.storage.machine_cache.cache_root`), read from the
    environment on every call."""
    from audioloader.shards.storage.machine_cache import cache_root

    return cache_root() / "bench"

#: Source codecs: file suffix, libsndfile format and subtype.
CODECS = {
    "flac": (".flac", "FLAC", "PCM_16"),
    "wav": (".wav", "WAV", "PCM_16"),
    "ogg": (".ogg", "OGG", "VORBIS"),
    "mp3": (".mp3", "MP3", "MPEG_LAYER_III"),
}


@dataclass(frozen=True)
class DatasetSpec:
    """What to generate.

    Attributes:
        clips: number of clips (rows).
        seconds: length of every clip in seconds.
        sample_rate: Hz of the stored audio.
        codec: ``"flac"`` (default), ``"wav"`` (PCM16), ``"ogg"`` (Vorbis) or ``"mp3"``.
        channels: 1 (mono) or 2 (stereo: the two channels are different mixes).
        classes: number of labels; clip ``i`` is in class folder ``i % classes``.
        rows_per_shard: rows per shard file (so 1000 clips make 4 files by default).
        seed: content seed.
    """

    clips: int = 1000
    seconds: float = 10.0
    sample_rate: int = 44100
    codec: str = "flac"
    channels: int = 1
    classes: int = 10
    rows_per_shard: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"codec={self.codec!r}: must be one of {', '.join(CODECS)}")
        for name in ("clips", "sample_rate", "channels", "classes", "rows_per_shard"):
            checks.positive_integer(name, getattr(self, name))
        if self.channels > 2:
            raise ValueError(f"channels={self.channels}: 1 or 2")
        if not self.seconds > 0:
            raise ValueError(f"seconds={self.seconds!r}: must be > 0")

    @property
    def key(self) -> str:
        """Folder name of this spec in the cache."""
        seconds = f"{self.seconds:g}".replace(".", "p")
        return (f"{self.codec}-{self.sample_rate}hz-{seconds}s-{self.channels}ch-n{self.clips}"
                f"-c{self.classes}-r{self.rows_per_shard}-s{self.seed}-v{GENERATOR_VERSION}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# -- content ---------------------------------------------------------------------------------------------


def _envelope(n: int, sample_rate: int, rng: np.random.Generator) -> tuple[int, int, np.ndarray]:
    """A note's span ``[start, stop)`` and its amplitude there: attack ramp, then exponential decay."""
    start = int(rng.uniform(0.0, 0.6) * n)
    stop = min(n, start + max(1, int(rng.uniform(0.3, 1.0) * n)))
    attack = max(1, int(rng.uniform(0.005, 0.08) * sample_rate))
    steps = np.arange(stop - start, dtype=np.float32)
    shape = np.exp(-steps / sample_rate * rng.uniform(0.05, 1.5)).astype(np.float32)
    return start, stop, shape * np.minimum(np.float32(1.0), steps / attack)


def _pinkish_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """White noise through a one-pole low-pass mixed with the white part: a tilted, pink-ish spectrum."""
    white = rng.standard_normal(n).astype(np.float32)
    # The one-pole filter 1 / (1 - alpha z^-1), applied in the frequency domain
    # (one FFT instead of a Python-speed recursion).
    alpha = 0.97
    spectrum = np.fft.rfft(white)
    freqs = np.fft.rfftfreq(n)
    response = 1.0 / np.abs(1.0 - alpha * np.exp(-2j * np.pi * freqs))
    low = np.fft.irfft(spectrum * response, n).astype(np.float32)
    low /= np.std(low) + 1e-12
    return 0.6 * low + 0.4 * white


def _mix(n: int, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros(n, dtype=np.float32)
    for _ in range(int(rng.integers(2, 6))):
        f0 = float(np.exp(rng.uniform(np.log(60.0), np.log(2000.0))))
        vib_rate, vib_depth = rng.uniform(3.0, 7.0), rng.uniform(0.0, 0.01)
        start, stop, env = _envelope(n, sample_rate, rng)
        t = np.arange(start, stop, dtype=np.float64) / sample_rate
        # Phase in float64 (10 s at 2 kHz is 1e5 radians), reduced before the float32 sines.
        phase = 2 * np.pi * f0 * (t + vib_depth / (2 * np.pi * vib_rate) * np.sin(2 * np.pi * vib_rate * t))
        tilt = rng.uniform(0.5, 1.5)
        for h in range(1, int(rng.integers(3, 9)) + 1):
            if f0 * h >= 0.45 * sample_rate:
                break
            harmonic = np.remainder(h * phase + rng.uniform(0, 2 * np.pi), 2 * np.pi).astype(np.float32)
            out[start:stop] += env * np.float32(rng.uniform(0.5, 1.0) / h**tilt) * np.sin(harmonic)
    # Percussive bursts: short decaying noise at random instants.
    for _ in range(int(rng.integers(0, 12))):
        at = int(rng.integers(0, n))
        length = min(n - at, int(rng.uniform(0.02, 0.25) * sample_rate))
        decay = np.exp(-np.arange(length) / (0.2 * length + 1)).astype(np.float32)
        out[at:at + length] += rng.uniform(0.2, 1.0) * decay * rng.standard_normal(length).astype(np.float32)
    peak = float(np.max(np.abs(out))) or 1.0
    out /= peak
    noise_db = rng.uniform(-45.0, -25.0)
    out += (10 ** (noise_db / 20)) * _pinkish_noise(n, rng)
    return out


def synth_clip(index: int, spec: DatasetSpec) -> np.ndarray:
    """Clip ``index`` of ``spec``: float32 ``[frames]`` (mono) or ``[frames, 2]``, peak about 0.9."""
    n = round(spec.seconds * spec.sample_rate)
    rng = np.random.default_rng([spec.seed, index, GENERATOR_VERSION])
    channels = [_mix(n, spec.sample_rate, rng)]
    if spec.channels == 2:
        # A different but correlated mix: mostly the same notes, plus an independent part.
        other = _mix(n, spec.sample_rate, rng)
        channels.append(0.7 * channels[0] + 0.3 * other)
    signal = np.stack(channels, axis=1)
    signal *= 0.9 / (float(np.max(np.abs(signal))) or 1.0)
    return signal[:, 0] if spec.channels == 1 else signal


def encode_clip(signal: np.ndarray, sample_rate: int, codec: str) -> bytes:
    """Encode with soundfile (libsndfile) in ``codec`` (see `CODECS`)."""
    import soundfile as sf

    _, fmt, subtype = CODECS[codec]
    buf = io.BytesIO()
    sf.write(buf, signal, sample_rate, format=fmt, subtype=subtype)
    return buf.getvalue()


# -- building and caching ----------------------------------------------------------------------------------


def _spec_matches(folder: Path, doc: dict) -> bool:
    try:
        return json.loads((folder / "spec.json").read_text()) == doc
    except (OSError, ValueError):
        return False


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary folder into place; if another process won the race, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _write_sources(spec: DatasetSpec, src: Path, workers: int, log) -> None:
    suffix = CODECS[spec.codec][0]

    def one(i: int) -> None:
        folder = src / f"class_{i % spec.classes:02d}"
        data = encode_clip(synth_clip(i, spec), spec.sample_rate, spec.codec)
        (folder / f"clip_{i:06d}{suffix}").write_bytes(data)

    for c in range(spec.classes):
        (src / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        for done, _ in enumerate(pool.map(one, range(spec.clips)), 1):
            if done % 200 == 0 or done == spec.clips:
                log(f"  generated {done}/{spec.clips} clips")


def standard_dataset(spec: DatasetSpec | None = None, cache_dir: str | os.PathLike[str] | None = None, *,
                     workers: int = 2, log=None) -> Path:
    """The shards folder of ``spec`` (original bytes, untouched), generating it on first use.

    Args:
        spec: what to generate (default: `DatasetSpec()`, 1000 clips of 10 s 44.1 kHz FLAC).
        cache_dir: cache root (default `default_cache_dir`); the dataset lives in ``cache_dir / spec.key``.
        workers: threads for synthesis, encoding and packing.
        log: ``log(message)`` for progress (default: stderr).

    Returns:
        The folder of ``shard-NNNNN.arrow`` files (rows in a seeded shuffled order, so
        every shard mixes the classes; columns ``audio``, ``label``, ``path``).
    """
    from audioloader.tools.pack import pack

    spec = spec or DatasetSpec()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    root = Path(cache_dir if cache_dir is not None else default_cache_dir()) / spec.key
    shards = root / "shards"
    if _spec_matches(root, spec.to_dict()) and shards.is_dir():
        return shards
    if root.exists() and not (root / "spec.json").exists():
        shutil.rmtree(root, ignore_errors=True)  # an interrupted earlier build
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.with_name(f".{root.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        log(f"generating benchmark dataset {spec.key} in {root} (once; cached)")
        _write_sources(spec, tmp / "src", workers, log)
        pack(tmp / "src", tmp / "shards", shard_rows=spec.rows_per_shard, shard_mb=None, rows_per_batch=64,
             workers=workers, shuffle_seed=spec.seed, progress=False)
        (tmp / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        _publish(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return shards


def packed_dataset(spec: DatasetSpec | None = None, sample_rate: int = 32000, codec: str = "flac",
                   cache_dir: str | os.PathLike[str] | None = None, *, workers: int = 2, log=None) -> Path:
    """The same clips packed for speed: ``pack(src, sample_rate=..., codec=...)`` (mono, re-encoded).

    ``codec`` is `pack`'s: ``"flac"`` or ``"pcm16"``. Same rows, same order, same
    shard boundaries as `standard_dataset` (same ``shuffle_seed``).
    """
    from audioloader.tools.pack import pack

    spec = spec or DatasetSpec()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    standard_dataset(spec, cache_dir, workers=workers, log=log)
    root = Path(cache_dir) / spec.key
    out = root / f"packed-{sample_rate}hz-{codec}"
    if (out / "labels.json").exists():
        return out
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        log(f"packing {spec.key} at {sample_rate} Hz {codec} (once; cached)")
        pack(root / "src", tmp, shard_rows=spec.rows_per_shard, shard_mb=None, rows_per_batch=64,
             sample_rate=sample_rate, codec=codec, workers=workers, shuffle_seed=spec.seed, progress=False)
        _publish(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def dataset_bytes(folder: str | os.PathLike[str]) -> int:
    """Total size of the shard files in ``folder``, in bytes."""
    return sum(p.stat().st_size for p in Path(folder).glob("shard-*"))


def _datasets(cache_dir: Path) -> list[Path]:
    """The dataset folders (finished or interrupted) directly in ``cache_dir``."""
    try:
        return sorted(p for p in cache_dir.iterdir()
                      if _DATASET_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink())
    except OSError:  # no cache yet
        return []


def _tree_bytes(folder: Path) -> int:
    return sum(os.lstat(os.path.join(root, name)).st_size for root, _, names in os.walk(folder) for name in names)


def cache_usage(cache_dir: str | os.PathLike[str] | None = None) -> tuple[int, int]:
    """(dataset folders, bytes on disk in them) of the benchmark cache ``cache_dir`` (default `default_cache_dir`)."""
    folders = _datasets(Path(cache_dir if cache_dir is not None else default_cache_dir()))
    return len(folders), sum(_tree_bytes(f) for f in folders)


def clear_cache(cache_dir: str | os.PathLike[str] | None = None) -> tuple[int, int]:
    """Delete the benchmark datasets in ``cache_dir`` (default `default_cache_dir`), and the folder itself when
    that leaves it empty; returns (folders removed, bytes freed). Nothing else in the folder is touched."""
    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    folders = _datasets(cache)
    freed = sum(_tree_bytes(f) for f in folders)
    for folder in folders:
        shutil.rmtree(folder)
    with contextlib.suppress(OSError):  # absent, or holds something that is not ours
        cache.rmdir()
    return len(folders), freed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audioloader.tools.bench.dataset",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=DatasetSpec.clips)
    parser.add_argument("--seconds", type=float, default=DatasetSpec.seconds)
    parser.add_argument("--sample-rate", type=int, default=DatasetSpec.sample_rate)
    parser.add_argument("--codec", choices=sorted(CODECS), default=DatasetSpec.codec)
    parser.add_argument("--channels", type=int, default=DatasetSpec.channels, choices=(1, 2))
    parser.add_argument("--rows-per-shard", type=int, default=DatasetSpec.rows_per_shard)
    parser.add_argument("--seed", type=int, default=DatasetSpec.seed)
    parser.add_argument("--cache-dir", default=None, help="cache root (default: $XDG_CACHE_HOME/audioloader/bench "
                        "or ~/.cache/audioloader/bench; $AUDIOLOADER_CACHE/bench when set)")
    parser.add_argument("--packed", default=None, metavar="RATE:CODEC",
                        help="print the folder of the packed variant instead, e.g. 32000:pcm16")
    args = parser.parse_args(argv)
    spec = DatasetSpec(clips=args.clips, seconds=args.seconds, sample_rate=args.sample_rate, codec=args.codec,
                       channels=args.channels, rows_per_shard=args.rows_per_shard, seed=args.seed)
    if args.packed:
        rate, _, codec = args.packed.partition(":")
        print(packed_dataset(spec, int(rate), codec or "flac", args.cache_dir))
    else:
        print(standard_dataset(spec, args.cache_dir))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
