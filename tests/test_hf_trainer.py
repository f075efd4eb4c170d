"""Hugging Face Trainer: a run killed after a checkpoint and resumed in a fresh process trains on the same batches.

The runs are tests/hf_trainer_worker.py's (a linear layer on mean log-mels that records the SHA-256 of every
batch it trains on); the uninterrupted run goes on in this process while the killed one runs beside it.
"""

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
from tests.helpers import SMALL

pytest.importorskip("transformers")

from audioloader.integrations.transformers import STATE_FILE, AudioLoaderTrainer
from tests.hf_trainer_worker import Recorder, run

ROOT = Path(__file__).resolve().parents[1]
WORKER = "tests/hf_trainer_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def start(*command: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *command], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, code: int = 0) -> None:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == code, f"exited {process.returncode}, expected {code}\n{out[-4000:]}"


def report(path: Path, rank: int = 0) -> dict:
    return json.loads(Path(f"{path}.rank{rank}.json").read_text())


@pytest.mark.slow  # 30 s; test_examples' Whisper Trainer example resumes exactly by default
def test_killed_after_a_checkpoint_and_resumed_in_a_fresh_process_trains_on_the_same_batches(ipc_shards, tmp_path):
    # 8 steps of 2 accumulated batches, a checkpoint every 2 steps, an evaluation every 3: the killed run dies
    # (SIGKILL) right after checkpoint-4, the resumed one starts from it in a new process.
    killed = start(WORKER, str(ipc_shards), str(tmp_path / "killed"), str(tmp_path / "killed"), "--kill-after", "4")
    whole = run(str(ipc_shards), str(tmp_path / "whole"), str(tmp_path / "whole"))
    finish(killed, -9)
    assert sorted(os.listdir(tmp_path / "killed")) == ["checkpoint-2", "checkpoint-4"]
    # The loader's state goes into each checkpoint the Trainer saves, and nowhere else.
    assert sorted(path.parent.name for path in (tmp_path / "whole").rglob(STATE_FILE)) == [
        f"checkpoint-{step}" for step in (2, 4, 6, 8)]
    assert (tmp_path / "killed" / "checkpoint-4" / STATE_FILE).is_file()
    assert len(whole["trained"]) == 16 and len(set(whole["trained"])) == 16
    assert report(tmp_path / "killed")["trained"] == whole["trained"][:8]
    finish(start(WORKER, str(ipc_shards), str(tmp_path / "resumed"), str(tmp_path / "resumed"),
                 "--resume", str(tmp_path / "killed" / "checkpoint-4")))
    resumed = report(tmp_path / "resumed")
    assert resumed["trained"] == whole["trained"][8:]  # bit for bit, none re-read, none skipped
    assert resumed["weights"] == whole["weights"]  # and the model ends the same
    # Evaluations during training (after steps 3, 6 and at the end): every row once, in the resumed run too.
    assert whole["evaluated"] == [list(range(40))] * 3 and resumed["evaluated"] == [list(range(40))] * 2
    # ignore_data_skip=True resumes the same: the Trainer never skips, the loader holds the position.
    again = run(str(ipc_shards), str(tmp_path / "again"), str(tmp_path / "again"), ignore_data_skip=True,
                resume=str(tmp_path / "whole" / "checkpoint-6"))
    assert again["trained"] == whole["trained"][12:] and again["weights"] == whole["weights"]


