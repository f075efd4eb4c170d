"""Training frameworks for real: Lightning resumes bit-exactly, Accelerate on 2 processes, the examples run."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from audioloader.integrations.accelerate import AllRanksState
from tests.helpers import SMALL, assert_same_batches, loader_for, roundtrip, take

ROOT = Path(__file__).resolve().parents[1]

L = pytest.importorskip("lightning")


def digest(batch) -> str:
    h = hashlib.sha256()
    for name in ("spectrogram", "index", "label"):
        h.update(batch[name].contiguous().numpy().tobytes())
    return h.hexdigest()


class Recorder(L.LightningModule):
    """Trains a linear layer on mean log-mels and records each batch it trains and validates on."""

    def __init__(self, shards: Path) -> None:
        super().__init__()
        self.shards = shards
        self.layer = nn.Linear(SMALL.n_mels, 3)
        self.trained: list[tuple[int, str]] = []  # (global step, digest)
        self.validated: list[list[int]] = []  # the rows of each validation run

    def train_dataloader(self):
        return loader_for(self.shards)  # infinite: Lightning's fetcher takes a batch ahead

    def val_dataloader(self):
        return loader_for(self.shards, train=False)

    def training_step(self, batch, batch_idx):
        self.trained.append((self.global_step, digest(batch)))
        return nn.functional.cross_entropy(self.layer(batch["spectrogram"].mean(-1)), batch["label"])

    def on_validation_epoch_start(self):
        self.validated.append([])

    def validation_step(self, batch, batch_idx):
        self.validated[-1].extend(batch["index"][batch["valid"]].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(shards: Path, root: Path, steps: int, ckpt_path: Path | None = None, exact: bool = True) -> Recorder:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from audioloader.integrations.lightning import ExactResume

    module = Recorder(shards)
    callbacks = [ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=3, save_top_k=-1)]
    if exact:
        callbacks.insert(0, ExactResume())
    trainer = L.Trainer(max_steps=steps, val_check_interval=4, check_val_every_n_epoch=None, num_sanity_val_steps=2,
                        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, default_root_dir=root)
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


def test_lightning_fit_checkpoint_resume_trains_on_the_same_batches(ipc_shards, tmp_path):
    whole = fit(ipc_shards, tmp_path / "whole", 8)
    assert [step for step, _ in whole.trained] == list(range(8))
    # Validation: the sanity check's 2 batches, then a whole pass after steps 4 and 8 (every row once).
    assert [sorted(rows) for rows in whole.validated[1:]] == [list(range(40))] * 2
    for step in (3, 6):
        resumed = fit(ipc_shards, tmp_path / f"from{step}", 8, ckpt_path=tmp_path / "whole" / f"step={step}.ckpt")
        assert resumed.trained == whole.trained[step:], f"resumed from step {step}"


def test_without_exact_resume_lightning_skips_the_prefetched_batch(ipc_shards, tmp_path):
    # The cause, pinned: Lightning's fetcher took batch 4 before the checkpoint after step 3 was saved.
    whole = fit(ipc_shards, tmp_path / "whole", 4, exact=False)
    resumed = fit(ipc_shards, tmp_path / "resumed", 6, ckpt_path=tmp_path / "whole" / "step=3.ckpt", exact=False)
    with loader_for(ipc_shards) as loader:
        reference = [digest(batch) for batch in take(loader, 7)]
    assert [d for _, d in whole.trained] == reference[:4]
    assert [d for _, d in resumed.trained] == reference[4:7]  # batch 3 (0-based) was never trained on


def test_all_ranks_state_in_one_process_resumes_exactly(ipc_shards):
    with loader_for(ipc_shards) as reference:
        expected = take(reference, 5)
    with loader_for(ipc_shards) as loader:
        take(loader, 2)
        state = roundtrip(AllRanksState(loader).state_dict())
    assert len(state["ranks"]) == 1
    with loader_for(ipc_shards) as resumed:
        AllRanksState(resumed).load_state_dict(state)
        assert_same_batches(take(resumed, 3), expected[2:])
    with pytest.raises(ValueError, match="expected \\{'ranks'"):
        AllRanksState(loader).load_state_dict(state["ranks"][0])


def run(command: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_lightning_example_resumes_exactly():
    out = run([sys.executable, "examples/lightning_train.py", "--quick"])
    assert re.search(r"uninterrupted: 8 steps; validation: \d+ clips", out), out
    assert "resumed from the checkpoint after step 3: 5 batches, identical to the uninterrupted run: True" in out, out


def test_accelerate_example_on_two_processes():
    pytest.importorskip("accelerate")
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "examples/accelerate_train.py", "--quick"])
    for rank in (0, 1):
        assert f"rank {rank}: resumed after step 2; 4 batches identical to the uninterrupted run: True" in out, out
    assert "2 processes read disjoint rows: True" in out, out
    assert "accelerator.prepare(loader) hands it back unwrapped: True" in out, out
