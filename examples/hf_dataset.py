"""Read a Hugging Face ``datasets`` dataset as it is: a ``save_to_disk`` folder and a ``to_parquet`` export.

    python examples/hf_dataset.py                              # builds a small HF dataset first
    python examples/hf_dataset.py --saved my_ds/ --parquet my_ds.parquet
    python examples/hf_dataset.py --label-column none           # audio without labels (e.g. for pre-training)

No conversion step: ``save_to_disk`` writes Arrow IPC *stream* files plus a
``state.json`` listing them (AudioLoader reads exactly those files, ignoring any
``cache-*.arrow`` next to them), and ``to_parquet`` writes Parquet. An ``Audio``
column is stored as a struct ``{bytes: binary, path: string}``; AudioLoader takes
the ``bytes`` field. Class names come from the ``ClassLabel`` feature in the
schema metadata.

Building the dataset: ``Audio()`` with decoding on needs torchcodec to *encode*
arrays, so the example stores already-encoded WAV/FLAC bytes under a plain
struct feature and then casts the column to ``Audio(decode=False)``, which is
what ``datasets`` itself stores for audio files.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import audioloader as al
from audioloader.shards import ShardDataset
from audioloader.tools.synthetic import CLASS_NAMES, make_clip

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=2.0, n_fft=512, hop_length=256, n_mels=64)


def build_hf_dataset(folder: Path, clips_per_class: int, seed: int) -> tuple[Path, Path]:
    """A small labeled HF dataset; returns (save_to_disk folder, parquet file)."""
    import datasets
    from datasets import Audio, ClassLabel, Dataset, Features, Value

    datasets.disable_progress_bars()
    names = list(CLASS_NAMES[:5])
    clips = [make_clip(label, j, seed=seed, max_seconds=4.0) for j in range(clips_per_class)
             for label in range(len(names))]
    features = Features({"audio": {"bytes": Value("binary"), "path": Value("string")},
                         "label": ClassLabel(names=names)})
    ds = Dataset.from_dict({"audio": [{"bytes": c.audio, "path": c.path} for c in clips],
                            "label": [c.label for c in clips]}, features=features)
    ds = ds.cast_column("audio", Audio(decode=False))
    saved, parquet = folder / "hf_saved", folder / "hf.parquet"
    ds.save_to_disk(str(saved), num_shards=2)
    ds.to_parquet(str(parquet))
    return saved, parquet


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved", type=Path, help="a Dataset.save_to_disk folder")
    parser.add_argument("--parquet", type=Path, help="a Dataset.to_parquet file (or a folder of them)")
    parser.add_argument("--audio-column", default="audio")
    parser.add_argument("--label-column", default="label",
                        help="integer class column, or 'none' to read the audio unlabeled (batches without 'label')")
    parser.add_argument("--clips-per-class", type=int, default=6, help="clips per class when building the dataset")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    label_column = None if args.label_column.lower() == "none" else args.label_column

    with tempfile.TemporaryDirectory() as scratch:
        saved, parquet = args.saved, args.parquet
        if saved is None and parquet is None:
            saved, parquet = build_hf_dataset(Path(scratch), args.clips_per_class, args.seed)
        per_source = {}
        for name, path in (("save_to_disk", saved), ("to_parquet", parquet)):
            if path is None:
                continue
            ds = ShardDataset(path, audio_column=args.audio_column, label_column=label_column)
            classes = f"classes {ds.label_names}" if label_column else "unlabeled"
            print(f"{name}: {path}: {len(ds.files)} file(s), {ds.files[0].format}, {ds.num_rows} rows, "
                  f"audio column type {ds.schema.field(args.audio_column).type}, {classes}")
            # The columns to read: a Source names them (label_column=None: no labels in the batches).
            source = al.Source(path, audio_column=args.audio_column, label_column=label_column)
            # Evaluation order: one pass, file order, centre crops.
            with al.AudioLoader(source, batch_size=args.batch_size, train=False, features=FEATURES,
                                workers=al.Workers(num_workers=2)) as loader:
                batches = list(loader)
            per_source[name] = batches
            first = batches[0]
            what = f"labels {first['label'].tolist()}" if label_column else f"keys {sorted(first)}"
            print(f"  eval: {len(batches)} batches, spectrogram {tuple(first['spectrogram'].shape)}, {what}")
            # Training: infinite, shuffled; a small buffer for a small dataset.
            with al.AudioLoader(source, batch_size=args.batch_size, train=True, seed=args.seed, features=FEATURES,
                                workers=al.Workers(num_workers=2),
                                shuffle=al.Shuffle(buffer_size=32, min_size=16)) as loader:
                batch = next(iter(loader))
            what = f"labels {batch['label'].tolist()}" if label_column else f"indices {batch['index'].tolist()}"
            print(f"  train: first batch {what}")

        same = None
        if len(per_source) == 2:
            a, b = per_source.values()
            same = len(a) == len(b) and all(
                torch.equal(x["spectrogram"], y["spectrogram"]) and torch.equal(x["index"], y["index"])
                and (label_column is None or torch.equal(x["label"], y["label"])) for x, y in zip(a, b, strict=True))
            print(f"save_to_disk and to_parquet give identical eval batches: {same}")
    return same is not False


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
