"""Speech batches: audioloader (bucketing, random batches) against Lhotse, same utterances, same machine.

Data: ``--utterances`` synthetic utterances of 1-20 s (uniform), 16 kHz mono,
half FLAC and half WAV, each with a transcript, generated once into
``.cache/bench/speech-...``: as audio files (what Lhotse reads, through a
``CutSet`` of ``Recording.from_file``) and as Arrow IPC shards with ``text``
and ``duration`` columns (what audioloader reads). Features: 80-bin Kaldi fbank
with Lhotse's defaults (``snip_edges=False``, ``high_freq=-400``) on both sides.

Contenders, each in a fresh process, with ``--workers`` workers:

- ``audioloader-bucketing``: ``AudioLoader(features=FbankConfig(...),
  length=LengthPolicy(crop=None), batching=Bucketing(max_duration=D))``;
- ``audioloader-random``: the same with ``batch_size=B`` random batches
  (B = the mean batch size of bucketing, so both carry the same audio per batch);
- ``lhotse``: ``DynamicBucketingSampler(cuts, max_duration=D, shuffle=True)`` +
  ``K2SpeechRecognitionDataset(input_strategy=OnTheFlyFeatures(Fbank(...)))``
  under ``torch.utils.data.DataLoader(batch_size=None, num_workers=N)``, as
  Lhotse's documentation recommends.

Reported: seconds of audio delivered per wall second (steady state, after warm-up
batches), batches/s, and padding efficiency (real frames / padded frames).

    python benchmarks/bench_speech.py [--utterances 600] [--workers 2] [--seconds 20] [--rounds 2]
                                      [--max-duration 120]

Lhotse is not a dependency of audioloader: ``pip install lhotse`` to include it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MIN_S, MAX_S, RATE = 1.0, 20.0, 16000


def make_corpus(folder: Path, utterances: int) -> tuple[Path, Path, list[float]]:
    """Audio files + a shards folder of the same utterances; generated once, then reused."""
    import pyarrow as pa
    import soundfile as sf

    from audioloader.shards.writer import ShardWriter
    from audioloader.tools.bench.dataset import DatasetSpec, synth_clip

    root = folder / f"speech-n{utterances}-v1"
    files, shards = root / "audio", root / "shards"
    seconds = [float(s) for s in np.random.default_rng(0).uniform(MIN_S, MAX_S, utterances)]
    if (root / "done").exists():
        return files, shards, seconds
    files.mkdir(parents=True, exist_ok=True)
    shards.mkdir(parents=True, exist_ok=True)
    with ShardWriter(shards / "shard-00000.arrow", label_names=None, labeled=False, rows_per_batch=32,
                     extra_columns={"text": pa.string(), "duration": pa.float64(), "path": pa.string()}) as writer:
        for i, s in enumerate(seconds):
            signal = synth_clip(i, DatasetSpec(clips=1, seconds=round(s, 3), sample_rate=RATE))
            suffix, fmt = (".flac", "FLAC") if i % 2 else (".wav", "WAV")
            path = files / f"utt_{i:05d}{suffix}"
            sf.write(path, signal, RATE, format=fmt, subtype="PCM_16")
            writer.write(path.read_bytes(), text=f"utterance {i}", duration=len(signal) / RATE, path=path.name)
    (root / "done").write_text("ok")
    return files, shards, seconds


def run_audioloader(spec: dict) -> dict:
    import audioloader as al

    features = al.FbankConfig(num_mel_bins=80, snip_edges=False, high_freq=-400.0)
    bucketing = al.Bucketing(max_duration=spec["max_duration"]) if spec["bucketing"] else None
    loader = al.AudioLoader(spec["shards"], batch_size=spec.get("batch_size") or 32, train=True, seed=0,
                            features=features, label_column=None, columns=["text"],
                            length=al.LengthPolicy(crop=None), batching=bucketing, num_workers=spec["workers"],
                            shuffle_buffer_size=512, shuffle_min_size=256)
    batches = ((b["lengths"], b["fbank"].shape[1]) for b in loader)
    result = measure(batches, spec)
    loader.shutdown()
    return result


def run_lhotse(spec: dict) -> dict:
    import torch
    from lhotse import CutSet, Fbank, FbankConfig, Recording, SupervisionSegment
    from lhotse.dataset import DynamicBucketingSampler, K2SpeechRecognitionDataset, OnTheFlyFeatures

    cuts = []
    for path in sorted(Path(spec["files"]).iterdir()):
        recording = Recording.from_file(path)
        cut = recording.to_cut()
        cut.supervisions = [SupervisionSegment(id=recording.id, recording_id=recording.id, start=0.0,
                                               duration=recording.duration, text=f"utterance {path.stem}")]
        cuts.append(cut)
    cuts = CutSet.from_cuts(cuts).repeat()  # an endless stream, as training's
    sampler = DynamicBucketingSampler(cuts, max_duration=spec["max_duration"], shuffle=True, num_buckets=16,
                                      seed=0)
    dataset = K2SpeechRecognitionDataset(input_strategy=OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80))))
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=spec["workers"])
    batches = ((b["supervisions"]["num_frames"], b["inputs"].shape[1]) for b in loader)
    return measure(batches, spec)


def measure(batches, spec: dict) -> dict:
    """Audio seconds per second and padding efficiency over a steady-state window of ``(lengths, T)`` pairs."""
    for _ in range(spec["warmup"]):
        next(batches)
    start, frames, padded, count = time.perf_counter(), 0, 0, 0
    while time.perf_counter() - start < spec["seconds"] or count < 5:
        lengths, longest = next(batches)
        frames += int(sum(int(n) for n in lengths))
        padded += int(longest) * len(lengths)
        count += 1
    elapsed = time.perf_counter() - start
    return {"audio_s_per_s": frames * 0.01 / elapsed, "batches_per_s": count / elapsed,
            "padding_efficiency": frames / padded, "batches": count, "mean_batch": frames * 0.01 / count}


def in_child(spec: dict) -> dict:
    from audioloader.tools.bench.runner import Disturbance

    with Disturbance() as disturbance:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=spec["seconds"] + 900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"ok": False, "error": done.stderr[-2000:]}
    return {"ok": True, **json.loads(line[len("RESULT "):]), "others_cores": disturbance.cores,
            "disturbed": disturbance.disturbed}


def run_round(base: dict, batch_size: int | None) -> dict[str, dict]:
    """One round: each contender once, in a fresh process; random batches sized to bucketing's mean."""
    results = {"audioloader-bucketing": in_child({**base, "kind": "audioloader", "bucketing": True})}
    if batch_size is None:
        mean = results["audioloader-bucketing"].get("mean_batch") or base["max_duration"]
        batch_size = max(1, round(mean / base["mean_seconds"]))
    results["audioloader-random"] = in_child({**base, "kind": "audioloader", "bucketing": False,
                                              "batch_size": batch_size})
    try:
        import lhotse  # noqa: F401

        results["lhotse"] = in_child({**base, "kind": "lhotse"})
    except ImportError:
        results["lhotse"] = {"ok": False, "error": "lhotse is not installed (pip install lhotse)"}
    results["audioloader-random"]["batch_size"] = batch_size
    return results


