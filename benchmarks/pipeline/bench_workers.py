"""Does the hand-written worker machinery earn its place? audioloader's ParallelMap against torchdata's ParallelMapper.

Issue 22, item 7. `audioloader.nodes.ParallelMap` with `audioloader.workers` (pool,
wire, memory, threads) replaces torchdata 0.11's ``torchdata.nodes.ParallelMapper``,
which has worker processes (``method="process"``) and chunking (``prebatch=``) of its
own. Here both run the same per-sample function over the same rows:

- source: ``ArrowShardReader.of(shards, seed=0, shuffle=True, infinite=True)``, read in
  the consuming process (as in the loader);
- function: `SampleDecoder`, what `DecodeSpectrogram` runs per row: decode, mono,
  soxr to 32 kHz, a random 5 s crop seeded by the row's key, log-mel (n_fft 1024,
  hop 320, 128 mels): float32 ``[128, 501]`` per item;
- data: the standard benchmark shards (10 s 44.1 kHz FLAC, `audioloader.tools.bench.dataset`)
  and the same clips packed at 32 kHz PCM16 (what ``audioloader bench`` calls packed-pcm16).

Contenders (each in a fresh process, measured from outside by `audioloader.tools.bench.runner`):

- ``al-process``: ``ParallelMap.of(backend="process")`` as `DecodeSpectrogram` builds it for
  memory-mapped shards: rows travel as keys and the worker reads them (``fetch``), results
  come back through reusable shared-memory slots; chunks of 8, fork while the process has
  one thread (the library's default start);
- ``al-process-bytes``: the same, but the encoded audio is copied into the slots (no ``fetch``):
  the transport alone, as torchdata gets the rows;
- ``al-process-forkserver``: ``al-process`` started by a fork server (what it uses when other
  threads run);
- ``al-thread``: ``ParallelMap.of(backend="thread")``, one torch thread per worker, chunks of 4;
- ``td-process``: ``ParallelMapper(method="process", in_order=True)`` with its default
  ``multiprocessing_context`` (None: fork on Linux), the map function pickled as documented;
- ``td-process-prebatch``: the same with ``prebatch=8`` (audioloader's chunk size);
- ``td-process-forkserver`` / ``td-process-spawn``: ``multiprocessing_context="forkserver"`` / ``"spawn"``;
- ``td-thread``: ``ParallelMapper(method="thread", in_order=True)``.

Reported per contender and worker count: samples/s over a steady window (after a warm-up),
time to the first item (from building the node, imports excluded), peak PSS of the process
tree (a page shared by n processes counts 1/n), and CPU milliseconds per sample: of the
consuming process (every thread in it: what a training process loses), of the thread that
iterates alone (the training loop's own thread), and of the whole tree (the total work);
and where the workers' time went (``/proc/.../schedstat``): running, waiting for a CPU that
other processes held, or idle for want of work (the hand-offs did not keep them busy).
Ratios are to ``al-process`` with the same worker count in the same run. On a loaded machine
samples/s follow the scheduler more than the code (a worker that is always runnable waits
longer for a CPU than one that sleeps now and then): compare samples/s only between runs
whose workers rarely waited for a CPU.

Correctness: every contender hashes its first ``--check`` items (key, label, feature bytes)
in order; the digests must be identical across contenders (exit status 1 otherwise).

    python -m benchmarks.pipeline.bench_workers                                  # 1-4 workers, FLAC and PCM16
    python -m benchmarks.pipeline.bench_workers --workers 2 --seconds 3 --datasets pcm16 \
        --contenders al-process,td-process
    python -m benchmarks.pipeline.bench_workers --contenders all --rounds 2 --output workers.json

Needs only the library's dependencies (torchdata is one). Run it on a quiet machine: every
figure is taken while others may use the cores (``others`` reports how many they used).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, median_figures, module_command

RESULT_PREFIX = "BENCH-RESULT "  # = audioloader.tools.bench.contenders.RESULT_PREFIX (read by run_contender)

#: The benchmark's common features (`audioloader.tools.bench.contenders.FEATURES`, log offset 1e-6).
FEATURES = {"sample_rate": 32000, "clip_seconds": 5.0, "n_fft": 1024, "hop_length": 320, "n_mels": 128}


@dataclass(frozen=True)
class Contender:
    """How one contender maps: whose node, threads or processes, start method, chunking, rows as keys."""

    library: str  # "audioloader" (ParallelMap) or "torchdata" (ParallelMapper)
    method: str  # "process" or "thread"
    context: str | None = None  # start method; None: the library's default
    prebatch: int | None = None  # torchdata's prebatch=
    fetch: bool = False  # audioloader: rows travel as keys, the worker reads them


CONTENDERS = {
    "al-process": Contender("audioloader", "process", fetch=True),
    "al-process-bytes": Contender("audioloader", "process"),
    "al-process-forkserver": Contender("audioloader", "process", context="forkserver", fetch=True),
    "al-thread": Contender("audioloader", "thread"),
    "td-process": Contender("torchdata", "process"),
    "td-process-prebatch": Contender("torchdata", "process", prebatch=8),
    "td-process-forkserver": Contender("torchdata", "process", context="forkserver"),
    "td-process-spawn": Contender("torchdata", "process", context="spawn"),
    "td-thread": Contender("torchdata", "thread"),
}
DEFAULT_CONTENDERS = ["al-process", "al-process-bytes", "al-thread", "td-process", "td-process-prebatch",
                      "td-process-forkserver", "td-thread"]
BASELINE = "al-process"


# -- the child: one contender in a fresh process ---------------------------------------------------------------


def build(spec: dict[str, Any]) -> Any:
    """The contender's node over a fresh reader; ``decoder.stats`` collects the workers' counters."""
    import functools

    import torch
    from torchdata.nodes import ParallelMapper

    from audioloader.dsp.config import MelSpectrogramConfig
    from audioloader.dsp.features import prepare
    from audioloader.nodes.arrow_shard_reader import ArrowShardReader
    from audioloader.nodes.decode_spectrogram import SampleDecoder
    from audioloader.nodes.parallel_map import ParallelMap
    from audioloader.stats import LoaderStats
    from audioloader.workers.threads import pin_worker_to_one_thread

    how = CONTENDERS[spec["contender"]]
    features = MelSpectrogramConfig(**FEATURES, log=True, log_offset=1e-6)
    prepare(features)  # the filterbank, built once before workers start (as DecodeSpectrogram does)
    reader = ArrowShardReader.of(spec["source"], seed=0, shuffle=True, infinite=True)
    decoder = SampleDecoder(features, seed=0, train=True, window=True, augment=None, stats=LoaderStats(),
                            fetch=reader.fetcher if how.fetch else None)
    workers = spec["workers"]
    if how.library == "audioloader":
        pin = functools.partial(pin_worker_to_one_thread, torch.get_num_threads()) if how.method == "thread" else None
        return ParallelMap.of(reader, decoder, num_workers=workers, backend=how.method, start_method=how.context,
                           thread_initializer=pin, stats=decoder.stats, what="decode worker")
    # torchdata's documented use: a picklable map function, results in the source's order. Its workers set
    # torch to one thread themselves (_apply_udf).
    return ParallelMapper(reader, decoder, num_workers=workers, in_order=True, method=how.method,
                          multiprocessing_context=how.context, prebatch=how.prebatch)


def _torchdata_iter(node: Any) -> Any:
    """ParallelMapper's running iterator (under an Unbatcher with prebatch=): it holds the workers."""
    impl = node._it.source if node.prebatch is not None else node._it
    return impl._it


