"""Settings groups passed whole: `ShardDataset(source, storage=...)` and `ArrowShardReader.of(..., storage=...)` read
exactly what the same fields given one by one read; a field given both ways, or a share given twice, is refused by
name. Augmentations are handed the reader of their rows; a mix's stop is resolved where the user gives it."""

from __future__ import annotations

import numpy as np
import pytest
from torchdata.nodes import StopCriteria

import audioloader as al
from audioloader.checkpoint import Resume
from audioloader.dsp.augment import Augmentations
from audioloader.mix import stop_criterion
from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.nodes.batcher import Batcher, BatchLayout
from audioloader.nodes.duration_bucketer import BucketLimits, DurationBucketer
from audioloader.nodes.read_order import ReadPlan
from audioloader.nodes.shuffle_buffer import BufferLimits, ShuffleBuffer
from audioloader.nodes.weighted_mix import WeightedMix
from audioloader.samples import Key
from audioloader.shards import ShardDataset
from audioloader.shards.dataset.augment_rows import AugmentRows

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
        grouped = ArrowShardReader.of(folder, storage=al.Storage(rank=rank, world_size=2, split_rows=4),
                                      shuffle=shuffle, seed=3)
        loose = ArrowShardReader.of(folder, rank=rank, world_size=2, split_rows=4, shuffle=shuffle, seed=3)
        assert (grouped.rank, grouped.world_size) == (rank, 2)
        assert keys(grouped) == keys(loose)


def test_a_share_given_twice_or_files_beside_a_dataset_are_refused(folder):
    with pytest.raises(ValueError, match=r"share once.*Storage\(rank=\.\.\., world_size=\.\.\.\)"):
        ArrowShardReader.of(folder, storage=al.Storage(rank=0, world_size=2), rank=1, world_size=2)
    dataset = ShardDataset(folder, split_rows=4)
    with pytest.raises(ValueError, match="gives only this rank's share"):
        ArrowShardReader.of(dataset, storage=al.Storage(split_rows=8))
    with pytest.raises(ValueError, match=r"ArrowShardReader\(storage=\.\.\., split_rows=\.\.\.\): give it once"):
        ArrowShardReader.of(folder, storage=al.Storage(), split_rows=8)
    shared = ArrowShardReader.of(dataset, storage=al.Storage(rank=1, world_size=2), shuffle=False)
    assert keys(shared) == keys(ArrowShardReader.of(dataset, rank=1, world_size=2, shuffle=False))


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
    readers = {"a": ArrowShardReader.of(folder, seed=0), "b": ArrowShardReader.of(folder, seed=1)}
    node = WeightedMix(readers, {"a": 1.0, "b": 1.0}, stop=stop_criterion(StopCriteria.FIRST_DATASET_EXHAUSTED))
    assert node.stop == "first_exhausted"
    with pytest.raises(ValueError, match=r"stop='never'.*must be one of.*stop_criterion"):
        WeightedMix(readers, {"a": 1.0, "b": 1.0}, stop="never")


# -- the nodes' own groups, settled before the chain (issue 30, step 2) ------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_reader_built_from_a_read_plan_reads_what_its_arguments_read(folder, shuffle):
    dataset = ShardDataset(folder, storage=al.Storage(split_rows=4))
    for rank in range(3):
        options = dict(seed=5, rank=rank, world_size=3, shuffle=shuffle, interleave=2)
        plan = ReadPlan.of(dataset, **options)
        planned = ArrowShardReader(dataset, plan=plan)
        assert planned.plan is plan and keys(planned) == keys(ArrowShardReader.of(dataset, **options))
        assert plan.splits_for_pass(1) == ArrowShardReader.of(dataset, **options).splits_for_pass(1)


