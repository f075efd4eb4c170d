"""ArrowShardReader: passes, ranks, exact resume, random access and bad rows."""

from __future__ import annotations

import heapq
import logging
import threading

import numpy as np
import pyarrow as pa
import pytest
from torchdata.nodes import Loader, ParallelMapper

from audioloader.errors import CheckpointMismatchError
from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.nodes.read_order import Balance, balance_splits
from audioloader.samples import Key, RawSample
from audioloader.shards import ShardDataset
from audioloader.shards.catalog.file_table import SplitTable

from .helpers import audio_table, clip_bytes, make_shards, write_ipc_file, write_parquet

SHORT = {"seconds": 0.02}
UNEVEN = [7, 0, 13, 5, 9]  # 34 rows, an empty file, batches of 3 -> splits of 1..4 rows


def signature(sample: RawSample) -> tuple:
    """Everything a sample carries, comparable."""
    audio = None if sample.audio is None else bytes(sample.audio)
    return (sample.key, audio, sample.label, sorted(sample.extras.items()), sample.file, sample.row, sample.problem)


def take(reader: ArrowShardReader, n: int) -> list[RawSample]:
    return [next(reader) for _ in range(n)]


def read_pass(reader: ArrowShardReader, pass_index: int) -> list[RawSample]:
    reader.reset({"pass": pass_index, "split_pos": 0, "row": 0})
    return list(reader)


@pytest.fixture(scope="module", params=["ipc_file", "ipc_stream", "parquet"])
def uneven(request, tmp_path_factory) -> ShardDataset:
    folder = tmp_path_factory.mktemp(request.param)
    make_shards(folder, UNEVEN, fmt=request.param, batch_rows=3, **SHORT)
    return ShardDataset(folder, columns=["uid"], split_rows=4)


# ----------------------------------------------------------------------------- what is read


def test_samples_carry_key_audio_label_extras_and_origin(uneven):
    samples = list(ArrowShardReader.of(uneven, shuffle=False))
    assert [s.key for s in samples] == [Key(i, 0) for i in range(34)]
    assert all(s.extras == {"uid": s.key.index} and s.label == s.key.index % 3 for s in samples)
    assert bytes(samples[20].audio) == clip_bytes(20, **SHORT)
    assert (samples[20].file, samples[20].row) == (uneven.files[3].path, 0)
    assert all(s.problem is None for s in samples)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_each_row_exactly_once_per_pass_across_ranks(uneven, world_size, shuffle):
    for pass_index in (0, 1):
        per_rank = []
        for rank in range(world_size):
            reader = ArrowShardReader.of(uneven, rank=rank, world_size=world_size, shuffle=shuffle, seed=3)
            samples = read_pass(reader, pass_index)
            assert all(s.key.pass_index == pass_index and s.extras["uid"] == s.key.index for s in samples)
            if not shuffle or pass_index == 0:
                assert len(samples) == reader.rows_per_rank()[rank]
            per_rank.append([s.key.index for s in samples])
        flat = [i for rows in per_rank for i in rows]
        assert sorted(flat) == list(range(34)), f"rank shares {per_rank}"
        assert all(per_rank), "every rank has data"


def test_shuffled_pass_orders_differ_between_passes_and_repeat_between_runs(uneven):
    def order(pass_index: int, seed: int = 0) -> list[int]:
        return [s.key.index for s in read_pass(ArrowShardReader.of(uneven, seed=seed), pass_index)]

    assert order(0) != order(1) != order(2)
    assert order(1) == order(1) and order(0, seed=1) != order(0)
    reader = ArrowShardReader.of(uneven, world_size=2, rank=1, seed=5)
    assert reader.splits_for_pass(4) == ArrowShardReader.of(uneven, world_size=2, rank=1, seed=5).splits_for_pass(4)