def stop(node: Any) -> None:
    """Stop the node's workers before the process exits."""
    if hasattr(node, "shutdown"):  # ParallelMap
        node.shutdown()
    elif _torchdata_iter(node) is not None:  # ParallelMapper stops in __del__; its iterator has _shutdown()
        _torchdata_iter(node)._shutdown()


def worker_tasks(node: Any) -> list[str]:
    """``/proc`` paths of the workers' (main) threads, for their scheduler statistics (private attributes:
    neither node says who its workers are)."""
    if hasattr(node, "shutdown"):  # ParallelMap over a ProcessPool or a ThreadPool
        pool = node._pool
        if hasattr(pool, "_workers"):
            return [f"/proc/{w.process.pid}/task/{w.process.pid}" for w in pool._workers]
        return [f"/proc/self/task/{t.native_id}" for t in pool._executor._threads]
    workers = _torchdata_iter(node)._workers
    return [f"/proc/{w.pid}/task/{w.pid}" if hasattr(w, "pid") else f"/proc/self/task/{w.native_id}"
            for w in workers]


def schedstat(tasks: list[str]) -> tuple[float, float]:
    """Seconds the tasks ran and seconds they were runnable but waited for a CPU (Linux schedstat)."""
    run = wait = 0
    for task in tasks:
        with open(f"{task}/schedstat") as fh:
            ran, waited, _ = fh.read().split()
        run, wait = run + int(ran), wait + int(waited)
    return run / 1e9, wait / 1e9


