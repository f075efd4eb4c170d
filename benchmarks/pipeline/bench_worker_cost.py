"""Where the decode workers' CPU goes: CPU per sample of worker processes against the bare decode loop.

Issue 37, item 1. Wall-clock rates on a shared machine follow the scheduler; the
measures here survive contention: CPU seconds (utime + stime from ``/proc``),
minor page faults and context switches per sample, of

- ``bare``: `SampleDecoder` in a loop in this process, rows read beforehand
  (``bench_scaling``'s ``decode-processes`` / ceiling);
- ``workers-N``: `AudioLoader` with N decode processes, train mode, the defaults
  of `bench_scaling`'s ``processes-N``: each worker's CPU, faults and switches
  per sample it decoded, and the consuming process's.

    python -m benchmarks.pipeline.bench_worker_cost                    # FLAC and PCM16, N = 1 and 2
    python -m benchmarks.pipeline.bench_worker_cost --datasets pcm16 --workers 2 --batches 30
    python -m benchmarks.pipeline.bench_worker_cost --workers none --keep-heap     # the bare loop with a worker's heap
    AUDIOLOADER_PROFILE_WORKER=/tmp/prof python -m benchmarks.pipeline.bench_worker_cost   # + cProfile in the workers

With ``AUDIOLOADER_PROFILE_WORKER`` set, each worker writes a cProfile of its loop
to ``<prefix>-<pid>.prof`` at exit (``python -m pstats`` reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from audioloader.tools.bench import dataset as bench_dataset
from audioloader.tools.bench.contenders import FEATURES, LOG_OFFSET, tree_pids


def _proc(pid: int) -> dict[str, float]:
    """CPU seconds, minor/major faults and context switches of process ``pid`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    out = {"cpu_s": (int(f[11]) + int(f[12])) / tick, "minflt": int(f[7]), "majflt": int(f[9])}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches"):
                out["vcsw"] = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out["ivcsw"] = int(line.split()[1])
    return out


def _features():
    from audioloader.dsp.config import MelSpectrogramConfig

    return MelSpectrogramConfig(**FEATURES, log=True, log_offset=LOG_OFFSET)


def bare(source: Path, samples: int) -> dict:
    """The per-sample function in a loop here: CPU, faults and switches per sample."""
    import torch

    from audioloader.nodes.arrow_shard_reader import ArrowShardReader
    from audioloader.nodes.decode_spectrogram import DecodeSpectrogram

    torch.set_num_threads(1)
    reader = ArrowShardReader.of(str(source), seed=0, shuffle=True, infinite=True)
    reader.reset()
    node = DecodeSpectrogram.of(reader, _features(), seed=0, train=True, num_workers=0)
    for _ in range(8):
        node.decode(next(reader))
    raws = [next(reader) for _ in range(samples)]
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu0 = time.process_time()
    stages0 = dict(node.stats.snapshot()["seconds"])
    for raw in raws:
        node.decode(raw)
    cpu = time.process_time() - cpu0
    after = resource.getrusage(resource.RUSAGE_SELF)
    stages = {k: (v - stages0.get(k, 0.0)) * 1e3 / samples for k, v in node.stats.snapshot()["seconds"].items()}
    return {"samples": samples, "cpu_ms": 1e3 * cpu / samples, "wall_ms": 1e3 * (time.perf_counter() - wall) / samples,
            "minflt": (after.ru_minflt - before.ru_minflt) / samples,
            "vcsw": (after.ru_nvcsw - before.ru_nvcsw) / samples,
            "ivcsw": (after.ru_nivcsw - before.ru_nivcsw) / samples,
            "stage_ms": {k: round(v, 3) for k, v in stages.items() if v}}


def workers(source: Path, n: int, batches: int) -> dict:
    """AudioLoader with ``n`` decode processes: per-sample CPU, faults, switches of the workers and the consumer."""
    from audioloader.audio_loader import AudioLoader
    from audioloader.options import Shuffle, Workers

    loader = AudioLoader(str(source), batch_size=64, train=True, seed=0, features=_features(),
                         shuffle=Shuffle(buffer_size=1000, min_size=64),
                         workers=Workers(num_workers=n, kind="process"))
    stream = iter(loader)
    growth = loader.shuffle_buffer_size - loader.shuffle_min_size
    for _ in range(max(3, n, -(-growth // 64) + 1)):
        next(stream)
    me = os.getpid()
    kids = [p for p in tree_pids(me) if p != me]
    start = {p: _proc(p) for p in [me, *kids]}
    decoded0 = loader.stats()["counters"]["samples_decoded"]
    wall = time.perf_counter()
    for _ in range(batches):
        next(stream)
    wall = time.perf_counter() - wall
    end = {p: _proc(p) for p in [me, *kids]}
    decoded = loader.stats()["counters"]["samples_decoded"] - decoded0
    loader.shutdown()

    def per(pids: list[int], key: str) -> float:
        return sum(end[p][key] - start[p][key] for p in pids) / decoded

    return {"samples": decoded, "samples_per_s": decoded / wall,
            "workers_cpu_ms": 1e3 * per(kids, "cpu_s"), "main_cpu_ms": 1e3 * per([me], "cpu_s"),
            "workers_minflt": per(kids, "minflt"), "main_minflt": per([me], "minflt"),
            "workers_vcsw": per(kids, "vcsw"), "workers_ivcsw": per(kids, "ivcsw"),
            "main_vcsw": per([me], "vcsw")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="flac,pcm16")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--samples", type=int, default=256, help="rows of the bare loop")
    parser.add_argument("--batches", type=int, default=12, help="batches of 64 measured per worker count")
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--output", default=None)
    parser.add_argument("--keep-heap", action="store_true",
                        help="the bare loop with a worker's heap settings (workers/memory.keep_heap_pages); "
                             "give --workers none to run the bare loop alone")
    args = parser.parse_args()
    if args.keep_heap:
        from audioloader.workers import memory

        memory.keep_heap_pages()
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    sources = {"flac": lambda: bench_dataset.standard_dataset(spec, args.cache_dir),
               "pcm16": lambda: bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    table = {}
    for name in args.datasets.split(","):
        source = sources[name]()
        table[name] = {"bare": bare(source, args.samples)}
        print(name, "bare", json.dumps(table[name]["bare"]), flush=True)
        for n in (int(x) for x in args.workers.split(",") if x != "none"):
            table[name][f"workers-{n}"] = workers(source, n, args.batches)
            print(name, f"workers-{n}", json.dumps({k: round(v, 3) for k, v in table[name][f"workers-{n}"].items()}),
                  flush=True)
        b = table[name]["bare"]["cpu_ms"]
        for key, r in table[name].items():
            if key.startswith("workers"):
                tree = r["workers_cpu_ms"] + r["main_cpu_ms"]
                print(f"  {name} {key}: worker CPU {r['workers_cpu_ms']:.2f} ms/sample = "
                      f"{r['workers_cpu_ms'] / b:.2f}x bare {b:.2f}; tree {tree:.2f} = {tree / b:.2f}x", flush=True)
    with open("/proc/loadavg") as fh:
        print("loadavg", fh.read().strip())
    if args.output:
        Path(args.output).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