def test_one_pass_an_epoch_resumes_mid_epoch(ipc_shards, tmp_path):
    # infinite=False: 10 batches a pass, 2 accumulated: 5 steps an epoch, 2 epochs; checkpoint-6 is in the second.
    whole = run(str(ipc_shards), str(tmp_path / "whole"), str(tmp_path / "whole"), finite=True, eval_steps=100)
    assert len(whole["trained"]) == 20
    assert sorted(whole["rows"][:40]) == sorted(whole["rows"][40:]) == list(range(40))  # two whole passes
    resumed = run(str(ipc_shards), str(tmp_path / "resumed"), str(tmp_path / "resumed"), finite=True, eval_steps=100,
                  resume=str(tmp_path / "whole" / "checkpoint-6"))
    assert resumed["trained"] == whole["trained"][12:] and resumed["weights"] == whole["weights"]
    history = json.loads((tmp_path / "resumed" / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    expected = json.loads((tmp_path / "whole" / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    assert [entry["epoch"] for entry in history] == [entry["epoch"] for entry in expected]  # 1.6 after step 8


def test_a_mid_pass_resume_that_the_trainer_cannot_step_exactly_is_refused(ipc_shards, tmp_path):
    # 10 batches a pass in groups of 3: the pass ends with a step of 1 batch, which a resumed Trainer never takes.
    run(str(ipc_shards), str(tmp_path / "whole"), str(tmp_path / "whole"), finite=True, accumulation=3,
        eval_steps=100, steps=3)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=3.*infinite loader"):
        run(str(ipc_shards), str(tmp_path / "resumed"), str(tmp_path / "resumed"), finite=True, accumulation=3,
            eval_steps=100, resume=str(tmp_path / "whole" / "checkpoint-2"))


def test_a_checkpoint_without_the_loader_state_is_refused(ipc_shards, tmp_path):
    run(str(ipc_shards), str(tmp_path / "whole"), str(tmp_path / "whole"), steps=2, eval_steps=100)
    (tmp_path / "whole" / "checkpoint-2" / STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"{STATE_FILE} does not exist: .* was not saved by AudioLoaderTrainer"):
        run(str(ipc_shards), str(tmp_path / "resumed"), str(tmp_path / "resumed"), steps=4, eval_steps=100,
            resume=str(tmp_path / "whole" / "checkpoint-2"))


def test_options_an_audio_loader_cannot_honour_are_refused_naming_the_fix(ipc_shards, tmp_path):
    from transformers import TrainingArguments

    def trainer(**options):
        args = TrainingArguments(str(tmp_path), max_steps=2, report_to="none", use_cpu=True, **options)
        with al.AudioLoader(ipc_shards, features=SMALL) as loader:
            return AudioLoaderTrainer(model=Recorder(), args=args, train_loader=loader)

    with pytest.raises(ValueError, match=r"workers=al.Workers\(num_workers=2\)"):
        trainer(dataloader_num_workers=2)
    with pytest.raises(ValueError, match=r"batching=al.Bucketing"):
        trainer(train_sampling_strategy="group_by_length")
    with pytest.raises(ValueError, match="split_batches=True"):
        trainer(accelerator_config={"split_batches": True})
    with pytest.raises(ValueError, match="auto_find_batch_size=True"):
        trainer(auto_find_batch_size=True)
    with pytest.raises(TypeError, match="pass train_loader= and eval_loader="):
        AudioLoaderTrainer(model=Recorder(), args=TrainingArguments(str(tmp_path), report_to="none", use_cpu=True),
                           train_dataset=[])
    with al.AudioLoader(ipc_shards, features=SMALL) as endless, pytest.raises(ValueError, match="train=False"):
        AudioLoaderTrainer(model=Recorder(), args=TrainingArguments(str(tmp_path), report_to="none", use_cpu=True),
                           eval_loader=endless)
    with al.AudioLoader(ipc_shards, features=SMALL, storage=al.Storage(rank=1, world_size=2)) as other, \
            pytest.raises(ValueError, match="build the AudioLoaders after TrainingArguments"):
        AudioLoaderTrainer(model=Recorder(), args=TrainingArguments(str(tmp_path), report_to="none", use_cpu=True,
                                                                    max_steps=2), train_loader=other)


def torchrun(ranks: int, *args: str, code: int = 0) -> None:
    command = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", WORKER, *args]
    process = start(*command)
    out, _ = process.communicate(timeout=600)
    assert (process.returncode == 0) == (code == 0), f"exited {process.returncode}\n{out[-4000:]}"


@pytest.mark.slow
def test_two_processes_killed_and_resumed_on_two_exactly_and_on_one_elastically(ipc_shards, tmp_path):
    # 2 ranks of 20 rows a pass, 4 steps of 2 batches of 4: checkpoint-1 is in the middle of the first pass.
    common = ["--steps", "4", "--save-steps", "1", "--eval-steps", "2"]
    torchrun(2, str(ipc_shards), str(tmp_path / "whole"), str(tmp_path / "whole"), *common)
    torchrun(2, str(ipc_shards), str(tmp_path / "killed"), str(tmp_path / "killed"), *common, "--kill-after", "1",
             code=1)
    checkpoint = tmp_path / "killed" / "checkpoint-1"
    states = torch.load(checkpoint / STATE_FILE, weights_only=True)["ranks"]  # one file, every rank's position
    assert [state["fingerprint"]["rank"] for state in states] == [0, 1]
    torchrun(2, str(ipc_shards), str(tmp_path / "resumed"), str(tmp_path / "resumed"), *common, "--resume",
             str(checkpoint))
    for rank in (0, 1):
        whole, killed = report(tmp_path / "whole", rank), report(tmp_path / "killed", rank)
        resumed = report(tmp_path / "resumed", rank)
        assert killed["trained"] == whole["trained"][:2], rank
        assert resumed["trained"] == whole["trained"][2:], rank  # each rank's own batches, bit for bit
        assert resumed["weights"] == whole["weights"], rank
    evaluated = report(tmp_path / "whole", 0)["evaluated"][0] + report(tmp_path / "whole", 1)["evaluated"][0]
    assert sorted(evaluated) == list(range(40))  # the ranks share each evaluation: every row once
    # On 1 process: the rows the two ranks had left of the first pass come first, each exactly once.
    torchrun(1, str(ipc_shards), str(tmp_path / "alone"), str(tmp_path / "alone"), *common, "--resume",
             str(checkpoint))
    before = [i for rank in (0, 1) for i in report(tmp_path / "killed", rank)["rows"]]
    alone = report(tmp_path / "alone", 0)["rows"]
    counts = Counter(before + alone[:40 - len(before)])
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {1}


def test_the_library_imports_without_transformers_and_the_integration_names_the_install():
    code = ("import sys; sys.modules['transformers'] = None\n"  # as if it were not installed
            "import audioloader, audioloader.integrations.dcp\n"
            "try:\n"
            "    import audioloader.integrations.transformers\n"
            "except ImportError as error:\n"
            "    print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "needs Hugging Face Transformers: pip install transformers" in out.stdout, out.stdout