def _take(node: Any, digest: Any | None) -> None:
    """One item; its key, label and feature bytes go into ``digest`` when given."""
    import numpy as np

    item = next(node)
    features = getattr(item, "features", None)
    if features is None:
        raise RuntimeError(f"expected a decoded Sample, got {item!r}")
    if tuple(features.shape) != (FEATURES["n_mels"], 501):
        raise RuntimeError(f"features of shape {tuple(features.shape)}, expected (128, 501)")
    if digest is not None:
        digest.update(np.array([item.key.index, item.key.pass_index, item.label], dtype=np.int64).tobytes())
        digest.update(features.numpy().tobytes())


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, take the first item, warm up (hashing the first ``check`` items), then measure a window."""
    from audioloader.tools.bench.contenders import tree_cpu_seconds

    started = time.perf_counter()
    node = build(spec)
    node.reset()
    digest = hashlib.blake2b(digest_size=16)
    _take(node, digest)
    first_item_s = time.perf_counter() - started
    for i in range(1, max(spec["check"], spec["warmup"])):
        _take(node, digest if i < spec["check"] else None)
    tasks = worker_tasks(node)
    window_start = time.perf_counter()
    own, loop, tree, (ran, waited) = time.process_time(), time.thread_time(), tree_cpu_seconds(), schedstat(tasks)
    done, elapsed = 0, 0.0
    while elapsed < spec["seconds"] or done < spec["min_items"]:
        _take(node, None)
        done += 1
        elapsed = time.perf_counter() - window_start
    own, loop, tree = time.process_time() - own, time.thread_time() - loop, tree_cpu_seconds() - tree
    ran, waited = (now - before for now, before in zip(schedstat(tasks), (ran, waited), strict=True))
    stop(node)
    per_sample, worker_time = 1000.0 / done, len(tasks) * elapsed
    # Where the workers' time went: running, runnable but waiting for a CPU (other processes had it), or
    # idle (waiting for work: the hand-offs could not keep them busy).
    return {"samples_per_s": done / elapsed, "first_item_s": first_item_s, "measured_items": done,
            "measured_s": elapsed, "consumer_cpu_ms": own * per_sample, "loop_thread_cpu_ms": loop * per_sample,
            "tree_cpu_ms": tree * per_sample, "digest": digest.hexdigest(), "checked_items": spec["check"],
            "workers_running": ran / worker_time, "workers_waiting_for_cpu": waited / worker_time,
            "workers_idle": max(0.0, 1.0 - (ran + waited) / worker_time)}


def child_main(spec_json: str) -> int:
    import traceback

    spec = json.loads(spec_json)
    try:
        result = {"ok": True, **run_child(spec)}
    except Exception as error:  # reported to the parent, which shows it in the table
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1


# -- the parent: plan, run, report -----------------------------------------------------------------------------


def run_one(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    from audioloader.tools.bench.runner import run_contender

    spec = {**spec, "env": {**(spec.get("env") or {}), "PYTHONPATH": str(ROOT)}}  # finds benchmarks/ from any cwd
    result = run_contender(spec, timeout, log=lambda message: print(message, file=sys.stderr),
                           command=module_command(__spec__, "--child"))
    result["loadavg"] = list(os.getloadavg())
    return result


#: The figures a contender's rounds are summed up by (their medians).
FIGURES = ("samples_per_s", "first_item_s", "peak_pss_bytes", "consumer_cpu_ms", "loop_thread_cpu_ms", "tree_cpu_ms",
           "workers_running", "workers_waiting_for_cpu", "workers_idle", "others_cores")


def rounds_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several rounds: the median of every figure, the rounds' count, whether a round was disturbed
    and their digests; failed when any round failed."""
    out = median_figures(runs, FIGURES)
    if not out.get("ok"):
        return out
    out["rounds"] = len(runs)
    out["disturbed"] = any(r.get("disturbed") for r in runs)
    out["digests"] = sorted({r["digest"] for r in runs})
    return out


