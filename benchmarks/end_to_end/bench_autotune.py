"""Workers(num_workers="auto") against every fixed number of worker processes, on three loads, in one run.

Loads (the standard bench dataset, ``--clips`` 10 s clips; training mode, batches of 64):

- ``classification``: 44.1 kHz FLAC -> log-mel [128, 501] (the bench's features), 5 s random crops;
- ``waveform``: the clips packed at 32 kHz PCM16 -> 5 s waveforms [160000] (features left to the model);
- ``speech``: the FLAC clips whole (no crop) -> 80-bin fbank at 16 kHz, batched by duration
  (``Bucketing(max_duration=200)``): the speech recipe's shape of work.

Contenders, each in a fresh process measured with its whole process tree
(`audioloader.tools.bench.runner.run_contender`): ``processes-N`` for N = 1 .. ``--max-workers``
(default: the cores) and ``auto``. Reported: samples/s in a steady window after the warm-up,
cores used, the main process's CPU per sample, peak PSS of the tree, and for ``auto`` the
worker count it ended on and its decisions (``stats()["workers"]["autotune"]``). Targets:
``auto`` within 5% of the best fixed count's samples/s and at most 10% above its peak PSS.

    python -m benchmarks.end_to_end.bench_autotune [--loads classification,waveform,speech] [--seconds 8] [--clips 256]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from audioloader.tools.bench import dataset as bench_dataset
from audioloader.tools.bench.contenders import RESULT_PREFIX, cores, tree_cpu_seconds
from audioloader.tools.bench.runner import run_contender
from benchmarks.common import ROOT, module_command

LOADS = ("classification", "waveform", "speech")


def build(spec: dict):
    import audioloader as al
    from audioloader.tools.bench.contenders import _features

    common = {"batch_size": 64, "train": True, "seed": 0,
              "workers": al.Workers(num_workers=spec["workers"], kind="process")}
    if spec["load"] == "classification":
        return al.AudioLoader(spec["source"], features=_features(), shuffle=al.Shuffle(buffer_size=1000, min_size=64),
                              **common)
    if spec["load"] == "waveform":
        return al.AudioLoader(spec["source"], features=al.WaveformConfig(sample_rate=32000),
                              length=al.LengthPolicy(clip_seconds=5.0),
                              shuffle=al.Shuffle(buffer_size=1000, min_size=64), **common)
    return al.AudioLoader(spec["source"], features=al.FbankConfig(sample_rate=16000, num_mel_bins=80),
                          length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=200.0), **common)


def child(spec: dict) -> dict:
    """One contender: warm up, then count samples for ``seconds``; CPU of this (the main) process per sample."""
    loader = build(spec)
    it = iter(loader)
    for _ in range(spec["warmup_batches"]):
        next(it)
    start, cpu_start, tree_start, samples = time.perf_counter(), time.process_time(), tree_cpu_seconds(), 0
    while time.perf_counter() - start < spec["seconds"]:
        batch = next(it)
        samples += len(batch["index"])
    elapsed, cpu, tree = time.perf_counter() - start, time.process_time() - cpu_start, tree_cpu_seconds() - tree_start
    workers = loader.stats()["workers"]
    loader.shutdown()
    return {"ok": True, "samples_per_s": samples / elapsed, "main_process_cores": cpu / elapsed,
            "cores_used": tree / elapsed,
            "main_us_per_sample": 1e6 * cpu / max(samples, 1), "workers": workers}


def run(load: str, source: Path, workers: int | str, seconds: float) -> dict:
    spec = {"kind": f"{load}-{workers}", "load": load, "source": str(source), "workers": workers, "seconds": seconds,
            "warmup_batches": 24 if load != "speech" else 12}
    spec["env"] = {"PYTHONPATH": str(ROOT)}  # the child finds benchmarks/ from any working directory
    return run_contender(spec, timeout=seconds + 600, log=lambda *_: None, command=module_command(__spec__, "--child"))


def line(name: str, r: dict) -> str:
    if not r.get("ok"):
        return f"  {name:14s} FAILED {r.get('error')} {r.get('stderr', '')[-600:]}"
    pss = (r.get("peak_pss_bytes") or 0) / 1e6
    text = (f"  {name:14s} {r['samples_per_s']:8.1f} samples/s  cores {r.get('cores_used') or 0:4.2f}  "
            f"main {r['main_us_per_sample']:5.0f} us/sample  peak PSS {pss:6.0f} MB")
    if r.get("disturbed"):
        text += f"  (others used {r.get('others_cores', 0):.2f} cores)"
    if r["workers"].get("autotune") is not None:
        text += f"\n  {'':14s} ended on {r['workers']['count']} of {r['workers']['started']}; decisions:"
        for seconds, before, after, reason in r["workers"]["autotune"]:
            text += f"\n  {'':16s}{seconds:6.1f} s  {before} -> {after}: {reason}"
    return text


def main() -> int:
    if "--child" in sys.argv:
        spec = json.loads(sys.argv[-1])
        try:
            result = child(spec)
        except Exception as error:  # reported by the parent
            result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--max-workers", type=int, default=None, help="fixed counts 1..this (default: the cores)")
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement window per contender")
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--output", default=None, help="also write the results as JSON")
    args = parser.parse_args()
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    flac = bench_dataset.standard_dataset(spec, args.cache_dir)
    sources = {"classification": flac, "speech": flac,
               "waveform": bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    counts = list(range(1, (args.max_workers or cores()) + 1))
    table: dict[str, dict[str, dict]] = {}
    for load in args.loads.split(","):
        print(f"{load}:", flush=True)
        table[load] = {}
        for workers in [*counts, "auto"]:
            name = f"processes-{workers}" if workers != "auto" else "auto"
            table[load][name] = result = run(load, sources[load], workers, args.seconds)
            print(line(name, result), flush=True)
    print("\nauto against the best fixed count (same run):")
    for load, results in table.items():
        fixed = [(r["samples_per_s"], name) for name, r in results.items() if name != "auto" and r.get("ok")]
        auto = results.get("auto", {})
        if not fixed or not auto.get("ok"):
            print(f"  {load}: incomplete")
            continue
        best_rate, best = max(fixed)
        pss = (auto.get("peak_pss_bytes") or math.nan) / (results[best].get("peak_pss_bytes") or math.nan)
        print(f"  {load:15s} best fixed {best} {best_rate:.1f} samples/s; auto {auto['samples_per_s']:.1f} = "
              f"{auto['samples_per_s'] / best_rate:.2f}x (target >= 0.95), peak PSS {pss:.2f}x (target <= 1.10)")
    if args.output:
        Path(args.output).write_text(json.dumps({"cores": cores(), "results": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
