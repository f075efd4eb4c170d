"""Train on a three-source mix with augmentation, checkpoint at a random step, resume bit for bit.

    python examples/mix_and_augment.py                 # synthetic sources in a temporary folder
    python examples/mix_and_augment.py --steps 200 --batch-size 32

What it shows:

1. ``al.Mix``: three sources at weights 0.6 / 0.3 / 0.1. The third is small, so
   it runs out of rows again and again and starts its next pass (a new order,
   new crops) each time; the realised shares still follow the weights.
2. An ``augment=`` list: speed perturbation, gain, additive noise from a set of
   noise shards, reverberation with impulse responses from another set,
   SpecAugment masks and Mixup. Every draw (factor, gain, noise row, SNR,
   impulse response, masks, mixup weight) is a pure function of the seed and
   the sample's key (source, row, pass).
3. Training a small CNN with Mixup's soft targets (``al.mixup_targets``).
4. A checkpoint (model, optimizer, loader state) at a random step; a fresh
   model, optimizer and loader resume from it, and every batch after the
   checkpoint is identical to the uninterrupted run's, bit for bit.
5. ``loader.stats()``: samples per source against the weights, and the shuffle
   figures (see docs/mixing.md for how to size the buffer from them).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from torch import nn

import audioloader as al
from audioloader.tools.synthetic import make_classification_dataset

RATE = 16000
# 1 s crops, 40 mels: [40, 101] per clip; small enough to train on two cores in seconds.
FEATURES = al.MelSpectrogramConfig(sample_rate=RATE, clip_seconds=1.0, n_fft=400, hop_length=160, n_mels=40)
CLASSES = 4


def wav(signal: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, signal.astype(np.float32), RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def make_noise_and_rirs(root: Path, seed: int) -> tuple[Path, Path]:
    """Unlabeled shards of background noise (1.5 s) and of room impulse responses (0.3 s, exponential decay)."""
    rng = np.random.default_rng(seed)
    for folder in ("noise", "rirs"):
        (root / folder).mkdir()
    with al.ShardWriter(root / "noise" / "noise.arrow", labeled=False) as writer:
        for i in range(6):
            white = rng.standard_normal(round(1.5 * RATE))
            # every other clip low-passed (a running mean): rumble instead of hiss
            noise = white if i % 2 else np.convolve(white, np.ones(8) / 8, mode="same")
            writer.write(wav(0.1 * noise))
    t = np.arange(round(0.3 * RATE)) / RATE
    with al.ShardWriter(root / "rirs" / "rirs.arrow", labeled=False) as writer:
        for i in range(4):
            ir = rng.standard_normal(len(t)) * np.exp(-t / (0.03 + 0.03 * i))
            ir[0] = 1.0  # the direct path
            writer.write(wav(ir))
    return root / "noise", root / "rirs"


def make_sources(root: Path, seed: int) -> al.Mix:
    def source(name: str, clips_per_class: int, first_clip: int) -> Path:
        return make_classification_dataset(root / name, clips_per_class, seed=seed, num_classes=CLASSES,
                                           num_shards=2, min_seconds=0.5, max_seconds=2.5, first_clip=first_clip,
                                           rows_per_batch=4)

    return al.Mix({"studio": (source("studio", 8, 0), 0.6),
                   "field": (source("field", 6, 100), 0.3),
                   "rare": (source("rare", 2, 200), 0.1)})  # 8 rows: it cycles


def make_loader(mix: al.Mix, noise: Path, rirs: Path, args: argparse.Namespace) -> al.AudioLoader:
    """The loader; a resumed one must be built with the same arguments."""
    augment = [
        al.SpeedPerturb((0.9, 1.0, 1.1)),
        al.Gain(-6, 6),
        al.AddNoise(noise, snr_db=(5, 20), p=0.5),
        al.Reverb(rirs, p=0.3),
        al.SpecAugment(freq_masks=2, max_freq_width=6, time_masks=2, max_time_width=10),
        al.Mixup(alpha=0.4),
    ]
    return al.AudioLoader(mix, batch_size=args.batch_size, seed=args.seed, features=FEATURES, augment=augment,
                          workers=al.Workers(num_workers=args.workers), shuffle=al.Shuffle(buffer_size=64, min_size=32))


def small_cnn() -> nn.Module:
    """[B, n_mels, frames] -> [B, CLASSES] logits."""
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(nn.Unflatten(1, (1, FEATURES.n_mels)), block(1, 8), block(8, 16), block(16, 32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))


def digest(batch: dict[str, Any]) -> str:
    """SHA-256 over every tensor of a batch."""
    h = hashlib.sha256()
    for name in sorted(batch):
        if isinstance(batch[name], torch.Tensor):
            h.update(name.encode())
            h.update(batch[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def train(model: nn.Module, optimizer: torch.optim.Optimizer, loader: al.AudioLoader, steps: range,
          checkpoint: tuple[int, Path] | None = None) -> list[str]:
    """Train for ``steps``; returns each batch's digest. Saves a checkpoint after step ``checkpoint[0]``."""
    digests = []
    batches = iter(loader)  # one iterator for the whole run
    for step in steps:
        batch = next(batches)
        digests.append(digest(batch))
        logits = model(batch["spectrogram"])
        # Mixup: a soft target per sample, w on its own label and 1 - w on its partner's.
        targets = al.mixup_targets(batch, CLASSES)
        loss = -(targets * logits.log_softmax(dim=1)).sum(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == steps[-1]:
            print(f"step {step:3d}  loss {loss.item():.3f}", flush=True)
        if checkpoint is not None and step == checkpoint[0]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "data": loader.state_dict(), "step": step}, checkpoint[1])
    return digests


