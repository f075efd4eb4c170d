"""Training from object storage: audioloader on local disk vs S3 at 0-100 ms a request, and the peers, in one run.

How to run (from the repository root, in the dev environment)::

    .venv/bin/python -m benchmarks.remote.bench_remote --quick            # speech rows, 0 and 50 ms
    .venv/bin/python -m benchmarks.remote.bench_remote                    # the full run
    .venv/bin/python -m benchmarks.remote.bench_remote --latency 50 --contenders reader,eval-waveform
    git worktree add /tmp/before 3624b66                                         # before and after, one run:
    .venv/bin/python -m benchmarks.remote.bench_remote --project before=/tmp/before --project after=.
    .venv/bin/python -m benchmarks.remote.bench_remote --report bench-out/remote.json   # the tables again

Duration on 2 cores, once the data and the venv exist: ``--quick`` (the I/O-bound
setting only, the peers against the training loader) 25 runs, about 5 minutes;
the full run 116 runs (about 8 s each; construction over 1,000 files and the
peers longer), about 20-25 minutes; each extra ``--project`` adds its 104
audioloader runs. ``--latency 50,100`` or a ``--contenders`` subset cuts it down.
``--bandwidth 0`` lifts the per-connection cap (issue 19's first figures had none).

Results go to ``--output`` (default ``bench-out/remote.json``) and to tables on
stdout. The JSON holds ``settings``, ``projects`` (path, commit), ``peers``
(versions), ``machine`` (cores, load average at the end) and ``results``: one
object per run with ``name``, ``project`` (None for a peer), ``contender``,
``dataset``, ``format``, ``latency_ms`` (None: local disk), ``rows_per_s`` (reader)
or ``samples_per_s`` (after the first batch) and ``samples_per_s_total``,
``first_batch_s`` / ``first_row_s``, ``construct_s``, ``peak_pss_bytes``,
``requests`` (``requests``, ``GET``, ``HEAD``, ``LIST``, ``bytes``: the whole run),
``marks.constructed`` (the same counters when construction ended),
``bytes_read``, ``max_in_flight``, ``server_cores`` / ``proxy_cores`` /
``others_cores``; then ``ratios`` and ``targets`` (issue 19's, met or not).

The first run generates the datasets and makes the peers' venv under
``--cache-dir`` (default ``~/.cache/audioloader-bench``, outside the repository;
about 5 minutes, once). A ``--contenders`` list without the peers needs no venv.

Set-up: moto's S3 server on 127.0.0.1 (tests/s3_server.py, its own process), and
in front of it the shaping proxy in its own process (`ProxyProcess`: it waits
``--latency`` ms before forwarding each request, the time to first byte of a real
S3 GET, and caps each connection at ``--bandwidth`` MB/s). Datasets
(benchmarks/remote/remote_data.py): ``speech`` (short rows, ~25 KB) and ``standard`` (the
standard bench dataset, 10 s FLAC rows), each as Arrow IPC and Parquet; ``many``
(1,000 files of 2 rows) for construction.

Contenders, each in a fresh process (benchmarks/remote/remote_child.py, run against each
``--project``), on local disk and at each latency:

- ``reader``: ``ArrowShardReader`` alone, one pass: rows/s and MB/s;
- ``eval-waveform`` / ``train-waveform``: ``AudioLoader`` with 0.5 s windows of 16 kHz
  waveform (the I/O-bound setting of issue 19); ``eval-mel`` / ``train-mel``: the
  default log-mel features. Library defaults (workers, prefetch), train buffer
  ``--train-buffer``/``--train-min``;
- ``construct``: a train loader over the ``many`` files at ``--construct-latency``:
  construction and first batch cold, then a new process resuming from its checkpoint;
- peers (benchmarks/remote/remote_peers.py, in the peers' venv) at ``--peer-latency``,
  training (shuffled), with both features: ``litdata``, ``streaming`` (MosaicML),
  ``s3fs`` (one object per clip in a ``Dataset`` under a ``DataLoader``).

Figures per run: samples (rows) per second after the first batch (row), and over
the whole run (``samples_per_s_total``, construction included); seconds to the
first batch and to construct; peak PSS of the contender's process tree; requests
(GET, HEAD, LIST) and bytes the proxy forwarded; the CPU the server, the proxy and
other processes used meanwhile (moto and the proxy share the 2 cores with the
loader: a loopback stand-in for the store's protocol and latency, not its
capacity). Ratios are taken within the run: each remote figure against the same
contender on local disk (and the reader's against its 0 ms figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, module_command
from benchmarks.remote import remote_data, remote_report
from benchmarks.remote.runner import BUCKET, Bench, runner_module

LOADER_GROUPS = ("eval-waveform", "train-waveform", "eval-mel", "train-mel")
PEERS = ("litdata", "streaming", "s3fs")
GROUPS = ("reader", *LOADER_GROUPS, "construct", *PEERS)

FULL = {"datasets": "speech,standard", "formats": "ipc,parquet", "latency": "0,20,50,100",
        "contenders": ",".join(GROUPS), "peer_latency": "50", "peer_features": "waveform,mel",
        "construct_latency": "50", "construct_files": 1000, "measure_seconds": 2.0}
QUICK = {"datasets": "speech", "formats": "ipc,parquet", "latency": "0,50",
         "contenders": "reader,eval-waveform,train-waveform,construct,litdata,streaming,s3fs", "peer_latency": "50",
         "peer_features": "waveform", "construct_latency": "50", "construct_files": 200, "measure_seconds": 2.0}


# -- the plan -------------------------------------------------------------------------------------------------


def _settings(latencies: list[float]) -> list[float | None]:
    return [None, *latencies]  # None: local disk


def _ms(value: float | None) -> str:
    return "local" if value is None else f"{value:g}ms"


def run_ours(bench: Bench, projects: list[tuple[str, Path]], data: dict[str, Path]) -> None:
    """The reader and the loader contenders, per project, dataset and format, local then each latency."""
    args = bench.args
    for dataset in args.datasets:
        for fmt in args.formats:
            local = data[dataset] / fmt
            for group in [g for g in ("reader", *LOADER_GROUPS) if g in args.contenders]:
                for latency in _settings(args.latency):
                    for project, path in projects:
                        spec: dict[str, Any] = {"kind": "reader" if group == "reader" else "loader",
                                                "source": bench.source(f"{dataset}/{fmt}", latency, local),
                                                "measure_seconds": args.measure_seconds, "batch_size": 64}
                        if group != "reader":
                            mode, feature = group.split("-")
                            spec.update(train=mode == "train", feature=feature, buffer=args.train_buffer,
                                        min_fill=args.train_min)
                        meta = {"name": f"{project}:{group} {dataset}/{fmt} {_ms(latency)}", "project": project,
                                "contender": group, "dataset": dataset, "format": fmt, "latency_ms": latency}
                        bench.run(meta, spec, bench.child_command(), bench.child_env(path))


def run_construct(bench: Bench, projects: list[tuple[str, Path]], many: Path) -> None:
    """Construction over the many small files: cold (construct + first batch + checkpoint), then resume."""
    args = bench.args
    for latency, layout, project, path in [(latency, layout, project, path)
                                           for latency in [None, *args.construct_latency]
                                           for layout in ("ipc", *(["manifest"] if args.construct_manifest else []))
                                           for project, path in projects if latency is not None or layout == "ipc"]:
        state = Path(bench.tmp.name) / f"{project}-{layout}-{_ms(latency)}.pt"
        base = {"kind": "construct", "source": bench.source(f"many{args.construct_files}/{layout}", latency,
                                                            many / "ipc"),
                "batch_size": 64, "train": True, "feature": "waveform", "buffer": args.train_buffer,
                "min_fill": args.train_min, "state_file": str(state)}
        expected = None
        for phase in ("cold", "resume"):
            with_manifest = " +manifest" if layout == "manifest" else ""
            meta = {"name": f"{project}:construct-{phase} {args.construct_files} files{with_manifest} "
                            f"{_ms(latency)}",
                    "project": project, "contender": f"construct-{phase}", "dataset": "many",
                    "manifest": layout == "manifest",
                    "format": "ipc", "latency_ms": latency, "files": args.construct_files}
            spec = {**base, "phase": phase, "expected_next_index": expected}
            # Cold means cold: a machine cache of this project, layout and latency only (the resume shares it).
            cache = Path(bench.tmp.name) / f"machine-cache-{project}-{layout}-{_ms(latency)}"
            result = bench.run(meta, spec, bench.child_command(),
                               {**bench.child_env(path), "AUDIOLOADER_CACHE": str(cache)})
            expected = result.get("next_index")
            if not result.get("ok"):
                break


def run_peers(bench: Bench, python: Path, prefixes: dict[tuple[str, str], str]) -> None:
    """Each peer at each peer latency, dataset and feature setting, training (shuffled), a fresh cache each run."""
    args = bench.args
    env = {k: v for k, v in bench.env.items() if k != "PYTHONPATH"}
    cores = len(os.sched_getaffinity(0))  # DataLoader workers: audioloader's default, one per core
    for dataset in args.datasets:
        for feature in args.peer_features:
            for latency in args.peer_latency:
                for peer in [p for p in PEERS if p in args.contenders]:
                    cache = Path(bench.tmp.name) / f"cache-{peer}-{dataset}-{feature}-{latency:g}"
                    spec = {"kind": peer, "remote": f"s3://{BUCKET}/{prefixes[dataset, peer]}",
                            "endpoint": f"http://{bench.server.proxy.endpoint}", "cache_dir": str(cache),
                            "feature": feature, "train": True, "batch_size": 64, "workers": cores,
                            "measure_seconds": args.measure_seconds}
                    meta = {"name": f"{peer}:train-{feature} {dataset} {_ms(latency)}", "project": None,
                            "contender": peer, "dataset": dataset, "format": peer, "feature": feature,
                            "latency_ms": latency}
                    bench.run(meta, spec, module_command("benchmarks.remote.remote_peers", python=str(python)), env)


def prepare(bench: Bench) -> tuple[dict[str, Path], Path | None, Path | None, dict[tuple[str, str], str]]:
    """Generate (or reuse) the datasets and upload them; the peers' venv and formats when peers run."""
    args, cache, log = bench.args, args_cache(bench.args), bench.log
    data: dict[str, Path] = {}
    if "speech" in args.datasets:
        data["speech"] = remote_data.speech_dataset(cache, args.speech_rows, log)
    if "standard" in args.datasets:
        data["standard"] = remote_data.standard_dataset(cache, args.standard_clips, log)
    for name, folder in data.items():
        for fmt in args.formats:
            remote_data.upload_tree(bench.fs, folder / fmt, f"{BUCKET}/{name}/{fmt}")
    many = None
    if "construct" in args.contenders:
        many = remote_data.many_files(cache, args.construct_files, log)
        remote_data.upload_tree(bench.fs, many / "ipc", f"{BUCKET}/many{args.construct_files}/ipc")
        if args.construct_manifest:  # the same files and their manifest, written by this checkout
            from audioloader.shards.catalog.manifest_source import write_folder_manifest
            from tests.s3_server import S3_ENVIRONMENT

            os.environ.update(S3_ENVIRONMENT)  # the server's keys (unsigned: moto keeps the aws-chunked framing)
            prefix = f"{BUCKET}/many{args.construct_files}/manifest"
            remote_data.upload_tree(bench.fs, many / "ipc", prefix)
            endpoint = bench.server.direct_endpoint
            write_folder_manifest(f"s3://{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1")
    python, prefixes = None, {}
    if any(p in args.contenders for p in PEERS):
        python = remote_data.peers_python(cache, log)
        for name, folder in data.items():
            ipc = folder / "ipc"
            formats = {"litdata": "litdata", "streaming": "mds"}
            for peer in [p for p in PEERS if p in args.contenders]:
                if peer == "s3fs":
                    local = remote_data.files_dataset(cache, folder.name, ipc, log)
                else:
                    local = remote_data.peer_format(python, cache, folder.name, ipc, formats[peer], log)
                prefixes[name, peer] = f"{name}/{peer}"
                remote_data.upload_tree(bench.fs, local, f"{BUCKET}/{name}/{peer}")
    return data, many, python, prefixes


