"""Elastic resume: all ranks' checkpoints of a W-rank run resumed on W' ranks deliver the rest of the pass once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import audioloader as al
from tests.helpers import loader_factory, roundtrip

ROWS = [13, 9, 18, 7]  # 47 rows
TOTAL = sum(ROWS)


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder(ROWS, "ipc_file", batch_rows=4, seconds=0.3)


_loader = loader_factory(batch_size=4, seed=7, workers=al.Workers(num_workers=1, kind="thread"),
                         train_options={"shuffle": al.Shuffle(buffer_size=10, min_size=5), "infinite": False})


def loader_for(source, rank, world_size, **kwargs) -> al.AudioLoader:
    return _loader(source, storage=al.Storage(rank=rank, world_size=world_size), **kwargs)


def delivered(batch) -> list[int]:
    index = batch["index"]
    return index[batch["valid"]].tolist() if "valid" in batch else index.tolist()


def interrupted_run(source, world_size, batches, **kwargs) -> tuple[list[int], list[dict]]:
    """Each rank takes ``batches`` batches, then checkpoints: the rows delivered, and every rank's state."""
    seen, states = [], []
    for rank in range(world_size):
        with loader_for(source, rank, world_size, **kwargs) as loader:
            it = iter(loader)
            for _ in range(batches):
                seen += delivered(next(it))
            states.append(roundtrip(loader.state_dict()))
    return seen, states


def resumed_run(source, world_size, states, **kwargs) -> tuple[list[int], list[list]]:
    """Each new rank loads every old state and runs to the end of the pass."""
    seen, batches = [], []
    for rank in range(world_size):
        with loader_for(source, rank, world_size, **kwargs) as loader:
            loader.load_state_dict(states)
            mine = list(loader)
            batches.append(mine)
            seen += [i for b in mine for i in delivered(b)]
    return seen, batches


CHAINS = {
    "eval": dict(train=False),
    "train, decoded buffer": dict(shuffle=al.Shuffle(before_decode=False)),
    "train, raw buffer": dict(shuffle=al.Shuffle(before_decode=True)),
    "train, processes": dict(workers=al.Workers(kind="process", num_workers=2)),
    "eval, bucketing": dict(train=False, length=al.LengthPolicy(crop=None),
                            batching=al.Bucketing(max_duration=1.0, num_buckets=3)),
    "train, bucketing": dict(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=1.0, num_buckets=3)),
    "train, mixup": dict(augment=[al.Gain(), al.Mixup()]),  # a per-batch stage after the batcher
    # The bucket count fitted to a rank's pass differs with the world size: a resume keeps the checkpoint's.
    "eval, fitted buckets": dict(train=False, length=al.LengthPolicy(crop=None),
                                 batching=al.Bucketing(max_duration=1.0)),
    "train, fitted buckets": dict(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=1.0)),
}


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize(("old", "new"), [(2, 3), (2, 1), (3, 2)])
def test_rest_of_the_pass_is_delivered_exactly_once(shards, chain, old, new):
    before, states = interrupted_run(shards, old, 2, **CHAINS[chain])
    after, _ = resumed_run(shards, new, states, **CHAINS[chain])
    counts = Counter(before + after)
    assert sorted(counts) == list(range(TOTAL)) and set(counts.values()) == {1}, \
        f"missing {sorted(set(range(TOTAL)) - set(counts))}, twice {[i for i, n in counts.items() if n > 1]}"
    assert len(set(after) & set(before)) == 0


@pytest.mark.parametrize("chain", ["eval", "eval, bucketing"])
def test_eval_ranks_yield_equal_batch_counts_and_len_says_so(shards, chain):
    _, states = interrupted_run(shards, 2, 1, **CHAINS[chain])
    _, batches = resumed_run(shards, 3, states, **CHAINS[chain])
    assert len({len(b) for b in batches}) == 1
    with loader_for(shards, 1, 3, **CHAINS[chain]) as loader:
        loader.load_state_dict(states)
        assert len(loader) == len(batches[1])
    with loader_for(shards, 1, 3, **CHAINS[chain]) as fresh:
        full = len(fresh)
    with loader_for(shards, 1, 3, **CHAINS[chain]) as loader:
        loader.load_state_dict(states)
        list(loader)
        assert len(list(loader)) == full  # the next pass is a whole one, in the new layout


def test_resumed_batches_are_deterministic_and_resume_again_exactly(shards):
    _, states = interrupted_run(shards, 2, 2)
    with loader_for(shards, 0, 3) as a, loader_for(shards, 0, 3) as b:
        a.load_state_dict(states)
        b.load_state_dict(states)
        first, second = list(a), list(b)
    assert [x["index"].tolist() for x in first] == [y["index"].tolist() for y in second]
    assert all(torch.equal(x["spectrogram"], y["spectrogram"]) for x, y in zip(first, second, strict=True))
    # A checkpoint taken after the elastic resume resumes exactly, on the same world size.
    with loader_for(shards, 0, 3) as loader:
        loader.load_state_dict(states)
        it = iter(loader)
        head = [next(it)]
        state = roundtrip(loader.state_dict())
    with loader_for(shards, 0, 3) as resumed:
        resumed.load_state_dict(state)
        tail = list(resumed)
    assert [x["index"].tolist() for x in head + tail] == [x["index"].tolist() for x in first]


