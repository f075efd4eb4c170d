"""Speech batches: whole utterances as Kaldi fbank, bucketed by duration, with transcripts; resumed mid-pass.

    python examples/speech_batches.py                    # builds a small Hugging Face dataset first
    python examples/speech_batches.py --data my_ds/      # a save_to_disk folder or Parquet with audio + text

What a speech recogniser's training loop gets from audioloader:

- ``features=al.FbankConfig()``: 80-bin Kaldi filterbanks, equal to
  ``torchaudio.compliance.kaldi.fbank`` (what icefall, ESPnet and WeNet recipes use);
- ``length=al.LengthPolicy(crop=None, max_seconds=...)``: whole utterances, not crops;
- ``batching=al.Bucketing(max_duration=...)``: batches hold up to that many seconds of
  audio, drawn from buckets of similar duration, so they pad little;
- each batch: ``fbank`` float32 ``[B, T, 80]``, ``lengths`` int64 ``[B]`` (frames),
  ``padding_mask`` bool ``[B, T]`` (True where padded), ``text`` (a list of B strings),
  ``index`` int64 ``[B]``.

The example builds a Hugging Face ``datasets`` corpus (an ``Audio`` column stored
as encoded WAV/FLAC bytes, and a ``text`` column), trains on it for a few
batches, checkpoints in the middle of a pass, resumes in a fresh loader and
checks the next batches are identical, then makes one evaluation pass (each
utterance exactly once).
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from pathlib import Path

import torch

import audioloader as al
from audioloader.tools.synthetic import CLASS_NAMES, make_clip

FEATURES = al.FbankConfig(num_mel_bins=80)  # 16 kHz, 25 ms frames every 10 ms, povey window
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def build_corpus(folder: Path, utterances: int, seed: int) -> Path:
    """A Hugging Face dataset of ``utterances`` clips of 1-12 s at 16 kHz with transcripts; its save_to_disk folder."""
    import datasets

    datasets.disable_progress_bars()
    audio, text = [], []
    for i in range(utterances):
        clip = make_clip(i % len(CLASS_NAMES), i, seed=seed, min_seconds=1.0, max_seconds=12.0,
                         sample_rates=(16000,), stereo_fraction=0.0)
        audio.append({"bytes": clip.audio, "path": f"utt{i:04d}.{clip.path.rsplit('.', 1)[1]}"})
        text.append(" ".join(WORDS[int(d)] for d in f"{i:04d}"))
    features = datasets.Features({"audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
                                  "text": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"audio": audio, "text": text}, features=features)
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(folder / "corpus"), num_shards=2)
    return folder / "corpus"


def speech_loader(data: Path, *, train: bool, max_duration: float, workers: int, seed: int) -> al.AudioLoader:
    """The loader a speech recipe builds: fbank of whole utterances, bucketed by duration, with transcripts."""
    return al.AudioLoader(
        al.Source(data, label_column=None), train=train, seed=seed, features=FEATURES,
        columns=["text"],  # unlabeled audio; the transcripts come as lists of strings
        length=al.LengthPolicy(crop=None, max_seconds=20.0, too_long="skip", min_seconds=0.5),
        batching=al.Bucketing(max_duration=max_duration),  # buckets fitted to the data, at most 32
        shuffle=al.Shuffle(buffer_size=64, min_size=32),  # small: a small corpus (the preset holds 10000 rows)
        workers=al.Workers(num_workers=workers))


def describe(batch: dict) -> str:
    lengths = batch["lengths"]
    efficiency = float(lengths.sum()) / batch["padding_mask"].numel()
    return (f"fbank {tuple(batch['fbank'].shape)}, {float(lengths.sum()) / 100:.1f} s of speech, "
            f"padding efficiency {efficiency:.2f}, first text {batch['text'][0]!r}")


def same_batch(a: dict, b: dict) -> bool:
    return (torch.equal(a["fbank"], b["fbank"]) and torch.equal(a["lengths"], b["lengths"])
            and torch.equal(a["index"], b["index"]) and a["text"] == b["text"])


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a save_to_disk folder or Parquet file(s) with audio and text")
    parser.add_argument("--utterances", type=int, default=120, help="utterances to generate (without --data)")
    parser.add_argument("--max-duration", type=float, default=60.0, help="seconds of audio per batch")
    parser.add_argument("--batches", type=int, default=6, help="training batches before the checkpoint")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or build_corpus(Path(scratch), args.utterances, args.seed)
        options = dict(max_duration=args.max_duration, workers=args.workers, seed=args.seed)

        # Train: take a few batches, checkpoint mid-pass, take a few more (what the run would see next).
        with speech_loader(data, train=True, **options) as loader:
            it = iter(loader)
            for step in range(args.batches):
                print(f"train step {step}: {describe(next(it))}")
            checkpoint = loader.state_dict()
            expected = [next(it) for _ in range(3)]
        print(f"checkpoint after {args.batches} batches: {len(pickle.dumps(checkpoint))} bytes (keys, not audio)")

        # Resume in a fresh loader (in a real job: a new process after torch.load).
        with speech_loader(data, train=True, **options) as loader:
            loader.load_state_dict(checkpoint)
            it = iter(loader)
            resumed = [next(it) for _ in range(len(expected))]
        identical = all(same_batch(a, b) for a, b in zip(expected, resumed, strict=True))
        print(f"resumed mid-pass: next {len(resumed)} batches identical: {identical}")

        # Evaluate: one pass, every utterance exactly once (in DDP, across all ranks).
        with speech_loader(data, train=False, **options) as loader:
            seen = [int(i) for batch in loader for i, ok in zip(batch["index"], batch["valid"], strict=True) if ok]
            skipped = loader.stats()["skipped_rows"]
        total = len(seen) + len(skipped)
        once = len(seen) == len(set(seen)) and sorted(seen + [r["index"] for r in skipped]) == list(range(total))
        print(f"eval: {len(seen)} utterances in {len(loader)} batches, {len(skipped)} skipped by the length "
              f"policy, each exactly once: {once}")
    return identical and once


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