def args_cache(args: argparse.Namespace) -> Path:
    return Path(args.cache_dir).expanduser()


# -- arguments ------------------------------------------------------------------------------------------------


def _list(text: str, cast=str) -> list[Any]:
    return [cast(x.strip()) for x in str(text).split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="speech rows, 0 and 50 ms, waveform windows only, 200 files for construct")
    parser.add_argument("--latency", help="ms added per request, comma-separated (full: 0,20,50,100)")
    parser.add_argument("--bandwidth", type=float, default=50.0, help="MB/s per connection (50; 0: no cap)")
    parser.add_argument("--contenders", help=f"comma-separated subset of {','.join(GROUPS)}")
    parser.add_argument("--datasets", help="speech,standard (full) or one of them")
    parser.add_argument("--formats", help="ipc,parquet (default) or one of them")
    parser.add_argument("--peer-latency", help="ms for the peers' runs (50)")
    parser.add_argument("--peer-features", help="waveform,mel (full) or one of them")
    parser.add_argument("--construct-latency", help="ms for the construction runs (50); local is always run")
    parser.add_argument("--construct-manifest", action="store_true",
                        help="construct also over the same files with a dataset manifest (audioloader index)")
    parser.add_argument("--construct-files", type=int, help="small files for construct (full 1000, quick 200)")
    parser.add_argument("--measure-seconds", type=float, help="window after the first batch, seconds (2)")
    parser.add_argument("--speech-rows", type=int, default=2000, help="rows of the speech dataset (2000)")
    parser.add_argument("--standard-clips", type=int, default=256, help="clips of the standard dataset (256)")
    parser.add_argument("--train-buffer", type=int, default=256, help="train shuffle buffer (256; 0: the default)")
    parser.add_argument("--train-min", type=int, default=64, help="train shuffle buffer's min fill (64)")
    parser.add_argument("--project", action="append", default=[], metavar="[NAME=]DIR",
                        help="an audioloader checkout to measure (repeatable; default: this one)")
    parser.add_argument("--cache-dir", default="~/.cache/audioloader-bench", help="datasets and the peers' venv")
    parser.add_argument("--output", default="bench-out/remote.json", help="JSON results (bench-out/remote.json)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a contender is killed")
    parser.add_argument("--report", metavar="FILE", help="print the tables of an earlier run's JSON and exit")
    args = parser.parse_args(argv)
    if args.report:
        return args
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.latency = _list(args.latency, float)
    args.peer_latency = _list(args.peer_latency, float)
    args.construct_latency = _list(args.construct_latency, float)
    args.contenders, args.datasets = _list(args.contenders), _list(args.datasets)
    args.formats, args.peer_features = _list(args.formats), _list(args.peer_features)
    _check(parser, args)
    return args


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for option, values, allowed in (("--contenders", args.contenders, GROUPS),
                                    ("--datasets", args.datasets, ("speech", "standard")),
                                    ("--formats", args.formats, ("ipc", "parquet")),
                                    ("--peer-features", args.peer_features, ("waveform", "mel"))):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"{option}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    for option, values in (("--latency", args.latency), ("--peer-latency", args.peer_latency),
                           ("--construct-latency", args.construct_latency)):
        if any(v < 0 for v in values):
            parser.error(f"{option}: milliseconds >= 0")
    if args.bandwidth < 0 or args.measure_seconds <= 0 or args.construct_files < 1:
        parser.error("--bandwidth must be >= 0, --measure-seconds > 0, --construct-files >= 1")
    args.projects = []
    for item in args.project or ["this=" + str(ROOT)]:
        name, _, folder = item.rpartition("=")
        path = Path(folder).expanduser().resolve()
        if not (path / "audioloader" / "__init__.py").exists():
            parser.error(f"--project {item}: {path} has no audioloader/ package; give a checkout of the repository")
        args.projects.append((name or path.name, path))


