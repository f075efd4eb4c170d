"""The demo's model and run (`audioloader demo`, whose options and entry point are in `audioloader.tools.demo`).

Split from ``demo.py`` so that ``audioloader demo --help`` answers without importing torch; this module
imports torch and the loader.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from audioloader import AudioLoader, MelSpectrogramConfig, Shuffle, Workers
from audioloader.shards import ShardDataset
from audioloader.shards.storage.machine_cache import cache_root
from audioloader.tools import synthetic

__all__ = ["DemoPlan", "SmallCNN", "prepare_synthetic_data", "run_demo"]

#: Version of the demo's dataset recipe; part of the cache folder's name.
DATASET_VERSION = "demo-v1"

#: Synthetic dataset sizes: (train clips per class, eval clips per class, longest clip in seconds).
#: Durations start at 1 s, so clips are both shorter and longer than the 2 s crop.
FULL_DATA = (64, 20, 6.0)
QUICK_DATA = (12, 4, 4.0)

#: The eval clips are numbered from here, so they never coincide with training clips.
EVAL_FIRST_CLIP = 100_000

#: Maximum share of a user's shard files held out for evaluation when --data has no eval split.
EVAL_FILE_FRACTION = 0.2


# -- the model --------------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """A small CNN classifier of log-mel spectrograms.

    Input: float32 ``[B, n_mels, frames]`` (log-mel). Output: float32 ``[B, num_classes]`` logits.
    Four conv blocks (3x3 conv, batch norm, ReLU, 2x2 max pool) of ``width``,
    ``2 width``, ``4 width``, ``4 width`` channels, then the mean over time and
    frequency and a linear layer. The input batch norm standardizes the log-mel
    values, so no dataset statistics are needed.
    """

    def __init__(self, num_classes: int, width: int = 16) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.norm = nn.BatchNorm2d(1)
        self.features = nn.Sequential(block(1, width), block(width, 2 * width), block(2 * width, 4 * width),
                                      block(4 * width, 4 * width))
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        x = self.features(self.norm(spectrogram.unsqueeze(1)))
        return self.head(x.mean(dim=(2, 3)))


# -- data -------------------------------------------------------------------------------------------


@dataclass
class DemoPlan:
    """What the demo runs on: shard sources, class names, features and loop sizes."""

    train: Any  # a folder or a list of shard files
    eval: Any
    label_names: list[str]
    features: MelSpectrogramConfig
    steps: int
    batch_size: int
    description: str


def prepare_synthetic_data(root: Path, seed: int, quick: bool) -> tuple[Path, Path, bool]:
    """Make (or reuse) the synthetic train and eval folders under ``root``; returns them and whether reused."""
    train_clips, eval_clips, max_seconds = QUICK_DATA if quick else FULL_DATA
    train_dir, eval_dir = root / "train", root / "eval"
    common = dict(seed=seed, max_seconds=max_seconds)
    train_args = dict(clips_per_class=train_clips, num_shards=4, **common)
    eval_args = dict(clips_per_class=eval_clips, num_shards=2, first_clip=EVAL_FIRST_CLIP, **common)
    if synthetic.is_complete(train_dir, **train_args) and synthetic.is_complete(eval_dir, **eval_args):
        return train_dir, eval_dir, True
    synthetic.make_classification_dataset(train_dir, overwrite=True, **train_args)
    synthetic.make_classification_dataset(eval_dir, overwrite=True, **eval_args)
    return train_dir, eval_dir, False


def _label_names(source: Any) -> list[str]:
    """Class names of labeled shards: the stored ones, else ``"0" .. str(largest label id)``."""
    dataset = ShardDataset(source)
    if dataset.label_names:
        return list(dataset.label_names)
    largest = -1
    for split in dataset.splits:
        for batch in dataset.read_split(split):
            column = batch.column(dataset.label_column).drop_null()
            if len(column):
                largest = max(largest, int(max(column.to_pylist())))
    if largest < 0:
        raise ValueError(f"{source}: the label column holds no labels; the demo needs labeled shards")
    return [str(i) for i in range(largest + 1)]


def _user_sources(data: Path, eval_data: Path | None) -> tuple[Any, Any, str]:
    """Train and eval sources for ``--data``/``--eval-data``, and a sentence saying how they were chosen."""
    if eval_data is not None:
        return data, eval_data, f"train {data}, eval {eval_data}"
    if (data / "train").is_dir() and (data / "eval").is_dir():
        return data / "train", data / "eval", f"{data}/train and {data}/eval"
    files = [f.path for f in ShardDataset(data).files]
    if len(files) < 2:
        raise ValueError(f"--data {data}: one shard file, nothing to hold out for evaluation; give train/ and "
                         "eval/ sub-folders, several shard files, or --eval-data DIR")
    held_out = max(1, math.floor(len(files) * EVAL_FILE_FRACTION))
    return (files[:-held_out], files[-held_out:],
            f"{data}: {len(files) - held_out} shard files for training, the last {held_out} held out for eval")


def _plan(args: argparse.Namespace) -> DemoPlan:
    features = MelSpectrogramConfig(sample_rate=args.sample_rate, clip_seconds=args.clip_seconds,
                                    n_fft=512 if args.sample_rate <= 24000 else 1024,
                                    hop_length=256 if args.sample_rate <= 24000 else 512, n_mels=args.n_mels)
    steps = args.steps if args.steps is not None else (60 if args.quick else 400)
    batch_size = args.batch_size if args.batch_size is not None else (16 if args.quick else 32)
    if steps < 2:
        raise ValueError(f"--steps {steps}: need at least 2 (the checkpoint is taken half way)")
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: must be >= 1")
    if args.data is not None:
        train, evaluation, how = _user_sources(args.data, args.eval_data)
        names = _label_names(train)
        return DemoPlan(train, evaluation, names, features, steps, batch_size, how)
    if args.eval_data is not None:
        raise ValueError("--eval-data needs --data")
    root = (args.cache or cache_root()) / (DATASET_VERSION + ("-quick" if args.quick else ""))
    start = time.perf_counter()
    print(f"data: synthetic dataset in {root}", flush=True)
    train_dir, eval_dir, reused = prepare_synthetic_data(root, args.seed, args.quick)
    made = "reused (complete)" if reused else f"made in {time.perf_counter() - start:.1f} s"
    rows = [synthetic.read_description(d)["rows"] for d in (train_dir, eval_dir)]
    how = f"synthetic, {rows[0]} train + {rows[1]} eval clips, {made}"
    return DemoPlan(train_dir, eval_dir, list(synthetic.read_description(train_dir)["label_names"]), features,
                    steps, batch_size, how)


def _train_loader(plan: DemoPlan, seed: int, workers: int) -> AudioLoader:
    """The training loader; built twice (before and after the "restart"), with the same arguments."""
    rows = ShardDataset(plan.train).num_rows
    # The train preset's shuffle buffer (10000 items, first batch after 8000) is
    # sized for datasets of millions of clips: here it would hold the whole dataset
    # many times over (every pass again), cost ~8000 decodes before the first batch
    # and ~260 MB of decoded spectrograms. A buffer of about half the dataset (at
    # most 1024), first batch after a quarter, mixes well: the reader already visits
    # the shards' splits in a new seeded order every pass.
    capacity = max(plan.batch_size, min(1024, rows // 2))
    return AudioLoader(plan.train, batch_size=plan.batch_size, train=True, seed=seed, features=plan.features,
                       workers=Workers(num_workers=workers),
                       shuffle=Shuffle(buffer_size=capacity, min_size=capacity // 2))


def _same_batch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two batches are equal, key by key, bit for bit."""
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


