"""Peak memory (PSS) of the classification train loader, per process, against another checkout and the baseline.

Each contender runs in a fresh process (`audioloader.tools.bench.runner.run_contender`) for a fixed number of
batches, not seconds, so that every one reads as much of the dataset whatever the machine's load: the
``audioloader`` train contender of this checkout, of ``--against`` checkouts (e.g. an export of an older
commit: ``git archive b48bf92 | tar -x -C /tmp/before``) and the DataLoader baseline, interleaved round by
round. Reported: samples/s (read them as ratios of one run) and the process tree's peak PSS with each
process's share at the peak (the training process, its decode workers).

    python -m benchmarks.end_to_end.bench_memory --clips 1280 --batches 20 --against /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from audioloader.tools.bench import dataset as bench_dataset
from audioloader.tools.bench.runner import run_contender
from benchmarks.common import ROOT


def mib(n: float | None) -> str:
    return "-" if not n else f"{n / 2**20:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=1280)
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20, help="measured batches after the buffer's warm-up")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--against", action="append", default=[], help="another checkout's root (repeatable)")
    parser.add_argument("--output", default=None, help="also write the results as JSON")
    args = parser.parse_args()
    source = bench_dataset.standard_dataset(bench_dataset.DatasetSpec(clips=args.clips), Path(args.cache_dir).resolve())
    stream = {"source": str(source), "batch_size": 64, "warmup_batches": 2, "measure_seconds": 0.0,
              "min_batches": args.batches, "train": True, "buffer": 1000, "min_fill": 64, "workers": args.workers}
    trees = {"this checkout": str(ROOT), **{f"against {Path(p).name}": str(Path(p).resolve()) for p in args.against}}
    plan = [(label, {"kind": "audioloader", **stream, "env": {"PYTHONPATH": tree}}) for label, tree in trees.items()]
    plan.append(("DataLoader baseline", {"kind": "baseline", "resampler": "torchaudio", **stream,
                                         "warmup_batches": 2 * args.workers, "env": {"PYTHONPATH": str(ROOT)}}))
    results: dict[str, list[dict]] = {}
    # From a neutral folder: `python -m` puts the working directory first on the path, ahead of PYTHONPATH.
    os.chdir(tempfile.gettempdir())
    for round_ in range(args.rounds):
        for label, spec in plan:
            r = run_contender({**spec, "env": {**spec["env"], "PYTHONWARNINGS": "ignore"}}, timeout=1800, log=print)
            results.setdefault(label, []).append(r)
            each = r.get("peak_pss_by_process_bytes") or {}
            print(f"round {round_} {label:24s} " + (
                f"{r['samples_per_s']:7.1f} samples/s  peak PSS {mib(r.get('peak_pss_bytes'))} MiB = main "
                f"{mib(sum(each.get('main') or []))} + children {', '.join(mib(b) for b in each.get('children', []))}"
                f"  others {r.get('others_cores') or 0:.2f} cores" if r.get("ok") else
                f"FAILED {r.get('error')} {r.get('stderr', '')[-800:]}"), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
