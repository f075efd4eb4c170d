"""Iceberg tables as sources: a snapshot's data files, partition pruning by filter=, stable indices, the snapshot
in the checkpoint. Tables are written here with pyiceberg (an embedded SQLite catalog, a local warehouse)."""

from __future__ import annotations

import functools
import os
import pickle
import random
import sys
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import audioloader as al
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    audio_table,
    loader_factory,
    make_shards,
    roundtrip,
    take,
    write_orc,
)

pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg[sql-sqlite] (the dev extra)")

FIRST, SECOND = range(0, 20), range(20, 36)  # uids appended by snapshot 1 and snapshot 2
TEST_SPLIT = pc.field("split") == "test"  # the partition column: uid % 3 == 0


def split_of(uid: int) -> str:
    return "test" if uid % 3 == 0 else "train"


def rows(uids: range, speaker: bool = False) -> pa.Table:
    table = audio_table(uids.start, len(uids), seconds=0.3).drop_columns(["name"])
    table = table.append_column("split", pa.array([split_of(u) for u in uids]))
    return table.append_column("speaker", pa.array([f"s{u % 2}" for u in uids])) if speaker else table


@dataclass
class Warehouse:
    catalog: dict
    snapshots: list[int]

    def table(self, **kwargs) -> al.IcebergTable:
        return al.IcebergTable("audio.clips", catalog=self.catalog, **kwargs)


def create_table(folder, first: pa.Table) -> tuple[dict, object]:
    """audio.clips, partitioned by ``split`` (identity), row groups of 4 rows, holding ``first``."""
    from pyiceberg.catalog import load_catalog

    catalog = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}"}
    iceberg = load_catalog("default", **catalog)
    iceberg.create_namespace("audio")
    table = iceberg.create_table("audio.clips", schema=first.schema,
                                 properties={"write.parquet.row-group-limit": "4"})
    with table.update_spec() as spec:
        spec.add_identity("split")
    table.append(first)
    return catalog, table


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Warehouse:
    """Snapshot 1: uids 0-19 (2 data files); snapshot 2: a column ``speaker`` added, uids 20-35 (2 more)."""
    from pyiceberg.types import StringType

    catalog, table = create_table(tmp_path_factory.mktemp("warehouse"), rows(FIRST))
    first = table.current_snapshot().snapshot_id
    with table.update_schema() as schema:
        schema.add_column("speaker", StringType())
    table.append(rows(SECOND, speaker=True))
    return Warehouse(catalog, [first, table.current_snapshot().snapshot_id])


loader_for = loader_factory(batch_size=4, seed=4, workers=al.Workers(num_workers=2, kind="thread"),
                            columns=("uid", "split"),
                            train_options={"shuffle": al.Shuffle(buffer_size=8, min_size=4)})


def valid_uids(batches) -> list[int]:
    return [u for b in batches for u in (b["uid"][b["valid"]] if "valid" in b else b["uid"]).tolist()]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("snapshot", ["pinned first", "current"])