def test_eval_order_is_natural_and_the_same_every_pass(uneven):
    reader = ArrowShardReader.of(uneven, shuffle=False, world_size=2, rank=0)
    splits = reader.splits_for_pass(0)
    assert splits == reader.splits_for_pass(7) == sorted(splits, key=lambda s: (s.file_id, s.start))
    first = [s.key.index for s in read_pass(reader, 0)]
    assert first == sorted(first)


def test_splits_are_subdivided_so_every_rank_has_data(tmp_path):
    write_parquet(tmp_path / "a.parquet", audio_table(0, 10, **SHORT), row_group_rows=10)  # one row group
    for shuffle in (True, False):
        shares = [[s.key.index for s in ArrowShardReader.of(tmp_path, rank=r, world_size=4, shuffle=shuffle)]
                  for r in range(4)]
        assert all(shares) and sorted(i for share in shares for i in share) == list(range(10))


def test_fewer_rows_than_ranks(tmp_path):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 3, **SHORT))
    with pytest.raises(ValueError, match=r"world_size=4 but the source has only 3 rows.*use fewer ranks"):
        ArrowShardReader.of(tmp_path, rank=0, world_size=4)
    shares = [[s.key.index for s in ArrowShardReader.of(tmp_path, rank=r, world_size=4, shuffle=False)]
              for r in range(4)]
    assert shares == [[0], [1], [2], []]
    idle = ArrowShardReader.of(tmp_path, rank=3, world_size=4, shuffle=False, infinite=True)
    assert list(idle) == []  # an idle rank ends instead of spinning


def test_eval_balances_rows_longest_first(tmp_path):
    for i, rows in enumerate([10, 8, 6, 5, 4, 3]):
        write_ipc_file(tmp_path / f"f{i}.arrow", audio_table(100 * i, rows, **SHORT), batch_rows=rows)
    ds = ShardDataset(tmp_path, split_rows=100)
    assert [[s.split_id for s in part] for part in balance_splits(ds.splits, 2)] == [[0, 3, 5], [1, 2, 4]]
    readers = [ArrowShardReader.of(ds, rank=r, world_size=2, shuffle=False) for r in range(2)]
    assert readers[0].rows_per_rank() == [18, 18]
    assert [len(list(r)) for r in readers] == [18, 18]
    # Ties go to the lowest rank: three equal splits over two ranks.
    assert [len(p) for p in balance_splits(ds.splits[:1] * 3, 2)] == [2, 1]


def _balance_by_objects(splits, world_size):
    """The longest-first rule as 0.3 wrote it, one `Split` object at a time: the reference `Balance` must equal."""
    loads = [(0, rank) for rank in range(world_size)]
    assigned = [[] for _ in range(world_size)]
    for split in sorted(splits, key=lambda s: (-s.num_rows, s.split_id)):
        rows, rank = heapq.heappop(loads)
        assigned[rank].append(split)
        heapq.heappush(loads, (rows + split.num_rows, rank))
    return [sorted(parts, key=lambda s: s.split_id) for parts in assigned]


@pytest.mark.parametrize("seed", range(6))
def test_eval_balance_as_arrays_equals_the_rule_split_by_split(seed):
    rng = np.random.default_rng(seed)
    count, world = int(rng.integers(1, 3000)), int(rng.integers(1, 70))
    rows = rng.integers(1, 8, count) * int(rng.choice([1, 64]))  # many ties, as equal-sized splits give
    table = SplitTable(np.arange(count) // 3, (np.arange(count) % 3) * 1000, (np.arange(count) % 3) * 1000 + rows)
    expected = _balance_by_objects(list(table), world)
    assert balance_splits(table, world) == balance_splits(list(table), world) == expected
    balance = Balance.of(table, world)
    assert list(balance.rows) == [sum(s.num_rows for s in part) for part in expected]


def test_eval_imbalance_is_logged(tmp_path, caplog):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 10, **SHORT), batch_rows=10)
    write_ipc_file(tmp_path / "b.arrow", audio_table(10, 1, **SHORT), batch_rows=1)
    with caplog.at_level(logging.WARNING, logger="audioloader.nodes.read_order"):
        ArrowShardReader.of(tmp_path, world_size=2, rank=0, shuffle=False, split_rows=100)
    assert "rank 0 reads 10 rows, rank 1 reads 1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="audioloader.nodes.read_order"):
        ArrowShardReader.of(tmp_path, world_size=2, rank=0, shuffle=False, split_rows=3)  # splits 4,3,3,1 -> 6/5
    assert caplog.text == ""


