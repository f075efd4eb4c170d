"""Hugging Face Accelerate on several processes: save_state mid-run, load_state, the same batches on every rank.

    pip install accelerate
    torchrun --standalone --nproc_per_node=2 examples/accelerate_train.py           # CPU (gloo) or GPUs
    torchrun --standalone --nproc_per_node=2 examples/accelerate_train.py --quick   # seconds, as the tests run it
    accelerate launch --multi_gpu --num_processes=2 examples/accelerate_train.py   # 2 GPUs, or 2 CPU processes

On a machine without a GPU, ``--multi_gpu`` starts the processes all the same and the script
asks for the CPU itself (``Accelerator(cpu=True)``, gloo); ``accelerate launch --cpu`` starts ONE
process whatever ``--num_processes`` says (then nothing about the ranks is checked, and the
script says so).

The documented way (docs/integrations.md):

* build the `AudioLoader` after ``Accelerator()``: it takes its rank and world size from the
  process group and reads only its share of every pass;
* ``accelerator.prepare(model, optimizer)``, not the loader: Accelerate shards and wraps a
  ``torch.utils.data.DataLoader``; an AudioLoader already is sharded, batched and
  prefetched (``prepare`` would hand it back untouched, and nothing would save its state);
* ``accelerator.register_for_checkpointing(AllRanksState(loader))``: ``save_state`` then keeps
  every rank's position (Accelerate writes rank 0's copy of registered objects only) and
  ``load_state`` puts each rank back at its own;
* move each batch to ``accelerator.device`` (or build the loader with ``device=``).

The script trains ``--steps`` steps with a ``save_state`` after ``--save-at``, then builds a new
loader, model and optimizer, ``load_state`` s the checkpoint and trains the remaining steps; on
every rank the resumed batches must equal the uninterrupted run's, and the ranks' rows must not
overlap.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object
from torch import nn

import audioloader as al
from audioloader.integrations.accelerate import AllRanksState
from audioloader.tools.synthetic import make_classification_dataset

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)
QUICK_FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=0.5, n_fft=256, hop_length=128, n_mels=32)


def digest(batch: dict[str, Any]) -> str:
    """SHA-256 over the batch's features and row indices: equal digests, bit-identical batches."""
    h = hashlib.sha256()
    for name in ("spectrogram", "index", "label"):
        h.update(batch[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def make_loader(args: argparse.Namespace, train_dir: Path) -> al.AudioLoader:
    # No rank or world size given: they come from the process group that Accelerator() started.
    return al.AudioLoader(train_dir, batch_size=args.batch_size, train=True, seed=args.seed, features=args.features,
                          shuffle=al.Shuffle(buffer_size=64, min_size=16),
                          workers=al.Workers(num_workers=args.workers))


def make_accelerator() -> Accelerator:
    # On a machine without a GPU the processes talk through gloo on the CPU (Accelerate needs cpu=True for that).
    return Accelerator(cpu=not torch.cuda.is_available())


def make_model(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def train(args: argparse.Namespace, train_dir: Path, steps: range, checkpoint: Path,
          resume: bool) -> list[tuple[str, list[int]]]:
    """Train for ``steps`` (numbered from 1); save the state after step ``args.save_at`` or load it first.

    A new Accelerator each time, as a new job would have (its registered objects are its own).
    Returns the (digest, row indices) of each batch trained on.
    """
    accelerator = make_accelerator()
    loader = make_loader(args, train_dir)
    model, optimizer = accelerator.prepare(*make_model(args))  # the model and optimizer only
    accelerator.register_for_checkpointing(AllRanksState(loader))
    if resume:
        accelerator.load_state(checkpoint)  # model, optimizer, RNG and every rank's loader position
    trained = []
    with loader:
        batches = iter(loader)
        for step in steps:
            batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in next(batches).items()}
            loss = nn.functional.cross_entropy(model(batch["spectrogram"].unsqueeze(1)), batch["label"])
            optimizer.zero_grad()
            accelerator.backward(loss)  # gradients all-reduced across the processes
            optimizer.step()
            trained.append((digest(batch), batch["index"].tolist()))
            if step == args.save_at and not resume:
                accelerator.save_state(checkpoint)  # every rank calls it; AllRanksState gathers the positions
    return trained


def disjointness(reports: list[tuple[int, bool, list[int]]], processes: int) -> str:
    """Whether the ranks' first batches share a row; with one process there is nothing to compare, and it says so."""
    if processes < 2:
        return (f"{processes} process: disjoint rows NOT checked (it takes 2 or more processes; the launcher started "
                "one; `accelerate launch --cpu` always starts one: on a CPU use `accelerate launch --multi_gpu "
                "--num_processes=2 examples/accelerate_train.py` or `torchrun --standalone --nproc_per_node=2 "
                "examples/accelerate_train.py`)")
    rows = [i for _, _, indices in reports for i in indices]
    return f"{processes} processes read disjoint rows: {len(rows) == len(set(rows))}"


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder of training shards (default: a synthetic dataset)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-at", type=int, default=15, help="save_state after this step")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--clips-per-class", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a tiny run: 6 steps of 4 short clips")
    args = parser.parse_args(argv)
    args.features = FEATURES
    if args.quick:
        args.steps, args.save_at, args.batch_size, args.clips_per_class, args.workers = 6, 2, 4, 3, 1
        args.features = QUICK_FEATURES

    accelerator = make_accelerator()
    scratch = tempfile.mkdtemp(prefix="accelerate-train-") if accelerator.is_main_process else None
    root = Path(broadcast_object_list([scratch])[0])  # one folder for every rank (one machine)
    train_dir = args.data or root / "train"
    if args.data is None and accelerator.is_main_process:
        make_classification_dataset(train_dir, args.clips_per_class, seed=args.seed, num_classes=4, num_shards=4,
                                    min_seconds=0.5, max_seconds=2.0)
    accelerator.wait_for_everyone()

    # What prepare() does with an AudioLoader: nothing (it wraps torch DataLoaders only). So leave it out.
    probe = make_loader(args, train_dir)  # nothing starts before the first next()
    if accelerator.is_main_process:
        print(f"accelerator.prepare(loader) hands it back unwrapped: {accelerator.prepare(probe) is probe}")
    checkpoint = root / "checkpoint"
    whole = train(args, train_dir, range(1, args.steps + 1), checkpoint, resume=False)
    resumed = train(args, train_dir, range(args.save_at + 1, args.steps + 1), checkpoint, resume=True)
    same = [d for d, _ in resumed] == [d for d, _ in whole[args.save_at:]]
    # The rows of each rank's first batch (within the first pass): every row on one rank only.
    reports = gather_object([(accelerator.process_index, same, whole[0][1])])
    if accelerator.is_main_process:
        for rank, ok, _ in reports:
            print(f"rank {rank}: resumed after step {args.save_at}; {args.steps - args.save_at} batches identical "
                  f"to the uninterrupted run: {ok}")
        print(disjointness(reports, accelerator.num_processes))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(root, ignore_errors=True)
    return all(report[1] for report in reports)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
