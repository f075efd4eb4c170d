"""Training frameworks for real: Lightning resumes bit-exactly, Accelerate on 2 processes, the examples run."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import warnings
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

    def __init__(self, shards: Path, mode: str | None = None) -> None:
        super().__init__()
        self.shards = shards
        self.mode = mode  # a CombinedLoader mode to return the training loader in, or None: the loader itself
        self.layer = nn.Linear(SMALL.n_mels, 3)
        self.trained: list[tuple[int, str]] = []  # (global step, digest)
        self.validated: list[list[int]] = []  # the rows of each validation run

    def train_dataloader(self):
        loader = loader_for(self.shards)  # infinite: Lightning's fetcher takes a batch ahead
        if self.mode is None:
            return loader
        from lightning.pytorch.utilities import CombinedLoader

        return CombinedLoader([loader], mode=self.mode)

    def val_dataloader(self):
        return loader_for(self.shards, train=False)

    def training_step(self, batch, batch_idx):
        batch = batch[0] if isinstance(batch, list) else batch  # from a CombinedLoader: one batch of each loader
        self.trained.append((self.global_step, digest(batch)))
        return nn.functional.cross_entropy(self.layer(batch["spectrogram"].mean(-1)), batch["label"])

    def on_validation_epoch_start(self):
        self.validated.append([])

    def validation_step(self, batch, batch_idx):
        self.validated[-1].extend(batch["index"][batch["valid"]].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(shards: Path, root: Path, steps: int, ckpt_path: Path | None = None, exact: bool = True,
        mode: str | None = None) -> Recorder:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from audioloader.integrations.lightning import ExactResume

    module = Recorder(shards, mode)
    callbacks = [ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=3, save_top_k=-1)]
    if exact:
        callbacks.insert(0, ExactResume())
    trainer = L.Trainer(max_steps=steps, val_check_interval=4, check_val_every_n_epoch=None, num_sanity_val_steps=2,
                        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, default_root_dir=root)
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


#: The start of the warning that Lightning took a state without knowing how far ahead its fetcher is.
OURS = "PyTorch Lightning took this AudioLoader's state"


# With ExactResume the loader's state follows its marks; without it, the loader leaves out of the state the batch
# Lightning's fetcher took ahead of training (it took batch 4 before the checkpoint after step 3 was saved).
@pytest.mark.parametrize(("exact", "mode"),
                         [(True, None), (False, None), (False, "max_size_cycle"), (False, "min_size")],
                         ids=["ExactResume", "no-callback", "no-callback-max_size_cycle", "no-callback-min_size"])
def test_lightning_fit_checkpoint_resume_trains_on_the_same_batches(ipc_shards, tmp_path, exact, mode):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OURS)  # no warning: the state is exact without the callback
        whole = fit(ipc_shards, tmp_path / "whole", 8, exact=exact, mode=mode)
    assert [step for step, _ in whole.trained] == list(range(8))
    with loader_for(ipc_shards) as loader:
        assert [d for _, d in whole.trained] == [digest(batch) for batch in take(loader, 8)]
    # Validation: the sanity check's 2 batches, then a whole pass after steps 4 and 8 (every row once).
    assert [sorted(rows) for rows in whole.validated[1:]] == [list(range(40))] * 2
    for step in (3, 6):
        resumed = fit(ipc_shards, tmp_path / f"from{step}", 8, ckpt_path=tmp_path / "whole" / f"step={step}.ckpt",
                      exact=exact, mode=mode)
        assert resumed.trained == whole.trained[step:], f"resumed from step {step}"


def test_lightning_taking_the_state_where_its_look_ahead_is_unknown_warns_once_naming_exact_resume(ipc_shards,
                                                                                                  tmp_path):
    # In CombinedLoader(mode="max_size") a loader that ran out gives no batch to a step: the loader cannot tell
    # whether the step the fetcher holds has one of its batches, says so once (two checkpoints are saved), and
    # names the fix.
    with pytest.warns(UserWarning, match=r"ExactResume\(\)") as caught:
        fit(ipc_shards, tmp_path / "max_size", 7, exact=False, mode="max_size")
    assert len([w for w in caught if str(w.message).startswith(OURS)]) == 1
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OURS)  # with the callback: its marks say what was trained
        module = fit(ipc_shards, tmp_path / "marked", 4, exact=True, mode="max_size")
    assert len(module.trained) == 4
    # A save after fit() returned: Lightning's fetcher is gone with the batch it took ahead; only marks could tell.
    plain = fit(ipc_shards, tmp_path / "plain", 4, exact=False)
    with pytest.warns(UserWarning, match="no fetcher is running"):
        plain.trainer.save_checkpoint(tmp_path / "after.ckpt")


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


@pytest.mark.slow  # 13 s; test_lightning_fit_checkpoint_resume_trains_on_the_same_batches by default
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


@pytest.mark.slow  # 9 s; test_accelerate_example_on_two_processes by default
def test_accelerate_example_with_cpu_launch_checks_nothing_about_ranks():
    # `accelerate launch --cpu` starts one process whatever --num_processes says: the example must not claim that
    # "1 processes read disjoint rows", it says that it checked nothing and how to start two.
    pytest.importorskip("accelerate")
    out = run([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes=2", "--num_machines=1",
               "--mixed_precision=no", "--dynamo_backend=no", "examples/accelerate_train.py", "--quick"])
    assert "rank 0: resumed after step 2; 4 batches identical to the uninterrupted run: True" in out, out
    assert "rank 1" not in out, out
    assert "disjoint rows:" not in out, out
    assert "1 process: disjoint rows NOT checked" in out and "--multi_gpu --num_processes=2" in out, out