def _commit(path: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(path), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:  # ratios and targets again from the results (so a changed target definition applies)
        out = json.loads(Path(args.report).read_text())
        out["ratios"] = remote_report.ratios(out["results"])
        out["targets"] = remote_report.targets(out["results"], out["ratios"])
        print(remote_report.tables(out))
        return 0

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    bench = Bench(args, log)
    try:
        data, many, python, prefixes = prepare(bench)
        run_ours(bench, args.projects, data)
        if many is not None:
            run_construct(bench, args.projects, many)
        if python is not None:
            run_peers(bench, python, prefixes)
    finally:
        bench.close()
    out = {"settings": {k: v for k, v in vars(args).items() if k != "projects"},
           "projects": {name: {"path": str(path), "commit": _commit(path)} for name, path in args.projects},
           "peers": remote_data.peer_versions(args_cache(args)), "machine": runner_module().machine_info(),
           "seconds": time.perf_counter() - started, "results": bench.results}
    out["ratios"] = remote_report.ratios(bench.results)
    out["targets"] = remote_report.targets(bench.results, out["ratios"])
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(remote_report.tables(out))
    log(f"results in {output} ({out['seconds']:.0f} s; load average {os.getloadavg()})")
    return 0 if all(r.get("ok") for r in bench.results) else 1


if __name__ == "__main__":
    sys.exit(main())