class _Trainer:
    """The training loop's state: model, optimizer, progress and timing."""

    def __init__(self, num_classes: int, lr: float, seed: int) -> None:
        torch.manual_seed(seed)  # the same initial weights every run
        self.model = SmallCNN(num_classes)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.loss_ema: float | None = None
        self.samples = 0
        self.seconds = 0.0

    def step(self, batch: dict[str, Any]) -> float:
        self.model.train()
        logits = self.model(batch["spectrogram"])
        loss = nn.functional.cross_entropy(logits, batch["label"])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        value = loss.item()
        self.loss_ema = value if self.loss_ema is None else 0.9 * self.loss_ema + 0.1 * value
        return value

    def checkpoint(self, step: int, loader: AudioLoader) -> dict[str, Any]:
        return {"step": step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "loss_ema": self.loss_ema, "data": loader.state_dict()}

    def restore(self, ckpt: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.loss_ema = ckpt["loss_ema"]


def _train_steps(trainer: _Trainer, batches: Iterator[dict[str, Any]], first: int, last: int, total: int,
                 progress: bool, check: list[dict[str, Any]] | None = None) -> int:
    """Train on steps ``first .. last - 1``; returns how many of ``check`` matched the first batches."""
    matched = 0
    log_every = max(1, total // 6)
    # disable=None: a bar only on a terminal (log lines are printed either way).
    bar = tqdm(total=total, initial=first, desc="train", unit="step", disable=None if progress else True,
               dynamic_ncols=True, mininterval=0.5)
    start, samples = time.perf_counter(), 0
    try:
        for step in range(first, last):
            batch = next(batches)
            if check is not None and step - first < len(check):
                matched += _same_batch(batch, check[step - first])
            loss = trainer.step(batch)
            samples += len(batch["label"])
            rate = samples / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{trainer.loss_ema:.3f}", samples_s=f"{rate:.0f}", refresh=False)
            bar.update()
            if (step + 1) % log_every == 0 or step + 1 == total:
                tqdm.write(f"step {step + 1:4d}/{total}  loss {trainer.loss_ema:.3f} (last {loss:.3f})  "
                           f"{rate:5.0f} samples/s")
    finally:
        bar.close()
    trainer.samples += samples
    trainer.seconds += time.perf_counter() - start
    return matched


def _evaluate(model: nn.Module, plan: DemoPlan, workers: int) -> tuple[int, int, list[tuple[int, int]]]:
    """Accuracy on the eval split: (correct, total, per-class (correct, total))."""
    model.eval()
    per_class = [[0, 0] for _ in plan.label_names]
    # train=False: one pass, centre crops, every clip exactly once. Batches are
    # padded to equal counts across ranks (for DDP); batch["valid"] marks the real rows.
    with AudioLoader(plan.eval, batch_size=64, train=False, seed=0, features=plan.features,
                     workers=Workers(num_workers=workers)) as loader, torch.no_grad():
        for batch in loader:
            valid = batch["valid"]
            predicted = model(batch["spectrogram"]).argmax(dim=1)
            for label, hit in zip(batch["label"][valid].tolist(), (predicted == batch["label"])[valid].tolist(),
                                  strict=True):
                while label >= len(per_class):  # an eval label the training shards never named
                    per_class.append([0, 0])
                per_class[label][0] += int(hit)
                per_class[label][1] += 1
    correct = sum(c for c, _ in per_class)
    total = sum(n for _, n in per_class)
    return correct, total, [(c, n) for c, n in per_class]


def _saved_size(obj: Any) -> int:
    """Bytes of ``torch.save(obj)``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer().nbytes


def _cpu_split(workers: int | None, threads: int | None) -> tuple[int, int]:
    """Decode threads and torch intra-op threads: together about the machine's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = workers if workers is not None else max(1, cores // 2)
    threads = threads if threads is not None else max(1, cores - workers)
    if workers < 1 or threads < 1:
        raise ValueError(f"--workers {workers} / --threads {threads}: both must be >= 1")
    return workers, threads


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo; returns its results (accuracy, resume check, timings). See the module docstring."""
    t_start = time.perf_counter()
    workers, threads = _cpu_split(args.workers, args.threads)
    # The model runs in this thread with `threads` intra-op threads; the loader's
    # decode threads use one each (DecodeSpectrogram pins them), so together they
    # fill the cores without oversubscribing them.
    torch.set_num_threads(threads)
    plan = _plan(args)
    t_data = time.perf_counter()
    f = plan.features
    print(f"data: {plan.description}")
    print(f"classes ({len(plan.label_names)}): {', '.join(plan.label_names)}")
    print(f"features: {f.sample_rate} Hz, {f.clip_seconds:g} s crops, n_fft {f.n_fft}, hop {f.hop_length}, "
          f"{f.n_mels} mels -> float32 [{plan.batch_size}, {f.n_mels}, {f.n_frames}] per batch")
    print(f"cpu: {workers} decode thread(s), {threads} torch thread(s)")

    half = plan.steps // 2
    verify = max(0, min(args.verify_batches, plan.steps - half))
    progress = not args.no_progress
    ckpt_dir = None if args.checkpoint else tempfile.TemporaryDirectory(prefix="audioloader-demo-")
    ckpt_path = args.checkpoint or Path(ckpt_dir.name) / "checkpoint.pt"
    try:
        # Phase 1: train the first half, then checkpoint model + optimizer + loader.
        trainer = _Trainer(len(plan.label_names), args.lr, args.seed)
        loader = _train_loader(plan, args.seed, workers)
        batches = iter(loader)  # train mode: an endless stream of batches, pass after pass
        _train_steps(trainer, batches, 0, half, plan.steps, progress)
        ckpt = trainer.checkpoint(half, loader)
        torch.save(ckpt, ckpt_path)
        loader_bytes = _saved_size(ckpt["data"])
        print(f"checkpoint at step {half}: {ckpt_path.stat().st_size / 1024:.0f} KiB "
              f"(the loader's part is a small dict of keys and counters, ~{loader_bytes / 1024:.1f} KiB)")
        # What the uninterrupted loader yields next: the reference for the resume check.
        expected = [next(batches) for _ in range(verify)]
        loader.shutdown()
        del loader, batches, trainer, ckpt  # as if the process had ended

        # Phase 2: a fresh loader, model and optimizer, restored from the file.
        t_resume = time.perf_counter()
        ckpt = torch.load(ckpt_path, weights_only=True)
        trainer = _Trainer(len(plan.label_names), args.lr, args.seed + 1)  # other init: the checkpoint must win
        trainer.restore(ckpt)
        loader = _train_loader(plan, args.seed, workers)
        loader.load_state_dict(ckpt["data"])
        batches = iter(loader)
        print(f"resumed from step {ckpt['step']} with a new loader, model and optimizer")
        matched = _train_steps(trainer, batches, ckpt["step"], plan.steps, plan.steps, progress, check=expected)
        resume_seconds = time.perf_counter() - t_resume
        stats = loader.stats()
        loader.shutdown()
        del loader, batches
    finally:
        if ckpt_dir is not None:
            ckpt_dir.cleanup()
    identical = matched == len(expected)
    print(f"resume: {matched} of {len(expected)} batches identical" if not identical
          else f"resume: {matched} batches identical")

    t_eval = time.perf_counter()
    correct, total, per_class = _evaluate(trainer.model, plan, workers)
    accuracy = correct / total if total else float("nan")
    t_end = time.perf_counter()

    counters = stats["counters"]
    print("\nper-class accuracy (eval):")
    names = plan.label_names + [str(i) for i in range(len(plan.label_names), len(per_class))]
    for name, (c, n) in zip(names, per_class, strict=True):
        if n:
            print(f"  {name:<14} {c:3d}/{n:<3d} {c / n:6.1%}")
    print("\nsummary")
    print(f"  accuracy: {accuracy:.1%} ({correct}/{total} eval clips, each exactly once)")
    print(f"  resume: {'bit-for-bit identical' if identical else 'MISMATCH'} "
          f"({matched}/{len(expected)} batches compared after the restart)")
    print(f"  training: {plan.steps} steps of {plan.batch_size}, {trainer.samples / trainer.seconds:.0f} samples/s, "
          f"final loss {trainer.loss_ema:.3f}")
    print(f"  loader after resume: {counters.get('samples_decoded', 0)} clips decoded, "
          f"{counters.get('bad_rows', 0)} bad rows")
    print(f"  time: data {t_data - t_start:.1f} s, train+resume {t_eval - t_data:.1f} s "
          f"(of which after the restart {resume_seconds:.1f} s), eval {t_end - t_eval:.1f} s, "
          f"total {t_end - t_start:.1f} s")
    return {"accuracy": accuracy, "correct": correct, "total": total, "resume_identical": identical,
            "resume_matched": matched, "resume_compared": len(expected), "seconds": t_end - t_start}

