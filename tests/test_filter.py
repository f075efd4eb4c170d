"""Predicate pushdown: filter= keeps rows by non-audio columns, prunes Parquet row groups by statistics,
never reads a dropped row's audio, and keeps exactly-once evaluation, exact resume and elastic resume."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc
import pytest

import audioloader as al
from audioloader.shards.formats import readers
from tests.helpers import FILTER_DURATIONS as DURATIONS
from tests.helpers import FILTER_ROWS as ROWS
from tests.helpers import assert_resumes_exactly, loader_factory
from tests.helpers import filter_table as table
from tests.helpers import write_filter_shards as write_shards

TOTAL = sum(ROWS)


def expected(keep) -> list[int]:
    out, start = [], 0
    for n in ROWS:
        rows = table(start, n).drop_columns(["audio"]).to_pylist()
        out += [start + k for k, row in enumerate(rows) if keep(row)]
        start += n
    return out


@pytest.fixture(scope="module", params=["parquet", "ipc_file", "ipc_stream", "orc"])
def shards(request, tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def parquet_shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("parquet"), "parquet")


SHORT = pc.field("duration") < 1.0  # rows 0-3 of each file: its first Parquet row group
TRAIN_SPLIT = pc.field("split") == "train"


loader_for = loader_factory(batch_size=4, seed=3, workers=al.Workers(num_workers=1, kind="thread"),
                            storage=al.Storage(split_rows=8),
                            columns=("duration",),
                            train_options={"shuffle": al.Shuffle(buffer_size=8, min_size=4), "infinite": False})


def rows_of(batches) -> list[int]:
    return [i for b in batches for i in (b["index"][b["valid"]] if "valid" in b else b["index"]).tolist()]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize(("expression", "keep"), [(SHORT, lambda r: r["duration"] < 1.0),
                                                  (TRAIN_SPLIT, lambda r: r["split"] == "train")])
def test_eval_yields_each_kept_row_once_with_its_original_index(shards, world_size, expression, keep):
    seen, counts = [], []
    for rank in range(world_size):
        with loader_for(al.Source(shards, filter=expression), train=False,
                        storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            batches = list(loader)
            counts.append(len(batches))
            assert len(batches) == len(loader)
            seen += rows_of(batches)
            for b in batches:  # the index is the row's own: its duration column says so
                valid = b["valid"]
                assert [DURATIONS[i] for i in b["index"][valid].tolist()] == b["duration"][valid].tolist()
    assert sorted(seen) == expected(keep)
    assert len(set(counts)) == 1


def test_parquet_row_groups_are_pruned_and_dropped_rows_audio_never_read(parquet_shards, monkeypatch):
    reads = []  # (file, row group, columns) of every row group read
    original = readers.ParquetHandle.unit

    def spy(self, i):
        reads.append((self._file, i, tuple(self._columns)))
        return original(self, i)

    monkeypatch.setattr(readers.ParquetHandle, "unit", spy)
    with loader_for(al.Source(parquet_shards, filter=SHORT), train=False) as loader:
        stats = loader.reader.dataset.filter_stats
        construction = list(reads)
        reads.clear()
        rows = rows_of(list(loader))
    assert sorted(rows) == expected(lambda r: r["duration"] < 1.0)
    groups = sum(-(-n // 4) for n in ROWS)  # 15 row groups
    # Durations ascend within a file, so only the first row group of each file may match.
    assert stats["row_groups_pruned"] == groups - 3 and stats["units_filtered"] == 3
    assert [(i, columns) for _, i, columns in construction] == [(0, ("duration",))] * 3  # filter column only
    assert [i for _, i, _ in reads] == [0, 0, 0] and all("audio" in columns for _, _, columns in reads)


def test_units_without_kept_rows_are_never_read(shards, monkeypatch):
    with loader_for(al.Source(shards, filter=SHORT), train=False) as loader:
        dataset = loader.reader.dataset
        read = []
        original = dataset.units.read_unit
        monkeypatch.setattr(dataset.units, "read_unit", lambda f, u: read.append((f, u)) or original(f, u))
        list(loader)
    assert sorted(read) == [(0, 0), (1, 0), (2, 0)]  # batches of 4: rows 0-3 of each file only


def test_train_pass_covers_kept_rows_once_and_resumes_exactly(shards):
    keep = expected(lambda r: r["split"] == "train")
    with loader_for(al.Source(shards, filter=TRAIN_SPLIT)) as loader:
        reference = list(loader)
    assert Counter(rows_of(reference)) == Counter(keep)
    assert_resumes_exactly(lambda **kw: loader_for(al.Source(shards, filter=TRAIN_SPLIT), **kw), None, (1, 4, 7),
                           reference)


def test_elastic_resume_with_a_filter(shards):
    keep = expected(lambda r: r["split"] == "train")
    before, states = [], []
    for rank in range(2):
        with loader_for(al.Source(shards, filter=TRAIN_SPLIT), storage=al.Storage(rank=rank, world_size=2)) as loader:
            it = iter(loader)
            before += [i for _ in range(2) for i in next(it)["index"].tolist()]
            states.append(loader.state_dict())
    after = []
    for rank in range(3):
        with loader_for(al.Source(shards, filter=TRAIN_SPLIT), storage=al.Storage(rank=rank, world_size=3)) as loader:
            loader.load_state_dict(states)
            after += rows_of(list(loader))
    assert Counter(before + after) == Counter(keep)


def test_the_filter_is_part_of_the_fingerprint(shards):
    with loader_for(al.Source(shards, filter=TRAIN_SPLIT)) as loader:
        next(iter(loader))
        state = loader.state_dict()
    for other in (SHORT, None):
        with loader_for(al.Source(shards, filter=other)) as changed, pytest.raises(al.CheckpointMismatchError) as info:
            changed.load_state_dict(state)
        assert "filter" in info.value.fields and "split" in str(info.value)


def test_bad_filters_are_refused_clearly(shards):
    with pytest.raises(ValueError, match="reads the audio column 'audio'"):
        loader_for(al.Source(shards, filter=pc.field("audio") == b""))
    with pytest.raises(ValueError, match=r"do not have \('speaker'\); available: 'label'"):
        loader_for(al.Source(shards, filter=pc.field("speaker") == "a"))
    with pytest.raises(TypeError, match="boolean expression"):
        loader_for(al.Source(shards, filter=pc.field("duration") + 1.0))
    with pytest.raises(TypeError, match=r"pyarrow\.compute\.Expression"):
        loader_for(al.Source(shards, filter="duration < 1"))
    with pytest.raises(ValueError, match="keeps none of the 60 rows"):
        loader_for(al.Source(shards, filter=pc.field("duration") > 100.0))
