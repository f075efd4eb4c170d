"""The shuffle-quality figures in stats(): displacement and splits/sources per batch, and their references."""

from __future__ import annotations

from pathlib import Path

import pytest

import audioloader as al
from audioloader.nodes import ShuffleBuffer
from audioloader.samples import Key
from audioloader.stats import LoaderStats, ShuffleQuality
from tests.helpers import SMALL, CountingSource, Item, take


@pytest.mark.parametrize(("capacity", "min_size"), [(1, 0), (7, 3), (50, 50)])
def test_displacement_is_the_distance_between_arrival_and_emission(capacity, min_size):
    stats = LoaderStats()
    buffer = ShuffleBuffer.of(CountingSource(300), capacity, min_size, seed=4, stats=stats)
    emitted = [item.key.index for item in buffer]
    expected = sum(abs(position - index) for position, index in enumerate(emitted)) / len(emitted)
    figures = stats.snapshot()["shuffle"]
    assert figures["displaced_samples"] == 300
    assert figures["mean_displacement"] == pytest.approx(expected)
    if capacity == 1:
        assert expected == 0


def test_items_restored_from_a_checkpoint_are_not_counted():
    stats = LoaderStats()
    first = ShuffleBuffer.of(CountingSource(100), 10, 10, seed=4, restore=lambda keys: [Item(k) for k in keys])
    for _ in range(30):
        next(first)
    resumed = ShuffleBuffer.of(CountingSource(100), 10, 10, seed=4, restore=lambda keys: [Item(k) for k in keys],
                            stats=stats)
    state = first.state_dict()
    restored = len(state["indices"])
    assert restored > 0
    resumed.reset(state)
    assert len(list(resumed)) == 70
    assert stats.snapshot()["shuffle"]["displaced_samples"] == 70 - restored  # restored ones have no arrival


def test_splits_and_sources_per_batch_count_distinct_ones():
    quality = ShuffleQuality()
    quality.configure([[(0, 4), (4, 4), (8, 4)], [(0, 10)]], weights=[0.5, 0.5], batch_size=4)
    quality.add_batch([Key(0, 0), Key(3, 1), Key(9, 0), Key(2, 0, 1)])  # splits 0, 0, 2 of source 0; source 1
    quality.add_batch([Key(5, 0), Key(6, 0)])
    summary = quality.summary(mixed=True)
    assert summary["splits_per_batch"] == (3 + 1) / 2
    assert summary["sources_per_batch"] == (2 + 1) / 2
    assert summary["full_shuffle_sources_per_batch"] == pytest.approx(2 * (1 - 0.5 ** 4))
    shares = [0.5 / 3] * 3 + [0.5]
    assert summary["full_shuffle_splits_per_batch"] == pytest.approx(sum(1 - (1 - p) ** 4 for p in shares))
    assert summary["full_shuffle_displacement"] == pytest.approx(22 / 3)


@pytest.fixture(scope="module")
def many_splits(shard_folder) -> Path:
    return shard_folder([60, 60, 60], batch_rows=4, seconds=0.3)  # 45 splits of 4 rows


def figures(folder: Path, buffer: int) -> dict:
    # One split at a time (the preset would read 16 at once from memory-mapped shards): the buffer alone mixes.
    with al.AudioLoader(folder, batch_size=8, features=SMALL, seed=2, storage=al.Storage(split_rows=4),
                        workers=al.Workers(num_workers=0),
                        shuffle=al.Shuffle(buffer_size=buffer, min_size=buffer, interleave=1)) as loader:
        take(loader, 18)
        return loader.stats()["shuffle"]


def test_a_bigger_buffer_mixes_more_and_the_figures_show_it(many_splits):
    none, small, large = figures(many_splits, 1), figures(many_splits, 16), figures(many_splits, 120)
    assert none["mean_displacement"] == 0
    assert none["splits_per_batch"] <= 3  # 8 consecutive rows of 4-row splits: 2 or 3 splits
    assert none["splits_per_batch"] < small["splits_per_batch"] < large["splits_per_batch"]
    assert none["mean_displacement"] < small["mean_displacement"] < large["mean_displacement"]
    reference = large["full_shuffle_splits_per_batch"]
    assert reference == pytest.approx(45 * (1 - (1 - 1 / 45) ** 8))
    assert large["splits_per_batch"] > 0.8 * reference
    assert large["full_shuffle_displacement"] == pytest.approx(180 / 3)
    assert "sources_per_batch" not in large  # a single source
