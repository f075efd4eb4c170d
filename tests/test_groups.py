"""Settings groups passed whole: `ShardDataset(source, storage=...)` and `ArrowShardReader(..., storage=...)` read
exactly what the same fields given one by one read; a field given both ways, or a share given twice, is refused by
name. Augmentations are handed the reader of their rows; a mix's stop is resolved where the user gives it."""

from __future__ import annotations

import numpy as np
import pytest
from torchdata.nodes import StopCriteria

import audioloader as al
from audioloader.dsp.augment import Augmentations
from audioloader.mix import stop_criterion
from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.nodes.weighted_mix import WeightedMix
from audioloader.samples import Key
from audioloader.shards import ShardDataset
from audioloader.shards.augment_rows import AugmentRows

from .helpers import make_shards, noise_clip, write_audio

ROWS = [7, 13, 5, 9]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups")
    make_shards(root, ROWS, fmt="parquet", batch_rows=3, seconds=0.02)
    return root


def keys(reader) -> list[Key]:
    return [sample.key for sample in reader]


def test_a_dataset_built_from_the_storage_group_equals_one_built_field_by_field(folder):
    grouped = ShardDataset(folder, columns=["uid"], storage=al.Storage(split_rows=4, max_requests=3))
    loose = ShardDataset(folder, columns=["uid"], split_rows=4, remote_reads=al.Storage(max_requests=3).remote_reads())
    assert grouped.splits == loose.splits and grouped.split_rows == 4
    assert grouped.remote_reads == loose.remote_reads
    assert grouped.read_rows([0, 20]) == loose.read_rows([0, 20])


def test_a_field_given_beside_the_group_is_refused_by_name(folder):
    with pytest.raises(ValueError, match=r"split_rows=.*give it once.*Storage\(split_rows=4"):
        ShardDataset(folder, storage=al.Storage(), split_rows=4)
    with pytest.raises(TypeError, match=r"storage must be an audioloader\.Storage"):
        ShardDataset(folder, storage={"split_rows": 4})


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_reader_takes_its_share_and_its_files_from_the_group(folder, shuffle):
    for rank in range(2):
        grouped = ArrowShardReader(folder, storage=al.Storage(rank=rank, world_size=2, split_rows=4), shuffle=shuffle,
                                   seed=3)
        loose = ArrowShardReader(folder, rank=rank, world_size=2, split_rows=4, shuffle=shuffle, seed=3)
        assert (grouped.rank, grouped.world_size) == (rank, 2)
        assert keys(grouped) == keys(loose)


def test_a_share_given_twice_or_files_beside_a_dataset_are_refused(folder):
    with pytest.raises(ValueError, match=r"share once.*Storage\(rank=\.\.\., world_size=\.\.\.\)"):
        ArrowShardReader(folder, storage=al.Storage(rank=0, world_size=2), rank=1, world_size=2)
    dataset = ShardDataset(folder, split_rows=4)
    with pytest.raises(ValueError, match="gives only this rank's share"):
        ArrowShardReader(dataset, storage=al.Storage(split_rows=8))
    with pytest.raises(ValueError, match=r"ArrowShardReader\(storage=\.\.\., split_rows=\.\.\.\): give it once"):
        ArrowShardReader(folder, storage=al.Storage(), split_rows=8)
    shared = ArrowShardReader(dataset, storage=al.Storage(rank=1, world_size=2), shuffle=False)
    assert keys(shared) == keys(ArrowShardReader(dataset, rank=1, world_size=2, shuffle=False))


def test_augmentations_read_their_rows_through_the_reader_they_are_given(tmp_path):
    noise = write_audio(tmp_path / "noise.arrow", [noise_clip(0, 0.3), noise_clip(1, 0.2)])
    with pytest.raises(TypeError, match=r"augment\[1\] \(AddNoise\) reads rows of its shards.*open_rows="):
        Augmentations([al.Gain(), al.AddNoise(noise)], 0, al.WaveformConfig())
    bound = Augmentations([al.Gain(), al.AddNoise(noise)], 0, al.WaveformConfig(), open_rows=AugmentRows)
    rows = bound.ops[1].rows
    assert isinstance(rows, AugmentRows) and rows.num_rows == 2
    assert [d.files for d in bound.datasets()[1:]] == [ShardDataset(noise, label_column=None).files]
    audio, file, row = rows.read(1)
    assert (file, row) == (str(noise), 1) and len(np.frombuffer(audio, np.uint8)) > 0


def test_a_mix_stop_is_resolved_where_it_is_given_and_the_node_takes_the_value(folder):
    assert stop_criterion(StopCriteria.ALL_DATASETS_EXHAUSTED) == "all_exhausted"
    readers = {"a": ArrowShardReader(folder, seed=0), "b": ArrowShardReader(folder, seed=1)}
    node = WeightedMix(readers, {"a": 1.0, "b": 1.0}, stop=stop_criterion(StopCriteria.FIRST_DATASET_EXHAUSTED))
    assert node.stop == "first_exhausted"
    with pytest.raises(ValueError, match=r"stop='never'.*must be one of.*stop_criterion"):
        WeightedMix(readers, {"a": 1.0, "b": 1.0}, stop="never")
