"""Train a small audio classifier with AudioLoader, then evaluate it: the demo as plain code.

    python examples/train_classifier.py                  # synthetic data in a temporary folder
    python examples/train_classifier.py --data shards/   # your shards: train/ and eval/ sub-folders

The loop is the one you would write with a torch DataLoader: AudioLoader yields
dicts of tensors, ``spectrogram`` float32 [B, n_mels, frames] and ``label``
int64 [B]. In train mode it never ends (pass after pass, reshuffled), so the
loop counts steps; in eval mode it makes one pass and ``valid`` marks the rows
that are real samples rather than padding.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import audioloader as al
from audioloader.shards import ShardDataset
from audioloader.tools.synthetic import make_classification_dataset

# 16 kHz, 2 s crops, 64 mels: [64, 126] per clip; small enough to train on a CPU.
FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)


def small_cnn(num_classes: int) -> nn.Module:
    """[B, n_mels, frames] log-mel -> [B, num_classes] logits."""
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(nn.Unflatten(1, (1, FEATURES.n_mels)), nn.BatchNorm2d(1),  # [B, 1, mels, frames]
                         block(1, 16), block(16, 32), block(32, 64), block(64, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def train(model: nn.Module, train_dir: Path, args: argparse.Namespace) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # The train preset's shuffle buffer (10000 decoded clips, first batch after 8000)
    # is meant for large datasets; for a few hundred clips a few hundred is plenty.
    loader = al.AudioLoader(train_dir, batch_size=args.batch_size, train=True, seed=args.seed, features=FEATURES,
                            workers=al.Workers(num_workers=args.workers),
                            shuffle=al.Shuffle(buffer_size=256, min_size=128))
    model.train()
    start = time.perf_counter()
    with loader:  # stops the loader's threads when the block ends
        for step, batch in enumerate(loader, start=1):
            loss = nn.functional.cross_entropy(model(batch["spectrogram"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 25 == 0 or step == args.steps:
                rate = step * args.batch_size / (time.perf_counter() - start)
                print(f"step {step:4d}  loss {loss.item():.3f}  {rate:.0f} samples/s", flush=True)
            if step == args.steps:  # train mode is infinite: stop by step count
                break


@torch.no_grad()
def evaluate(model: nn.Module, eval_dir: Path, args: argparse.Namespace) -> float:
    model.eval()
    correct = total = 0
    # train=False: one pass, centre crops, each clip exactly once.
    with al.AudioLoader(eval_dir, batch_size=64, train=False, features=FEATURES,
                        workers=al.Workers(num_workers=args.workers)) as loader:
        for batch in loader:
            valid = batch["valid"]  # False for padding rows (they keep DDP ranks in step)
            predicted = model(batch["spectrogram"]).argmax(dim=1)
            correct += int((predicted == batch["label"])[valid].sum())
            total += int(valid.sum())
    return correct / total


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder with train/ and eval/ shard folders "
                        "(default: make the synthetic dataset in a temporary folder)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--clips-per-class", type=int, default=32, help="synthetic training clips per class")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="decode threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # The model and the decode threads share the CPU cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - args.workers))
    torch.manual_seed(args.seed)

    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        if args.data is None:
            print(f"making the synthetic dataset in {root}", flush=True)
            make_classification_dataset(root / "train", args.clips_per_class, seed=args.seed, max_seconds=6.0)
            make_classification_dataset(root / "eval", max(2, args.clips_per_class // 3), seed=args.seed,
                                        max_seconds=6.0, first_clip=100_000, num_shards=2)  # unseen clips
        # Class names travel in the shards' metadata (ShardWriter, `audioloader pack`, Hugging Face ClassLabel).
        names = ShardDataset(root / "train").label_names
        model = small_cnn(len(names))
        train(model, root / "train", args)
        accuracy = evaluate(model, root / "eval", args)
    print(f"eval accuracy: {accuracy:.1%}")
    return accuracy


if __name__ == "__main__":
    main()