def test_null_audio_and_label_rows_come_through_with_a_problem(tmp_path):
    table = pa.table({"audio": pa.array([b"a", None, b"c", b"d"], pa.binary()),
                      "label": pa.array([0, 1, None, 2], pa.int64())})
    write_parquet(tmp_path / "a.parquet", table)
    reader = ArrowShardReader.of(tmp_path, shuffle=False)
    samples = list(reader)
    assert [s.problem for s in samples] == [None, "audio is null", "label is null", None]
    assert samples[1].audio is None and samples[2].label is None and bytes(samples[3].audio) == b"d"
    assert [s.problem for s in reader.fetch([Key(2, 0), Key(1, 0)])] == ["label is null", "audio is null"]


# ----------------------------------------------------------------------------- state and resume


def assert_resumes_everywhere(make, total: int) -> None:
    """State after every item k: a fresh reader reset to it yields exactly the rest of the run."""
    reader = make()
    states, samples = [reader.state_dict()], []
    for _ in range(total):
        samples.append(signature(next(reader)))
        states.append(reader.state_dict())
    expected_tail = None
    if not reader.infinite:
        with pytest.raises(StopIteration):
            next(reader)
        expected_tail = []
    for k, state in enumerate(states):
        resumed = make()
        resumed.reset(state)
        assert [signature(s) for s in take(resumed, total - k)] == samples[k:], f"after {k} items"
        if expected_tail is not None:
            assert list(resumed) == expected_tail


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_at_every_position(uneven, shuffle):
    assert_resumes_everywhere(lambda: ArrowShardReader.of(uneven, world_size=2, rank=1, shuffle=shuffle, seed=9),
                              ArrowShardReader.of(uneven, world_size=2, rank=1, shuffle=shuffle, seed=9)
                              .rows_per_rank()[1])


def test_resume_across_pass_boundaries_when_infinite(uneven):
    def make() -> ArrowShardReader:
        return ArrowShardReader.of(uneven, shuffle=True, infinite=True, seed=2)

    samples = take(make(), 34 * 2 + 10)
    assert [s.key.pass_index for s in samples[33:36]] == [0, 1, 1]
    assert sorted(s.key.index for s in samples[34:68]) == list(range(34))
    assert_resumes_everywhere(make, 34 * 2 + 10)


def test_state_is_a_fresh_small_dict(uneven):
    reader = ArrowShardReader.of(uneven)
    take(reader, 5)
    first, second = reader.state_dict(), reader.state_dict()
    assert first == second and first is not second
    assert set(first) == {"pass", "split_pos", "row"}
    first["row"] = 999
    assert reader.state_dict() == second


def test_resume_seeks_without_reading_skipped_batches(tmp_path, monkeypatch):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 40, **SHORT), batch_rows=4)
    ds = ShardDataset(tmp_path, columns=["uid"], split_rows=40)
    read_units = []
    original = ds.units.read_unit
    monkeypatch.setattr(ds.units, "read_unit", lambda f, u: read_units.append(u) or original(f, u))
    reader = ArrowShardReader.of(ds, shuffle=False)
    reader.reset({"pass": 0, "split_pos": 0, "row": 29})
    assert next(reader).extras["uid"] == 29 and read_units == [7]


