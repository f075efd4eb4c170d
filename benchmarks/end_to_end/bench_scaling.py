"""Scaling with cores: AudioLoader on N threads or N processes against the DataLoader baseline and the limit.

For each dataset (the standard 10 s 44.1 kHz FLAC shards, and the same clips
packed at 32 kHz PCM16) and each N, every contender runs in a fresh process
(`audioloader.tools.bench.runner.run_contender`) and produces the same batches (64
log-mel spectrograms [128, 501]):

- ``threads-N``: ``AudioLoader(workers=Workers(kind="thread", num_workers=N))``;
- ``processes-N``: ``AudioLoader(workers=Workers(kind="process", num_workers=N))``;
- ``dataloader-N``: the user baseline (`audioloader.tools.bench.baseline`) under
  ``torch.utils.data.DataLoader(num_workers=N)`` (needs torchaudio);
- ``decode-threads-N``: the library's per-sample function in N plain threads;
- ``decode-processes-N``: the same function in N processes started together,
  rates summed: what the machine can do, the practical limit of any loader.

Reported per contender: samples/s, cores used by its whole process tree, and
for AudioLoader the cores of the consuming process alone (the serial part:
reading, shuffling, collating, receiving results) and that as microseconds of
CPU per sample. The last table gives ``processes-N / decode-processes-N``
(target >= 0.95) and the best AudioLoader against the best DataLoader.

    python -m benchmarks.end_to_end.bench_scaling                       # N = 1, 2, 4 (and up to 2x the cores)
    python -m benchmarks.end_to_end.bench_scaling --workers 1,4,8,16,32 --clips 2000 --seconds 10

Runs anywhere; on a machine with fewer cores than N the processes share them.
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

from audioloader.tools.bench import dataset as bench_dataset
from audioloader.tools.bench.contenders import RESULT_PREFIX, cores
from audioloader.tools.bench.runner import DISTURBED_CORES, run_contender


def decode_processes(source: Path, n: int, seconds: float) -> dict:
    """N `ceiling` contenders started together (each waits for GO after its warm-up); rates summed."""
    spec = {"kind": "ceiling", "source": str(source), "warmup_samples": 4, "measure_seconds": seconds,
            "min_samples": 8, "max_samples": max(64, int(seconds * 400)), "wait_go": True}
    children = [subprocess.Popen([sys.executable, "-m", "audioloader.tools.bench._child", json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for child in children:
        if child.stdout.readline().strip() != "READY":
            raise RuntimeError("a decode process did not get ready")
    for child in children:
        child.stdin.write("GO\n")
        child.stdin.flush()
    results = []
    for child in children:
        out, _ = child.communicate(timeout=seconds + 300)
        line = next(x for x in out.splitlines() if x.startswith(RESULT_PREFIX))
        results.append(json.loads(line[len(RESULT_PREFIX):]))
    rates = [r["one_thread_samples_per_s"] for r in results]
    return {"ok": True, "samples_per_s": sum(rates), "cores_used": sum(r["cores_used"] for r in results),
            "per_process": statistics.fmean(rates)}


def contenders(n: int, source: Path, seconds: float, baseline: bool) -> dict[str, dict]:
    stream = {"source": str(source), "batch_size": 64, "warmup_batches": max(3, n), "measure_seconds": seconds,
              "min_batches": 3, "train": True, "buffer": 1000, "min_fill": 64}
    plan = {f"threads-{n}": {"kind": "audioloader", "workers": n, "worker_type": "thread", **stream},
            f"processes-{n}": {"kind": "audioloader", "workers": n, "worker_type": "process", **stream}}
    if baseline:
        plan[f"dataloader-{n}"] = {"kind": "baseline", "workers": n, "resampler": "torchaudio", **stream,
                                   "warmup_batches": max(3, 2 * n)}
    plan[f"decode-threads-{n}"] = {"kind": "decode_threads", "source": str(source), "workers": n,
                                   "measure_seconds": seconds, "max_samples": 64}
    results = {}
    for name, spec in plan.items():
        results[name] = run_contender(spec, timeout=seconds + 600, log=lambda *_: None)
        _print(name, results[name])
    results[f"decode-processes-{n}"] = decode_processes(source, n, seconds)
    _print(f"decode-processes-{n}", results[f"decode-processes-{n}"])
    return results


def main_us(r: dict) -> float:
    """Microseconds of the main (consuming) process's CPU per sample delivered."""
    cores, rate = r.get("main_process_cores"), r.get("samples_per_s")
    return 1e6 * cores / rate if cores is not None and rate else float("nan")


def tree_ms(r: dict) -> float:
    """Milliseconds of CPU of the contender's whole process tree per sample delivered."""
    cores, rate = r.get("cores_used"), r.get("samples_per_s")
    return 1e3 * cores / rate if cores and rate else float("nan")


