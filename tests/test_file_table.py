"""Per-file metadata as columns (issue 26): a rank's metadata at a million files costs tens of bytes a file, the
splits planned for all files at once are the splits planned file by file, and a dataset from a manifest reads,
pickles and checkpoints as before."""

from __future__ import annotations

import gc
import os
import pickle
import random
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

import audioloader as al
from audioloader.nodes import ArrowShardReader
from audioloader.shards.catalog.file_table import FileTable, SplitTable, plan_splits
from audioloader.shards.catalog.manifest import MANIFEST_NAME, manifest_columns, write_manifest
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.formats.scan import FORMATS
from audioloader.shards.sources.splits import Split, _numbered, file_splits
from tests.helpers import make_shards


def _table(unit_rows: list[tuple[int, ...]], formats: list[str]) -> FileTable:
    offsets = np.zeros(len(unit_rows) + 1, dtype=np.int64)
    np.cumsum([len(u) for u in unit_rows], out=offsets[1:])
    values = np.array([r for u in unit_rows for r in u], dtype=np.int64)
    return FileTable([f"f{i}" for i in range(len(unit_rows))], np.array([FORMATS.index(f) for f in formats]),
                     np.ones(len(unit_rows), dtype=np.int64), offsets, values)


def _file_by_file(unit_rows: list[tuple[int, ...]], formats: list[str], split_rows: int) -> list[Split]:
    return _numbered([s for i, (u, f) in enumerate(zip(unit_rows, formats, strict=True))
                      for s in file_splits(i, u, split_rows, f in ("ipc_file", "ipc_stream"))])


@pytest.mark.parametrize("seed", range(6))
def test_splits_planned_for_all_files_at_once_are_the_splits_planned_file_by_file(seed):
    rng = random.Random(seed)
    split_rows = rng.choice([1, 3, 8, 50])
    unit_rows, formats = [], []
    for _ in range(300):
        units = rng.choice([0, 1, 2, 5, 12, 300 if rng.random() < 0.02 else 4])  # a few files of many units
        unit_rows.append(tuple(rng.choice([0, 1, 2, 7, 20, 130, rng.randrange(400)]) for _ in range(units)))
        formats.append(rng.choice(FORMATS))
    planned = plan_splits(_table(unit_rows, formats), split_rows)
    assert isinstance(planned, SplitTable)
    assert list(planned) == _file_by_file(unit_rows, formats, split_rows)


def test_files_of_one_split_each_are_planned_without_a_loop():
    unit_rows = [(3, 4), (0,), (), (7,), (0, 2, 0)]
    planned = plan_splits(_table(unit_rows, ["ipc_file"] * 5), 8)
    assert list(planned) == _file_by_file(unit_rows, ["ipc_file"] * 5, 8)
    assert [(s.file_id, s.start, s.stop) for s in planned] == [(0, 0, 7), (3, 0, 7), (4, 0, 2)]


def test_a_split_table_is_a_sequence_of_splits():
    table = SplitTable.of([Split(0, 0, 0, 4), Split(1, 0, 4, 9, kept=2), Split(2, 3, 0, 1)])
    assert len(table) == 3 and table[1] == Split(1, 0, 4, 9, 2) and table[-1] == Split(2, 3, 0, 1, 1)
    assert table[1:] == [Split(1, 0, 4, 9, 2), Split(2, 3, 0, 1, 1)]
    assert table.num_rows().tolist() == [4, 2, 1]
    assert table.take(np.array([2, 0])) == [table[2], table[0]] == [Split(2, 3, 0, 1, 1), Split(0, 0, 0, 4, 4)]
    with pytest.raises(IndexError):
        table[3]


def _manifest_folder(folder, count: int, rows: int = 32, units: int = 4) -> None:
    schema = pa.schema([("audio", pa.binary()), ("label", pa.int64())]).serialize().to_pybytes()
    table = manifest_columns([f"part-{i:07d}.arrow" for i in range(count)], sizes=np.full(count, 500_000),
                             formats=["ipc_file"] * count, schemas=[schema], schema_ids=np.zeros(count),
                             unit_rows=[(rows // units,) * units] * count, digests=["0123456789abcdef"] * count,
                             etags=[f'ETag:"{i:032x}"' for i in range(count)])
    folder.mkdir(exist_ok=True)
    write_manifest(table, str(folder / MANIFEST_NAME))


def test_a_rank_holds_tens_of_bytes_a_file_from_a_manifest_of_200000_files(tmp_path):
    """Was ~1.1 KB a file: a ShardFile, a location, a FileMeta and a Split a file."""
    count = 200_000
    _manifest_folder(tmp_path / "data", count)
    gc.collect()
    tracemalloc.start()
    try:
        dataset = al.ShardDataset(tmp_path / "data")
        reader = ArrowShardReader.of(dataset, rank=3, world_size=1024, shuffle=True, seed=0)
        mine = reader.splits_for_pass(0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(dataset.files) == count and len(dataset.splits) == count and len(mine) in (195, 196)
    assert held / count <= 40, f"{held / count:.1f} B a file"
    assert dataset.metadata_memory()["metadata_bytes"] / count <= 40
    assert dataset.files[123_456].path == str(tmp_path / "data" / "part-0123456.arrow")
    assert dataset.files[5].batch_rows == (8, 8, 8, 8) and dataset.files[5].index_offset == 160
    assert dataset.locate(160 + 9) == (5, 9)


def test_a_dataset_from_a_manifest_pickles_reads_and_checkpoints_as_a_scanned_one(tmp_path):
    make_shards(tmp_path, [13, 9, 18, 7], "ipc_file", batch_rows=4, seconds=0.1)
    scanned = al.ShardDataset(tmp_path, split_rows=4)
    write_folder_manifest(tmp_path)
    listed = al.ShardDataset(tmp_path, split_rows=4)
    (tmp_path / "other").write_bytes(b"not this one")
    os.replace(tmp_path / "other", tmp_path / MANIFEST_NAME)  # published again: a worker gets what this one read
    copy = pickle.loads(pickle.dumps(listed))
    assert copy.files == scanned.files and copy.splits == scanned.splits
    assert copy.fingerprint() == scanned.fingerprint()
    rows = [(r.index, r.audio, r.label) for r in copy.read_rows(range(47))]
    assert rows == [(r.index, r.audio, r.label) for r in scanned.read_rows(range(47))]
    assert copy.identity() == scanned.identity()  # the footers, once read, are the scan's
