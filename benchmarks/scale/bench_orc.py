"""Cost of counting ORC stripe rows at construction, at 1,000 files.

    .venv/bin/python -m benchmarks.scale.bench_orc [--files 1000] [--stripes 8] [--rows 256] [--repeats 3]

pyarrow tells an ORC file's rows but not each stripe's, so `ShardDataset` reads
each stripe's cheapest column once (all but the last stripe). This writes
``--files`` ORC files of ``--stripes`` stripes of ``--rows`` rows each (audio:
2 KB of bytes, an int64 label, a string name) and the same rows as Parquet with
one row group per stripe, then builds `ShardDataset` over them, interleaved
``--repeats`` rounds: ORC as shipped, ORC with the counting replaced by
``nrows`` split evenly (what it would cost if pyarrow exposed the counts), and
Parquet (counts from the footer). Prints medians, the counting's cost per file
and per stripe, and the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from audioloader.shards import ShardDataset
from audioloader.shards.formats import scan
from benchmarks.common import interleaved_medians


def write_files(folder: Path, files: int, stripes: int, rows: int) -> None:
    n = stripes * rows
    table = pa.table({"audio": pa.array([bytes(2048)] * n, pa.binary()), "label": pa.array(np.arange(n) % 7),
                      "name": pa.array([f"clip{i}" for i in range(n)])})
    (folder / "orc").mkdir()
    (folder / "parquet").mkdir()
    for i in range(files):
        orc.write_table(table, str(folder / "orc" / f"part-{i:05d}.orc"), stripe_size=1, batch_size=rows)
        pq.write_table(table, folder / "parquet" / f"part-{i:05d}.parquet", row_group_size=rows)


def _uncounted(orc_file) -> tuple[int, ...]:
    """Rows per stripe without reading any (wrong in general: only for timing the counting's share)."""
    stripes = orc_file.nstripes
    return tuple(orc_file.nrows // stripes for _ in range(stripes))


def build_seconds(folder: Path, variant: str) -> float:
    start = time.perf_counter()
    if variant == "orc, uncounted":
        with mock.patch.object(scan, "_stripe_rows", _uncounted):
            ShardDataset(folder / "orc")
    else:
        ShardDataset(folder / variant.split(",")[0])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--stripes", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    variants = ["orc", "orc, uncounted", "parquet"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        write_files(folder, args.files, args.stripes, args.rows)
        mb = sum(p.stat().st_size for p in (folder / "orc").iterdir()) / 1e6
        print(f"{args.files} files x {args.stripes} stripes x {args.rows} rows ({mb:.0f} MB of ORC)")
        dataset = ShardDataset(folder / "orc")
        assert all(f.batch_rows == (args.rows,) * args.stripes for f in dataset.files)
        median = interleaved_medians({v: partial(build_seconds, folder, v) for v in variants}, args.repeats)
    for variant in variants:
        print(f"{variant:>15}: {median[variant]:.3f} s  ({1e3 * median[variant] / args.files:.2f} ms/file)")
    counting = median["orc"] - median["orc, uncounted"]
    print(f"counting: {counting:.3f} s = {1e6 * counting / args.files:.0f} us/file = "
          f"{1e6 * counting / (args.files * (args.stripes - 1)):.1f} us per stripe read; "
          f"orc / uncounted {median['orc'] / median['orc, uncounted']:.2f}, orc / parquet "
          f"{median['orc'] / median['parquet']:.2f}")


if __name__ == "__main__":
    main()
