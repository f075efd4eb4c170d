"""Ctrl-C latency: SIGINT to the training loop's KeyboardInterrupt, and to the last thread/process stopped.

Each try runs a small training loop in a fresh process (its own process group,
as a terminal's foreground job), waits until the loop is in the phase under
test, sends SIGINT to the whole group (what Ctrl-C does) and reads back when
the loop caught ``KeyboardInterrupt`` and when every thread and worker process
of the loader had stopped (``loader.shutdown()`` returned).

Phases: ``start`` (right after ``iter()``: worker start-up, first reads),
``fill`` (a shuffle buffer of decoded samples filling), ``steady``
(training), ``restore`` (a resumed loader re-decoding its buffer) and
``eval`` (an evaluation pass).

    python -m benchmarks.end_to_end.bench_interrupt [--tries 5] [--workers 2] [--types thread,process]

Prints the worst and median latency per phase and worker type, in seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks.common import CACHE, ROOT

CHILD = textwrap.dedent("""
    import os, sys, time, multiprocessing, threading
    import audioloader as al
    phase, worker_type, workers, source, checkpoint = sys.argv[1:6]
    workers = int(workers)
    features = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=160, n_mels=64)
    train = phase != "eval"
    shuffle = al.Shuffle(buffer_size=400, min_size=400, before_decode=False) \\
        if phase in ("fill", "restore") else al.Shuffle(buffer_size=64, min_size=16)
    def build():
        return al.AudioLoader(source, batch_size=16, train=train, seed=0, features=features,
                              workers=al.Workers(num_workers=workers, kind=worker_type),
                              shuffle=shuffle if train else None)
    if phase == "restore" and not os.path.exists(checkpoint):
        import torch
        with build() as loader:
            it = iter(loader)
            next(it)
            torch.save(loader.state_dict(), checkpoint)
        print("saved", flush=True)
        sys.exit(0)
    loader = build()
    try:
        if phase == "restore":
            import torch
            loader.load_state_dict(torch.load(checkpoint))
        it = iter(loader)
        if phase == "steady":
            for _ in range(3):
                next(it)
        print("ready", time.monotonic(), flush=True)
        while True:
            next(it)
    except KeyboardInterrupt:
        caught = time.monotonic()
        loader.shutdown()
        stopped = time.monotonic()
        alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        print("interrupted", caught, stopped, len(multiprocessing.active_children()), len(alive), flush=True)
        sys.exit(3)
""")


def make_dataset(folder: Path) -> Path:
    """400 clips of 6 s, 44.1 kHz FLAC, in 4 IPC shards (long enough to decode that a fill takes seconds)."""
    from audioloader.tools.bench.dataset import DatasetSpec, standard_dataset

    return standard_dataset(DatasetSpec(clips=400, seconds=6.0), folder, log=lambda *_: None)


def one_try(phase: str, worker_type: str, workers: int, source: Path, checkpoint: Path, delay: float) -> dict:
    args = [sys.executable, "-c", CHILD, phase, worker_type, str(workers), str(source), str(checkpoint)]
    if phase == "restore" and not checkpoint.exists():
        subprocess.run(args, cwd=ROOT, check=True, capture_output=True, timeout=300)
    child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        line = child.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"child not ready: {line} {child.stderr.read()[-2000:]}")
        time.sleep(delay)
        sent = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)
        try:
            out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Report a hang as a result (with where the child was, if py-spy is installed) instead of
            # ending the whole benchmark: it is the finding this benchmark exists to catch.
            stacks = subprocess.run(["py-spy", "dump", "--pid", str(child.pid)], capture_output=True,
                                    text=True).stdout if shutil.which("py-spy") else "(py-spy not installed)"
            child.kill()
            out, err = child.communicate()
            print(f"HANG: {phase} {worker_type} {delay:.2f} s; child printed {out.strip()!r}\n{stacks}\n"
                  f"child's stderr (the loader warns with the stack of a thread that does not stop):\n{err[-4000:]}",
                  file=sys.stderr, flush=True)
            return {"caught_s": float("inf"), "stopped_s": float("inf"), "processes_left": -1,
                    "threads_left": -1, "tracebacks": err.count("Traceback"), "hang": True}
    finally:
        child.kill()
    fields = out.split()
    if not fields or fields[0] != "interrupted":
        raise RuntimeError(f"no interrupt report: {out} {err[-2000:]}")
    return {"caught_s": float(fields[1]) - sent, "stopped_s": float(fields[2]) - sent,
            "processes_left": int(fields[3]), "threads_left": int(fields[4]), "tracebacks": err.count("Traceback")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--types", default="thread,process")
    parser.add_argument("--phases", default="start,fill,steady,restore,eval")
    parser.add_argument("--cache-dir", default=str(CACHE))
    args = parser.parse_args()
    source = make_dataset(Path(args.cache_dir))
    rows = []
    for worker_type in args.types.split(","):
        checkpoint = Path(args.cache_dir) / f"interrupt-{worker_type}.pt"
        checkpoint.unlink(missing_ok=True)
        for phase in args.phases.split(","):
            results = [one_try(phase, worker_type, args.workers, source, checkpoint, delay=0.05 + 0.1 * k)
                       for k in range(args.tries)]
            caught = [r["caught_s"] for r in results]
            stopped = [r["stopped_s"] for r in results]
            hangs = sum(bool(r.get("hang")) for r in results)
            left = max(r["processes_left"] + r["threads_left"] for r in results)
            tracebacks = max(r["tracebacks"] for r in results)
            rows.append((worker_type, phase, max(caught), statistics.median(caught), max(stopped), left, tracebacks,
                         hangs))
            print(f"{worker_type:8s} {phase:8s} caught max {max(caught):.3f} s  all stopped max {max(stopped):.3f} s",
                  flush=True)
    print(f"\nCtrl-C latency over {args.tries} tries, {args.workers} workers, {os.cpu_count()} cores "
          "(seconds from SIGINT):")
    print(f"{'workers':8s} {'phase':8s} {'caught max':>10s} {'median':>7s} {'stopped max':>11s} "
          f"{'left':>5s} {'tracebacks':>10s} {'hangs':>5s}")
    for worker_type, phase, worst, median, stopped, left, tracebacks, hangs in rows:
        print(f"{worker_type:8s} {phase:8s} {worst:10.3f} {median:7.3f} {stopped:11.3f} {left:5d} {tracebacks:10d} "
              f"{hangs:5d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
