"""Benchmark the shard layer: ShardDataset construction over many files, and ArrowShardReader throughput.

Writes synthetic shards (random bytes stand in for encoded audio: the reader
never decodes) into a temporary folder, then measures, per format:

- construction: ``ShardDataset(folder)`` over ``--files`` small files (median of ``--repeat``);
- pass: rows/s and MB/s of one full pass through ``ArrowShardReader`` (train and eval order);
- state: cost of one ``state_dict()`` call (it runs after every item behind a ParallelMapper);
- fetch: rows/s of random access (``fetch`` of shuffled keys, in chunks of 256).

Example::

    python -m benchmarks.pipeline.bench_reader --files 1000 --rows-per-file 64 --clip-kb 16
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.samples import Key
from audioloader.shards import ShardDataset
from benchmarks.common import median_seconds

FORMATS = ("ipc_file", "ipc_stream", "parquet")


def synthetic_table(start: int, rows: int, clip_bytes: int, rng: np.random.Generator) -> pa.Table:
    """``rows`` rows: audio (random bytes, about ``clip_bytes`` each), label (int64), uid (int64)."""
    sizes = rng.integers(clip_bytes // 2, clip_bytes * 3 // 2 + 1, rows)
    blob = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    audio = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(blob)])
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({"audio": audio, "label": pa.array(ids % 10), "uid": pa.array(ids)})


def write_shards(folder: Path, fmt: str, files: int, rows_per_file: int, batch_rows: int, clip_bytes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        table = synthetic_table(i * rows_per_file, rows_per_file, clip_bytes, rng)
        path = folder / f"part-{i:05d}.{'parquet' if fmt == 'parquet' else 'arrow'}"
        if fmt == "parquet":
            pq.write_table(table, str(path), row_group_size=batch_rows)
            continue
        with pa.OSFile(str(path), "wb") as sink:
            new = pa.ipc.new_file if fmt == "ipc_file" else pa.ipc.new_stream
            with new(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=batch_rows):
                    writer.write_batch(batch)


def full_pass(ds: ShardDataset, shuffle: bool) -> tuple[float, int, int]:
    """Seconds, rows and audio bytes of one pass (touching each sample's fields as a consumer would)."""
    reader = ArrowShardReader.of(ds, shuffle=shuffle, seed=0)
    rows = nbytes = 0
    start = time.perf_counter()
    for sample in reader:
        rows += 1
        nbytes += sample.audio.size
    return time.perf_counter() - start, rows, nbytes


def state_cost_us(ds: ShardDataset, calls: int = 100_000) -> float:
    reader = ArrowShardReader.of(ds)
    next(reader)
    start = time.perf_counter()
    for _ in range(calls):
        reader.state_dict()
    return (time.perf_counter() - start) / calls * 1e6


def fetch_rate(ds: ShardDataset, rows: int) -> float:
    reader = ArrowShardReader.of(ds)
    indices = np.random.default_rng(1).permutation(ds.num_rows)[:rows].tolist()
    start = time.perf_counter()
    for i in range(0, len(indices), 256):
        reader.fetch([Key(k, 0) for k in indices[i:i + 256]])
    return len(indices) / (time.perf_counter() - start)


def bench_format(root: Path, fmt: str, args: argparse.Namespace) -> dict[str, float]:
    folder = root / fmt
    write_shards(folder, fmt, args.files, args.rows_per_file, args.batch_rows, args.clip_kb * 1024)
    construct = median_seconds(lambda: ShardDataset(folder, columns=["uid"], split_rows=args.split_rows),
                               args.repeat)
    ds = ShardDataset(folder, columns=["uid"], split_rows=args.split_rows)
    full_pass(ds, True)  # warm the page cache
    train_s, rows, nbytes = full_pass(ds, True)
    eval_s, _, _ = full_pass(ds, False)
    return {
        "files": len(ds.files), "rows": rows, "construct_s": construct,
        "train_rows_s": rows / train_s, "eval_rows_s": rows / eval_s,
        "train_mb_s": nbytes / train_s / 1e6, "us_per_row": train_s / rows * 1e6,
        "state_us": state_cost_us(ds), "fetch_rows_s": fetch_rate(ds, min(args.fetch_rows, ds.num_rows)),
    }


def print_table(results: dict[str, dict[str, float]]) -> None:
    columns = [("files", "files", "{:.0f}"), ("rows", "rows", "{:.0f}"), ("construct_s", "build s", "{:.3f}"),
               ("train_rows_s", "train rows/s", "{:,.0f}"), ("eval_rows_s", "eval rows/s", "{:,.0f}"),
               ("train_mb_s", "MB/s", "{:,.0f}"), ("us_per_row", "µs/row", "{:.2f}"),
               ("state_us", "state µs", "{:.2f}"), ("fetch_rows_s", "fetch rows/s", "{:,.0f}")]
    header = ["format"] + [title for _, title, _ in columns]
    rows = [[fmt] + [spec.format(r[key]) for key, _, spec in columns] for fmt, r in results.items()]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="shard files per format (default 1000)")
    parser.add_argument("--rows-per-file", type=int, default=64, help="rows per file (default 64)")
    parser.add_argument("--batch-rows", type=int, default=16, help="rows per record batch / row group (default 16)")
    parser.add_argument("--clip-kb", type=int, default=16, help="mean encoded clip size in KiB (default 16)")
    parser.add_argument("--split-rows", type=int, default=512, help="ShardDataset split_rows (default 512)")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--repeat", type=int, default=3, help="construction repeats; the median is shown")
    parser.add_argument("--fetch-rows", type=int, default=5000, help="rows read by random access (default 5000)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write shards (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = {fmt: bench_format(Path(tmp), fmt, args) for fmt in args.formats}
    print(f"{args.files} files x {args.rows_per_file} rows, {args.batch_rows} rows/batch, ~{args.clip_kb} KiB "
          f"clips, split_rows={args.split_rows}, {os.cpu_count()} CPUs")
    print_table(results)


if __name__ == "__main__":
    main()