def test_eval_reads_each_row_of_the_snapshot_that_passes_the_filter_once(warehouse, monkeypatch, snapshot,
                                                                         world_size):
    source = warehouse.table(snapshot_id=warehouse.snapshots[0]) if snapshot == "pinned first" else warehouse.table()
    uids = [*FIRST] if snapshot == "pinned first" else [*FIRST, *SECOND]
    opened = []
    memory_map = pa.memory_map
    monkeypatch.setattr(pa, "memory_map", lambda path, mode="r": opened.append(path) or memory_map(path, mode))
    seen, counts = [], []
    for rank in range(world_size):
        with loader_for(al.Source(source, filter=TEST_SPLIT), train=False,
                        storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            batches = list(loader)
            counts.append(len(batches))
            dataset = loader.reader.dataset
            seen += valid_uids(batches)
            for b in batches:
                assert b["label"][b["valid"]].tolist() == [u % 3 for u in b["uid"][b["valid"]].tolist()]
    assert Counter(seen) == Counter(u for u in uids if split_of(u) == "test")
    assert len(set(counts)) == 1
    assert dataset.table.snapshot_id == warehouse.snapshots[0 if snapshot == "pinned first" else 1]
    assert dataset.filter_stats["files_pruned"] == len(dataset.files) // 2  # the "train" partition's files
    assert opened and not any("split=train" in path for path in opened)  # pruned files are never opened


def test_pruning_a_file_shifts_no_other_row(warehouse):
    everything = al.ShardDataset(warehouse.table(), columns=("uid",))
    pruned = al.ShardDataset(warehouse.table(), columns=("uid",), filter=TEST_SPLIT)
    assert pruned.filter_stats["files_pruned"] == 2 and pruned.num_rows == everything.num_rows == 36
    assert [f.path for f in pruned.files] == [f.path for f in everything.files]  # every data file, sorted by path
    kept = pruned.kept_indices().tolist()
    assert [r.extras["uid"] for r in pruned.read_rows(kept)] == [r.extras["uid"] for r in everything.read_rows(kept)]
    with pytest.raises(IndexError, match="was pruned by the filter"):
        pruned.read_rows([next(i for i in range(36) if i not in kept)])


def test_train_resumes_exactly_on_a_table(warehouse):
    source, total = warehouse.table(), 16  # 64 samples: into the second pass over 36 rows
    assert_resumes_exactly(functools.partial(loader_for, source), total,
                           sorted(random.Random(3).sample(range(1, total), 3)))


def test_a_resume_against_a_newer_snapshot_is_refused_by_name(warehouse):
    first, second = warehouse.snapshots
    with loader_for(al.Source(warehouse.table(snapshot_id=first), filter=TEST_SPLIT)) as loader:
        reference = take(loader, 4)
    with loader_for(al.Source(warehouse.table(snapshot_id=first), filter=TEST_SPLIT)) as loader:
        head = take(loader, 2)
        state = roundtrip(loader.state_dict())
    assert state["fingerprint"]["iceberg"] == [["audio.clips", first]]
    with loader_for(al.Source(warehouse.table(), filter=TEST_SPLIT)) as newer, \
            pytest.raises(al.CheckpointMismatchError) as info:
        newer.load_state_dict(state)
    message = str(info.value)
    assert "'audio.clips'" in message and str(first) in message and str(second) in message, message
    assert f"snapshot_id={first}" in message and "iceberg" in info.value.fields
    with loader_for(al.Source(warehouse.table(snapshot_id=first), filter=TEST_SPLIT)) as pinned:
        pinned.load_state_dict(state)
        assert_same_batches(head + take(pinned, 2), reference)


def test_a_column_added_by_a_later_snapshot_is_null_in_older_files(warehouse):
    with loader_for(warehouse.table(), train=False, columns=("uid", "speaker")) as loader:
        speakers = {u: s for b in loader for u, s in zip(b["uid"].tolist(), b["speaker"], strict=True)}
    assert speakers == {u: None if u in FIRST else f"s{u % 2}" for u in [*FIRST, *SECOND]}


def test_a_loader_pickles_with_its_snapshot(tmp_path):
    catalog, table = create_table(tmp_path, rows(FIRST))
    source = al.IcebergTable("audio.clips", catalog=catalog)
    with loader_for(source) as loader:
        reference = take(loader, 8)
    with loader_for(source) as loader:
        head = take(loader, 3)
        data = pickle.dumps(loader)
    table.append(rows(SECOND))  # the table moves on; the pickled loader still reads its snapshot
    with pickle.loads(data) as resumed:
        assert_same_batches(head + take(resumed, 5), reference)


def test_orc_data_files_listed_by_the_table_are_read(tmp_path):
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    catalog, table = create_table(tmp_path, rows(FIRST))
    extra = rows(range(36, 42))
    extra = extra.set_column(extra.schema.get_field_index("split"), "split", pa.array(["test"] * 6))
    path = write_orc(tmp_path / "extra.orc", extra, stripe_rows=4)
    data_file = DataFile.from_args(content=DataFileContent.DATA, file_path=f"file://{path}", file_format=FileFormat.ORC,
                                   partition=Record("test"), record_count=6, file_size_in_bytes=os.path.getsize(path),
                                   spec_id=table.spec().spec_id)
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    table = al.IcebergTable("audio.clips", catalog=catalog)
    with loader_for(al.Source(table, filter=TEST_SPLIT), train=False) as loader:
        assert sorted(f.format for f in loader.reader.dataset.files) == ["orc", "parquet", "parquet"]
        uids = valid_uids(list(loader))
    assert Counter(uids) == Counter([u for u in FIRST if u % 3 == 0] + list(range(36, 42)))


def test_an_iceberg_table_in_a_mix_reads_every_row_of_both_sources_once(warehouse, tmp_path):
    make_shards(tmp_path, [7, 5], "parquet", batch_rows=4, seconds=0.3)
    mix = al.Mix({"table": (warehouse.table(snapshot_id=warehouse.snapshots[0]), 1.0), "files": (tmp_path, 1.0)})
    seen = []
    for rank in range(2):
        with loader_for(mix, train=False, columns=("uid",), storage=al.Storage(rank=rank, world_size=2)) as loader:
            seen += [(s, u) for b in loader for s, u, ok in zip(b["source"].tolist(), b["uid"].tolist(),
                                                                b["valid"].tolist(), strict=True) if ok]
    assert Counter(seen) == Counter([(0, u) for u in FIRST] + [(1, u) for u in range(12)])


def test_errors_name_the_table_and_the_fix(warehouse, monkeypatch):
    with pytest.raises(al.SourceNotFoundError, match=r"'audio\.missing' not found in catalog 'default'"):
        al.ShardDataset(al.IcebergTable("audio.missing", catalog=warehouse.catalog))
    first = warehouse.snapshots[0]
    with pytest.raises(al.SourceNotFoundError, match=rf"has no snapshot 12345; its snapshots are \[{first}"):
        al.ShardDataset(warehouse.table(snapshot_id=12345))
    with pytest.raises(TypeError, match="is a whole source: pass it alone"):
        al.ShardDataset([warehouse.table(), "shards/"])
    with pytest.raises(ValueError, match=r"'namespace\.table'"):
        al.IcebergTable("clips")
    with pytest.raises(ValueError, match="keeps none of the 4 data files"):
        al.ShardDataset(warehouse.table(), filter=pc.field("split") == "validation")
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)  # as if pyiceberg were not installed
    with pytest.raises(ImportError, match=r"needs the pyiceberg package.*pip install 'pyiceberg\[sql-sqlite\]'"):
        al.ShardDataset(warehouse.table())
