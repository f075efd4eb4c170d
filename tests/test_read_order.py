"""The reader's read order: its position as a value, and the units it reads from a position on (what its read-ahead
fetches from a reset on), listed by walking the same `Walk` the reader reads along."""

from __future__ import annotations

import itertools

import pytest

from audioloader.nodes import ArrowShardReader
from audioloader.nodes.read_order import units_ahead
from audioloader.shards import ShardDataset
from tests.helpers import make_shards

ROWS = [13, 9, 0, 18, 7, 11]  # an empty file too; batches of 3 rows, splits of 4


@pytest.fixture(scope="module", params=["ipc_file", "parquet"])
def dataset(request, tmp_path_factory) -> ShardDataset:
    folder = tmp_path_factory.mktemp(request.param)
    make_shards(folder, ROWS, request.param, batch_rows=3)
    return ShardDataset(folder, split_rows=4)


def units_read(dataset: ShardDataset, monkeypatch) -> list[tuple[int, int]]:
    """The units ``dataset`` reads from now on, appended as they are read."""
    read: list[tuple[int, int]] = []
    original = dataset.units.read_unit
    monkeypatch.setattr(dataset.units, "read_unit", lambda f, u: read.append((f, u)) or original(f, u))
    return read


@pytest.mark.parametrize("interleave", [1, 3])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("rows_before", [0, 1, 10, 20])
def test_units_ahead_are_the_units_the_reader_reads(dataset, monkeypatch, interleave, shuffle, rows_before):
    reader = ArrowShardReader.of(dataset, seed=3, rank=1, world_size=2, shuffle=shuffle, interleave=interleave)
    reader.reset(None)
    for _ in range(rows_before):
        next(reader)
    resumed = ArrowShardReader.of(dataset, seed=3, rank=1, world_size=2, shuffle=shuffle, interleave=interleave)
    resumed.reset(reader.get_state())
    expected = list(units_ahead(resumed, resumed.position()))
    read = units_read(dataset, monkeypatch)
    rest = sum(1 for _ in resumed)
    assert rest > 0
    assert read == expected


@pytest.mark.parametrize("interleave", [1, 3])
def test_units_ahead_of_an_infinite_reader_go_on_into_the_next_passes(dataset, monkeypatch, interleave):
    reader = ArrowShardReader.of(dataset, seed=3, infinite=True, interleave=interleave)
    reader.reset(None)
    for _ in range(20):
        next(reader)
    resumed = ArrowShardReader.of(dataset, seed=3, infinite=True, interleave=interleave)
    resumed.reset(reader.get_state())
    expected = list(itertools.islice(units_ahead(resumed, resumed.position()), 60))
    read = units_read(dataset, monkeypatch)
    while len(read) < 60:  # three passes and more
        next(resumed)
    assert read[:60] == expected


@pytest.mark.parametrize("interleave", [1, 3])
def test_the_position_is_what_the_state_holds(dataset, interleave):
    reader = ArrowShardReader.of(dataset, seed=3, infinite=True, interleave=interleave)
    reader.reset(None)
    for rows in (0, 1, 7, 40, 100):
        for _ in range(rows):
            next(reader)
        assert reader.position_of(reader.get_state()) == reader.position()
