"""torch.distributed.checkpoint: `LoaderState` saves every rank's position and resumes exactly, or elastically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from audioloader.errors import CheckpointMismatchError
from audioloader.integrations.dcp import LoaderState
from tests.helpers import assert_same_batches, loader_for, take

ROOT = Path(__file__).resolve().parents[1]
ROWS = [13, 9, 18, 7]  # 47 rows, splits of 4: uneven shares on 2 ranks
TOTAL = sum(ROWS)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP in one process


def test_dcp_save_and_load_in_one_process_resumes_exactly(ipc_shards, tmp_path):
    with loader_for(ipc_shards) as reference:
        expected = take(reference, 6)
    with loader_for(ipc_shards) as loader:
        take(loader, 2)
        dcp.save({"data": LoaderState(loader)}, checkpoint_id=str(tmp_path / "checkpoint"))
        take(loader, 2)  # the saving run goes on: the checkpoint holds the position at the save
    with loader_for(ipc_shards) as resumed:
        dcp.load({"data": LoaderState(resumed)}, checkpoint_id=str(tmp_path / "checkpoint"))
        assert_same_batches(take(resumed, 4), expected[2:])


def test_dcp_checkpoint_of_another_loader_is_refused_naming_the_difference(ipc_shards, tmp_path):
    with loader_for(ipc_shards) as loader:
        take(loader, 1)
        dcp.save({"data": LoaderState(loader)}, checkpoint_id=str(tmp_path / "checkpoint"))
    with loader_for(ipc_shards, batch_size=4) as other, pytest.raises(CheckpointMismatchError, match="batch_size"):
        dcp.load({"data": LoaderState(other)}, checkpoint_id=str(tmp_path / "checkpoint"))
    with loader_for(ipc_shards) as loader, pytest.raises(ValueError, match=r"expected \{'ranks': \[bytes"):
        LoaderState(loader).load_state_dict(loader.state_dict())  # a plain loader state is not LoaderState's


def torchrun(ranks: int, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "tests/dcp_worker.py", *args]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow  # three torchrun launches: 2-3 minutes on a busy 2-core machine
def test_dcp_two_ranks_resume_exactly_on_two_and_elastically_on_one(shard_folder, tmp_path):
    shards = shard_folder(ROWS, "ipc_file", batch_rows=4, seconds=0.3)
    torchrun(2, "save", str(shards), str(tmp_path))
    saved = json.loads((tmp_path / "save-2.json").read_text())
    assert all(saved["before"]) and all(saved["digests"])  # each rank had batches on both sides of the save
    # Fresh processes on 2 ranks: each rank delivers, bit for bit, the batches the uninterrupted run did.
    torchrun(2, "resume", str(shards), str(tmp_path))
    resumed = json.loads((tmp_path / "resume-2.json").read_text())
    assert resumed["digests"] == saved["digests"]
    # On 1 rank: the rows both old ranks had left, each exactly once (the pass completes with no row lost or repeated).
    torchrun(1, "resume", str(shards), str(tmp_path))
    alone = json.loads((tmp_path / "resume-1.json").read_text())
    counts = Counter([i for rows in saved["before"] for i in rows] + alone["rows"][0])
    assert sorted(counts) == list(range(TOTAL)) and set(counts.values()) == {1}
    assert sorted(alone["rows"][0]) == sorted(i for rows in saved["rows"] for i in rows)

