"""ORC files as shards: stripes are the units, counted once at construction; exactly once, exact resume."""

from __future__ import annotations

import functools
import random
from collections import Counter

import pyarrow.orc as orc
import pytest

import audioloader as al
from tests.helpers import assert_resumes_exactly, audio_table, loader_factory, write_orc

ROWS = [13, 9, 18, 7]  # 47 rows in stripes of 4: 4, 3, 5 and 2 stripes
TOTAL = sum(ROWS)


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder(ROWS, "orc", batch_rows=4, seconds=0.3)


loader_for = loader_factory(batch_size=4, seed=5, workers=al.Workers(num_workers=2, kind="thread"), columns=("uid",),
                            train_options={"shuffle": al.Shuffle(buffer_size=10, min_size=5)})


def test_stripes_are_the_units(shards):
    dataset = al.ShardDataset(shards, split_rows=4)
    assert [f.format for f in dataset.files] == ["orc"] * 4
    assert [f.batch_rows for f in dataset.files] == [(4, 4, 4, 1), (4, 4, 1), (4, 4, 4, 4, 2), (4, 3)]
    assert [(s.file_id, s.start, s.stop) for s in dataset.splits][:4] == [(0, 0, 4), (0, 4, 8), (0, 8, 12),
                                                                          (0, 12, 13)]


def test_stripe_rows_are_counted_once_from_the_cheapest_column(tmp_path, monkeypatch):
    write_orc(tmp_path / "a.orc", audio_table(0, 10, seconds=0.02), stripe_rows=4)  # stripes 4, 4, 2
    write_orc(tmp_path / "b.orc", audio_table(10, 3, seconds=0.02), stripe_rows=4)  # one stripe: nothing read
    reads = []
    original = orc.ORCFile.read_stripe

    def spy(self, i, columns=None):
        reads.append((i, tuple(columns)))
        return original(self, i, columns=columns)

    monkeypatch.setattr(orc.ORCFile, "read_stripe", spy)
    dataset = al.ShardDataset(tmp_path, columns=("uid", "name"), split_rows=4)
    # The last stripe's rows are the file's rows less the others': two reads of one int64 column, no audio.
    assert reads == [(0, ("label",)), (1, ("label",))]
    assert [f.batch_rows for f in dataset.files] == [(4, 4, 2), (3,)]
    reads.clear()
    rows = dataset.read_rows([9, 10, 0])
    assert [(r.extras["uid"], r.label) for r in rows] == [(9, 0), (10, 1), (0, 0)]
    assert sorted(reads) == [(0, ("audio", "label", "uid", "name")), (0, ("audio", "label", "uid", "name")),
                             (2, ("audio", "label", "uid", "name"))]  # random access by stripe, no counting


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_eval_reads_every_row_exactly_once_across_ranks(shards, world_size):
    seen, counts = [], []
    for rank in range(world_size):
        with loader_for(shards, train=False, storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            batches = list(loader)
            assert len(batches) == len(loader)
            counts.append(len(batches))
            for b in batches:
                valid = b["valid"]
                assert b["uid"][valid].tolist() == b["index"][valid].tolist()  # the row is the one its index names
                assert b["label"][valid].tolist() == [i % 3 for i in b["index"][valid].tolist()]
                seen += b["index"][valid].tolist()
    assert Counter(seen) == Counter(range(TOTAL))
    assert len(set(counts)) == 1  # equal batch counts on every rank (DDP steps)


@pytest.mark.parametrize("shuffle_before_decode", [False, True])
def test_train_resumes_exactly_at_random_cut_points(shards, shuffle_before_decode):
    total = 30  # more than two passes
    build = functools.partial(loader_for, shards, shuffle=al.Shuffle(before_decode=shuffle_before_decode))
    assert_resumes_exactly(build, total, sorted(random.Random(14).sample(range(1, total), 3)),
                           workers=al.Workers(num_workers=1))
