"""Distributed data-parallel training with AudioLoader, on CPU (gloo).

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py

Each rank gets its rank and world size from the process group; AudioLoader
reads them from torch.distributed, so the loader code is the same as on one
process. Training: every pass splits the data between the ranks (disjoint
splits, one global order). Evaluation: every clip exactly once across ranks and
the same number of batches on every rank, so the metric all-reduce never waits
on a rank that ran out; padding entries are masked out with ``batch["valid"]``.
Each rank saves its own loader state: a rank's state only loads on that rank.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import audioloader as al
from audioloader.tools.synthetic import make_classification_dataset

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="folder for the synthetic dataset (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=80, help="training steps per rank")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size per rank")
    parser.add_argument("--clips-per-class", type=int, default=24, help="training clips per class")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def small_cnn(n_classes: int) -> nn.Module:
    """Input [B, 1, n_mels, frames] log-mel; output [B, n_classes] logits."""
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(block(1, 16), block(16, 32), block(32, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, n_classes))


def prepare_data(root: Path, clips_per_class: int, seed: int) -> tuple[Path, Path]:
    """Rank 0 writes the train and eval shards; the other ranks wait at the barrier."""
    train_dir, eval_dir = root / "train", root / "eval"
    if dist.get_rank() == 0 and not (eval_dir / "labels.json").exists():
        make_classification_dataset(train_dir, clips_per_class, seed=seed, num_shards=8, max_seconds=4.0,
                                    num_classes=8, overwrite=True)
        make_classification_dataset(eval_dir, max(4, clips_per_class // 3), seed=seed, num_shards=4,
                                    max_seconds=4.0, num_classes=8, first_clip=clips_per_class, overwrite=True)
    dist.barrier()
    return train_dir, eval_dir


def train(model: nn.Module, train_dir: Path, args: argparse.Namespace, checkpoint_dir: Path) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = al.AudioLoader(train_dir, batch_size=args.batch_size, train=True, seed=args.seed, features=FEATURES,
                            workers=al.Workers(num_workers=2), shuffle=al.Shuffle(buffer_size=256, min_size=64))
    rank = dist.get_rank()
    start = time.perf_counter()
    with loader:
        for step, batch in enumerate(loader, start=1):
            logits = model(batch["spectrogram"].unsqueeze(1))
            loss = nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            if rank == 0 and (step % 20 == 0 or step == args.steps):
                rate = step * args.batch_size * dist.get_world_size() / (time.perf_counter() - start)
                print(f"step {step:4d}  loss {loss.item():.3f}  {rate:.0f} samples/s (all ranks)", flush=True)
            if step == args.steps // 2:
                # Per-rank loader state: loading it on another rank raises CheckpointMismatchError.
                torch.save({"data": loader.state_dict()}, checkpoint_dir / f"loader-rank{rank}.pt")
            if step == args.steps:
                break


def evaluate(model: nn.Module, eval_dir: Path, args: argparse.Namespace) -> float:
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)  # correct, total
    with al.AudioLoader(eval_dir, batch_size=args.batch_size, train=False, features=FEATURES,
                        workers=al.Workers(num_workers=2)) as loader, torch.no_grad():
        for batch in loader:  # the same number of batches on every rank
            valid = batch["valid"]
            predicted = model(batch["spectrogram"].unsqueeze(1)).argmax(dim=1)
            counts[0] += (predicted[valid] == batch["label"][valid]).sum()
            counts[1] += valid.sum()
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    torch.set_num_threads(1)  # two ranks on two cores, each with its own decode threads
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data if args.data is not None else Path(scratch)
        if args.data is None:
            # Every rank must see the same folder: rank 0's temporary folder is broadcast.
            shared = [str(root)]
            dist.broadcast_object_list(shared, src=0)
            root = Path(shared[0])
        train_dir, eval_dir = prepare_data(root, args.clips_per_class, args.seed)
        model = DistributedDataParallel(small_cnn(8))
        train(model, train_dir, args, root)
        accuracy = evaluate(model, eval_dir, args)
        dist.barrier()  # rank 0 must not delete the shared scratch folder while others read it
    if dist.get_rank() == 0:
        print(f"eval accuracy {accuracy:.1%} over {dist.get_world_size()} ranks", flush=True)
    # DDP keeps its process group in a reference cycle: free it before the group is destroyed, not during
    # interpreter shutdown (where gloo's last work can abort a finished job: "terminate called without ...").
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
