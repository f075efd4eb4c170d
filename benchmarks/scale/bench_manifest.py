"""The dataset manifest at scale: bytes a file, and what a rank holds to start from it (issue 26, item 1).

For each size (default 1,000 / 100,000 / 1,000,000 files) a synthetic manifest is
written with the real writer (`audioloader.shards.catalog.manifest.manifest_columns`) into a
temporary folder: Parquet files of one row group of 100 rows (``--units`` for more),
S3 MD5 ETags, one schema; names ``part-NNNNNNN.parquet`` (a pattern: no name stored) and,
with ``--free-names``, names that follow no pattern (each stored). Then a `ShardDataset` is
built from it (local: the files do not exist, and construction opens none, which is the
point) and measured: seconds to construct, the growth of the process's resident memory, the
dataset's own estimate (`ShardDataset.metadata_memory`, what ``stats()`` reports) and splits;
then what rank 1 of ``--ranks`` adds to start reading: its `ArrowShardReader` in training (a seeded order of
the splits) and in evaluation (the splits balanced over the ranks), seconds and growth; the file part of every
checkpoint's fingerprint (`checkpoint.files_of`, `_identity_of`): seconds and pickled bytes; and a whole
`AudioLoader` with its defaults (no worker started): seconds, growth and its ``state_dict()`` pickled. Runs on
0.3's API too, so one copy of this file measures two checkouts (``PYTHONPATH=<checkout>``).

    python -m benchmarks.scale.bench_manifest [--files 1000,100000,1000000] [--free-names] [--units 1]
                                         [--ranks 1024] [--no-loader]

Prints one JSON line a case.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import audioloader as al
from audioloader import checkpoint
from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.shards import ShardDataset
from audioloader.shards.catalog.manifest import MANIFEST_NAME, manifest_columns, write_manifest

SCHEMA = pa.schema([("audio", pa.binary()), ("label", pa.int64()), ("duration", pa.float32())])


def names_for(count: int, free: bool) -> list[str]:
    if not free:
        return [f"part-{i:07d}.parquet" for i in range(count)]
    # What a crawl or a hashed layout gives: 2-level folders and 12 hex digits a file, sorted.
    return sorted(f"{i % 97:02x}/{(i * 2654435761) % 16**12:012x}.parquet" for i in range(count))


def write(folder: Path, count: int, free: bool, units: int) -> int:
    table = manifest_columns(
        names_for(count, free), sizes=[50_000_000] * count, formats=["parquet"] * count,
        schemas=[SCHEMA.serialize().to_pybytes()], schema_ids=[0] * count, unit_rows=[(100,) * units] * count,
        digests=[f"{(i * 0x9E3779B97F4A7C15) % 2**64:016x}" for i in range(count)],
        etags=[f'ETag:"{(i * 0x9E3779B97F4A7C15) % 2**128:032x}"' for i in range(count)])
    return write_manifest(table, str(folder / MANIFEST_NAME))


def _rss() -> int:
    """This process's resident bytes now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reader_cost(dataset: ShardDataset, ranks: int, shuffle: bool) -> dict:
    """Seconds, CPU-seconds and resident growth of rank 1's `ArrowShardReader` (its read plan made) and its splits
    of pass 0: training (a seeded order) or evaluation (the splits balanced over the ranks)."""
    gc.collect()
    before, started, cpu_started = _rss(), time.perf_counter(), time.process_time()
    reader = ArrowShardReader.of(dataset, rank=min(1, ranks - 1), world_size=ranks, shuffle=shuffle)
    mine = reader.splits_for_pass(0)
    mode = "train" if shuffle else "eval"
    return {f"reader_{mode}_s": round(time.perf_counter() - started, 2),
            f"reader_{mode}_cpu_s": round(time.process_time() - cpu_started, 2),
            f"reader_{mode}_rss_growth_bytes": _rss() - before, f"reader_{mode}_splits_of_rank": len(mine)}


def loader_cost(folder: Path, ranks: int) -> dict:
    """Seconds and resident growth of rank 1's `AudioLoader` (defaults, no workers started), and its
    ``state_dict()`` pickled: what every checkpoint of every rank holds."""
    gc.collect()
    before, started = _rss(), time.perf_counter()
    loader = al.AudioLoader(folder, storage=al.Storage(rank=min(1, ranks - 1), world_size=ranks))
    seconds, growth = time.perf_counter() - started, _rss() - before
    started = time.perf_counter()
    state = pickle.dumps(loader.state_dict())
    return {"loader_s": round(seconds, 2), "loader_rss_growth_bytes": growth,
            "state_dict_s": round(time.perf_counter() - started, 2), "state_dict_bytes": len(state)}


def fingerprint_cost(dataset: ShardDataset) -> dict:
    """Seconds to make the files' part of a checkpoint's fingerprint, and its size pickled (in every state)."""
    started = time.perf_counter()
    files = {"files": checkpoint.files_of(dataset), "file_identity": checkpoint._identity_of(dataset)}
    return {"fingerprint_files_s": round(time.perf_counter() - started, 2),
            "fingerprint_files_bytes": len(pickle.dumps(files))}


def measure(count: int, free: bool, units: int, ranks: int = 1024, loaders: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        nbytes = write(folder, count, free, units)
        write_s = time.perf_counter() - started
        gc.collect()
        before = _rss()
        started, cpu_started = time.perf_counter(), time.process_time()
        dataset = ShardDataset(folder, split_rows=512)
        construct_s, construct_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        allocated = _rss() - before
        memory = dataset.metadata_memory()
        costs = {**reader_cost(dataset, ranks, True), **reader_cost(dataset, ranks, False),
                 **fingerprint_cost(dataset), **(loader_cost(folder, ranks) if loaders else {})}
        return {"files": count, "free_names": free, "units_per_file": units, "manifest_bytes": nbytes,
                "bytes_per_file": round(nbytes / count, 1), "write_s": round(write_s, 2),
                "construct_s": round(construct_s, 2), "construct_cpu_s": round(construct_cpu_s, 2),
                "rss_growth_bytes": allocated,
                "rss_growth_per_file": round(allocated / count, 1), "splits": len(dataset.splits), **memory,
                "ranks": ranks, **costs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="1000,100000,1000000", help="comma-separated file counts")
    parser.add_argument("--free-names", action="store_true", help="also names that follow no pattern")
    parser.add_argument("--units", type=int, default=1, help="row groups a file (100 rows each)")
    parser.add_argument("--ranks", type=int, default=1024, help="world size of the readers and loaders measured")
    parser.add_argument("--no-loader", action="store_true", help="leave out the AudioLoader (seconds at 1M files)")
    args = parser.parse_args(argv)
    for count in [int(x) for x in args.files.split(",")]:
        for free in (False, True) if args.free_names else (False,):
            print(json.dumps(measure(count, free, args.units, args.ranks, not args.no_loader)), flush=True)


if __name__ == "__main__":
    main()
