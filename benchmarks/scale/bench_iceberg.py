"""Cost of resolving an Iceberg table to its data files, against the same files read as a folder.

    .venv/bin/python -m benchmarks.scale.bench_iceberg [--files 1000] [--rows 8] [--repeats 3]

Writes a table (embedded SQLite catalog, local warehouse) partitioned by
identity on ``part``, with ``--files`` partitions of ``--rows`` rows: one
append, so one data file per partition. Then builds `ShardDataset`, interleaved
``--repeats`` rounds, over:

- the table (catalog load + the snapshot's file list + a footer scan of each file),
- the same Parquet files as a folder (the footer scan alone),
- the table with ``filter=part < files / 10`` (each file's partition value and column
  bounds become a guarantee; pyarrow prunes 90 % of the files, which are never opened),

and the resolution alone (`resolve_iceberg`: catalog, snapshot, file list; with and
without the guarantees). Prints medians, the table's overhead per file and the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import load_catalog

from audioloader.shards import IcebergTable, ShardDataset
from audioloader.shards.sources.resolve import resolve_iceberg
from benchmarks.common import interleaved_medians


def write_table(folder: Path, files: int, rows: int) -> dict:
    catalog = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}"}
    iceberg = load_catalog("default", **catalog)
    iceberg.create_namespace("audio")
    n = files * rows
    data = pa.table({"audio": pa.array([bytes(64)] * n, pa.binary()), "label": pa.array(np.arange(n) % 7),
                     "part": pa.array(np.arange(n) // rows)})
    table = iceberg.create_table("audio.clips", schema=data.schema)
    with table.update_spec() as spec:
        spec.add_identity("part")
    table.append(data)
    return catalog


def build_seconds(source, expected_files: int, **kwargs) -> float:
    start = time.perf_counter()
    dataset = ShardDataset(source, **kwargs)
    seconds = time.perf_counter() - start
    assert len(dataset.files) == expected_files
    return seconds


def resolve_seconds(table: IcebergTable, guarantees: bool) -> float:
    start = time.perf_counter()
    resolve_iceberg(table, guarantees=guarantees)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        start = time.perf_counter()
        catalog = write_table(folder, args.files, args.rows)
        print(f"wrote {args.files} data files of {args.rows} rows in {time.perf_counter() - start:.1f} s")
        table = IcebergTable("audio.clips", catalog=catalog)
        variants = {
            "table": lambda: build_seconds(table, args.files),
            "folder": lambda: build_seconds(folder / "audio" / "clips" / "data", args.files),
            "table, filter": lambda: build_seconds(table, args.files, filter=pc.field("part") < args.files // 10),
            "resolve": lambda: resolve_seconds(table, guarantees=False),
            "+ guarantees": lambda: resolve_seconds(table, guarantees=True),
        }
        median = interleaved_medians(variants, args.repeats)
    for name, value in median.items():
        print(f"{name:>14}: {value:.3f} s  ({1e3 * value / args.files:.2f} ms/file)")
    print(f"table - folder: {1e3 * (median['table'] - median['folder']) / args.files:.2f} ms/file; "
          f"table / folder {median['table'] / median['folder']:.2f}; "
          f"filtered / unfiltered table {median['table, filter'] / median['table']:.2f}")


if __name__ == "__main__":
    main()