def test_bad_state_is_refused(uneven):
    reader = ArrowShardReader.of(uneven)
    with pytest.raises(CheckpointMismatchError, match="does not fit this reader"):
        reader.reset({"pass": 0, "split_pos": 10_000, "row": 0})
    with pytest.raises(CheckpointMismatchError, match="lacks a valid 'row'"):
        reader.reset({"pass": 0, "split_pos": 0})


@pytest.mark.parametrize(("shuffle", "second_pass"), [(True, 1), (False, 0)])
def test_loader_epochs_and_end_of_epoch_state(uneven, shuffle, second_pass):
    loader = Loader(ArrowShardReader.of(uneven, shuffle=shuffle, seed=4))
    epoch0 = [s.key for s in loader]
    end_state = loader.state_dict()
    epoch1 = [s.key for s in loader]
    assert {k.pass_index for k in epoch0} == {0} and {k.pass_index for k in epoch1} == {second_pass}
    assert sorted(k.index for k in epoch1) == list(range(34))
    assert (epoch0 == epoch1) == (not shuffle)
    resumed = Loader(ArrowShardReader.of(uneven, shuffle=shuffle, seed=4))
    resumed.load_state_dict(end_state)
    assert [s.key for s in resumed] == epoch1


def test_resume_behind_a_parallel_mapper(uneven):
    def build() -> Loader:
        reader = ArrowShardReader.of(uneven, seed=1)
        return Loader(ParallelMapper(reader, map_fn=lambda s: (s.key, bytes(s.audio)), num_workers=2,
                                     method="thread", in_order=True))

    full = list(build())
    loader = build()
    it = iter(loader)
    head = [next(it) for _ in range(11)]
    state = loader.state_dict()
    resumed = build()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


# ----------------------------------------------------------------------------- random access


def test_fetch_matches_sequential_reads(uneven):
    reader = ArrowShardReader.of(uneven, shuffle=True, seed=8)
    sequential = {s.key.index: s for s in reader}
    keys = [Key(33, 1), Key(0, 1), Key(17, 1), Key(17, 1), Key(6, 1)]
    fetched = reader.fetch(keys)
    assert [s.key for s in fetched] == keys
    for sample in fetched:
        expected = sequential[sample.key.index]
        assert signature(sample)[1:] == signature(expected)[1:]


def test_fetch_from_another_thread_while_next_runs(uneven):
    reader = ArrowShardReader.of(uneven, shuffle=False)
    expected = {s.key.index: signature(s) for s in reader}
    reader.reset(None)
    fetched, errors = [], []

    def fetch_all() -> None:
        try:
            for start in range(0, 34, 5):
                fetched.extend(reader.fetch([Key(i, 0) for i in range(start, min(start + 5, 34))]))
        except Exception as error:  # reported by the main thread
            errors.append(error)

    worker = threading.Thread(target=fetch_all)
    worker.start()
    streamed = list(reader)
    worker.join()
    assert not errors
    assert [signature(s) for s in fetched] == [expected[i] for i in range(34)]
    assert [signature(s) for s in streamed] == [expected[i] for i in range(34)]


# ----------------------------------------------------------------------------- arguments


def test_arguments_are_checked(uneven, tmp_path):
    with pytest.raises(ValueError, match=r"rank=2 must be in \[0, world_size=2\)"):
        ArrowShardReader.of(uneven, rank=2, world_size=2)
    with pytest.raises(TypeError, match="seed must be an int"):
        ArrowShardReader.of(uneven, seed="0")
    with pytest.raises(ValueError, match="label_column='y' differs from the ShardDataset's 'label'"):
        ArrowShardReader.of(uneven, label_column="y")
    make_shards(tmp_path, [3], **SHORT)
    reader = ArrowShardReader.of(str(tmp_path), label_column=None, columns=["name"], rank=None, world_size=None)
    assert (reader.rank, reader.world_size) == (0, 1)
    assert [(s.label, s.extras) for s in reader][:1] == [(None, {"name": "clip0"})]