def main() -> int:
    from audioloader.tools.bench.settings import DISTURBED_CORES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--utterances", type=int, default=600)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per contender and round")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; figures are medians")
    parser.add_argument("--warmup", type=int, default=5, help="batches left out first")
    parser.add_argument("--max-duration", type=float, default=120.0, help="seconds of audio per bucketed batch")
    parser.add_argument("--cache-dir", default=".cache/bench")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = run_lhotse(spec) if spec["kind"] == "lhotse" else run_audioloader(spec)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    files, shards, seconds = make_corpus(Path(args.cache_dir), args.utterances)
    base = {"files": str(files), "shards": str(shards), "workers": args.workers, "seconds": args.seconds,
            "warmup": args.warmup, "max_duration": args.max_duration, "mean_seconds": float(np.mean(seconds))}
    rounds, batch_size = [], None
    for _ in range(args.rounds):
        rounds.append(run_round(base, batch_size))
        batch_size = rounds[0]["audioloader-random"]["batch_size"]
    print(f"\n{args.utterances} utterances of {MIN_S:g}-{MAX_S:g} s ({sum(seconds) / 3600:.2f} h), 16 kHz FLAC+WAV, "
          f"80-bin fbank, {args.workers} workers, {os.cpu_count()} cores, {args.rounds} round(s); bucketing "
          f"max_duration {args.max_duration:g} s, random batches of {batch_size}")
    print(f"{'contender':24s} {'audio s/s':>10s} {'(rounds)':>18s} {'batches/s':>10s} {'padding eff.':>12s} "
          f"{'others':>7s}")
    for name in rounds[0]:
        ok = [r[name] for r in rounds if r[name]["ok"]]
        if len(ok) < len(rounds):
            error = next(r[name]["error"] for r in rounds if not r[name]["ok"])
            print(f"{name:24s} FAILED {error[-600:]}")
            continue
        per_round = " / ".join(f"{r['audio_s_per_s']:.0f}" for r in ok)
        others = max((r["others_cores"] or 0.0) for r in ok)
        mark = "!" if any(r["disturbed"] for r in ok) else " "
        print(f"{name:24s} {median(ok, 'audio_s_per_s'):10.1f} {per_round:>18s} {median(ok, 'batches_per_s'):10.2f} "
              f"{median(ok, 'padding_efficiency'):12.3f} {others:6.2f}{mark}")
    print("others: the most cores other processes used while a round of it ran "
          f"(! = over {DISTURBED_CORES}: re-run)")
    ratios = [r["audioloader-bucketing"]["audio_s_per_s"] / r["lhotse"]["audio_s_per_s"] for r in rounds
              if r["lhotse"]["ok"] and r["audioloader-bucketing"]["ok"]]
    if ratios:
        print(f"audioloader-bucketing / lhotse: {statistics.median(ratios):.2f}x (rounds "
              f"{' / '.join(f'{x:.2f}' for x in ratios)}; target >= 1.5x); padding efficiency target >= 0.9")
    return 0


def median(results: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in results)

if __name__ == "__main__":
    sys.exit(main())
