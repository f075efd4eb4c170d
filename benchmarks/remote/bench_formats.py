"""Audio where it lives (issue 35): WebDataset tars read in place vs the same clips packed as Arrow IPC and Parquet,
on local disk and from S3 at a latency a request, in one run.

How to run (from the repository root, in the dev environment)::

    .venv/bin/python -m benchmarks.remote.bench_formats                  # 2,400 clips, local and 50 ms
    .venv/bin/python -m benchmarks.remote.bench_formats --rows 1200 --latency 0,50 --contenders train-waveform

Data: ``--rows`` speech-like clips (benchmarks/remote/remote_data.py's ``speech_clips``: 1.0-1.5 s
of 16 kHz FLAC, about 25 KB, label ``i % 10``) in 4 WebDataset tars (``KEY.flac`` +
``KEY.cls`` + ``KEY.json``), then ``audioloader pack --from webdataset`` of those tars into
Arrow IPC and Parquet (record batches / row groups of 64 rows): the same clips, labels and
columns. Each folder gets its dataset manifest (``audioloader index``, on S3 after the
upload: with ETags), so every layout starts from one manifest request.

Set-up and contenders as benchmarks/remote/bench_remote.py (whose runner this uses): moto's
S3 server on 127.0.0.1 behind the shaping proxy (its own process, ``--latency`` ms before
each request); each contender in a fresh process (benchmarks/remote/remote_child.py) with the
library's defaults: ``eval-waveform`` / ``train-waveform`` (0.5 s of 16 kHz waveform:
the I/O-bound setting) and ``reader`` (``ArrowShardReader`` alone). Figures: samples/s
after the first batch, seconds to the first batch (construction included), peak PSS of
the process tree, requests at construction (LIST, HEAD, GET up to the child's
"constructed" mark). Ratios: tar / Arrow IPC of the same contender and setting (the
target: >= 0.9). The machine has 2 cores shared with other work, moto and the proxy:
read ratios, not absolute rates; ``--repeats`` takes the median.

Results: ``--output`` (default ``bench-out/formats.json``) and a table on stdout. ``--reader-only``: the
reader's own cost instead (`reader_pass`: ``ArrowShardReader`` in this process, no decode).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, median_round
from benchmarks.remote import remote_data, remote_report
from benchmarks.remote.runner import BUCKET, Bench

LAYOUTS = ("tar", "ipc", "parquet")


def write_tars(folder: Path, rows: int, files: int = 4) -> None:
    """``rows`` speech clips in ``files`` WebDataset tars: ``clipNNNNNN.flac``, ``.cls``, ``.json`` (its length)."""
    folder.mkdir(parents=True)
    per_file = -(-rows // files)
    for f in range(files):
        start, count = f * per_file, min(per_file, rows - f * per_file)
        table = remote_data.speech_clips(start, count)
        with tarfile.open(folder / f"shard-{f:05d}.tar", "w") as tar:
            for k, (audio, label) in enumerate(zip(table.column("audio").to_pylist(),
                                                   table.column("label").to_pylist(), strict=True)):
                i = start + k
                for extension, data in (("flac", audio), ("cls", str(label).encode()),
                                        ("json", json.dumps({"uid": i}).encode())):
                    info = tarfile.TarInfo(f"clip{i:06d}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def make_data(root: Path, rows: int) -> dict[str, Path]:
    from audioloader.shards.catalog.manifest_source import write_folder_manifest
    from audioloader.tools.pack_from import pack_from

    folders = {layout: root / layout for layout in LAYOUTS}
    write_tars(folders["tar"], rows)
    write_folder_manifest(str(folders["tar"]))
    pack_from(folders["tar"], folders["ipc"], "webdataset", fmt="ipc_file", shard_mb=None)
    pack_from(folders["tar"], folders["parquet"], "webdataset", fmt="parquet", shard_mb=None)
    return folders


def upload(bench: Bench, folders: dict[str, Path]) -> None:
    """Each layout to ``bench/formats/<layout>``, then its manifest written again from the store (with ETags)."""
    from audioloader.shards.catalog.manifest_source import write_folder_manifest
    from tests.s3_server import S3_ENVIRONMENT

    os.environ.update(S3_ENVIRONMENT)  # this process's own writes are signed as the children's reads are
    fs = bench.fs
    for layout, folder in folders.items():
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.startswith("_"):
                with fs.open_output_stream(f"{BUCKET}/formats/{layout}/{path.name}") as out:
                    out.write(path.read_bytes())
        direct = (f"s3://{BUCKET}/formats/{layout}?endpoint_override={bench.server.direct_endpoint}"
                  "&scheme=http&region=us-east-1")
        write_folder_manifest(direct)


def start_requests(r: dict[str, Any]) -> str:
    marked = (r.get("marks") or {}).get("constructed")
    if not marked:
        return "-"
    return f"LIST {marked['LIST']} HEAD {marked['HEAD']} GET {marked['GET']}"


def table(results: list[dict[str, Any]], latencies: list[float | None]) -> list[str]:
    lines = [f"{'contender':15s} {'where':6s} {'layout':8s} {'samples/s':>10s} {'tar/ipc':>8s} {'first s':>8s} "
             f"{'PSS MB':>7s}  requests at start"]
    for contender in dict.fromkeys(r["contender"] for r in results):
        for latency in latencies:
            ipc = next((r for r in results if r["contender"] == contender and r["latency_ms"] == latency
                        and r["format"] == "ipc"), None)
            for layout in LAYOUTS:
                r = next((x for x in results if x["contender"] == contender and x["latency_ms"] == latency
                          and x["format"] == layout), None)
                if r is None:
                    continue
                ratio = remote_report._div(remote_report.rate(r), remote_report.rate(ipc)) if ipc else None
                first = r.get("first_batch_s", r.get("first_row_s"))
                lines.append(f"{contender:15s} {remote_report._ms(latency):6s} {layout:8s} "
                             f"{remote_report._f(remote_report.rate(r)):>10s} "
                             f"{remote_report._f(ratio, 2) if layout == 'tar' else '':>8s} "
                             f"{remote_report._f(first, 2):>8s} "
                             f"{remote_report._f((r.get('peak_pss_bytes') or 0) / 2**20):>7s}  {start_requests(r)}")
    return lines


def reader_pass(rows: int, rounds: int = 7) -> dict[str, float]:
    """``--reader-only``: rows/s of ``ArrowShardReader`` (construction and a shuffled pass) on each layout, in this
    one process, the layouts interleaved, best of ``rounds``: the reader's own cost, without decode or processes."""
    import tempfile
    import time

    from audioloader.nodes import ArrowShardReader

    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        folders = make_data(Path(tmp), rows)
        best = dict.fromkeys(folders, float("inf"))
        for _ in range(rounds):
            for layout, folder in folders.items():
                start = time.perf_counter()
                count = sum(1 for _ in ArrowShardReader.of(str(folder), shuffle=True, seed=0))
                best[layout] = min(best[layout], time.perf_counter() - start)
    return {layout: count / seconds for layout, seconds in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2400)
    parser.add_argument("--latency", default="50", help="ms a request, comma-separated (local disk is always run)")
    parser.add_argument("--contenders", default="eval-waveform,train-waveform")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--measure-seconds", type=float, default=3.0)
    parser.add_argument("--train-buffer", type=int, default=None)
    parser.add_argument("--train-min", type=int, default=None)
    parser.add_argument("--bandwidth", type=float, default=0.0, help="MB/s a connection (0: no cap)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--output", default="bench-out/formats.json")
    parser.add_argument("--reader-only", action="store_true", help="only the in-process reader pass (`reader_pass`)")
    args = parser.parse_args(argv)
    if args.reader_only:
        rates = reader_pass(args.rows)
        print({layout: round(rate) for layout, rate in rates.items()}, "rows/s; tar / ipc",
              round(rates["tar"] / rates["ipc"], 2))
        return 0
    latencies: list[float | None] = [None, *(float(x) for x in args.latency.split(",") if x)]
    bench = Bench(args, print)
    results: list[dict[str, Any]] = []
    try:
        folders = make_data(Path(bench.tmp.name) / "data", args.rows)
        upload(bench, folders)
        for contender in args.contenders.split(","):
            for latency in latencies:
                runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
                for _ in range(args.repeats):  # the layouts interleaved: a busy spell of the machine hits all
                    for layout in LAYOUTS:
                        spec: dict[str, Any] = {"kind": "reader" if contender == "reader" else "loader",
                                                "source": bench.source(f"formats/{layout}", latency, folders[layout]),
                                                "measure_seconds": args.measure_seconds, "batch_size": 64}
                        if contender != "reader":
                            mode, feature = contender.split("-")
                            spec.update(train=mode == "train", feature=feature, buffer=args.train_buffer,
                                        min_fill=args.train_min)
                        meta = {"name": f"{contender} {layout} {remote_report._ms(latency)}", "project": "here",
                                "contender": contender, "dataset": "speech", "format": layout, "latency_ms": latency}
                        runs[layout].append(bench.run(meta, spec, bench.child_command(),
                                                      bench.child_env(ROOT)))
                results.extend(median_round(runs[layout], lambda r: remote_report.rate(r) or 0.0) for layout in LAYOUTS)
    finally:
        bench.close()
    lines = table(results, latencies)
    print("\n".join(lines))
    ratios = {f"{r['contender']} {remote_report._ms(r['latency_ms'])}": remote_report._div(
        remote_report.rate(r), remote_report.rate(next(x for x in results if x["contender"] == r["contender"]
                                                       and x["latency_ms"] == r["latency_ms"]
                                                       and x["format"] == "ipc")))
        for r in results if r["format"] == "tar"}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "results": results, "tar_over_ipc": ratios,
                               "median_of": args.repeats, "table": lines}, indent=1, default=str))
    print(f"tar / Arrow IPC samples/s: {json.dumps({k: round(v, 2) if v else v for k, v in ratios.items()})}")
    return 0 if all(v is not None and v >= 0.9 for v in ratios.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
