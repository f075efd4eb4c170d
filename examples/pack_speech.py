"""From speech downloads to batches: `audioloader pack` on each input it reads, then a speech loader.

    python examples/pack_speech.py                           # builds tiny inputs of each kind in a temp folder
    python examples/pack_speech.py --librispeech LibriSpeech/dev-clean --out shards/   # a real download
    python examples/pack_speech.py --commonvoice cv-corpus-17.0/en/dev.tsv --out shards/

For each input it prints the command it runs and the summary `audioloader pack` ends with
(what it wrote, what it skipped and why), then reads the LibriSpeech shards (or yours)
the way a speech recipe does: whole utterances as 80-bin Kaldi fbank, batched by
duration, with the transcripts.

The inputs built here, a few seconds of tones each (real corpora hold speech):

- a LibriSpeech tree: ``<speaker>/<chapter>/*.flac`` and ``<speaker>-<chapter>.trans.txt``;
- a Common Voice release: ``train.tsv`` beside ``clips/*.mp3``;
- a CSV manifest ``path,text,speaker``, a JSONL one (NeMo's ``audio_filepath``, ``text``);
- a Hugging Face ``audiofolder``: ``metadata.csv`` with ``file_name,transcription``;
- a manifest of segments of two long recordings: ``path,start,end,text``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

import audioloader as al
from audioloader.tools import cli

RATE = 16000


def clip(path: Path, seconds: float, fmt: str = "FLAC", seed: int = 0, rate: int = RATE) -> None:
    """A few harmonics with a syllable-like envelope: ``seconds`` of mono audio at ``rate`` Hz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(round(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    pitch = rng.uniform(90, 220)
    voice = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(2, 5) * t)
    sf.write(path, (0.2 * voice * envelope).astype(np.float32), rate, format=fmt)


def build_inputs(root: Path) -> dict[str, Path]:
    """One small input of each kind under ``root``; returns {name: the path to give `audioloader pack`}."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    lines = {}
    for u in range(6):  # LibriSpeech: 2 speakers x 1 chapter x 3 utterances
        speaker, chapter = (19, 198) if u < 3 else (26, 495)
        utt = f"{speaker}-{chapter}-{u % 3:04d}"
        clip(root / "LibriSpeech" / "dev-clean" / str(speaker) / str(chapter) / f"{utt}.flac", 1.0 + u / 2, seed=u)
        lines.setdefault((speaker, chapter), []).append(f"{utt} {' '.join(words[u:u + 4]).upper()}")
    for (speaker, chapter), text in lines.items():
        folder = root / "LibriSpeech" / "dev-clean" / str(speaker) / str(chapter)
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(text) + "\n")

    cv = root / "cv-corpus" / "en"  # Common Voice: TSV + clips/*.mp3 (one with an empty sentence)
    rows = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\tlocale"]
    for i in range(4):
        clip(cv / "clips" / f"common_voice_en_{i}.mp3", 1.5 + i / 3, fmt="MP3", seed=10 + i, rate=48000)
        sentence = "" if i == 2 else " ".join(words[i:i + 5]).capitalize() + "."
        rows.append(f"client{i % 2}\tcommon_voice_en_{i}.mp3\t{sentence}\t{2 + i}\t0\t{'twenties' if i else ''}"
                    f"\t\ten")
    (cv / "train.tsv").write_text("\n".join(rows) + "\n")

    data = root / "my_corpus"
    for i in range(3):
        clip(data / "wavs" / f"utt{i}.wav", 1.2 + i / 2, fmt="WAV", seed=20 + i)
    (data / "train.csv").write_text("path,text,speaker\n" + "".join(
        f"wavs/utt{i}.wav,{' '.join(words[i:i + 3])},spk{i % 2}\n" for i in range(3)))
    (data / "train.jsonl").write_text("".join(json.dumps({"audio_filepath": f"wavs/utt{i}.wav", "text": words[i],
                                                          "duration": 1.2 + i / 2}) + "\n" for i in range(3)))

    hf = root / "hf_audiofolder"
    for i in range(2):
        clip(hf / "data" / f"{i}.wav", 1.0 + i, fmt="WAV", seed=30 + i)
    (hf / "metadata.csv").write_text("file_name,transcription\ndata/0.wav,hello there\ndata/1.wav,general kenobi\n")

    meetings = root / "meetings"  # two 60 s recordings, segmented
    for m in range(2):
        clip(meetings / f"meeting{m}.flac", 60.0, seed=40 + m)
    segments = ["path,start,end,text"] + [f"meeting{m}.flac,{s:.2f},{s + 2.5 + (s % 7):.2f},turn {k}"
                                          for m in range(2) for k, s in enumerate(np.arange(0.5, 50.0, 9.75))]
    (meetings / "segments.csv").write_text("\n".join(segments) + "\n")
    return {"librispeech": root / "LibriSpeech" / "dev-clean", "commonvoice": cv / "train.tsv",
            "csv": data / "train.csv", "jsonl": data / "train.jsonl", "audiofolder": hf,
            "segments": meetings / "segments.csv"}


def pack(src: Path, out: Path) -> None:
    """Run `audioloader pack SRC OUT` as a user would (here in this process), showing the command."""
    print(f"$ audioloader pack {src.name if src.is_file() else src} {out.name}/")
    status = cli.main(["pack", str(src), str(out), "--overwrite"])
    if status:
        raise SystemExit(status)


def train_a_little(shards: Path, batches: int, max_duration: float = 200.0, shuffle: al.Shuffle | None = None) -> None:
    """What a speech recipe builds on the shards: fbank of whole utterances, bucketed, with transcripts."""
    loader = al.AudioLoader(al.Source(shards, label_column=None), train=True, features=al.FbankConfig(),
                            columns=["text"], length=al.LengthPolicy(crop=None, max_seconds=20.0),
                            batching=al.Bucketing(max_duration=max_duration), shuffle=shuffle)
    with loader:
        for step, batch in zip(range(batches), loader, strict=False):
            lengths = batch["lengths"]
            print(f"batch {step}: fbank {tuple(batch['fbank'].shape)} ({len(lengths)} utterances, "
                  f"{float(lengths.sum()) / 100:.1f} s of audio), first text {batch['text'][0]!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--librispeech", type=Path, help="a LibriSpeech download folder (e.g. LibriSpeech/dev-clean)")
    parser.add_argument("--commonvoice", type=Path, help="a Common Voice TSV (e.g. cv-corpus-17.0/en/dev.tsv)")
    parser.add_argument("--out", type=Path, help="where to write the shards (default: a temporary folder)")
    parser.add_argument("--batches", type=int, default=2, help="training batches to show")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "shards"
        if args.librispeech or args.commonvoice:
            pack(args.librispeech or args.commonvoice, out)
            train_a_little(out, args.batches)
            return 0
        inputs = build_inputs(Path(scratch) / "downloads")
        for name, src in inputs.items():
            pack(src, out.with_name(f"{name}-shards"))
            print()
        # A corpus of 6 utterances (11 s): batches of 8 s and a buffer of a few rows (the training preset's
        # holds 10000; in a real corpus a batch of 200 s holds 20-100 utterances).
        train_a_little(out.with_name("librispeech-shards"), args.batches, 8.0, al.Shuffle(buffer_size=4, min_size=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
