"""The local cache of remote shards (``Storage(cache_dir=...)``): passes over S3 with and without it, vs local disk.

    .venv/bin/python -m benchmarks.remote.bench_cache [--latency 0.05] [--bandwidth 50e6] [--files 8]
        [--rows-per-file 64] [--passes 2] [--world-size 4]

Writes ``--files`` Arrow IPC shards of 2 s PCM16 clips at 16 kHz (record batches of 16 rows), uploads them to
moto's S3 server on 127.0.0.1 behind the shaping proxy of tests/s3_server.py, run in a process of its own
(``--latency`` s before each request, ``--bandwidth`` bytes/s per connection), and runs each contender in a
fresh process, its process tree's peak PSS sampled from here (audioloader.tools.bench.runner.TreeSampler):

* ``local``: the shards on local disk (the baseline of the ratios);
* ``s3``: the shards on S3, no cache (every pass reads them over the network);
* ``s3+cache``: the same with ``Storage(cache_dir=<new folder>)``: pass 1 downloads each file whole,
  later passes read the copies (memory-mapped);
* ``rank0-of-W`` and ``rank0-of-W+cache``: rank 0 of ``--world-size`` alone, one pass without and with a
  new cache: what whole-file caching costs a rank whose machine runs no other rank (it downloads every
  file it touches, whole): bytes downloaded against the bytes of the splits it reads, and its rate
  against reading just its splits remotely.

An I/O-bound loader (0.5 s waveform windows, ``WaveformConfig``; eval passes, 2 decode threads, splits of
one record batch): per pass,
samples/s after the first batch and seconds to the first batch; per contender, requests and bytes through
the proxy and peak PSS. Printed as a table, and as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit_result, module_command, run_child


def write_shards(folder: Path, files: int, rows: int) -> None:
    from tests.helpers import audio_table, write_ipc_file

    folder.mkdir(parents=True)
    for i in range(files):
        write_ipc_file(folder / f"part-{i:05d}.arrow", audio_table(i * rows, rows, seconds=2.0), batch_rows=16)


def child(spec: dict) -> dict:
    """One contender, in this fresh process: ``passes`` eval passes; per pass samples/s and first batch."""
    import audioloader as al

    # Splits of one record batch: a rank of W reads about 1/W of each file.
    storage = al.Storage(rank=spec.get("rank", 0), world_size=spec.get("world_size", 1), split_rows=16,
                         cache_dir=spec.get("cache"))
    started = time.perf_counter()
    loader = al.AudioLoader(spec["source"], batch_size=32, train=False, features=al.WaveformConfig(16000),
                            length=al.LengthPolicy(clip_seconds=0.5), workers=al.Workers(num_workers=2, kind="thread"),
                            storage=storage)
    built = time.perf_counter() - started
    passes = []
    with loader:
        for _ in range(spec["passes"]):
            start = time.perf_counter()
            it = iter(loader)
            first = next(it)
            first_at = time.perf_counter()
            samples = int(first["valid"].sum()) if "valid" in first else len(first["index"])
            rest = 0
            for batch in it:
                rest += int(batch["valid"].sum())
            end = time.perf_counter()
            passes.append({"first_batch_s": first_at - start, "samples": samples + rest,
                           "samples_per_s": rest / (end - first_at) if end > first_at else None})
        counters = {k: v for k, v in loader.stats()["counters"].items() if k.startswith("cache")}
        needed = sum(loader.reader.dataset.files[s.file_id].size * s.num_rows
                     // loader.reader.dataset.files[s.file_id].num_rows for s in loader.reader.splits_for_pass(0))
    return {"construct_s": built, "passes": passes, "cache": counters, "bytes_of_own_splits": needed}


def run(spec: dict, server) -> dict:
    server.proxy.reset_counters()
    result = run_child(module_command(__spec__, "--child", json.dumps(spec)), timeout=1800)
    if not result["ok"]:
        raise RuntimeError(f"{spec['name']} failed: {result['error']}")
    traffic = server.proxy.stats()
    result.update(name=spec["name"], requests=traffic["requests"], mb_through_proxy=traffic["bytes"] / 1e6)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--bandwidth", type=float, default=50e6)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows-per-file", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        emit_result(child(json.loads(args.child)))
        return
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    from tests.s3_server import S3Server

    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        local = Path(tmp) / "shards"
        write_shards(local, args.files, args.rows_per_file)
        server = S3Server(latency=args.latency, bandwidth=args.bandwidth, proxy_process=True, ranges_in_place=True)
        try:
            server.upload(local, "bench/shards")
            url = server.url("bench/shards")
            specs = [{"name": "local", "source": str(local)}, {"name": "s3", "source": url},
                     {"name": "s3+cache", "source": url, "cache": str(Path(tmp) / "cache")},
                     {"name": f"rank0-of-{args.world_size}", "source": url, "world_size": args.world_size,
                      "passes": 1},
                     {"name": f"rank0-of-{args.world_size}+cache", "source": url,
                      "cache": str(Path(tmp) / "cache-r0"), "world_size": args.world_size, "passes": 1}]
            results = [run({"passes": args.passes, **spec}, server) for spec in specs]
        finally:
            server.close()
    report(results, args)


def report(results: list[dict], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(results, indent=1))
    local = results[0]["passes"]
    print(f"latency {args.latency * 1000:.0f} ms/request, {args.bandwidth / 1e6:.0f} MB/s per connection, "
          f"{args.files} files x {args.rows_per_file} rows; load average {os.getloadavg()[0]:.2f}")
    print(f"{'contender':<14} {'pass':>4} {'samples/s':>10} {'x local':>8} {'1st batch s':>11} {'construct s':>11} "
          f"{'requests':>8} {'MB via S3':>9} {'PSS MB':>7}")
    for r in results:
        for i, p in enumerate(r["passes"]):
            ratio = p["samples_per_s"] / local[i]["samples_per_s"] if p["samples_per_s"] and i < len(local) else 0
            print(f"{r['name']:<14} {i + 1:>4} {p['samples_per_s'] or 0:>10.0f} {ratio:>8.2f} "
                  f"{p['first_batch_s']:>11.2f} {r['construct_s'] if i == 0 else 0:>11.2f} "
                  f"{r['requests'] if i == 0 else '':>8} {r['mb_through_proxy'] if i == 0 else 0:>9.1f} "
                  f"{r['peak_pss_mb'] if i == 0 else 0:>7.0f}")
    last = results[-1]
    print(f"{last['name']}: downloaded {last['cache'].get('cache_bytes_downloaded', 0) / 1e6:.1f} MB whole files for "
          f"{last['bytes_of_own_splits'] / 1e6:.1f} MB of its own splits")


if __name__ == "__main__":
    main()
