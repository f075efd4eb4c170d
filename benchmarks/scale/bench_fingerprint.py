"""Cost of the content identity in the checkpoint fingerprint, at 10,000 files.

    .venv/bin/python -m benchmarks.scale.bench_fingerprint [--files 10000] [--repeats 3]

Writes ``--files`` small shards (4 rows each, one format at a time) to a temporary
folder, then builds `ShardDataset` over them with the identity (a stat for the
modification time and a BLAKE2b digest of the metadata read anyway: IPC footer,
stream message headers, Parquet footer) and with it disabled, interleaved
``--repeats`` rounds, and prints the medians, their difference per file and the
ratio. Also times `AudioLoader.load_state_dict`'s identity check.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq

from audioloader.checkpoint import _changed_files, _identity_of
from audioloader.shards import ShardDataset
from audioloader.shards.formats import scan


class _NoDigest:
    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def write_files(folder: Path, n: int, fmt: str) -> None:
    table = pa.table({"audio": pa.array([b"RIFF" + bytes(60)] * 4, pa.binary()), "label": pa.array([0, 1, 2, 3])})
    for i in range(n):
        path = folder / f"part-{i:05d}.{'parquet' if fmt == 'parquet' else 'arrow'}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=2)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=2)


def build_seconds(folder: Path, identity: bool) -> float:
    start = time.perf_counter()
    if identity:
        ShardDataset(folder)
    else:
        with mock.patch.object(scan, "_hasher", _NoDigest), \
                mock.patch.object(scan, "_local_mtime_ns", lambda loc: None), \
                mock.patch.object(scan, "_footer", lambda f: (b"", b"")):
            ShardDataset(folder)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'format':10s} {'with (s)':>9s} {'without (s)':>12s} {'per file (us)':>14s} {'ratio':>6s}")
    for fmt in ("ipc_file", "parquet"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_files(folder, args.files, fmt)
            build_seconds(folder, True)  # warm the page cache
            with_identity, without, ratios = [], [], []
            for _ in range(args.repeats):
                a, b = build_seconds(folder, True), build_seconds(folder, False)
                with_identity.append(a)
                without.append(b)
                ratios.append(a / b)
            a, b = statistics.median(with_identity), statistics.median(without)
            print(f"{fmt:10s} {a:9.2f} {b:12.2f} {(a - b) / args.files * 1e6:14.1f} {statistics.median(ratios):6.2f}")
            dataset = ShardDataset(folder)
            start = time.perf_counter()
            ours = _identity_of(dataset)  # what a checkpoint holds
            changed = _changed_files(dataset, copy.deepcopy(ours), ours)  # the check a resume runs on it
            print(f"{'':10s} identity of {len(dataset.files)} files in the state and its check "
                  f"({len(changed)} changed): "
                  f"{(time.perf_counter() - start) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
