"""Build the loading chain by hand from `audioloader.nodes`, in both orders, plus a node of your own.

    python examples/compose_nodes.py                 # synthetic data in a temporary folder
    python examples/compose_nodes.py --data shards/

`AudioLoader` only assembles nodes that you can assemble yourself, in one of two orders
(which one it picks: docs/concepts.md, "Data flow"):

  A. shuffle raw rows, then decode (AudioLoader's default for local Arrow IPC
     shards, remote shards and duration bucketing; ``shuffle=al.Shuffle(before_decode=True)``)
       ArrowShardReader -> ShuffleBuffer -> DecodeSpectrogram -> Batcher
     The buffer holds the rows' encoded bytes (zero-copy views of the memory-mapped
     shards), far smaller than spectrograms, so it can be much larger.

  B. decode, then shuffle (AudioLoader's default for local Parquet and ORC shards;
     ``shuffle=al.Shuffle(before_decode=False)``)
       ArrowShardReader -> DecodeSpectrogram -> ShuffleBuffer -> Batcher
     The buffer holds decoded spectrograms (float32 [n_mels, frames] each).

Both orders yield the *same* batches: the buffer's picks depend only on the seed
and its fill level, and each clip's crop only on (seed, key), not on when or
where it was decoded. Between the nodes you can put torchdata nodes of your own;
here a ``Mapper`` adds a per-clip loudness feature. A checkpoint of the hand-built
chain resumes exactly, like AudioLoader's.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch
from torchdata.nodes import Mapper

import audioloader as al
from audioloader.nodes import ArrowShardReader, Batcher, CatchFailures, DecodeSpectrogram, Prefetcher, ShuffleBuffer
from audioloader.tools.synthetic import make_classification_dataset

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)


def add_loudness(sample: al.Sample) -> al.Sample:
    """A user node's function: the clip's mean log-mel energy as an extra column (a pure function of the sample)."""
    extras = {**sample.extras, "loudness": float(sample.spectrogram.mean())}
    return dataclasses.replace(sample, extras=extras)


def decode_then_shuffle(data: Path, seed: int, batch_size: int, workers: int) -> al.Loader:
    """Chain B. Returns an `audioloader.Loader` (torchdata's Loader with exact resume and clean shutdown)."""
    reader = ArrowShardReader.of(data, seed=seed, shuffle=True, infinite=True)   # RawSample, encoded audio
    decode = DecodeSpectrogram.of(reader, FEATURES, seed=seed, train=True, num_workers=workers)  # -> Sample
    loudness = Mapper(decode, add_loudness)                                   # your own node

    def restore(keys):
        # On resume the buffer gets back its items by key: a random-access read of those
        # rows and the same decode (same per-key crop), in parallel; so a checkpoint holds
        # only keys. (AudioLoader's version also fails loudly if a row no longer decodes.)
        return [add_loudness(s) for s in decode.decode_many(reader.fetch(keys))]

    shuffle = ShuffleBuffer.of(loudness, capacity=128, min_size=64, seed=seed, restore=restore)
    batches = Batcher.of(shuffle, batch_size, columns=["loudness"])
    # CatchFailures carries an exception out of the Prefetcher's thread intact (torchdata
    # 0.11 would turn it into a string and hang); Prefetcher prepares batches ahead.
    return al.Loader(Prefetcher(CatchFailures(batches), prefetch_factor=2))


def shuffle_then_decode(data: Path, seed: int, batch_size: int, workers: int) -> al.Loader:
    """Chain A: the buffer holds raw rows; ``reader.fetch`` restores them from their keys."""
    reader = ArrowShardReader.of(data, seed=seed, shuffle=True, infinite=True)
    shuffle = ShuffleBuffer.of(reader, capacity=128, min_size=64, seed=seed, restore=reader.fetch)
    decode = DecodeSpectrogram.of(shuffle, FEATURES, seed=seed, train=True, num_workers=workers)
    loudness = Mapper(decode, add_loudness)
    batches = Batcher.of(loudness, batch_size, columns=["loudness"])
    return al.Loader(Prefetcher(CatchFailures(batches), prefetch_factor=2))


def take(loader: al.Loader, n: int) -> list[dict]:
    batches = iter(loader)
    return [next(batches) for _ in range(n)]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x["spectrogram"], y["spectrogram"]) and torch.equal(x["index"], y["index"])
        and torch.equal(x["label"], y["label"]) and torch.equal(x["loudness"], y["loudness"])
        for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="shard folder (default: a synthetic dataset in a temporary folder)")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="decode threads")
    parser.add_argument("--clips-per-class", type=int, default=16, help="synthetic clips per class")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n = args.batches

    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or make_classification_dataset(Path(scratch), args.clips_per_class, seed=args.seed,
                                                        max_seconds=4.0)
        build = {"shuffle then decode": shuffle_then_decode, "decode then shuffle": decode_then_shuffle}
        results = {}
        for name, make in build.items():
            with make(data, args.seed, args.batch_size, args.workers) as loader:
                results[name] = take(loader, n)
            first = results[name][0]
            loudness = [round(x, 2) for x in first["loudness"][:3].tolist()]
            print(f"{name}: {n} batches; first: spectrogram {tuple(first['spectrogram'].shape)} "
                  f"{first['spectrogram'].dtype}, label {first['label'][:6].tolist()}..., "
                  f"index {first['index'][:6].tolist()}..., loudness {loudness}...")
        a, b = results.values()
        identical = same(a, b)
        print(f"both orders yield identical batches: {identical}")

        # Exact resume of a hand-built chain: save after n // 2 batches, rebuild, load, continue.
        with shuffle_then_decode(data, args.seed, args.batch_size, args.workers) as loader:
            take(loader, n // 2)
            state = loader.state_dict()  # small: keys of the buffered rows, counters, positions
        with shuffle_then_decode(data, args.seed, args.batch_size, args.workers) as loader:
            loader.load_state_dict(state)
            resumed = take(loader, n - n // 2)
        exact = same(resumed, a[n // 2:])  # the same chain, uninterrupted
        print(f"resumed hand-built chain matches the uninterrupted one: {exact}")
    return identical and exact


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
