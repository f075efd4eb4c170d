"""Train with PyTorch Lightning, checkpoint mid-run, resume with ``fit(ckpt_path=...)``: the same batches, bit for bit.

    pip install lightning
    python examples/lightning_train.py            # synthetic data in a temporary folder
    python examples/lightning_train.py --quick    # a tiny run (seconds), as the tests run it

What to do (docs/integrations.md):

* return an `AudioLoader` from ``train_dataloader()`` and ``val_dataloader()``, as it is: no
  ``torch.utils.data.DataLoader`` around it (it batches and decodes in its own workers);
* optionally add ``audioloader.integrations.lightning.ExactResume()`` to the Trainer's callbacks (the
  resume is exact without it too: the loader leaves out the batch Lightning took ahead);
* a training loader is infinite (``train=True``): give the Trainer ``max_steps``, and
  ``val_check_interval=<steps>`` with ``check_val_every_n_epoch=None``.

Lightning saves the loader's state in its checkpoints and restores it on ``fit(ckpt_path=...)``
by itself. This script runs ``--steps`` steps uninterrupted (checkpointing every
``--checkpoint-every`` steps, validating every ``--val-every``), then a new Trainer, a new
module and a new loader resume from the first checkpoint, and it compares the digests of the
batches each run trained on. ``--without-exact-resume`` leaves the callback out (the same batches).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

import audioloader as al
from audioloader.integrations.lightning import ExactResume
from audioloader.tools.synthetic import make_classification_dataset

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)
QUICK_FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=0.5, n_fft=256, hop_length=128, n_mels=32)


def digest(batch: dict[str, Any]) -> str:
    """SHA-256 over the batch's features and row indices: equal digests, bit-identical batches."""
    h = hashlib.sha256()
    for name in ("spectrogram", "index", "label"):
        h.update(batch[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class AudioClassifier(L.LightningModule):
    """A small CNN on log-mels ``[B, n_mels, frames]``; records what it trains on (``trained``)."""

    def __init__(self, args: argparse.Namespace, train_dir: Path, eval_dir: Path, n_classes: int) -> None:
        super().__init__()
        self.args, self.train_dir, self.eval_dir = args, train_dir, eval_dir
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(32, n_classes))
        self.trained: list[tuple[int, str]] = []  # (global step, digest of the batch)
        self.correct = self.seen = 0

    def train_dataloader(self) -> al.AudioLoader:
        # An infinite, shuffled stream; Lightning saves and restores its state (ExactResume: exactly).
        return al.AudioLoader(self.train_dir, batch_size=self.args.batch_size, train=True, seed=self.args.seed,
                              features=self.args.features, shuffle=al.Shuffle(buffer_size=64, min_size=16),
                              workers=al.Workers(num_workers=self.args.workers))

    def val_dataloader(self) -> al.AudioLoader:
        # One pass per validation run, every clip once, in file order.
        return al.AudioLoader(self.eval_dir, batch_size=self.args.batch_size, train=False,
                              features=self.args.features, workers=al.Workers(num_workers=self.args.workers))

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        return self.net(spectrogram.unsqueeze(1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.append((self.global_step, digest(batch)))
        return nn.functional.cross_entropy(self(batch["spectrogram"]), batch["label"])

    def on_validation_epoch_start(self) -> None:
        self.correct = self.seen = 0

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        valid = batch["valid"]  # false for padding rows (equal batch counts across ranks)
        predicted = self(batch["spectrogram"]).argmax(dim=1)
        self.correct += int((predicted == batch["label"])[valid].sum())
        self.seen += int(valid.sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def fit(args: argparse.Namespace, data: tuple[Path, Path, int], root: Path,
        ckpt_path: Path | None = None) -> AudioClassifier:
    """One ``Trainer.fit`` of ``args.steps`` steps (from ``ckpt_path`` if given); checkpoints go to ``root``."""
    torch.manual_seed(args.seed)
    module = AudioClassifier(args, *data)
    callbacks: list[Any] = [ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=args.checkpoint_every,
                                            save_top_k=-1)]
    if not args.without_exact_resume:
        callbacks.append(ExactResume())
    trainer = L.Trainer(max_steps=args.steps, val_check_interval=args.val_every, check_val_every_n_epoch=None,
                        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, default_root_dir=root)
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder with train/ and eval/ shards and their labels.json, as "
                        "`audioloader pack` writes them (default: a synthetic dataset)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--val-every", type=int, default=30, help="training steps between validation runs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--clips-per-class", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--without-exact-resume", action="store_true",
                        help="leave ExactResume out (the loader then leaves the batch Lightning took ahead out of the "
                        "checkpoint by itself)")
    parser.add_argument("--quick", action="store_true", help="a tiny run: 8 steps of 4 short clips")
    args = parser.parse_args(argv)
    args.features = FEATURES
    if args.quick:
        args.steps, args.checkpoint_every, args.val_every, args.batch_size = 8, 3, 4, 4
        args.clips_per_class, args.workers, args.features = 3, 1, QUICK_FEATURES

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        data_dir = args.data or root / "data"
        if args.data is None:
            make_classification_dataset(data_dir / "train", args.clips_per_class, seed=args.seed, num_classes=4,
                                        num_shards=2, min_seconds=0.5, max_seconds=2.0)
            make_classification_dataset(data_dir / "eval", 2, seed=args.seed, num_classes=4, num_shards=1,
                                        min_seconds=0.5, max_seconds=2.0, first_clip=args.clips_per_class)
        n_classes = len(json.loads((data_dir / "train" / "labels.json").read_text()))  # {name: id}
        data = (data_dir / "train", data_dir / "eval", n_classes)

        whole = fit(args, data, root / "uninterrupted")
        print(f"uninterrupted: {len(whole.trained)} steps; validation: {whole.seen} clips, "
              f"accuracy {100 * whole.correct / max(whole.seen, 1):.1f}%")
        step = args.checkpoint_every
        resumed = fit(args, data, root / "resumed", ckpt_path=root / "uninterrupted" / f"step={step}.ckpt")
        expected = [d for s, d in whole.trained if s >= step]
        same = [d for _, d in resumed.trained] == expected
        print(f"resumed from the checkpoint after step {step}: {len(resumed.trained)} batches, "
              f"identical to the uninterrupted run: {same}")
    return same


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
