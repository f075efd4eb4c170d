"""Does `audioloader doctor` predict the rate? Its prediction against bench_scaling's ``processes-N`` measured.

Issue 37, item 3. For each dataset (bench_scaling's: 10 s 44.1 kHz FLAC, and the same clips
packed at 32 kHz PCM16) and each N: `audioloader doctor SOURCE --num-workers N` (its
measurement in this process and in N decode processes, and the rate its model predicts on this
machine's cores), then bench_scaling's ``processes-N`` contender (AudioLoader, N processes, in a
fresh process, the same 64 log-mels a batch). Reported: predicted, measured and their ratio
(target: within 15 %), with the load average beside them: on a machine others use, the measured
rate is lower than the model's (it assumes the cores are ours), so the same model is also given
the cores the other processes left during the contender's run (`others_cores`, from /proc/stat).

    python -m benchmarks.end_to_end.bench_doctor                    # N = 1, 2; FLAC and PCM16
    python -m benchmarks.end_to_end.bench_doctor --workers 2 --datasets pcm16
"""

from __future__ import annotations

import argparse
import json
import sys

from audioloader.tools import doctor
from audioloader.tools.bench import dataset as bench_dataset
from audioloader.tools.bench.contenders import FEATURES, cores
from audioloader.tools.bench.runner import run_contender


def _loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def predict(source: str, n: int, rows: int, batches: int) -> dict:
    from audioloader.dsp.config import MelSpectrogramConfig

    features = MelSpectrogramConfig(**FEATURES, log=True, log_offset=1e-6)
    measured = doctor.measure_in_process(source, features, rows=rows, train=True, seed=0, compute_features=True)
    workers = doctor.measure_in_workers(source, features, num_workers=n, batch_size=64, batches=batches, train=True,
                                        seed=0, compute_features=True)
    return doctor.diagnose(measured, workers, cores=cores(), num_workers=n, batch_size=64, target=None, step_ms=None,
                           world_size=1, prefix_limit=doctor.DEFAULT_PREFIX_LIMIT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--datasets", default="flac,pcm16")
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=6.0, help="bench_scaling's measurement window")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--cache-dir", default=".cache/bench")
    args = parser.parse_args()
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    sources = {"flac": lambda: bench_dataset.standard_dataset(spec, args.cache_dir),
               "pcm16": lambda: bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    rows = []
    for name in args.datasets.split(","):
        source = str(sources[name]())
        for n in (int(x) for x in args.workers.split(",")):
            before = _loadavg()
            report = predict(source, n, args.rows, args.batches)
            spec_n = {"kind": "audioloader", "workers": n, "worker_type": "process", "source": source,
                      "batch_size": 64, "warmup_batches": max(3, n), "measure_seconds": args.seconds,
                      "min_batches": 3, "train": True, "buffer": 1000, "min_fill": 64}
            result = run_contender(spec_n, timeout=args.seconds + 600, log=lambda *_: None)
            measured = result.get("samples_per_s") if result.get("ok") else None
            predicted = report["predicted_samples_per_s"]
            # The same model on the cores the other processes left during the contender's run.
            others = result.get("others_cores")
            left = None if others is None else doctor.predicted_rate(
                n, max(0.05, cores() - others), report["in_workers"]["worker_cpu_ms"],
                report["in_workers"]["main_cpu_ms"])
            row = {"dataset": name, "workers": n, "predicted": predicted, "measured": measured,
                   "ratio": measured / predicted if measured else None, "others_cores": others,
                   "predicted_on_cores_left": left,
                   "ratio_on_cores_left": measured / left if measured and left else None,
                   "worker_cpu_ms": report["in_workers"]["worker_cpu_ms"],
                   "main_cpu_ms": report["in_workers"]["main_cpu_ms"],
                   "bench_cores_used": result.get("cores_used"), "loadavg": f"{before} -> {_loadavg()}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'dataset':8s} {'N':>2s} {'predicted':>10s} {'measured':>10s} {'measured/predicted':>19s} "
          f"{'others used':>11s} {'on cores left':>13s} {'ratio':>6s}  load average")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        left = f"{r['predicted_on_cores_left']:.1f}" if r["predicted_on_cores_left"] else "-"
        ratio_left = f"{r['ratio_on_cores_left']:.2f}" if r["ratio_on_cores_left"] else "-"
        print(f"{r['dataset']:8s} {r['workers']:2d} {r['predicted']:10.1f} {r['measured'] or 0:10.1f} {ratio:>19s} "
              f"{r['others_cores'] or 0:11.2f} {left:>13s} {ratio_left:>6s}  {r['loadavg']}")
    print(f"(target: within 15 %; {cores()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