def _print(name: str, r: dict) -> None:
    if not r.get("ok"):
        print(f"  {name:22s} FAILED {r.get('error')} {r.get('stderr', '')[-800:]}", flush=True)
        return
    main, others = r.get("main_process_cores"), r.get("others_cores")
    print(f"  {name:22s} {r['samples_per_s']:8.1f} samples/s  cores {r.get('cores_used') or 0:5.2f}"
          + (f"  main process {main:.2f} ({main_us(r):.0f} us a sample)" if main is not None else "")
          + (f"  others {others:.2f}{' (disturbed)' if r.get('disturbed') else ''}" if others is not None else ""),
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default=None, help="N values (default 1,2,4 up to 2x the cores)")
    parser.add_argument("--datasets", default="flac,pcm16")
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per contender")
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--output", default=None, help="also write the results as JSON")
    parser.add_argument("--no-baseline", action="store_true", help="leave out the DataLoader baseline")
    args = parser.parse_args()
    ns = [int(x) for x in args.workers.split(",")] if args.workers else \
        [n for n in (1, 2, 4, 8, 16, 32) if n <= max(4, 2 * cores())]
    try:
        import torchaudio  # noqa: F401
        baseline = not args.no_baseline
    except ImportError:
        print("torchaudio is not installed: the DataLoader baseline is left out", file=sys.stderr)
        baseline = False
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    sources = {"flac": bench_dataset.standard_dataset(spec, args.cache_dir),
               "pcm16": bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    started = time.perf_counter()
    table: dict[str, dict[str, dict]] = {}
    for name in args.datasets.split(","):
        print(f"{name}:", flush=True)
        table[name] = {}
        one = run_contender({"kind": "ceiling", "source": str(sources[name]), "warmup_samples": 4,
                             "measure_seconds": args.seconds, "min_samples": 8, "max_samples": 4000},
                            timeout=600, log=lambda *_: None)
        table[name]["one-thread"] = {**one, "samples_per_s": one.get("one_thread_samples_per_s")}
        _print("one-thread", table[name]["one-thread"])
        for n in ns:
            table[name].update(contenders(n, sources[name], args.seconds, baseline))
    if args.output:
        Path(args.output).write_text(json.dumps({"cores": cores(), "workers": ns, "results": table}, indent=2))
    _summary(table, ns)
    print(f"\n{cores()} cores, {os.cpu_count()} CPUs; total {time.perf_counter() - started:.0f} s")
    return 0


def _summary(table: dict[str, dict[str, dict]], ns: list[int]) -> None:
    def rate(r: dict | None) -> float | None:
        return r.get("samples_per_s") if r and r.get("ok") else None

    kinds = ["threads", "processes", "dataloader", "decode-threads", "decode-processes"]
    for name, results in table.items():
        print(f"\n{name}: samples/s (cores used) for N =", ", ".join(map(str, ns)),
              f"| one thread: {rate(results['one-thread']) or 0:.1f}")
        for kind in kinds:
            cells = []
            for n in ns:
                r = results.get(f"{kind}-{n}")
                mark = "!" if r and r.get("disturbed") else ""
                cells.append("-" if rate(r) is None else f"{rate(r):7.1f} ({r.get('cores_used') or 0:4.1f}){mark}")
            print(f"  {kind:17s} " + "  ".join(f"{c:>15s}" for c in cells))
        main = [results.get(f"processes-{n}", {}).get("main_process_cores") for n in ns]
        print(f"  {'main process, processes-N':26s}" + "  ".join(f"{m or 0:6.2f}" for m in main) + "   (cores)")
        print(f"  {'main process, processes-N':26s}"
              + "  ".join(f"{main_us(results.get(f'processes-{n}', {})):6.0f}" for n in ns)
              + "   (us of CPU a sample; target <= 60)")
        ratios = []
        for n in ns:
            a, b = rate(results.get(f"processes-{n}")), rate(results.get(f"decode-processes-{n}"))
            ratios.append("-" if not (a and b) else f"{a / b:.2f}")
        print(f"  {'processes-N / limit':26s}" + "  ".join(f"{x:>6s}" for x in ratios) + "   (target >= 0.95)")
        for kind in ("processes", "decode-processes"):
            print(f"  {'CPU a sample, ' + kind:26s}"
                  + "  ".join(f"{tree_ms(results.get(f'{kind}-{n}', {})):6.2f}" for n in ns)
                  + "   (ms, the whole process tree; inflated too when others load the machine)")
        print(f"  (cores used by the contender's process tree; ! = other processes used > {DISTURBED_CORES} cores "
              "meanwhile)")
        best_al = max((rate(results.get(f"{k}-{n}")) or 0, f"{k}-{n}") for k in ("threads", "processes") for n in ns)
        best_dl = max((rate(results.get(f"dataloader-{n}")) or 0, f"dataloader-{n}") for n in ns)
        if best_dl[0]:
            print(f"  best AudioLoader {best_al[1]} {best_al[0]:.1f} vs best DataLoader {best_dl[1]} "
                  f"{best_dl[0]:.1f}: {best_al[0] / best_dl[0]:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
