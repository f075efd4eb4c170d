"""One run of `AudioLoaderTrainer` on a tiny model, recording every batch it trains on; alone or under torchrun.

Usage: python tests/hf_trainer_worker.py SHARDS OUTPUT_DIR REPORT [--steps N] [--accumulation G] [--save-steps S]
           [--eval-steps E] [--kill-after STEP] [--resume CHECKPOINT] [--ignore-data-skip] [--finite]

The model is a linear layer on mean log-mels whose ``forward`` records the SHA-256 of each training batch
(features, rows, labels). With ``--kill-after STEP`` the process writes its report and kills itself (SIGKILL,
no cleanup) right after the Trainer saved ``checkpoint-STEP``; with ``--resume`` a fresh process goes on
from a checkpoint. REPORT (``.rank<R>.json`` appended) holds the digests trained on in order, the rows of
each evaluation, and a digest of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from typing import Any

import torch
from torch import nn

import audioloader as al

SMALL = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for tensor in tensors:
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Recorder(nn.Module):
    """Cross-entropy of a linear layer on the mean log-mel; records each batch it sees (training or evaluation)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(SMALL.n_mels, 3)
        self.trained: list[str] = []  # the digest of each training batch, in order
        self.trained_rows: list[int] = []
        self.evaluated: list[list[int]] = []  # the rows of each evaluation run
        self.rows: list[int] = []  # of the evaluation running

    def forward(self, spectrogram: torch.Tensor, labels: torch.Tensor, index: torch.Tensor,
                valid: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if self.training:
            self.trained.append(digest(spectrogram, index, labels))
            self.trained_rows.extend(index.tolist())
        elif valid is not None:
            self.rows.extend(index[valid].tolist())
        return {"loss": nn.functional.cross_entropy(self.layer(spectrogram.mean(-1)), labels)}


def loaders(shards: str, finite: bool) -> tuple[al.AudioLoader, al.AudioLoader]:
    train = al.AudioLoader(shards, batch_size=4, seed=3, features=SMALL, infinite=False if finite else None,
                           shuffle=al.Shuffle(buffer_size=12, min_size=6), workers=al.Workers(num_workers=1))
    evaluation = al.AudioLoader(shards, batch_size=8, train=False, features=SMALL, workers=al.Workers(num_workers=1))
    return train, evaluation


def to_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    inputs = {"spectrogram": batch["spectrogram"], "labels": batch["label"], "index": batch["index"]}
    if "valid" in batch:
        inputs["valid"] = batch["valid"]
    return inputs


def run(shards: str, output_dir: str, report: str, steps: int = 8, accumulation: int = 2, save_steps: int = 2,
        eval_steps: int = 3, kill_after: int | None = None, resume: str | None = None, ignore_data_skip: bool = False,
        finite: bool = False) -> dict[str, Any]:
    """One training run; returns (and writes to ``report.rank<R>.json``) what it trained and evaluated on."""
    from transformers import TrainerCallback, TrainingArguments

    from audioloader.integrations.transformers import AudioLoaderTrainer

    torch.manual_seed(0)
    args = TrainingArguments(output_dir, max_steps=-1 if finite else steps, num_train_epochs=2,
                             gradient_accumulation_steps=accumulation, save_steps=save_steps, eval_strategy="steps",
                             eval_steps=eval_steps, logging_steps=1, learning_rate=0.1, report_to="none",
                             use_cpu=True, ignore_data_skip=ignore_data_skip, disable_tqdm=True, seed=0,
                             per_device_train_batch_size=4, per_device_eval_batch_size=8)
    train, evaluation = loaders(shards, finite)  # after TrainingArguments: the process group is up
    model = Recorder()
    rank = args.process_index
    path = f"{report}.rank{rank}.json"

    def write() -> dict[str, Any]:
        result = {"trained": model.trained, "rows": model.trained_rows, "evaluated": model.evaluated,
                  "weights": digest(*model.state_dict().values())}
        with open(path, "w") as f:
            json.dump(result, f)
        return result

    class Evaluations(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):  # an evaluation ended: its rows, in order
            model.evaluated.append(model.rows)
            model.rows = []

    class Kill(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == kill_after:
                write()
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()  # every rank's report written before torchrun stops the others
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = AudioLoaderTrainer(model=model, args=args, train_loader=train, eval_loader=evaluation,
                                 to_inputs=to_inputs, callbacks=[Evaluations(), Kill()])
    trainer.train(resume_from_checkpoint=resume)
    train.shutdown()
    evaluation.shutdown()
    return write()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("output_dir")
    parser.add_argument("report")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--eval-steps", type=int, default=3)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--resume")
    parser.add_argument("--ignore-data-skip", action="store_true")
    parser.add_argument("--finite", action="store_true")
    options = parser.parse_args()
    run(options.shards, options.output_dir, options.report, options.steps, options.accumulation, options.save_steps,
        options.eval_steps, options.kill_after, options.resume, options.ignore_data_skip, options.finite)
    sys.exit(0)


if __name__ == "__main__":
    main()
