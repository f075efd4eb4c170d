"""Rank-aware loading: single-process with explicit ranks, and a real torchrun launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import audioloader as al
from tests.helpers import SMALL

UNEVEN = [7, 5, 11, 3]  # 26 rows, splits of up to 4 rows -> uneven shares


@pytest.fixture(scope="module")
def uneven_shards(shard_folder) -> Path:
    return shard_folder(UNEVEN, "ipc_file", batch_rows=4, seconds=0.3)


def eval_loader(source, rank, world_size, batch_size=4):
    return al.AudioLoader(source, batch_size=batch_size, train=False, features=SMALL, workers=al.Workers(num_workers=1),
                          storage=al.Storage(split_rows=4, rank=rank, world_size=world_size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_eval_exactly_once_with_equal_batch_counts(uneven_shards, world_size):
    seen, counts = [], []
    for rank in range(world_size):
        with eval_loader(uneven_shards, rank, world_size) as loader:
            batches = list(loader)
            counts.append(len(batches))
            assert len(batches) == len(loader)
            for batch in batches:
                valid = batch["valid"]
                seen.extend(batch["index"][valid].tolist())
                assert (batch["index"][~valid] == -1).all()
    assert sorted(seen) == list(range(sum(UNEVEN)))
    assert len(set(counts)) == 1


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_train_pass_is_disjoint_between_ranks(uneven_shards, world_size):
    shares = []
    for rank in range(world_size):
        with al.AudioLoader(uneven_shards, batch_size=1, features=SMALL, workers=al.Workers(num_workers=1),
                            storage=al.Storage(split_rows=4, rank=rank, world_size=world_size),
                            shuffle=al.Shuffle(buffer_size=1, min_size=0)) as loader:
            rows = sum(split.num_rows for split in loader.reader.splits_for_pass(0))
            it = iter(loader)
            shares.append([next(it)["index"].item() for _ in range(rows)])
    flat = [i for share in shares for i in share]
    assert sorted(flat) == list(range(sum(UNEVEN)))


def test_rank_validation():
    with pytest.raises(ValueError, match="rank"):
        al.AudioLoader("unused", storage=al.Storage(rank=2, world_size=2))
    with pytest.raises(ValueError, match="rank"):
        al.AudioLoader("unused", storage=al.Storage(rank=-1, world_size=2))
    with pytest.raises(ValueError, match="world_size"):
        al.AudioLoader("unused", storage=al.Storage(rank=0, world_size=0))


def test_torchrun_two_ranks(uneven_shards, tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "tests/ddp_worker.py", str(uneven_shards), str(out)]
    result = subprocess.run(command, cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert [r["eval"]["rank"] for r in reports] == [0, 1]
    assert all(r["eval"]["world_size"] == 2 for r in reports)
    # eval: every row exactly once across ranks, and equal batch counts
    valid = [i for r in reports for i in r["eval"]["valid_indices"]]
    assert sorted(valid) == list(range(sum(UNEVEN)))
    assert len({r["eval"]["batches"] for r in reports}) == 1
    assert all(r["eval"]["batches"] == r["eval"]["len"] for r in reports)
    # training: a pass is split between the ranks with no overlap
    train = [i for r in reports for i in r["train_pass0"]]
    assert sorted(train) == list(range(sum(UNEVEN)))
    # resume per rank is exact; another rank's state is refused
    assert all(r["resume_exact"] for r in reports)
    assert all("rank" in r["foreign_state"] for r in reports)


def test_torch_distributed_defaults_are_used_when_initialized(uneven_shards, tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with eval_loader(uneven_shards, None, None) as loader:
            assert (loader.rank, loader.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()
    assert torch.distributed.is_available()


@pytest.mark.slow
def test_ddp_example_trains_and_evaluates(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "examples/ddp_train.py", "--steps", "40", "--data", str(tmp_path)]
    result = subprocess.run(command, cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "eval accuracy" in result.stdout
    assert (tmp_path / "loader-rank0.pt").exists() and (tmp_path / "loader-rank1.pt").exists()
