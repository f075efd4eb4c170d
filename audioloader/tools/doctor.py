"""What bounds a loading run, and how many cores it needs: ``audioloader doctor SOURCE [options]``.

Measures, on a sample of rows of SOURCE, the CPU each stage of the per-sample work
costs (read, decode, resample, features, augmentation; the crop is part of decode:
only the window is decoded), first in this process, then in ``--num-workers`` decode
processes of a real `AudioLoader` (CPU of the workers and of the consuming process,
from ``/proc``), and prints:

- samples/s per core, and for the given ``--num-workers`` on this machine's cores;
- the cores needed for ``--target N/s``, or to keep up with a training step of
  ``--step-ms`` milliseconds at ``--batch-size``;
- whether computing the features on a GPU would pay (their share of the CPU);
- for a remote source: requests a second per machine, and for ``--world-size``
  machines against the store's per-prefix limit (``--prefix-limit``), and the cache
  a pass needs per machine.

The model of the rate with N workers on C cores, from the CPU per sample in a
worker ``w`` and in the consuming process ``m``: ``min(N / w, C / (w + m), 1 / m)``.
``--json`` prints the same as one JSON object for scripts.

    audioloader doctor /data/shards --num-workers 8 --target 2000
    audioloader doctor s3://bucket/shards --step-ms 120 --batch-size 64 --world-size 16 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

__all__ = ["add_arguments", "diagnose", "main", "predicted_rate"]

#: Share of the per-sample CPU above which moving the features to a GPU (``compute_features=False`` and
#: `BatchFeatures` on the device) is worth it: at 25 % the CPU-bound rate rises by a third.
GPU_FEATURES_PAY_SHARE = 0.25

#: GET requests a second an object store serves per prefix (S3's documented figure; GCS and Azure are similar).
DEFAULT_PREFIX_LIMIT = 5500

#: CPU seconds the workers must spend in the measurement at least (``/proc`` counts in 10 ms ticks) ...
MIN_MEASURED_CPU_S = 1.0
#: ... unless the measurement has lasted this many seconds.
MAX_MEASURE_SECONDS = 30.0

#: The stages measured in this process, in the order they run (``stats()["seconds"]`` names).
STAGES = ("read", "decode", "resample", "augment")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="shards folder, file or URL (as AudioLoader takes it)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=None,
                        help="decode processes to measure and predict for (default: the cores, at most 8)")
    parser.add_argument("--eval", action="store_true", help="eval mode (centre crops) instead of train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-rate", type=int, default=32000, help="features' sample rate, Hz")
    parser.add_argument("--clip-seconds", type=float, default=5.0, help="crop length, s")
    parser.add_argument("--n-fft", type=int, default=1024)
    parser.add_argument("--hop-length", type=int, default=320)
    parser.add_argument("--n-mels", type=int, default=128)
    parser.add_argument("--waveform", action="store_true",
                        help="no features in the workers (compute_features=False: waveforms, features per batch)")
    parser.add_argument("--rows", type=int, default=64, help="rows measured in this process (default 64)")
    parser.add_argument("--batches", type=int, default=6, help="batches measured in the workers (default 6)")
    parser.add_argument("--no-workers", action="store_true", help="measure in this process only (quick)")
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--target", type=_rate, default=None, metavar="N/s", help="samples a second wanted")
    goal.add_argument("--step-ms", type=float, default=None, help="a training step's milliseconds (per batch)")
    parser.add_argument("--world-size", type=int, default=1, help="machines reading the source together")
    parser.add_argument("--prefix-limit", type=float, default=DEFAULT_PREFIX_LIMIT,
                        help=f"the store's GET requests/s per prefix (default {DEFAULT_PREFIX_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _rate(text: str) -> float:
    value = float(text.strip().removesuffix("/s"))
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--target {text!r}: must be a positive rate, e.g. 2000/s")
    return value


def _features(args: argparse.Namespace) -> Any:
    from audioloader.dsp.config import MelSpectrogramConfig

    return MelSpectrogramConfig(sample_rate=args.sample_rate, clip_seconds=args.clip_seconds, n_fft=args.n_fft,
                                hop_length=args.hop_length, n_mels=args.n_mels)


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # exited meanwhile
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
        except OSError:
            continue
    return kids


def _descendants(pid: int) -> list[int]:
    out, stack = [], _children(pid)
    while stack:
        child = stack.pop()
        out.append(child)
        stack += _children(child)
    return out


def measure_in_process(source: str, features: Any, *, rows: int, train: bool, seed: int,
                       compute_features: bool) -> dict[str, Any]:
    """CPU milliseconds a sample of each stage, reading and decoding ``rows`` rows here on one thread."""
    import torch

    from audioloader.nodes.arrow_shard_reader import ArrowShardReader
    from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
    from audioloader.stats import LoaderStats, feature_stage

    torch.set_num_threads(1)
    stats = LoaderStats()
    reader = ArrowShardReader.of(source, seed=seed, shuffle=True, infinite=True, stats=stats)
    reader.reset()
    node = DecodeSpectrogram.of(reader, features, seed=seed, train=train, num_workers=0, stats=stats,
                             compute_features=compute_features)
    opened = stats.snapshot()  # the requests of the reads from here on (construction's footer reads left out)
    for _ in range(min(4, rows)):  # warm-up: filterbanks, FFT plans, first page faults
        node.decode(next(reader))
    before = stats.snapshot()
    cpu, wall = time.process_time(), time.perf_counter()
    bad = 0
    for _ in range(rows):
        out = node.decode(next(reader))
        bad += not hasattr(out, "features")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    after = stats.snapshot()
    stage_names = (*STAGES, feature_stage(features.batch_key))
    seconds = {name: after["seconds"].get(name, 0.0) - before["seconds"].get(name, 0.0) for name in stage_names}
    # Requests a row read, over every read since the reader opened: reads run ahead in units (record batches,
    # row groups), so the measured rows alone may have needed none.
    requests = after["counters"].get("remote_requests", 0) - opened["counters"].get("remote_requests", 0)
    rows_read = max(1, after["counters"].get("rows_read", 0) - opened["counters"].get("rows_read", 0))
    timed = sum(seconds.values())
    # Stages are timed in wall seconds; on one busy thread those are CPU seconds but for waits (a remote read).
    # The CPU not inside a timed stage (hashing, checks, the loop) is reported as "other".
    scale = min(1.0, cpu / timed) if timed > 0 else 1.0
    stage_ms = {name: 1e3 * s * scale / rows for name, s in seconds.items()}
    stage_ms["other"] = max(0.0, 1e3 * cpu / rows - sum(stage_ms.values()))
    dataset = reader.dataset
    return {"rows": rows, "bad_rows": bad, "cpu_ms": 1e3 * cpu / rows, "wall_ms": 1e3 * wall / rows,
            "stage_ms": stage_ms, "features_stage": feature_stage(features.batch_key),
            "remote": bool(dataset.remote_files().any()), "requests_per_sample": requests / rows_read,
            "dataset_bytes": int(dataset.files.sizes.sum()), "dataset_rows": int(dataset.num_rows)}


def measure_in_workers(source: str, features: Any, *, num_workers: int, batch_size: int, batches: int,
                       train: bool, seed: int, compute_features: bool) -> dict[str, Any]:
    """CPU milliseconds a sample of the decode processes and of the consuming process, in a real `AudioLoader`."""
    from audioloader.audio_loader import AudioLoader
    from audioloader.options import Workers

    loader = AudioLoader(source, batch_size=batch_size, train=train, seed=seed, features=features,
                         workers=Workers(kind="process", num_workers=num_workers),
                         **({} if compute_features else {"device": "cpu"}))
    try:
        stream = iter(loader)
        warmup = max(2, num_workers)
        if train:  # the shuffle buffer decodes two rows a sample until it is full: start-up, not steady state
            warmup = max(warmup, math.ceil((loader.shuffle_buffer_size - loader.shuffle_min_size) / batch_size) + 1)
        for _ in range(warmup):
            next(stream)
        me = os.getpid()
        kids = _descendants(me)  # the workers: children of this process, or of its fork server
        main0, kids0, busy0 = _proc_cpu(me), {pid: _proc_cpu(pid) for pid in kids}, _machine_busy_s()
        decoded0 = loader.stats()["counters"]["samples_decoded"]
        wall = time.perf_counter()
        done = 0
        # At least `batches` batches, and enough CPU that /proc's ticks (10 ms) are a small part of it.
        while done < batches or (_workers_cpu(kids, kids0) < MIN_MEASURED_CPU_S
                                 and time.perf_counter() - wall < MAX_MEASURE_SECONDS):
            next(stream)
            done += 1
        wall = time.perf_counter() - wall
        decoded = loader.stats()["counters"]["samples_decoded"] - decoded0
        main_cpu = _proc_cpu(me) - main0
        worker_cpu = _workers_cpu(kids, kids0)
        busy1 = _machine_busy_s()
    finally:
        loader.shutdown()
    return {"num_workers": num_workers, "samples": decoded, "samples_per_s": decoded / wall,
            "worker_cpu_ms": 1e3 * worker_cpu / decoded, "main_cpu_ms": 1e3 * main_cpu / decoded,
            # The cores the loader's processes got: fewer than the machine's when other processes use it too.
            "cores_obtained": (worker_cpu + main_cpu) / wall,
            # ... because other processes used this many meanwhile (None where /proc/stat is missing).
            "others_cores": None if busy0 is None or busy1 is None else
            max(0.0, (busy1 - busy0 - worker_cpu - main_cpu) / wall)}


def _machine_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine (every core, every process) from ``/proc/stat``; None without it."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _workers_cpu(pids: list[int], start: dict[int, float]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += _proc_cpu(pid) - start[pid]
        except OSError:  # exited meanwhile (a worker replaced): its CPU since the start is lost
            continue
    return total


def predicted_rate(num_workers: int, cores: int, worker_ms: float, main_ms: float) -> float:
    """Samples/s of ``num_workers`` decode processes on ``cores`` cores whose work costs ``worker_ms`` of CPU a sample
    in a worker and ``main_ms`` in the consuming process: each bound, the lowest wins.

    ``num_workers / w`` (every worker busy), ``cores / (w + m)`` (the cores shared by all), ``1 / m`` (the consuming
    process's one thread)."""
    w, m = worker_ms / 1e3, max(main_ms, 1e-6) / 1e3
    return min(num_workers / w, cores / (w + m), 1 / m)


def diagnose(measured: dict[str, Any], workers: dict[str, Any] | None, *, cores: int, num_workers: int,
             batch_size: int, target: float | None, step_ms: float | None, world_size: int,
             prefix_limit: float) -> dict[str, Any]:
    """The report: rates, cores needed, whether GPU features pay, remote figures (pure arithmetic; see the module)."""
    worker_ms = max(workers["worker_cpu_ms"] if workers else measured["cpu_ms"], 1e-3)
    main_ms = workers["main_cpu_ms"] if workers else 0.0
    stage_ms = measured["stage_ms"]
    features_ms = stage_ms.get(measured["features_stage"], 0.0) if measured["features_stage"] != "waveform" else 0.0
    features_share = features_ms / measured["cpu_ms"] if measured["cpu_ms"] else 0.0
    report: dict[str, Any] = {
        "cores": cores, "num_workers": num_workers,
        "in_process": {"cpu_ms_per_sample": measured["cpu_ms"], "stage_ms": stage_ms},
        "in_workers": workers,
        "samples_per_s_per_core": 1e3 / worker_ms,
        "predicted_samples_per_s": predicted_rate(num_workers, cores, worker_ms, main_ms),
        # The model on the cores other processes left during the measurement (a shared machine).
        "predicted_samples_per_s_on_cores_left": predicted_rate(
            num_workers, max(0.05, cores - workers["others_cores"]), worker_ms, main_ms)
        if workers and workers.get("others_cores") is not None else None,
        "limit_samples_per_s": 1e3 / max(main_ms, 1e-6) if workers else None,
        "worker_overhead": worker_ms / measured["cpu_ms"] if workers and measured["cpu_ms"] else None,
        "features_share": features_share,
        "gpu_features_pay": features_share >= GPU_FEATURES_PAY_SHARE,
        "gpu_features_speedup": 1 / (1 - features_share) if features_share < 1 else None,
    }
    if step_ms is not None:
        target = batch_size / (step_ms / 1e3)
    if target is not None:
        cores_needed = target * (worker_ms + main_ms) / 1e3
        report["target_samples_per_s"] = target
        report["cores_needed"] = cores_needed
        report["workers_needed"] = math.ceil(target * worker_ms / 1e3)
        report["consumer_keeps_up"] = target * main_ms / 1e3 < 1.0
    if measured["remote"]:
        rate = report["predicted_samples_per_s"] if target is None else target
        per_machine = rate * measured["requests_per_sample"]
        report["remote"] = {
            "requests_per_sample": measured["requests_per_sample"],
            "requests_per_s_per_machine": per_machine,
            "requests_per_s_all_machines": per_machine * world_size, "world_size": world_size,
            "prefix_limit": prefix_limit, "over_prefix_limit": per_machine * world_size > prefix_limit,
            "cache_bytes_per_pass_per_machine": math.ceil(measured["dataset_bytes"] / world_size),
        }
    return report


def format_report(report: dict[str, Any]) -> str:
    stage = report["in_process"]["stage_ms"]
    lines = ["CPU a sample, in this process: " + ", ".join(f"{k} {v:.2f} ms" for k, v in stage.items() if v >= 0.005)
             + f" (total {report['in_process']['cpu_ms_per_sample']:.2f} ms)"]
    workers = report["in_workers"]
    if workers:
        lines.append(f"in {workers['num_workers']} decode processes: {workers['worker_cpu_ms']:.2f} ms a sample in "
                     f"the workers ({report['worker_overhead']:.2f}x this process), {workers['main_cpu_ms']:.3f} ms in "
                     f"the consuming process; measured {workers['samples_per_s']:.0f} samples/s on the "
                     f"{workers['cores_obtained']:.2f} cores the run got")
        if report["predicted_samples_per_s_on_cores_left"] is not None and workers["others_cores"] > 0.1:
            lines.append(f"other processes used {workers['others_cores']:.2f} of the {report['cores']} cores "
                         f"meanwhile; on what they left the model says "
                         f"{report['predicted_samples_per_s_on_cores_left']:.0f} samples/s")
    lines.append(f"samples/s per core: {report['samples_per_s_per_core']:.1f}; with {report['num_workers']} workers on "
                 f"{report['cores']} cores: {report['predicted_samples_per_s']:.0f} samples/s")
    if report.get("limit_samples_per_s"):
        lines.append(f"the consuming process alone caps the rate at {report['limit_samples_per_s']:.0f} samples/s")
    if "target_samples_per_s" in report:
        lines.append(f"for {report['target_samples_per_s']:.0f} samples/s: {report['cores_needed']:.1f} cores "
                     f"({report['workers_needed']} decode workers)"
                     + ("" if report["consumer_keeps_up"] else "; the consuming process cannot keep up: use "
                        "several loaders (one a GPU) or lighter per-batch work"))
    share = report["features_share"]
    lines.append(f"features are {share:.0%} of the CPU: GPU features "
                 + (f"would pay (up to {report['gpu_features_speedup']:.2f}x the CPU-bound rate; "
                    "compute_features=False and BatchFeatures on the device)" if report["gpu_features_pay"]
                    else "would not pay much"))
    remote = report.get("remote")
    if remote:
        lines.append(f"remote: {remote['requests_per_sample']:.2f} requests a sample, "
                     f"{remote['requests_per_s_per_machine']:.0f}/s a machine, "
                     f"{remote['requests_per_s_all_machines']:.0f}/s for {remote['world_size']} machines against "
                     f"a per-prefix limit of {remote['prefix_limit']:.0f}/s"
                     + (" (over it: spread the shards over prefixes or read larger units)"
                        if remote["over_prefix_limit"] else "")
                     + f"; a pass needs {remote['cache_bytes_per_pass_per_machine'] / 1e9:.2f} GB of cache a machine")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    for name in ("batch_size", "rows", "batches", "world_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.num_workers is not None and args.num_workers < 1:
        raise ValueError(f"--num-workers {args.num_workers}: must be at least 1")
    cores = available_cores()
    num_workers = args.num_workers or min(8, cores)
    features = _features(args)
    train, compute = not args.eval, not args.waveform
    measured = measure_in_process(args.source, features, rows=args.rows, train=train, seed=args.seed,
                                  compute_features=compute)
    workers = None if args.no_workers else measure_in_workers(
        args.source, features, num_workers=num_workers, batch_size=args.batch_size, batches=args.batches,
        train=train, seed=args.seed, compute_features=compute)
    report = diagnose(measured, workers, cores=cores, num_workers=num_workers, batch_size=args.batch_size,
                      target=args.target, step_ms=args.step_ms, world_size=args.world_size,
                      prefix_limit=args.prefix_limit)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