def new_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = small_cnn()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="decode workers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the decode workers have the other cores
    stop = random.Random(args.seed).randrange(1, args.steps - 1)  # the interruption: a random step

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        mix = make_sources(root, args.seed)
        noise, rirs = make_noise_and_rirs(root, args.seed)
        ckpt = root / "ckpt.pt"

        print(f"uninterrupted run, {args.steps} steps; checkpoint after step {stop}")
        model, optimizer = new_model(args.seed)
        with make_loader(mix, noise, rirs, args) as loader:
            expected = train(model, optimizer, loader, range(args.steps), (stop, ckpt))
            stats = loader.stats()
        final = [p.detach().clone() for p in model.parameters()]

        print(f"resumed run: a fresh model, optimizer and loader from the checkpoint of step {stop}")
        state = torch.load(ckpt, weights_only=True)
        model, optimizer = new_model(args.seed + 1)  # other initial weights: the checkpoint must restore them
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        with make_loader(mix, noise, rirs, args) as loader:
            loader.load_state_dict(state["data"])
            resumed = train(model, optimizer, loader, range(state["step"] + 1, args.steps))

    same = resumed == expected[stop + 1:]
    print(f"resumed batches identical to the uninterrupted run: {same} ({len(resumed)} batches)")
    weights = all(torch.equal(a, b) for a, b in zip(final, model.parameters(), strict=True))
    print(f"resumed model ends with the same weights: {weights}")
    print("per source: weight, share of the samples, passes started")
    for name, s in stats["sources"].items():
        print(f"  {name:7} {s['weight']:.2f}  {s['share']:.2f}  {s['passes']}")
    shuffle = stats["shuffle"]
    print(f"shuffle: {shuffle['splits_per_batch']:.1f} splits per batch (full shuffle "
          f"{shuffle['full_shuffle_splits_per_batch']:.1f}), mean displacement {shuffle['mean_displacement']:.1f} "
          f"(full shuffle {shuffle['full_shuffle_displacement']:.1f}), {shuffle['sources_per_batch']:.2f} sources "
          f"per batch (full shuffle {shuffle['full_shuffle_sources_per_batch']:.2f})")
    return same and weights


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