def report(table: dict[str, dict[str, dict[str, Any]]], workers: list[int], names: list[str]) -> bool:
    """Print one table per dataset; True when every contender delivered identical items."""
    identical = True
    for dataset, results in table.items():
        print(f"\n{dataset}: per sample (ms) = CPU milliseconds per item; x {BASELINE} = samples/s ratio, same N")
        print(f"  {'contender':22s} {'N':>2s} {'samples/s':>9s} {'x ' + BASELINE:>13s} {'first s':>8s} "
              f"{'PSS MB':>7s} {'consumer ms':>11s} {'loop ms':>8s} {'tree ms':>8s} {'workers run/wait/idle':>21s} "
              f"{'others':>6s}")
        for n in workers:
            base = results.get(f"{BASELINE}-{n}", {})
            for name in names:
                r = results.get(f"{name}-{n}")
                if r is None:
                    continue
                if not r.get("ok"):
                    print(f"  {name:22s} {n:2d} FAILED {r.get('error')} {(r.get('stderr') or '')[-600:]}")
                    continue
                ratio = (f"{r['samples_per_s'] / base['samples_per_s']:.2f}"
                         if base.get("ok") and base.get("samples_per_s") else "-")
                pss = f"{r['peak_pss_bytes'] / 2**20:7.0f}" if r.get("peak_pss_bytes") else "      -"
                others = r.get("others_cores")
                split = f"{r['workers_running']:.2f}/{r['workers_waiting_for_cpu']:.2f}/{r['workers_idle']:.2f}"
                print(f"  {name:22s} {n:2d} {r['samples_per_s']:9.1f} {ratio:>13s} {r['first_item_s']:8.2f} {pss} "
                      f"{r['consumer_cpu_ms']:11.2f} {r['loop_thread_cpu_ms']:8.2f} {r['tree_cpu_ms']:8.2f} "
                      f"{split:>21s} " + ("     -" if others is None else f"{others:6.2f}")
                      + ("!" if r.get("disturbed") else ""))
        digests = {d for r in results.values() if r.get("ok") for d in r.get("digests", [r.get("digest")])}
        same = len(digests) == 1
        identical &= same
        checked = next((r["checked_items"] for r in results.values() if r.get("ok")), 0)
        print(f"  first {checked} items identical (keys, labels, feature bytes) across contenders: "
              + ("yes" if same else f"NO ({len(digests)} different digests)"))
    return identical


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workers", default="1,2,3,4", help="worker counts (default 1,2,3,4)")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS),
                        help=f"comma-separated, or 'all' (default: {','.join(DEFAULT_CONTENDERS)}); "
                             f"known: {', '.join(CONTENDERS)}")
    parser.add_argument("--datasets", default="flac,pcm16", help="flac (10 s 44.1 kHz originals), pcm16 (packed)")
    parser.add_argument("--clips", type=int, default=256, help="clips in the benchmark dataset (default 256)")
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per contender (default 6)")
    parser.add_argument("--warmup", type=int, default=64, help="items taken before the window (default 64)")
    parser.add_argument("--check", type=int, default=32, help="first items hashed for the correctness check")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; figures are medians")
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a contender is killed")
    parser.add_argument("--output", default=None, help="also write the results as JSON")
    args = parser.parse_args()
    if args.child is not None:
        return child_main(args.child)

    from audioloader.tools.bench import dataset as bench_dataset
    from audioloader.tools.bench.runner import machine_info

    names = list(CONTENDERS) if args.contenders == "all" else [c.strip() for c in args.contenders.split(",")]
    unknown = [name for name in names if name not in CONTENDERS]
    if unknown:
        parser.error(f"--contenders: unknown {', '.join(unknown)}; known: {', '.join(CONTENDERS)}")
    workers = [int(x) for x in args.workers.split(",")]
    if args.rounds < 1 or args.check < 1 or min(workers) < 1:
        parser.error("--rounds, --check and --workers must be >= 1")
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    paths = {"flac": lambda: bench_dataset.standard_dataset(spec, args.cache_dir),
             "pcm16": lambda: bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    sources = {name: paths[name]() for name in args.datasets.split(",")}
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    started = time.perf_counter()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in sources}
    for round_index in range(args.rounds):  # interleaved: a disturbance hits every contender alike
        shift = round_index % len(names)  # and each round starts with another contender
        for dataset, source in sources.items():
            for n in workers:
                for name in names[shift:] + names[:shift]:
                    child = {"kind": name, "contender": name, "source": str(source), "workers": n,
                             "seconds": args.seconds, "warmup": args.warmup, "check": args.check,
                             "min_items": 8}
                    result = run_one(child, args.timeout)
                    runs[dataset].setdefault(f"{name}-{n}", []).append(result)
                    rate = f"{result['samples_per_s']:.1f} samples/s" if result.get("ok") else "FAILED"
                    print(f"  round {round_index + 1} {dataset} {name}-{n}: {rate}", flush=True)
    table = {dataset: {key: rounds_result(results) for key, results in by_key.items()}
             for dataset, by_key in runs.items()}
    identical = report(table, workers, names)
    machine = machine_info()
    print(f"\n{machine['cores']} cores ({machine['cpu']}), torch {machine['torch']}; load average at the end "
          f"{machine['loadavg_end']}; total {time.perf_counter() - started:.0f} s")
    if args.output:
        Path(args.output).write_text(json.dumps({"machine": machine, "workers": workers, "args": vars(args),
                                                 "results": table}, indent=2, default=str) + "\n")
    failed = any(not r.get("ok") for results in table.values() for r in results.values())
    return 1 if failed or not identical else 0


if __name__ == "__main__":
    sys.exit(main())
