"""Segments of long recordings: packed as cut clips (``audioloader pack``) against rows that hold the whole
recording and a window (``al.Source(..., segments=al.Segments())``), same segments, same loader otherwise.

Data: ``--recordings`` synthetic recordings of ``--minutes`` minutes, 16 kHz mono 16-bit FLAC, and a
manifest of consecutive segments of 1-20 s (gaps of 0-0.5 s) with a transcript each, generated once into
``.cache/bench/segments-...``.

Storage (measured while building, once):

- ``cut``: ``audioloader pack segments.csv``: each segment stored as a FLAC clip of its own frames;
- ``windows``: one row per segment holding its recording's bytes plus ``start``/``end`` columns, as a table
  of (recording, segment) rows exported to Arrow would: the recording is copied once per segment.

Loading, each contender in a fresh process with the defaults a speech user would write:
``AudioLoader(Source(shards, label_column=None), train=True, features=FbankConfig(),
length=LengthPolicy(crop=None), batching=Bucketing(max_duration=D), columns=["text"])`` (the source with
``segments=Segments()`` for ``windows``).
Reported: time to the first batch, audio seconds per second over ``--seconds`` after the warm-up, and the
peak PSS of the process tree (`audioloader.tools.bench.runner.TreeSampler`).

    python -m benchmarks.end_to_end.bench_segments [--recordings 4] [--minutes 10] [--workers 2] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit_result, module_command, run_child

RATE = 16000


def make_corpus(folder: Path, recordings: int, minutes: float) -> tuple[Path, dict]:
    """The recordings, the manifest and both kinds of shards; built once, then reused."""
    import pyarrow as pa
    import soundfile as sf

    from audioloader.shards.formats.writer import ShardWriter
    from audioloader.tools.bench.dataset import DatasetSpec, synth_clip
    from audioloader.tools.pack import pack_dataset

    root = folder / f"segments-r{recordings}-m{minutes:g}-v1"
    if (root / "built.json").exists():
        return root, json.loads((root / "built.json").read_text())
    shutil.rmtree(root, ignore_errors=True)
    (root / "audio").mkdir(parents=True)
    rng = np.random.default_rng(0)
    segments = []
    for r in range(recordings):
        signal = synth_clip(r, DatasetSpec(clips=1, seconds=minutes * 60, sample_rate=RATE))
        path = root / "audio" / f"recording_{r:03d}.flac"
        sf.write(path, signal, RATE, format="FLAC", subtype="PCM_16")
        t = 0.0
        while True:
            start = round(t + float(rng.uniform(0.0, 0.5)), 3)
            end = round(start + float(rng.uniform(1.0, 20.0)), 3)
            if end > minutes * 60:
                break
            segments.append((path.name, start, end, f"segment {len(segments)} of recording {r}"))
            t = end
    lines = ["path,start,end,text"] + [f"audio/{p},{s},{e},{text}" for p, s, e, text in segments]
    (root / "segments.csv").write_text("\n".join(lines) + "\n")

    began = time.perf_counter()
    summary = pack_dataset(root / "segments.csv", root / "cut", workers=2, progress=False)
    cut_s = time.perf_counter() - began

    began = time.perf_counter()
    (root / "windows").mkdir()
    extra = {"path": pa.string(), "start": pa.float64(), "end": pa.float64(), "text": pa.string()}
    blobs = {}
    with ShardWriter(root / "windows" / "shard-00000.arrow", labeled=False, extra_columns=extra) as writer:
        for p, s, e, text in segments:
            data = blobs.setdefault(p, (root / "audio" / p).read_bytes())
            writer.write(data, path=f"audio/{p}", start=s, end=e, text=text)
    windows_s = time.perf_counter() - began
    built = {"segments": len(segments), "segment_hours": sum(e - s for _, s, e, _ in segments) / 3600,
             "recording_bytes": sum(f.stat().st_size for f in (root / "audio").iterdir()),
             "cut": {"bytes": summary.audio_bytes, "build_s": cut_s},
             "windows": {"bytes": sum(len(blobs[p]) for p, *_ in segments), "build_s": windows_s}}
    (root / "built.json").write_text(json.dumps(built, indent=2) + "\n")
    return root, built


def run_loader(spec: dict) -> dict:
    import audioloader as al

    began = time.perf_counter()
    source = al.Source(spec["shards"], label_column=None, segments=al.Segments() if spec["windows"] else None)
    loader = al.AudioLoader(source, train=True, seed=0, features=al.FbankConfig(), columns=["text"],
                            length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=spec["max_duration"]),
                            workers=al.Workers(num_workers=spec["workers"]))
    batches = iter(loader)
    first = next(batches)
    first_s = time.perf_counter() - began
    for _ in range(spec["warmup"]):
        next(batches)
    start, seconds, count = time.perf_counter(), 0.0, 0
    while time.perf_counter() - start < spec["seconds"] or count < 5:
        seconds += float(next(batches)["lengths"].sum()) * 0.01
        count += 1
    elapsed = time.perf_counter() - start
    loader.shutdown()
    return {"first_batch_s": first_s, "audio_s_per_s": seconds / elapsed, "batches": count,
            "first_batch_rows": len(first["lengths"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--recordings", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of each recording")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per contender")
    parser.add_argument("--warmup", type=int, default=3, help="batches left out after the first")
    parser.add_argument("--max-duration", type=float, default=120.0, help="seconds of audio per batch")
    parser.add_argument("--cache-dir", default=".cache/bench")
    args = parser.parse_args()
    if args.child:
        emit_result(run_loader(json.loads(args.child)))
        return 0
    root, built = make_corpus(Path(args.cache_dir), args.recordings, args.minutes)
    base = {"workers": args.workers, "seconds": args.seconds, "warmup": args.warmup,
            "max_duration": args.max_duration}
    results = {name: run_child(module_command(__spec__, "--child", json.dumps({**base, "shards": str(root / name),
                                                                             "windows": name == "windows"})),
                               timeout=args.seconds + 900)
               for name in ("cut", "windows")}
    print(f"\n{args.recordings} recordings of {args.minutes:g} min (16 kHz FLAC, "
          f"{built['recording_bytes'] / 2**20:.1f} MiB), {built['segments']} segments of 1-20 s "
          f"({built['segment_hours']:.2f} h); fbank, bucketing max_duration {args.max_duration:g} s, "
          f"{args.workers} workers, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"{'contender':10s} {'stored MiB':>10s} {'build s':>8s} {'first batch s':>13s} {'audio s/s':>10s} "
          f"{'peak PSS MB':>11s} {'others':>7s}")
    for name, result in results.items():
        stored = built[name]
        if not result["ok"]:
            print(f"{name:10s} FAILED {result['error'][-600:]}")
            continue
        mark = "!" if result["disturbed"] else " "
        print(f"{name:10s} {stored['bytes'] / 2**20:10.1f} {stored['build_s']:8.1f} {result['first_batch_s']:13.2f} "
              f"{result['audio_s_per_s']:10.0f} {result['peak_pss_mb']:11.0f} {result['others_cores'] or 0:6.2f}{mark}")
    if all(r["ok"] for r in results.values()):
        cut, windows = results["cut"], results["windows"]
        print(f"windows / cut: stored {built['windows']['bytes'] / built['cut']['bytes']:.1f}x, audio s/s "
              f"{windows['audio_s_per_s'] / cut['audio_s_per_s']:.2f}x, first batch "
              f"{windows['first_batch_s'] / cut['first_batch_s']:.2f}x, peak PSS "
              f"{windows['peak_pss_mb'] / cut['peak_pss_mb']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
