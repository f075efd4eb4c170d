"""Row-level interleaving: the reader reads k splits at once, a row of each in turn; exact resume, exactly once."""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter

import pytest

import audioloader as al
from audioloader.nodes import ArrowShardReader
from audioloader.shards import ShardDataset
from tests.helpers import assert_resumes_exactly, assert_same_batches, loader_factory, make_shards, roundtrip, take

ROWS = [13, 9, 18, 7, 11]  # 58 rows, batches of 3: splits of 3-4 rows
TOTAL = sum(ROWS)


@pytest.fixture(scope="module", params=["ipc_file", "parquet"])
def shards(request, shard_folder):
    return shard_folder(ROWS, request.param, batch_rows=3, seconds=0.3)


@pytest.fixture(scope="module")
def dataset(shards) -> ShardDataset:
    return ShardDataset(shards, columns=["uid"], split_rows=4)


def split_of(dataset: ShardDataset, index: int) -> int:
    file_id, row = dataset.locate(index)
    return next(s.split_id for s in dataset.splits if s.file_id == file_id and s.start <= row < s.stop)


def keys(reader, n=None) -> list[tuple[int, int]]:
    items = list(reader) if n is None else [next(reader) for _ in range(n)]
    return [(s.key.index, s.key.pass_index) for s in items]


@pytest.mark.parametrize("interleave", [2, 4, 40])
def test_every_row_once_per_pass_and_k_splits_in_each_round(dataset, interleave):
    reader = ArrowShardReader.of(dataset, seed=3, interleave=interleave, infinite=True)
    two_passes = keys(reader, 2 * TOTAL)
    for pass_index in (0, 1):
        assert sorted(i for i, p in two_passes if p == pass_index) == list(range(TOTAL))
    order = [split_of(dataset, i) for i, _ in two_passes[:TOTAL]]
    k = min(interleave, len(dataset.splits))
    assert len(set(order[:k])) == k  # the first round: one row of each lane's split
    # Consecutive rows come from one split only once one lane is left (the last rows of the pass: < 4).
    repeats = [n for n, (a, b) in enumerate(itertools.pairwise(order)) if a == b]
    assert len(repeats) < 4 and all(n > TOTAL - 5 for n in repeats), repeats
    plain = [split_of(dataset, i) for i, _ in keys(ArrowShardReader.of(dataset, seed=3))]
    assert sum(a == b for a, b in itertools.pairwise(plain)) == TOTAL - len(dataset.splits)


def test_the_order_is_a_pure_function_of_the_seed(dataset):
    def order(seed):
        return keys(ArrowShardReader.of(dataset, seed=seed, interleave=4))

    assert order(5) == order(5) and order(5) != order(6)
    assert sorted(order(5)) == sorted(keys(ArrowShardReader.of(dataset, seed=5)))  # the same rows as without


