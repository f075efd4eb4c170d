"""Benchmark the augmentations: the cost of each one per sample, against no augmentation, in the same run.

    .venv/bin/python -m benchmarks.pipeline.bench_augment [--clips 16] [--repeats 5]

Generates ``--clips`` FLAC clips (10 s, 44.1 kHz, mono), a set of noise shards
(10 s, 44.1 kHz FLAC) and a set of impulse responses (0.5 s, 48 kHz WAV) in a
temporary folder, then decodes every clip with the default features (32 kHz,
5 s crops, 128-band log-mel) on one thread, one torch thread (what each decode
worker runs), once without augmentation and once with each augmentation alone:

- per-sample augmentations (``SampleDecoder``, the decode workers' function):
  SpeedPerturb (factors 0.9 / 1.1, so it always resamples), Gain, AddNoise
  (reads and decodes a window of a noise row: FLAC at 44.1 kHz, or packed as
  PCM16 at the features' rate), Reverb (decodes and resamples an impulse
  response, FFT convolution), SpecAugment;
- per-batch augmentations (``BatchAugment`` on a batch of 64 log-mels, CPU):
  Mixup, and SpecAugment as applied per batch with ``device=``; their cost is
  per batch divided by 64.

Variants run interleaved, ``--repeats`` rounds; the table shows the median ms
per sample, and the medians of the per-round extra ms and ratios to no
augmentation. On a shared machine only the ratios are meaningful.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from torchdata.nodes import IterableWrapper

import audioloader as al
from audioloader.dsp.augment import Augmentations
from audioloader.nodes.batch_augment import BatchAugment
from audioloader.nodes.batcher import BATCH_PARAMS_KEY
from audioloader.nodes.decode_spectrogram import SampleDecoder
from audioloader.samples import Key, RawSample
from audioloader.shards.dataset.augment_rows import AugmentRows
from audioloader.stats import LoaderStats

FEATURES = al.MelSpectrogramConfig()  # 32 kHz, 5 s crops, n_fft 1024, hop 320, 128 mels
BATCH = 64


def encoded(signal: np.ndarray, rate: int, fmt: str = "FLAC", subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, signal.astype(np.float32), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def make_clips(n: int, rng: np.random.Generator) -> list[bytes]:
    t = np.arange(10 * 44100) / 44100
    return [encoded(0.3 * np.sin(2 * np.pi * (220 + 40 * i) * t) + 0.05 * rng.standard_normal(len(t)), 44100)
            for i in range(n)]


def make_side_shards(folder: Path, rng: np.random.Generator) -> tuple[Path, Path, Path]:
    """Noise (8 rows of 10 s: FLAC at 44.1 kHz, and the same packed as PCM16 WAV at the features' 32 kHz,
    as ``audioloader pack --codec pcm16 --sample-rate 32000`` writes) and impulse responses (8 rows, 0.5 s
    WAV at 48 kHz)."""
    for name in ("noise", "noise_pcm16", "rirs"):
        (folder / name).mkdir()
    noises = [0.1 * rng.standard_normal(10 * 44100) for _ in range(8)]
    with al.ShardWriter(folder / "noise" / "noise.arrow", labeled=False) as writer:
        for noise in noises:
            writer.write(encoded(noise, 44100))
    with al.ShardWriter(folder / "noise_pcm16" / "noise.arrow", labeled=False) as writer:
        for noise in noises:
            writer.write(encoded(noise[:10 * 32000], 32000, "WAV", "PCM_16"))
    t = np.arange(24000) / 48000
    with al.ShardWriter(folder / "rirs" / "rirs.arrow", labeled=False) as writer:
        for i in range(8):
            ir = rng.standard_normal(len(t)) * np.exp(-t / (0.05 + 0.02 * i))
            ir[0] = 1.0
            writer.write(encoded(ir, 48000, "WAV", "FLOAT"))
    return folder / "noise", folder / "noise_pcm16", folder / "rirs"


def per_sample_variants(noise: Path, noise_pcm16: Path, rirs: Path) -> dict[str, list | None]:
    return {
        "none": None,
        "SpeedPerturb": [al.SpeedPerturb((0.9, 1.1))],
        "Gain": [al.Gain()],
        "AddNoise (FLAC 44.1 kHz noise)": [al.AddNoise(noise)],
        "AddNoise (PCM16 32 kHz noise)": [al.AddNoise(noise_pcm16)],
        "Reverb": [al.Reverb(rirs)],
        "SpecAugment": [al.SpecAugment()],
    }


def decode_ms(decoder: SampleDecoder, rows: list[RawSample]) -> float:
    start = time.perf_counter()
    for row in rows:
        decoder(row)
    return (time.perf_counter() - start) / len(rows) * 1e3


def batch_ms(node_input: dict, augment: Augmentations) -> float:
    """ms per sample of BatchAugment on one batch (params drawn as the workers draw them)."""
    batch = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in node_input.items()}
    params = [augment.batch_params(Key(i, 0), FEATURES.clip_samples) for i in range(BATCH)]
    batch[BATCH_PARAMS_KEY] = {name: torch.from_numpy(np.stack([p[name] for p in params])) for name in params[0]}
    node = BatchAugment(IterableWrapper([batch]), augment, FEATURES.batch_key)
    node.reset()
    start = time.perf_counter()
    next(node)
    return (time.perf_counter() - start) / BATCH * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=16, help="clips decoded per variant and round (default 16)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, "
          f"{os.cpu_count()} cores")
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)  # what each decode worker runs with
    with tempfile.TemporaryDirectory() as scratch:
        side = make_side_shards(Path(scratch), rng)
        rows = [RawSample(Key(i, 0), clip, 0, {}, "bench", i) for i, clip in enumerate(make_clips(args.clips, rng))]
        decoders = {name: SampleDecoder(FEATURES, seed=0, train=True, window=True, stats=LoaderStats(),
                                        augment=None if items is None else Augmentations(items, 0, FEATURES,
                                                                                        open_rows=AugmentRows))
                    for name, items in per_sample_variants(*side).items()}
        for decoder in decoders.values():
            decode_ms(decoder, rows[:2])  # warm-up: first reads, filterbanks, FFT plans
        features = torch.randn(BATCH, FEATURES.n_mels, FEATURES.n_frames)
        batch_in = {FEATURES.batch_key: features, "label": torch.arange(BATCH) % 5}
        per_batch = {"Mixup (per batch)": Augmentations([al.Mixup()], 0, FEATURES),
                     "SpecAugment (per batch, device=)": Augmentations([al.SpecAugment()], 0, FEATURES,
                                                                       per_batch_features=True)}
        times: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeats):
            for name, decoder in decoders.items():
                times[name].append(decode_ms(decoder, rows))
            for name, augment in per_batch.items():
                times[name].append(statistics.median(batch_ms(batch_in, augment) for _ in range(5)))
    none = times["none"]
    print(f"\nms per sample, one thread, {args.clips} clips of 10 s FLAC at 44.1 kHz -> 5 s log-mel at 32 kHz; "
          f"median of {args.repeats} interleaved rounds")
    print(f"{'augmentation':34} {'ms/sample':>10} {'extra ms':>9} {'ratio to none':>14}")
    for name, values in times.items():
        # Per round: the variant against "none" of the same round; then the median over rounds.
        per_batch = "per batch" in name
        extra = statistics.median(v if per_batch else v - n for n, v in zip(none, values, strict=True))
        ratio = statistics.median((n + v if per_batch else v) / n for n, v in zip(none, values, strict=True))
        print(f"{name:34} {statistics.median(values):10.3f} {extra:9.3f} {ratio:14.3f}")
    print("(per-batch rows: the cost per sample of the batch operation alone; the ratio adds it to the "
          "decode of one sample)")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores: > ~0.3 "
          "means someone else was running; rerun)")


if __name__ == "__main__":
    main()