def test_a_read_plan_holds_the_share_and_the_reader_takes_nothing_beside_it(folder):
    dataset = ShardDataset(folder)
    plan = ReadPlan.of(dataset, rank=1, world_size=2)
    with pytest.raises(TypeError, match=r"ArrowShardReader\(\.\.\.\) takes a ShardDataset and its ReadPlan.*\(seed=\)"
                                        r".*use ArrowShardReader\.of\(\.\.\.\)"):
        ArrowShardReader(dataset, plan=plan, seed=3)
    with pytest.raises(TypeError, match=r"takes a ShardDataset and its ReadPlan.*ArrowShardReader\.of"):
        ArrowShardReader(folder, plan=plan)
    with pytest.raises(ValueError, match=r"rank=2 must be in \[0, world_size=2\)"):
        ReadPlan.of(dataset, rank=2, world_size=2)
    with pytest.raises(ValueError, match="interleave=0 must be an int >= 1"):
        ReadPlan.of(dataset, interleave=0)


def test_buffer_bucketer_and_batcher_take_their_group_or_its_fields_and_check_them_once(folder):
    rows = ArrowShardReader.of(folder, shuffle=False)
    limits = BufferLimits(6, 2, one_pass=True)
    assert keys(ShuffleBuffer(rows, limits=limits, seed=1)) == keys(ShuffleBuffer.of(rows, 6, 2, seed=1, one_pass=True))
    with pytest.raises(ValueError, match=r"min_size=9: must be an integer in \[0, capacity=6\]"):
        ShuffleBuffer.of(rows, 6, 9)
    with pytest.raises(TypeError, match=r"takes its limits as one BufferLimits.*\(capacity=\).*ShuffleBuffer\.of"):
        ShuffleBuffer(rows, limits=limits, capacity=6)
    bucketed = DurationBucketer(rows, limits=BucketLimits(0.05, (0.01, 0.03)))
    assert bucketed.boundaries == [0.01, 0.03] and bucketed.max_duration == 0.05
    with pytest.raises(ValueError, match="must be ascending"):
        DurationBucketer.of(rows, max_duration=1.0, boundaries=[2.0, 1.0])
    with pytest.raises(TypeError, match=r"one BucketLimits.*\(max_duration=\).*DurationBucketer\.of"):
        DurationBucketer(rows, max_duration=1.0, limits=BucketLimits(1.0))
    layout = BatchLayout(4, drop_last=True, columns=["uid"])
    assert (Batcher(rows, layout=layout).layout, Batcher(rows, layout=layout).drop_last) == (layout, True)
    with pytest.raises(TypeError, match=r"one BatchLayout.*\(batch_size=\).*Batcher\.of"):
        Batcher(rows, layout=layout, batch_size=4)
    with pytest.raises(ValueError, match="num_batches needs spectrogram_shape"):
        Batcher.of(rows, 4, num_batches=2)


@pytest.mark.parametrize("train", [True, False])
def test_the_loader_hands_each_node_the_group_settled_before_the_chain(folder, train):
    with al.AudioLoader(folder, batch_size=4, train=train, storage=al.Storage(split_rows=4),
                        workers=al.Workers(num_workers=0)) as loader:
        s, chain = loader.settings, loader._chain
        assert chain.readers[0].plan is s.reads[0] and chain.batcher.layout is s.batch_layout
        assert chain.buffer is None or chain.buffer.limits is s.buffer_limits
        assert s.batch_layout.num_batches == s.num_batches == (None if train else len(loader))


def test_a_checkpoint_is_read_once_for_this_rank_or_for_an_elastic_resume():
    def state(rank, world):
        return {"format": al.audio_loader.STATE_FORMAT, "fingerprint": {"rank": rank, "world_size": world},
                "loader": {"rank": rank}}

    one = Resume.of(state(1, 2), rank=1, world_size=2)
    assert (one.states, one.elastic, one.ignore) == ([state(1, 2)], False, ())
    mine = Resume.of([state(1, 2), state(0, 2)], rank=1, world_size=2)
    assert mine.states == [state(1, 2)] and not mine.elastic
    elastic = Resume.of([state(2, 3), state(0, 3), state(1, 3)], rank=0, world_size=2)
    assert [s["loader"]["rank"] for s in elastic.states] == [0, 1, 2] and elastic.elastic
    assert elastic.fingerprint == state(0, 3)["fingerprint"] and elastic.ignore == ("rank", "world_size")
    with pytest.raises(al.CheckpointMismatchError, match="not an AudioLoader state dict"):
        Resume.of([state(0, 2), {"format": "other"}], rank=0, world_size=2)