@pytest.mark.parametrize("interleave", [3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_from_any_row_is_exact(dataset, interleave, shuffle):
    def reader():
        return ArrowShardReader.of(dataset, seed=9, interleave=interleave, shuffle=shuffle, infinite=True,
                                rank=1, world_size=2)

    reference = keys(reader(), 2 * TOTAL // 2 + 7)  # past the end of the rank's first pass
    for cut in range(len(reference)):
        first = reader()
        head = keys(first, cut)
        state = first.get_state()
        assert set(state) >= {"lanes", "turn"} and len(state["lanes"]) == interleave
        resumed = reader()
        resumed.reset(state)
        assert head + keys(resumed, len(reference) - cut) == reference, cut


loader_for = loader_factory(batch_size=4, seed=6, workers=al.Workers(num_workers=2, kind="thread"), columns=("uid",),
                            train_options={"shuffle": al.Shuffle(buffer_size=6, min_size=3, interleave=4)},
                            eval_options={"shuffle": al.Shuffle(interleave=4)})


@pytest.mark.parametrize("shuffle_before_decode", [False, True])
def test_train_resumes_bit_exactly_at_random_cut_points(shards, shuffle_before_decode):
    total = 34  # more than two passes of 58 rows
    build = functools.partial(loader_for, shards, shuffle=al.Shuffle(before_decode=shuffle_before_decode))
    assert_resumes_exactly(build, total, sorted(random.Random(2).sample(range(1, total), 4)),
                           workers=al.Workers(num_workers=0))


def test_batches_do_not_depend_on_workers(shards):
    with loader_for(shards, workers=al.Workers(num_workers=0)) as a, \
            loader_for(shards, workers=al.Workers(kind="process", num_workers=2)) as b:
        assert_same_batches(take(a, 10), take(b, 10))


@pytest.mark.parametrize("chain", ["fixed", "bucketing"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_reads_every_row_exactly_once(shards, world_size, chain):
    extra = {} if chain == "fixed" else {"length": al.LengthPolicy(crop=None),
                                         "batching": al.Bucketing(max_duration=1.0, num_buckets=3)}
    seen, counts = [], []
    for rank in range(world_size):
        with loader_for(shards, train=False, storage=al.Storage(rank=rank, world_size=world_size), **extra) as loader:
            batches = list(loader)
            assert len(batches) == len(loader)
            counts.append(len(batches))
            seen += [i for b in batches for i in b["index"][b["valid"]].tolist()]
    assert Counter(seen) == Counter(range(TOTAL)) and len(set(counts)) == 1


@pytest.mark.parametrize("train", [True, False])
def test_elastic_resume_delivers_the_rest_of_the_pass_once(shards, train):
    options = {"train": train, "infinite": False} if train else {"train": False}
    before, states = [], []
    for rank in range(2):
        with loader_for(shards, storage=al.Storage(rank=rank, world_size=2), **options) as loader:
            it = iter(loader)
            for _ in range(3):
                batch = next(it)
                before += batch["index"][batch["valid"]].tolist() if "valid" in batch else batch["index"].tolist()
            states.append(roundtrip(loader.state_dict()))
    after = []
    for rank in range(3):
        with loader_for(shards, storage=al.Storage(rank=rank, world_size=3), **options) as loader:
            loader.load_state_dict(states)
            after += [i for b in loader for i in (b["index"][b["valid"]] if "valid" in b else b["index"]).tolist()]
    assert Counter(before + after) == Counter(range(TOTAL))


def test_a_small_buffer_mixes_more_splits_into_each_batch(shards):
    figures = {}
    for interleave in (1, 4):
        shuffle = al.Shuffle(buffer_size=4, min_size=4, interleave=interleave)
        with loader_for(shards, shuffle=shuffle, batch_size=8, storage=al.Storage(split_rows=16),
                        infinite=False) as loader:  # 6 splits of 7-16 rows
            for _ in range(2):  # two whole passes: every batch counted, whatever the prefetcher did
                list(loader)
            figures[interleave] = loader.stats()["shuffle"]
    plain, interleaved = figures[1]["splits_per_batch"], figures[4]["splits_per_batch"]
    assert figures[1]["batches"] == figures[4]["batches"] == 16
    assert plain <= 2.5 and interleaved >= 2 * plain, (plain, interleaved)
    assert interleaved <= figures[4]["full_shuffle_splits_per_batch"]


def test_interleave_is_in_the_fingerprint_and_checked(shards):
    with loader_for(shards) as loader:
        take(loader, 2)
        state = loader.state_dict()
    with loader_for(shards, shuffle=al.Shuffle(buffer_size=6, min_size=3, interleave=1)) as plain, \
            pytest.raises(al.CheckpointMismatchError) as info:
        plain.load_state_dict(state)
    assert "interleave" in info.value.fields
    with pytest.raises(ValueError, match=r"Shuffle\.interleave=0: must be an integer >= 1"):
        al.Shuffle(interleave=0)
    with pytest.raises(ValueError, match="interleave=0 must be an int >= 1"):
        ArrowShardReader.of(shards, interleave=0)


def test_a_mix_of_interleaved_sources_reads_every_row_of_each_once(shards, tmp_path):
    make_shards(tmp_path, [10, 6], "ipc_stream", batch_rows=2, seconds=0.3)
    mix = al.Mix({"a": (shards, 2.0), "b": (tmp_path, 1.0)})
    seen = []
    for rank in range(2):
        with loader_for(mix, train=False, storage=al.Storage(rank=rank, world_size=2)) as loader:
            seen += [(s, i) for b in loader for s, i, ok in zip(b["source"].tolist(), b["index"].tolist(),
                                                                b["valid"].tolist(), strict=True) if ok]
    assert Counter(seen) == Counter([(0, i) for i in range(TOTAL)] + [(1, i) for i in range(16)])
