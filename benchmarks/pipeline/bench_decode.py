"""Benchmark the decode stage: per-stage cost, window vs full decode, thread scaling.

    .venv/bin/python -m benchmarks.pipeline.bench_decode [--clips 8] [--seconds 10] [--rate 44100] [--repeats 5]

Generates ``--clips`` FLAC clips (``--seconds`` long, ``--rate`` Hz, stereo) in
memory with soundfile, then measures with the default `MelSpectrogramConfig`
(32 kHz, 5 s crops, n_fft 1024, hop 320, 128 mels):

1. per-stage time per sample on one thread: decode (soundfile + mixdown),
   resample (soxr), mel (torch), for the full and the window path;
2. window vs full decode: ``load_clip`` + log-mel per sample, both paths;
3. samples/s through `DecodeSpectrogram` at 1 and 2 threads (and inline);
4. GIL contention: decode time per sample while another thread runs pure
   Python, reading through the thread's memfd (the default) vs soundfile's
   virtual IO over the buffer (`BufferFile`, one Python callback per read).

Timings on a shared machine are noisy, so every comparison is measured side
by side: the variants run interleaved, ``--repeats`` times, and the table shows
the median of the per-round ratios as well as the median times.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import soundfile as sf
import torch
from torchdata.nodes import IterableWrapper

from audioloader.dsp import audio, hashing
from audioloader.dsp.audio import load_clip
from audioloader.dsp.config import MelSpectrogramConfig
from audioloader.dsp.features import log_mel
from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
from audioloader.samples import Key, RawSample


def make_clips(n: int, seconds: float, rate: int, channels: int) -> list[bytes]:
    """``n`` distinct FLAC (PCM_16) clips: tones plus noise, ``channels`` channels."""
    clips = []
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    for i in range(n):
        tone = 0.4 * np.sin(2 * np.pi * (220 + 50 * i) * t)
        signal = np.stack([tone + 0.05 * rng.standard_normal(len(t)) for _ in range(channels)], axis=1)
        buf = io.BytesIO()
        sf.write(buf, signal.astype(np.float32), rate, format="FLAC", subtype="PCM_16")
        clips.append(buf.getvalue())
    return clips


def draw_for(index: int):
    return lambda n: hashing.uniform_int(n, 0, hashing.SALT_CROP, index, 0)


def one_sample(clip: bytes, index: int, cfg: MelSpectrogramConfig, window: bool, stages: dict) -> None:
    wave = load_clip(clip, cfg.sample_rate, cfg.clip_samples, train=True, draw=draw_for(index),
                     window=window, timer=lambda stage, s: stages.__setitem__(stage, stages[stage] + s))
    start = time.perf_counter()
    log_mel(wave, cfg)
    stages["mel"] += time.perf_counter() - start


def per_stage(clips: list[bytes], cfg: MelSpectrogramConfig, repeats: int) -> dict[str, dict[str, float]]:
    """ms per sample and stage, on one thread, median over rounds, for both paths (interleaved)."""
    rounds: dict[str, list[dict[str, float]]] = {"full": [], "window": []}
    for _ in range(repeats):
        for name, window in (("full", False), ("window", True)):
            stages: dict[str, float] = defaultdict(float)
            start = time.perf_counter()
            for i, clip in enumerate(clips):
                one_sample(clip, i, cfg, window, stages)
            stages["total"] = time.perf_counter() - start
            rounds[name].append({k: v / len(clips) * 1e3 for k, v in stages.items()})
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}


def node_rate(clips: list[bytes], cfg: MelSpectrogramConfig, workers: int, items: int, window: bool) -> float:
    """Samples/s through DecodeSpectrogram over ``items`` rows (the clips repeated)."""
    raws = [RawSample(Key(i, 0), clips[i % len(clips)], 0, {}, "bench", i) for i in range(items)]
    node = DecodeSpectrogram.of(IterableWrapper(raws), cfg, num_workers=workers, window=window)
    start = time.perf_counter()
    n = sum(1 for _ in node)
    elapsed = time.perf_counter() - start
    node.shutdown()
    if n != items:
        raise RuntimeError(f"expected {items} samples, got {n}")
    return items / elapsed


def scaling(clips: list[bytes], cfg: MelSpectrogramConfig, items: int, repeats: int, window: bool):
    """Interleaved rounds of 0 (inline), 1 and 2 threads; returns median rates and median ratio 2/1."""
    rates: dict[int, list[float]] = defaultdict(list)
    ratios = []
    node_rate(clips, cfg, 2, min(items, 8), window)  # warm-up (first-call costs)
    for _ in range(repeats):
        for workers in (0, 1, 2):
            rates[workers].append(node_rate(clips, cfg, workers, items, window))
        ratios.append(rates[2][-1] / rates[1][-1])
    return {w: statistics.median(r) for w, r in rates.items()}, statistics.median(ratios), ratios


def busy_python(stop: threading.Event) -> None:
    """Stands in for a training loop that keeps the GIL busy with Python code."""
    n = 0
    while not stop.is_set():
        n += 1


def contended_ms(clips: list[bytes], cfg: MelSpectrogramConfig, seconds: float, busy: bool) -> float:
    """ms per sample (window decode) in one thread, optionally beside a Python-busy thread."""
    stop, done = threading.Event(), [0]

    def work() -> None:
        i = 0
        while not stop.is_set():
            load_clip(clips[i % len(clips)], cfg.sample_rate, cfg.clip_samples, train=True, draw=draw_for(i))
            i += 1
        done[0] = i

    threads = [threading.Thread(target=work)] + ([threading.Thread(target=busy_python, args=(stop,))]
                                                 if busy else [])
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # measuring a duration, not synchronising
    stop.set()
    for thread in threads:
        thread.join()
    return (time.perf_counter() - start) / max(done[0], 1) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=8, help="distinct clips generated (default 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="clip length in seconds (default 10)")
    parser.add_argument("--rate", type=int, default=44100, help="clip sample rate in Hz (default 44100)")
    parser.add_argument("--channels", type=int, default=2, help="clip channels (default 2)")
    parser.add_argument("--items", type=int, default=64, help="rows per node run (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds per comparison (default 5)")
    args = parser.parse_args()

    cfg = MelSpectrogramConfig()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    clips = make_clips(args.clips, args.seconds, args.rate, args.channels)
    mb = sum(len(c) for c in clips) / len(clips) / 1e6
    print(f"{args.clips} FLAC clips, {args.seconds:g} s, {args.rate} Hz, {args.channels} ch, {mb:.2f} MB each; "
          f"features: {cfg.sample_rate} Hz, {cfg.clip_seconds:g} s crop, n_fft {cfg.n_fft}, hop {cfg.hop_length}, "
          f"{cfg.n_mels} mels; torch {torch.__version__}, main-thread torch threads {torch.get_num_threads()}")

    user_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-stage numbers are for one decode thread (what each worker runs with)
    try:
        one_sample(clips[0], 0, cfg, True, defaultdict(float))  # warm-up
        stages = per_stage(clips, cfg, args.repeats)
    finally:
        torch.set_num_threads(user_threads)
    print("\n1. per-stage ms per sample, one thread (median of rounds)")
    print(f"{'path':8} {'decode':>8} {'resample':>9} {'mel':>7} {'total':>7}")
    for name in ("full", "window"):
        s = stages[name]
        print(f"{name:8} {s['decode']:8.2f} {s['resample']:9.2f} {s['mel']:7.2f} {s['total']:7.2f}")
    print(f"\n2. window vs full: {stages['full']['total'] / stages['window']['total']:.2f}x faster per sample "
          f"(decode+resample {stages['full']['decode'] + stages['full']['resample']:.2f} -> "
          f"{stages['window']['decode'] + stages['window']['resample']:.2f} ms)")

    print(f"\n3. DecodeSpectrogram samples/s, {args.items} rows per run, {args.repeats} interleaved rounds")
    print(f"{'path':8} {'inline':>8} {'1 thread':>9} {'2 threads':>10} {'2/1 (median)':>13}  per-round 2/1")
    for name, window in (("window", True), ("full", False)):
        rates, ratio, ratios = scaling(clips, cfg, args.items, args.repeats, window)
        print(f"{name:8} {rates[0]:8.1f} {rates[1]:9.1f} {rates[2]:10.1f} {ratio:13.2f}  "
              + " ".join(f"{r:.2f}" for r in ratios))

    print("\n4. window decode ms per sample while another thread runs pure Python "
          f"(switch interval {sys.getswitchinterval() * 1e3:g} ms)")
    print(f"{'reading through':28} {'alone':>7} {'beside busy thread':>19}")
    default = audio.MEMFD_MAX_BYTES
    try:
        for name, limit in (("memfd (default)", default), ("BufferFile (virtual IO)", 0)):
            audio.MEMFD_MAX_BYTES = limit
            alone = contended_ms(clips, cfg, 1.5, busy=False)
            busy = contended_ms(clips, cfg, 1.5, busy=True)
            print(f"{name:28} {alone:7.2f} {busy:19.1f}")
    finally:
        audio.MEMFD_MAX_BYTES = default
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores: > ~0.3 "
          "means someone else was running; rerun)")


if __name__ == "__main__":
    main()
