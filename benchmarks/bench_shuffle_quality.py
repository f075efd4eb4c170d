"""The shuffle-quality figures of ``loader.stats()["shuffle"]`` for several buffer sizes and interleavings, from the
real nodes.

    .venv/bin/python benchmarks/bench_shuffle_quality.py [--rows 100000] [--split-rows 512] [--batch-size 64]
        [--buffers 1 1000 10000 50000] [--interleave 1]

Writes a shard of ``--rows`` rows whose audio is a placeholder (the figures
depend only on the order of the keys, so nothing is decoded), then runs the
train-mode order: `ArrowShardReader` (a seeded split order per pass; with
``interleave=k``, k splits read at once, a row of each in turn) ->
`ShuffleBuffer` (min fill = capacity) -> batches of ``--batch-size``, with the
same `LoaderStats` accounting an `AudioLoader` does, for each buffer size and
interleaving, over two passes of the data. Prints the figures and their
full-shuffle references: the tables in docs/mixing.md ("Shuffle quality") and
docs/lakehouse.md ("Interleaving").

``mean displacement`` is the metric's own: how far the buffer moves a row (from
its arrival to its emission), so interleaving, which happens before the buffer,
does not change it. ``from file order`` is the benchmark's: how far a row lands
from where it would be read without interleaving and without a buffer (its
split's place in the pass's split order plus its row), which shows both.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from audioloader.nodes import ArrowShardReader, ShuffleBuffer
from audioloader.stats import LoaderStats


def sequential_positions(reader: ArrowShardReader, passes: int) -> dict[int, np.ndarray]:
    """Per pass: each global index's position in the whole run read without interleaving or a buffer."""
    positions, offset = {}, 0
    for pass_index in range(passes):
        where = np.zeros(reader.dataset.num_rows, dtype=np.int64)
        for split in reader.splits_for_pass(pass_index):
            first = reader.dataset.files[split.file_id].index_offset + split.start
            where[first:first + split.num_rows] = np.arange(offset, offset + split.num_rows)
            offset += split.num_rows
        positions[pass_index] = where
    return positions


def figures(folder: Path, buffer: int, interleave: int, split_rows: int, batch_size: int, rows: int) -> dict:
    stats = LoaderStats()
    reader = ArrowShardReader(folder, label_column=None, seed=0, split_rows=split_rows, infinite=True,
                              interleave=interleave)
    splits = reader.splits_for_pass(0)
    stats.shuffle.configure([[(s.start, s.num_rows) for s in splits]], [1.0], batch_size)
    sequential = sequential_positions(reader, 3)
    node = ShuffleBuffer(reader, buffer, buffer, seed=0, stats=stats)
    items = iter(node)
    moved, emitted = 0, 0
    for _ in range(2 * rows // batch_size):
        keys = [item.key for item in itertools.islice(items, batch_size)]
        stats.record_batch(keys)
        for key in keys:
            moved += abs(emitted - int(sequential[key.pass_index][key.index]))
            emitted += 1
    return {**stats.snapshot()["shuffle"], "from_file_order": moved / emitted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--split-rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--buffers", type=int, nargs="+", default=[1, 1000, 10_000, 50_000])
    parser.add_argument("--interleave", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        table = pa.table({"audio": pa.array([b"-"] * args.rows, pa.binary())})
        with pa.OSFile(f"{scratch}/rows.arrow", "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=args.split_rows):
                writer.write_batch(batch)
        print(f"{args.rows} rows in splits of {args.split_rows}, batches of {args.batch_size}, two passes")
        print(f"{'interleave':>10} {'buffer':>7} {'splits/batch':>13} {'(full shuffle)':>15} "
              f"{'mean displacement':>18} {'from file order':>16} {'(full shuffle)':>15} {'seconds':>8}")
        for interleave in args.interleave:
            for buffer in args.buffers:
                start = time.perf_counter()
                f = figures(Path(scratch), buffer, interleave, args.split_rows, args.batch_size, args.rows)
                print(f"{interleave:10d} {buffer:7d} {f['splits_per_batch']:13.1f} "
                      f"{f['full_shuffle_splits_per_batch']:15.1f} {f.get('mean_displacement', 0.0):18.0f} "
                      f"{f['from_file_order']:16.0f} {f['full_shuffle_displacement']:15.0f} "
                      f"{time.perf_counter() - start:8.1f}")


if __name__ == "__main__":
    main()
