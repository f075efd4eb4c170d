"""Interrupt a loader, resume it in a new process, and check that the batches are identical.

    python examples/resume.py                # synthetic data in a temporary folder
    python examples/resume.py --data shards/ # your own shards

For each mode (train and eval) this

1. runs an uninterrupted loader for ``--stop + --batches`` batches and keeps a
   digest (SHA-256 of every tensor) of the last ``--batches`` of them;
2. runs a second loader for ``--stop`` batches, saves ``loader.state_dict()``
   with ``torch.save`` and throws the loader away (the "interruption");
3. starts a new Python process that builds a fresh loader with the same
   arguments, loads the saved state and yields ``--batches`` batches;
4. compares the digests: a resumed loader yields exactly the batches the
   uninterrupted one yielded next, bit for bit.

Finally it shows that loading the state into a loader built with different
arguments raises `audioloader.CheckpointMismatchError`, naming the field.

In a real job you save the loader's state beside the model's::

    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "data": loader.state_dict(), "step": step}, "ckpt.pt")
    ...
    ckpt = torch.load("ckpt.pt")   # plain Python types and tensors: weights_only-safe
    loader = al.AudioLoader(...same arguments...)
    loader.load_state_dict(ckpt["data"])
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import audioloader as al
from audioloader.tools.synthetic import make_classification_dataset

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)


def make_loader(data: Path, mode: str, batch_size: int, seed: int) -> al.AudioLoader:
    """The loader under test. A resumed loader must be built with the same arguments as the saved one."""
    if mode == "train":
        # Small buffer for a small dataset (the preset's 10000 is for large ones).
        return al.AudioLoader(data, batch_size=batch_size, train=True, seed=seed, features=FEATURES,
                              workers=al.Workers(num_workers=2), shuffle=al.Shuffle(buffer_size=64, min_size=32))
    return al.AudioLoader(data, batch_size=batch_size, train=False, seed=seed, features=FEATURES,
                          workers=al.Workers(num_workers=2))


def digest(batch: dict[str, Any]) -> str:
    """SHA-256 over every tensor of a batch (name, dtype, shape and bytes)."""
    h = hashlib.sha256()
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, torch.Tensor):
            h.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
            h.update(value.contiguous().numpy().tobytes())
        else:
            h.update(f"{name}:{value!r}".encode())
    return h.hexdigest()


def take(loader: al.AudioLoader, n: int) -> list[dict[str, Any]]:
    """The next ``n`` batches of a fresh ``iter(loader)`` (fewer if an eval pass ends first)."""
    batches = iter(loader)
    out = []
    for _ in range(n):  # not `for batch in loader: ... break`, which would pull one batch too many
        try:
            out.append(next(batches))
        except StopIteration:
            break
    return out


def resume_in_this_process(args: argparse.Namespace) -> None:
    """Step 3, run as the child process: load the state, print the next batches' digests as JSON."""
    state = torch.load(args.resume, weights_only=True)
    with make_loader(args.data, args.mode, args.batch_size, args.seed) as loader:
        loader.load_state_dict(state["data"])
        print(json.dumps([digest(b) for b in take(loader, args.batches)]))


def check_mode(mode: str, args: argparse.Namespace, scratch: Path) -> bool:
    stop = args.stop
    # 1. The uninterrupted run.
    with make_loader(args.data, mode, args.batch_size, args.seed) as loader:
        if mode == "eval" and stop >= len(loader):
            # A state saved after the last batch of a pass resumes into the next pass
            # (torchdata's Loader restarts at the end of an epoch); stop inside the pass.
            stop = len(loader) // 2
        expected = [digest(b) for b in take(loader, stop + args.batches)[stop:]]
    # 2. The interrupted run: stop after `--stop` batches and save the loader's state.
    ckpt = scratch / f"{mode}.pt"
    with make_loader(args.data, mode, args.batch_size, args.seed) as loader:
        take(loader, stop)
        state = loader.state_dict()
        torch.save({"data": state, "step": stop}, ckpt)
    print(f"{mode}: stopped after {stop} batches, saved the loader state ({ckpt.stat().st_size} bytes)")
    # 3. Resume in a brand-new process.
    child = subprocess.run(
        [sys.executable, __file__, "--resume", str(ckpt), "--mode", mode, "--data", str(args.data),
         "--batch-size", str(args.batch_size), "--batches", str(args.batches), "--seed", str(args.seed)],
        check=True, capture_output=True, text=True)
    resumed = json.loads(child.stdout.strip().splitlines()[-1])
    # 4. Compare.
    same = resumed == expected
    print(f"{mode}: resumed in a new process; {len(expected)} batches "
          f"{'identical' if same else 'DIFFERENT'} to the uninterrupted run")

    # A state only loads into a loader built the same way: a different batch size is refused.
    with make_loader(args.data, mode, args.batch_size + 1, args.seed) as other:
        try:
            other.load_state_dict(state)
        except al.CheckpointMismatchError as error:
            print(f"{mode}: loading into a loader with another batch size raises CheckpointMismatchError "
                  f"(fields: {', '.join(error.fields)})")
    return same


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="shard folder (default: a synthetic dataset in a temporary folder)")
    parser.add_argument("--stop", type=int, default=5, help="batches before the interruption")
    parser.add_argument("--batches", type=int, default=3, help="batches compared after resuming")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--clips-per-class", type=int, default=8, help="synthetic clips per class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=("train", "eval", "both"), default="both")
    parser.add_argument("--resume", type=Path, help=argparse.SUPPRESS)  # internal: the child process of step 3
    args = parser.parse_args(argv)
    if args.resume is not None:
        resume_in_this_process(args)
        return True

    with tempfile.TemporaryDirectory() as scratch:
        if args.data is None:
            args.data = make_classification_dataset(Path(scratch) / "data", args.clips_per_class, seed=args.seed,
                                                    max_seconds=4.0)
        modes = ("train", "eval") if args.mode == "both" else (args.mode,)
        ok = all([check_mode(mode, args, Path(scratch)) for mode in modes])
    print("resume: all batches identical" if ok else "resume: MISMATCH")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
