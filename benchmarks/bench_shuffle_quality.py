"""The shuffle-quality figures of ``loader.stats()["shuffle"]`` for several buffer sizes, from the real nodes.

    .venv/bin/python benchmarks/bench_shuffle_quality.py [--rows 100000] [--split-rows 512] [--batch-size 64]

Writes a shard of ``--rows`` rows whose audio is a placeholder (the figures
depend only on the order of the keys, so nothing is decoded), then runs the
train-mode order: `ArrowShardReader` (a seeded split order per pass) ->
`ShuffleBuffer` (min fill = capacity) -> batches of ``--batch-size``, with the
same `LoaderStats` accounting an `AudioLoader` does, for each buffer size, over
two passes of the data. Prints the figures and their full-shuffle references:
the table in docs/mixing.md ("Shuffle quality").
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from audioloader.nodes import ArrowShardReader, ShuffleBuffer
from audioloader.stats import LoaderStats


def figures(folder: Path, buffer: int, split_rows: int, batch_size: int, rows: int) -> dict:
    stats = LoaderStats()
    reader = ArrowShardReader(folder, label_column=None, seed=0, split_rows=split_rows, infinite=True)
    splits = reader.splits_for_pass(0)
    stats.shuffle.configure([[(s.start, s.num_rows) for s in splits]], [1.0], batch_size)
    node = ShuffleBuffer(reader, buffer, buffer, seed=0, stats=stats)
    items = iter(node)
    for _ in range(2 * rows // batch_size):
        stats.record_batch([item.key for item in itertools.islice(items, batch_size)])
    return stats.snapshot()["shuffle"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--split-rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--buffers", type=int, nargs="+", default=[1, 1000, 10_000, 50_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        table = pa.table({"audio": pa.array([b"-"] * args.rows, pa.binary())})
        with pa.OSFile(f"{scratch}/rows.arrow", "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=args.split_rows):
                writer.write_batch(batch)
        print(f"{args.rows} rows in splits of {args.split_rows}, batches of {args.batch_size}, two passes")
        print(f"{'buffer':>7} {'splits/batch':>13} {'(full shuffle)':>15} {'mean displacement':>18} "
              f"{'(full shuffle)':>15} {'seconds':>8}")
        for buffer in args.buffers:
            start = time.perf_counter()
            f = figures(Path(scratch), buffer, args.split_rows, args.batch_size, args.rows)
            print(f"{buffer:7d} {f['splits_per_batch']:13.1f} {f['full_shuffle_splits_per_batch']:15.1f} "
                  f"{f.get('mean_displacement', 0.0):18.0f} {f['full_shuffle_displacement']:15.0f} "
                  f"{time.perf_counter() - start:8.1f}")


if __name__ == "__main__":
    main()
