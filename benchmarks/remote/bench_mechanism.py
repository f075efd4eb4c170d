"""Which mechanism hides S3 latency: pyarrow's own pre-buffering and scanner read-ahead, or audioloader's read-ahead.

Issue 19 asked to measure before choosing. Every contender reads the same pass over
the speech rows (benchmarks/remote/remote_data.py: 2,000 rows of ~25 KB in 4 files, record
batches / row groups of 100 rows) from moto's S3 server behind the shaping proxy
(tests/s3_server.py) at ``--latency`` ms a request, each in this one process, one
after another, in one run:

- ``pyarrow-sequential``: open each file, read its record batches / row groups in order
  (what a hand-written reader does; IPC: a ranged read per batch message, Parquet:
  per column chunk);
- ``pyarrow-pre_buffer`` (Parquet): ``pq.ParquetFile(pre_buffer=True)``: pyarrow
  coalesces a read's column chunks and fetches them concurrently, within one
  ``read_row_group`` call, nothing beyond it;
- ``pyarrow-scanner``: ``pyarrow.dataset`` with ``batch_readahead=16``,
  ``fragment_readahead=4`` (and ``pre_buffer`` for Parquet): pyarrow's own
  asynchronous read-ahead, in file order;
- ``audioloader-reader``: ``ArrowShardReader`` (eval pass, the default
  ``Storage(readahead_bytes=64 MiB, max_requests=16)``): the same rows in its order;
- ``audioloader-shuffled``: ``ArrowShardReader`` in training order (seeded shuffle of
  splits, 4 interleaved): an order pyarrow's scanner cannot follow, since it reads
  fragments in their listed order (one scanner per split would read them one at a time).

Each contender's time includes opening its files (audioloader: constructing the
reader: listing, tails). Prints the median rows/s of ``--repeats`` runs, requests
and the most requests in flight at once, per contender, and writes JSON to ``--output``::

    .venv/bin/python -m benchmarks.remote.bench_mechanism --latency 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from benchmarks.common import median_of
from benchmarks.remote.remote_data import speech_dataset
from tests.s3_server import S3_ENVIRONMENT, S3Server


def _sequential(fs: Any, paths: list[str], fmt: str) -> int:
    rows = 0
    for path in paths:
        with fs.open_input_file(path) as handle:
            if fmt == "ipc":
                reader = ipc.open_file(handle)
                for i in range(reader.num_record_batches):
                    rows += reader.get_batch(i).num_rows
            else:
                parquet = pq.ParquetFile(handle)
                for i in range(parquet.num_row_groups):
                    rows += parquet.read_row_group(i).num_rows
    return rows


def _pre_buffer(fs: Any, paths: list[str], fmt: str) -> int:
    rows = 0
    for path in paths:
        with fs.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle, pre_buffer=True)
            for i in range(parquet.num_row_groups):
                rows += parquet.read_row_group(i).num_rows
    return rows


def _scanner(fs: Any, paths: list[str], fmt: str) -> int:
    if fmt == "ipc":
        dataset = ds.dataset(paths, filesystem=fs, format="arrow")
        options = None
    else:
        dataset = ds.dataset(paths, filesystem=fs, format="parquet")
        options = ds.ParquetFragmentScanOptions(pre_buffer=True)
    batches = dataset.to_batches(fragment_scan_options=options, batch_readahead=16, fragment_readahead=4)
    return sum(batch.num_rows for batch in batches)


def _audioloader(url: str, train: bool) -> int:
    from audioloader.nodes import ArrowShardReader

    reader = ArrowShardReader.of(url, label_column=None, shuffle=train, seed=0, interleave=4 if train else 1)
    reader.reset()
    return sum(1 for _ in reader)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=50.0, help="ms the proxy waits per request")
    parser.add_argument("--bandwidth", type=float, default=50.0, help="MB/s per connection (0: no cap)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each contender (the median is printed)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "audioloader-bench")
    parser.add_argument("--output", type=Path, default=Path("bench-out/mechanism.json"))
    args = parser.parse_args(argv)
    os.environ.update(S3_ENVIRONMENT)
    local = speech_dataset(args.cache_dir, 2000, print)
    server = S3Server(proxy_process=True, ranges_in_place=True)
    results = []
    try:
        server.proxy.configure(latency=args.latency / 1000, bandwidth=args.bandwidth * 1e6 or None)
        for fmt in ("ipc", "parquet"):
            keys = server.upload(local / fmt, f"bench/{fmt}")
            fs = server.filesystem(direct=False)
            url = server.url(f"bench/{fmt}/")
            contenders: list[tuple[str, Any]] = [("pyarrow-sequential", partial(_sequential, fs, keys, fmt))]
            if fmt == "parquet":
                contenders.append(("pyarrow-pre_buffer", partial(_pre_buffer, fs, keys, fmt)))
            contenders += [("pyarrow-scanner", partial(_scanner, fs, keys, fmt)),
                           ("audioloader-reader", partial(_audioloader, url, False)),
                           ("audioloader-shuffled", partial(_audioloader, url, True))]
            for name, run in contenders:
                for repeat in range(args.repeats):
                    server.proxy.reset_counters()
                    start = time.perf_counter()
                    rows = run()
                    seconds = time.perf_counter() - start
                    counts = server.proxy.stats()
                    results.append({"format": fmt, "contender": name, "repeat": repeat, "rows": rows,
                                    "seconds": seconds, "rows_per_s": rows / seconds,
                                    "requests": counts.get("requests"), "bytes": counts.get("bytes"),
                                    "max_in_flight": counts.get("max_in_flight")})
                runs = [r for r in results if r["format"] == fmt and r["contender"] == name]
                rate = median_of(runs, "rows_per_s")
                print(f"{fmt:8} {name:22} {rows:6d} rows {rate:9.0f} rows/s (median of {len(runs)}) "
                      f"{runs[-1]['requests']:5d} requests, {runs[-1]['max_in_flight']:3d} at once", flush=True)
    finally:
        server.close()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"latency_ms": args.latency, "bandwidth_mb_s": args.bandwidth,
                                       "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                                                   "load": os.getloadavg()},
                                       "results": results}, indent=1))


if __name__ == "__main__":
    main()
