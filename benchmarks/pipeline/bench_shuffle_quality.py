"""The shuffle-quality figures of ``loader.stats()["shuffle"]`` for several buffer sizes and interleavings, from the
real nodes; with ``--bucketing``, per byte held, for whole utterances batched by duration.

    .venv/bin/python -m benchmarks.pipeline.bench_shuffle_quality [--rows 100000] [--split-rows 512] [--batch-size 64]
        [--buffers 1 1000 10000 50000] [--interleave 1]
    .venv/bin/python -m benchmarks.pipeline.bench_shuffle_quality --bucketing [--rows 20000] [--unit-rows 100]
        [--max-mb 32 64 128 256] [--interleave 1 2 4 8 16] [--bytes-per-second 24000]

Writes a shard of ``--rows`` rows whose audio is a placeholder (the figures
depend only on the order of the keys, so nothing is decoded), then runs the
train-mode order: `ArrowShardReader` (a seeded split order per pass; with
``interleave=k``, k splits read at once, a row of each in turn) ->
`ShuffleBuffer` (min fill = capacity) -> batches of ``--batch-size``, with the
same `LoaderStats` accounting an `AudioLoader` does, for each buffer size and
interleaving, over two passes of the data. Prints the figures and their
full-shuffle references: the tables in docs/mixing.md ("Shuffle quality") and
docs/lakehouse.md ("Interleaving").

``--bucketing``: every row gets a duration (1-20 s, uniform, seeded) and a size
(``--bytes-per-second`` times its duration: 16 kHz speech, half FLAC half WAV, is
about 24 KB/s), units (record batches, as Parquet row groups) of ``--unit-rows``
rows; the chain is the speech preset's: reader -> `ShuffleBuffer` bounded by
``--max-mb`` (shared with the bucketer, which may hold half) -> `DurationBucketer`
(16 buckets, 200 s a batch, one pass, no utterance twice). Bytes held: the
buffer's and the bucketer's peak (their `HeldBytes`) plus, for Parquet, a unit per
lane of the reader (an interleaving reader holds the unit each lane is reading;
memory-mapped IPC lanes cost nothing). The figures then tell which mix of buffer and
interleave mixes best per byte (docs/concepts.md, "Memory").

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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from audioloader.nodes import ArrowShardReader, DurationBucketer, ShuffleBuffer
from audioloader.nodes.duration_bucketer import estimate_boundaries
from audioloader.samples import BatchEnd
from audioloader.stats import LoaderStats

MiB = 1 << 20


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
    stats, reader, sequential = _start(folder, interleave, split_rows, batch_size)
    node = ShuffleBuffer.of(reader, buffer, buffer, seed=0, stats=stats)
    items = iter(node)
    batches = ([item.key for item in itertools.islice(items, batch_size)] for _ in range(2 * rows // batch_size))
    return _tally(stats, batches, sequential)


def bucketed_figures(folder: Path, max_bytes: int, interleave: int, split_rows: int, seconds: np.ndarray,
                     bytes_per_second: float, unit_rows: int) -> dict:
    """The speech preset's order: buffer bounded by ``max_bytes`` (rows of ``bytes_per_second`` x duration), then
    16 duration buckets of 200 s, one pass at a time; two passes of batches."""
    stats, reader, sequential = _start(folder, interleave, split_rows, round(200.0 / float(seconds.mean())))
    sizes = (seconds * bytes_per_second).astype(np.int64)

    def size_of(item) -> int:
        return int(sizes[item.key.index])

    node = ShuffleBuffer.of(reader, 10**9, 10**9, seed=0, stats=stats, max_bytes=max_bytes, min_bytes=max_bytes,
                         size_fn=size_of, one_pass=True)
    bucketer = DurationBucketer.of(node, max_duration=200.0, boundaries=estimate_boundaries(seconds, 16),
                                duration_fn=lambda item: float(seconds[item.key.index]), size_fn=size_of,
                                max_bytes=max_bytes // 2, distinct=True, stats=stats)
    out = _tally(stats, _bucketed(iter(bucketer), 2 * len(seconds)), sequential)
    memory = stats.memory.report()
    lanes = interleave * unit_rows * float(sizes.mean()) if interleave > 1 else float(unit_rows * sizes.mean())
    out.update(held_mb=memory["peak_bytes"] / MiB, lanes_mb=lanes / MiB, buffer_rows=memory["shuffle_buffer"]["rows"],
               early=memory["bucketer"]["early_batches"])
    return out


def _start(folder: Path, interleave: int, split_rows: int, batch_size: int):
    stats = LoaderStats()
    reader = ArrowShardReader.of(folder, label_column=None, seed=0, split_rows=split_rows, infinite=True,
                              interleave=interleave)
    splits = reader.splits_for_pass(0)
    stats.shuffle.configure([[(s.start, s.num_rows) for s in splits]], [1.0], batch_size)
    return stats, reader, sequential_positions(reader, 4)


def _bucketed(items: Iterator, rows: int) -> Iterator[list]:
    """The keys of each bucketed batch, until ``rows`` rows were batched."""
    batch: list = []
    for item in items:
        if isinstance(item, BatchEnd):
            yield batch
            rows -= len(batch)
            batch = []
            if rows <= 0:
                return
        else:
            batch.append(item.key)


def _tally(stats: LoaderStats, batches: Iterator[list], sequential: dict[int, np.ndarray]) -> dict:
    moved = emitted = 0
    for keys in batches:
        stats.record_batch(keys)
        for key in keys:
            moved += abs(emitted - int(sequential[key.pass_index][key.index]))
            emitted += 1
    return {**stats.snapshot()["shuffle"], "from_file_order": moved / emitted}


def write_rows(folder: str, rows: int, unit_rows: int, seconds: np.ndarray | None = None) -> None:
    columns = {"audio": pa.array([b"-"] * rows, pa.binary())}
    if seconds is not None:
        columns["duration"] = pa.array(seconds)
    table = pa.table(columns)
    with pa.OSFile(f"{folder}/rows.arrow", "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=unit_rows):
            writer.write_batch(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="rows (100000; 20000 with --bucketing)")
    parser.add_argument("--split-rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--buffers", type=int, nargs="+", default=[1, 1000, 10_000, 50_000])
    parser.add_argument("--interleave", type=int, nargs="+", default=[1])
    parser.add_argument("--bucketing", action="store_true", help="whole utterances, per byte held (see above)")
    parser.add_argument("--max-mb", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--bytes-per-second", type=float, default=24000.0)
    parser.add_argument("--unit-rows", type=int, default=None, help="rows per unit (512; 100 with --bucketing)")
    args = parser.parse_args()
    rows = args.rows or (20_000 if args.bucketing else 100_000)
    unit_rows = args.unit_rows or (100 if args.bucketing else args.split_rows)
    with tempfile.TemporaryDirectory() as scratch:
        if args.bucketing:
            seconds = np.random.default_rng(0).uniform(1.0, 20.0, rows)
            write_rows(scratch, rows, unit_rows, seconds)
            print(f"{rows} utterances of 1-20 s ({seconds.sum() / 3600:.0f} h, {args.bytes_per_second / 1000:g} KB/s), "
                  f"units of {unit_rows} rows, splits of {args.split_rows}, 16 buckets of 200 s, two passes")
            print(f"{'interleave':>10} {'max MB':>7} {'buffer rows':>11} {'held MB':>8} {'lanes MB':>8} "
                  f"{'splits/batch':>13} {'(full shuffle)':>15} {'from file order':>16} {'(full shuffle)':>15} "
                  f"{'early':>6} {'seconds':>8}")
            for interleave in args.interleave:
                for mb in args.max_mb:
                    start = time.perf_counter()
                    f = bucketed_figures(Path(scratch), mb * MiB, interleave, args.split_rows, seconds,
                                         args.bytes_per_second, unit_rows)
                    print(f"{interleave:10d} {mb:7d} {f['buffer_rows']:11d} {f['held_mb']:8.0f} {f['lanes_mb']:8.0f} "
                          f"{f['splits_per_batch']:13.1f} {f['full_shuffle_splits_per_batch']:15.1f} "
                          f"{f['from_file_order']:16.0f} {f['full_shuffle_displacement']:15.0f} {f['early']:6d} "
                          f"{time.perf_counter() - start:8.1f}")
            return
        write_rows(scratch, rows, args.split_rows)
        print(f"{rows} rows in splits of {args.split_rows}, batches of {args.batch_size}, two passes")
        print(f"{'interleave':>10} {'buffer':>7} {'splits/batch':>13} {'(full shuffle)':>15} "
              f"{'mean displacement':>18} {'from file order':>16} {'(full shuffle)':>15} {'seconds':>8}")
        for interleave in args.interleave:
            for buffer in args.buffers:
                start = time.perf_counter()
                f = figures(Path(scratch), buffer, interleave, args.split_rows, args.batch_size, rows)
                print(f"{interleave:10d} {buffer:7d} {f['splits_per_batch']:13.1f} "
                      f"{f['full_shuffle_splits_per_batch']:15.1f} {f.get('mean_displacement', 0.0):18.0f} "
                      f"{f['from_file_order']:16.0f} {f['full_shuffle_displacement']:15.0f} "
                      f"{time.perf_counter() - start:8.1f}")


if __name__ == "__main__":
    main()
