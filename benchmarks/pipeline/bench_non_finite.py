"""Cost of the non-finite check (NaN / inf samples make a row bad) on the decode hot path.

    .venv/bin/python -m benchmarks.pipeline.bench_non_finite [--clips 32] [--repeats 7]

Decodes PCM16 WAV clips already at the target rate (the fastest path there is,
so the check's share is largest) and FLAC clips needing a resample, with the
default `MelSpectrogramConfig` (5 s crops at 32 kHz, log-mel), through
`SampleDecoder` with the check and with it replaced by a no-op. The variants
run interleaved, ``--repeats`` rounds; the table gives the median per-sample
times and the median of the per-round ratios (with / without).
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import soundfile as sf

from audioloader.dsp.config import MelSpectrogramConfig
from audioloader.nodes import decode_spectrogram
from audioloader.nodes.decode_spectrogram import SampleDecoder
from audioloader.samples import Key, RawSample
from audioloader.stats import LoaderStats


def clips(n: int, fmt: str, rate: int, seconds: float) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        signal = (0.3 * np.sin(2 * np.pi * (200 + 20 * i) * np.arange(int(seconds * rate)) / rate)
                  + 0.01 * rng.standard_normal(int(seconds * rate))).astype(np.float32)
        buf = io.BytesIO()
        sf.write(buf, signal, rate, format=fmt, subtype="PCM_16")
        out.append(buf.getvalue())
    return out


def per_sample_us(decoder: SampleDecoder, rows: list[RawSample]) -> float:
    start = time.perf_counter()
    for row in rows:
        decoder(row)
    return (time.perf_counter() - start) / len(rows) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    cfg = MelSpectrogramConfig()
    check = decode_spectrogram._non_finite_reason
    cases = {"PCM16 WAV at 32 kHz (fast path)": clips(args.clips, "WAV", 32000, 10.0),
             "FLAC at 44.1 kHz (resampled)": clips(args.clips, "FLAC", 44100, 10.0)}
    clip = np.random.default_rng(1).standard_normal(cfg.sample_rate * 5).astype(np.float32)
    start = time.perf_counter()
    for _ in range(2000):
        check(clip)
    alone = (time.perf_counter() - start) / 2000 * 1e6
    print(f"the check alone on a 5 s clip ({len(clip)} float32 samples): {alone:.1f} us")
    print(f"{'case':36s} {'with (us)':>10s} {'without (us)':>13s} {'ratio':>7s}")
    for name, data in cases.items():
        rows = [RawSample(Key(i, 0), b, 0, {}, "bench", i) for i, b in enumerate(data)]
        decoder = SampleDecoder(cfg, seed=0, train=True, window=True, augment=None, stats=LoaderStats())
        per_sample_us(decoder, rows)  # warm up (filterbanks, memfd)
        with_check, without, ratios = [], [], []
        for _ in range(args.repeats):
            a = per_sample_us(decoder, rows)
            decode_spectrogram._non_finite_reason = lambda clip: None
            try:
                b = per_sample_us(decoder, rows)
            finally:
                decode_spectrogram._non_finite_reason = check
            with_check.append(a)
            without.append(b)
            ratios.append(a / b)
        print(f"{name:36s} {statistics.median(with_check):10.0f} {statistics.median(without):13.0f} "
              f"{statistics.median(ratios):7.3f}")


if __name__ == "__main__":
    main()