def test_infinite_training_continues_with_the_next_pass_in_the_new_layout(shards):
    # A pass-through buffer reading one split at a time keeps passes visible: rank r's rows are its share of
    # pass 0, then of pass 1...
    options = dict(shuffle=al.Shuffle(buffer_size=1, min_size=0, interleave=1), infinite=True)
    readers = [loader_for(shards, r, 2, **options) for r in range(2)]
    shares = [[s.num_rows for s in loader.reader.splits_for_pass(0)] for loader in readers]
    for loader in readers:
        loader.shutdown()
    before_rows = [sum(shares[0]) + 2, sum(shares[1]) - 5]  # rank 0 is into pass 1, rank 1 still in pass 0
    before = {0: Counter(), 1: Counter()}
    states = []
    for rank in range(2):
        with loader_for(shards, rank, 2, batch_size=1, **options) as loader:
            it = iter(loader)
            rows = [next(it)["index"].item() for _ in range(before_rows[rank])]
            pass0 = sum(shares[rank])
            before[0].update(rows[:pass0])
            before[1].update(rows[pass0:])
            states.append(loader.state_dict())
    carry_rows, after = {0: Counter(), 1: Counter()}, []
    for rank in range(3):
        with loader_for(shards, rank, 3, batch_size=1, **options) as loader:
            loader.load_state_dict(states)
            carry = [al.nodes.arrow_shard_reader.Segment.from_list(s)
                     for s in loader.reader.plan.start.get("carry", [])]
            n = sum(loader.reader.segment_rows(s) for s in carry)
            next_pass = sum(s.num_rows for s in loader.reader.splits_for_pass(2))
            it = iter(loader)
            rows = [next(it)["index"].item() for _ in range(n + next_pass)]
            cursor = 0
            for segment in carry:
                size = loader.reader.segment_rows(segment)
                carry_rows[segment.pass_index].update(rows[cursor:cursor + size])
                cursor += size
            after += rows[n:]
    for pass_index in (0, 1):
        counts = before[pass_index] + carry_rows[pass_index]
        assert sorted(counts) == list(range(TOTAL)) and set(counts.values()) == {1}, pass_index
    assert sorted(after) == list(range(TOTAL))  # pass 2, whole, in the new layout


def test_refusals_name_the_field(shards):
    _, states = interrupted_run(shards, 2, 1)
    with loader_for(shards, 0, 3) as loader, pytest.raises(al.CheckpointMismatchError, match="rank") as info:
        loader.load_state_dict(states[:1])
    assert "rank" in info.value.fields
    with loader_for(shards, 0, 3) as loader, pytest.raises(al.CheckpointMismatchError, match="exactly once"):
        loader.load_state_dict([states[0], states[0]])
    with loader_for(shards, 0, 3, seed=8) as loader, pytest.raises(al.CheckpointMismatchError) as info:
        loader.load_state_dict(states)
    assert "seed" in info.value.fields and "world_size" not in info.value.fields
    _, other = interrupted_run(shards, 2, 1, batch_size=2)
    with loader_for(shards, 0, 3) as loader, pytest.raises(al.CheckpointMismatchError, match="batch_size"):
        loader.load_state_dict([states[0], other[1]])


def test_same_world_size_list_is_the_plain_resume(shards):
    _, states = interrupted_run(shards, 2, 2)
    with loader_for(shards, 1, 2) as a, loader_for(shards, 1, 2) as b:
        a.load_state_dict(states)
        b.load_state_dict(states[1])
        assert [x["index"].tolist() for x in a] == [y["index"].tolist() for y in b]


def torchrun(ranks: int, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "tests/elastic_worker.py", *args]
    result = subprocess.run(command, cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_torchrun_two_ranks_resumed_on_three_and_on_one(shards, tmp_path):
    torchrun(2, "save", str(shards), str(tmp_path))
    saved = json.loads((tmp_path / "save-2.json").read_text())
    for ranks in (3, 1):
        torchrun(ranks, "resume", str(shards), str(tmp_path))
        resumed = json.loads((tmp_path / f"resume-{ranks}.json").read_text())
        for mode in ("train", "eval"):
            counts = Counter(saved[mode] + resumed[mode])
            assert sorted(counts) == list(range(TOTAL)) and set(counts.values()) == {1}, (ranks, mode)
            assert saved[mode] and resumed[mode]
        assert len(set(resumed["eval-batches"])) == 1  # every new rank runs the same number of eval steps
