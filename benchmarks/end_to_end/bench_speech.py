"""Speech training, audioloader against Lhotse, as a user would run each: throughput, first batch, peak memory.

Corpora (generated once into ``--cache-dir``): utterances of 1-20 s spoken by
espeak-ng (voices, speeds and pitches varied per utterance; soundfile-made
tones when espeak-ng is missing: ``apt-get install espeak-ng``), 16 kHz mono,
half FLAC and half WAV, with transcripts. Stored twice: as Hugging Face-shaped
Parquet (``audio: struct<bytes, path>``, ``text``, ``duration``; row groups of 100
rows, as ``datasets`` writes audio) for audioloader, and as audio files plus a
Lhotse cut manifest (``cuts.jsonl.gz``, prepared once) for Lhotse. Three sizes:
``--utterances`` (600, the main figures), ``--large`` (more bytes than the
training preset's 256 MiB shuffle budget) and ``--small`` (fewer rows than any
buffer: its batches are checked for repeated utterances).

Contenders, each in a fresh process, with ``--workers`` workers, training mode,
80-bin Kaldi fbank with Lhotse's defaults (``snip_edges=False``, ``high_freq=-400``)
on both sides, batches of up to ``--max-duration`` s from 16 duration buckets:

- ``audioloader``: ``AudioLoader(Source(parquet, label_column=None), features=FbankConfig(...),
  length=LengthPolicy(crop=None), batching=Bucketing(max_duration=D), columns=["text"],
  workers=Workers(num_workers=N))``, the training preset otherwise (shuffle buffer, interleaving,
  byte budget: the defaults);
- ``lhotse`` (1.33, in a virtual environment this script creates: it is not a
  dependency): ``CutSet.from_file(manifest).repeat()`` (an endless stream, as
  audioloader's), ``DynamicBucketingSampler(cuts, max_duration=D, shuffle=True,
  num_buckets=16)``, ``K2SpeechRecognitionDataset(OnTheFlyFeatures(Fbank(...)))``
  under ``torch.utils.data.DataLoader(batch_size=None, num_workers=N)``, as its
  documentation shows.

Reported per contender and corpus (medians over interleaved rounds): audio seconds
delivered per wall second in a steady window after ``--warmup`` batches, time to
the first batch (from the start of building the loader, after imports), peak PSS of
the whole process tree (workers included; every 0.25 s), padding efficiency (real
frames / padded frames), batches holding an utterance twice, and the CPU other
processes used meanwhile (a disturbed figure is marked). Targets (same run):
audioloader >= 1.5x Lhotse's audio s/s, first batch no later, peak PSS no more,
padding efficiency >= 0.93.

    python -m benchmarks.end_to_end.bench_speech [--utterances 600] [--large 2400] [--small 60] [--workers 2]
        [--seconds 20] [--rounds 2] [--max-duration 200] [--corpora main large small] [--contenders ...]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, emit_result, median_of, module_command, ratio_lines, rounds_line, run_child
from benchmarks.end_to_end.lhotse_env import lhotse_python

MIN_S, MAX_S, RATE = 1.0, 20.0, 16000
ROW_GROUP_ROWS = 100  # what Hugging Face `datasets` writes for audio
TARGETS = {"throughput": 1.5, "first_batch": 1.0, "peak_pss": 1.0, "padding_efficiency": 0.93}
_TEXT = (
    "the a of to and in is it that was for on are with as his they at be this from have or one had by word but "
    "not what all were when we there can an your which their said if do will each about how up out them then "
    "she many some so these would other into has more her two like him see time could no make than first been "
    "its who now people my made over did down only way find use may water long little very after words called "
    "just where most know get through back much before go good new write our used me man too any day same right "
    "look think also around another came come work three must because does part even place well such here take "
    "why help put different away again off went old number great tell men say small every found still between "
    "name should home big give air line set own under read last never us left end along while might next sound "
    "below saw something thought both few those always show large often together asked house world going want "
    "school important until form food keep children feet land side without boy once animal life enough took "
    "four head above kind began almost live page got earth need far hand high year mother light country father "
    "let night picture being study second soon story since white ever paper hard near sentence better best "
    "across during today however sure knew try told young sun thing whole hear example heard several change "
    "answer room sea against top turned learn point city play toward five himself usually money seen")
WORDS = tuple(_TEXT.split())  # the transcripts' vocabulary
VOICES = ("en", "en-us", "en+f3", "en+m3", "en-gb-x-rp", "en+f2", "en-us+m5", "en+f4")


# ---------------------------------------------------------------------------------------------- corpora


def _speak(text: str, voice: str, speed: int, pitch: int) -> tuple[np.ndarray, int]:
    import soundfile as sf

    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
                         capture_output=True, check=True).stdout
    signal, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return signal, rate


def _utterance(i: int, rng: np.random.Generator, espeak: bool) -> tuple[np.ndarray, str]:
    """One utterance at 16 kHz (float32) and its transcript, about U(1, 20) s long: the words are rescaled to the
    target duration once, after a first try, and the audio cut at 20 s."""
    import soxr

    from audioloader.tools.bench.dataset import DatasetSpec, synth_clip

    target = float(rng.uniform(MIN_S, MAX_S))
    if not espeak:
        words = " ".join(rng.choice(WORDS, size=max(1, round(target * 2.5))))
        return synth_clip(i, DatasetSpec(clips=1, seconds=round(target, 3), sample_rate=RATE)), words
    speed, pitch, voice = int(rng.integers(140, 200)), int(rng.integers(30, 70)), VOICES[i % len(VOICES)]
    count = max(1, round(target * speed / 60))
    for _ in range(2):
        words = " ".join(rng.choice(WORDS, size=count))
        signal, rate = _speak(words, voice, speed, pitch)
        seconds = len(signal) / rate
        count = max(1, round(count * target / seconds))
    signal = soxr.resample(signal, rate, RATE).astype(np.float32)
    return signal[: int(MAX_S * RATE)], words


def make_corpus(cache: Path, utterances: int) -> dict:
    """Audio files + Hugging Face-shaped Parquet of the same utterances (made once, then reused)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import soundfile as sf

    espeak = shutil.which("espeak-ng") is not None
    root = cache / f"speech-{'espeak' if espeak else 'synth'}-n{utterances}-v3"
    files, parquet = root / "audio", root / "parquet"
    if not (root / "done.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        files.mkdir(parents=True)
        parquet.mkdir(parents=True)
        rng = np.random.default_rng(utterances)
        audio_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        schema = pa.schema([("audio", audio_type), ("text", pa.string()), ("duration", pa.float64())])
        seconds = []
        with pq.ParquetWriter(parquet / "train-00000-of-00001.parquet", schema) as writer:
            rows: list[tuple[dict, str, float]] = []
            for i in range(utterances):
                signal, text = _utterance(i, rng, espeak)
                suffix, fmt = (".flac", "FLAC") if i % 2 else (".wav", "WAV")
                path = files / f"utt_{i:05d}{suffix}"
                sf.write(path, signal, RATE, format=fmt, subtype="PCM_16")
                seconds.append(len(signal) / RATE)
                (files / f"utt_{i:05d}.txt").write_text(text)
                rows.append(({"bytes": path.read_bytes(), "path": path.name}, text, seconds[-1]))
                if len(rows) == ROW_GROUP_ROWS or i == utterances - 1:
                    audio, texts, durations = zip(*rows, strict=True)
                    writer.write_table(pa.table({"audio": pa.array(audio, audio_type), "text": list(texts),
                                                 "duration": list(durations)}, schema=schema))
                    rows = []
        (root / "done.json").write_text(json.dumps({"seconds": seconds, "espeak": espeak}))
    done = json.loads((root / "done.json").read_text())
    audio_bytes = sum(p.stat().st_size for p in files.iterdir() if p.suffix in (".wav", ".flac"))
    return {"files": str(files), "parquet": str(parquet), "manifest": str(root / "cuts.jsonl.gz"),
            "durations": done["seconds"], "espeak": done["espeak"], "audio_bytes": audio_bytes}


# ---------------------------------------------------------------------------------------------- Lhotse's venv


def lhotse_manifest(python: str, corpus: dict) -> None:
    """The cut manifest a Lhotse user prepares once (recordings with a supervision each), as cuts.jsonl.gz."""
    if Path(corpus["manifest"]).exists():
        return
    subprocess.run(module_command(__spec__, "--prepare-manifest", json.dumps(corpus), python=python), cwd=ROOT,
                   check=True)


def _prepare_manifest(corpus: dict) -> None:
    from lhotse import CutSet, Recording, SupervisionSegment

    cuts = []
    for path in sorted(Path(corpus["files"]).glob("utt_*.*")):
        if path.suffix == ".txt":
            continue
        recording = Recording.from_file(path)
        cut = recording.to_cut()
        text = path.with_suffix(".txt").read_text()
        cut.supervisions = [SupervisionSegment(id=recording.id, recording_id=recording.id, start=0.0,
                                               duration=recording.duration, text=text)]
        cuts.append(cut)
    CutSet.from_cuts(cuts).to_file(corpus["manifest"])


# ---------------------------------------------------------------------------------------------- contenders


def run_audioloader(spec: dict) -> dict:
    import audioloader as al

    # `import audioloader` is lazy (its names load on first use): import what building a loader uses now, so the
    # first batch is timed after imports, as Lhotse's is (its imports come before its timer too).
    import audioloader.audio_loader
    import audioloader.chain
    import audioloader.nodes
    import audioloader.workers.pool

    started = time.perf_counter()
    loader = al.AudioLoader(al.Source(spec["parquet"], label_column=None), train=True, seed=0,
                            features=al.FbankConfig(num_mel_bins=80, snip_edges=False, high_freq=-400.0),
                            length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=spec["max_duration"]),
                            columns=["text"], workers=al.Workers(num_workers=spec["workers"]))
    batches = ((b["lengths"].tolist(), b["fbank"].shape[1], b["index"].tolist()) for b in loader)
    result = measure(batches, spec, started)
    memory = loader.stats()["memory"]
    loader.shutdown()
    buffer = memory.get("shuffle_buffer", {})
    return {**result, "held_peak_mb": memory["peak_bytes"] / 2**20, "buffer_limited_by": buffer.get("limited_by"),
            "buffer_rows": buffer.get("rows"), "interleave": loader.interleave}


def run_lhotse(spec: dict) -> dict:
    import torch
    from lhotse import CutSet, Fbank, FbankConfig
    from lhotse.dataset import DynamicBucketingSampler, K2SpeechRecognitionDataset, OnTheFlyFeatures

    started = time.perf_counter()
    cuts = CutSet.from_file(spec["manifest"]).repeat()  # an endless stream, as audioloader's training
    sampler = DynamicBucketingSampler(cuts, max_duration=spec["max_duration"], shuffle=True, num_buckets=16, seed=0)
    dataset = K2SpeechRecognitionDataset(input_strategy=OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80))),
                                         return_cuts=True)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=spec["workers"])
    batches = ((b["supervisions"]["num_frames"].tolist(), b["inputs"].shape[1],
                [re.sub(r"_repeat\d+$", "", c.id) for c in b["supervisions"]["cut"]]) for b in loader)
    return measure(batches, spec, started)


def measure(batches, spec: dict, started: float) -> dict:
    """First batch, then audio seconds per second and padding over a steady window of ``(lengths, T, ids)``."""
    first = next(batches)
    first_batch_s = time.perf_counter() - started
    repeats = int(len(set(first[2])) < len(first[2]))
    for _ in range(spec["warmup"]):
        repeats += _repeats(next(batches))
    start, frames, padded, count = time.perf_counter(), 0, 0, 0
    while time.perf_counter() - start < spec["seconds"] or count < 5:
        lengths, longest, ids = next(batches)
        frames += sum(lengths)
        padded += longest * len(lengths)
        repeats += _repeats((lengths, longest, ids))
        count += 1
    elapsed = time.perf_counter() - start
    return {"audio_s_per_s": frames * 0.01 / elapsed, "batches_per_s": count / elapsed,
            "padding_efficiency": frames / padded, "batches": count, "first_batch_s": first_batch_s,
            "batches_with_repeats": repeats, "mean_batch_s": frames * 0.01 / count}


def _repeats(batch) -> int:
    return int(len(set(batch[2])) < len(batch[2]))


# ---------------------------------------------------------------------------------------------- report


def report(name: str, corpus: dict, runs: dict[str, list[dict]]) -> list[str]:
    seconds = corpus["durations"]
    lines = [f"\n{name}: {len(seconds)} utterances of {min(seconds):.1f}-{max(seconds):.1f} s "
             f"({sum(seconds) / 3600:.2f} h, {corpus['audio_bytes'] / 2**20:.0f} MiB of audio, "
             f"{'espeak-ng' if corpus['espeak'] else 'synthetic'})",
             f"{'contender':12s} {'audio s/s':>9s} {'(rounds)':>13s} {'first batch s':>13s} {'peak PSS MB':>11s} "
             f"{'padding eff.':>12s} {'repeats':>7s} {'others':>7s}"]
    for contender, results in runs.items():
        lines.append(rounds_line(contender, results, "audio_s_per_s", ".0f", width=12, middle=lambda ok: (
            f"{median_of(ok, 'padding_efficiency'):12.3f} {sum(r['batches_with_repeats'] for r in ok):7d} ")))
        ok = [r for r in results if r.get("ok")]
        if contender == "audioloader" and len(ok) == len(results):
            r = ok[0]
            lines.append(f"{'':12s} held ahead of decode: peak {r['held_peak_mb']:.0f} MiB, buffer {r['buffer_rows']} "
                         f"rows (limited by {r['buffer_limited_by']}), interleave {r['interleave']}")
    a, b = runs.get("audioloader", []), runs.get("lhotse", [])
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x.get("ok") and y.get("ok")]
    lines += ratio_lines(a, b, "audioloader / lhotse", {"throughput": "audio_s_per_s", "first_batch": "first_batch_s",
                                                        "peak_pss": "peak_pss_mb"}, TARGETS, {"throughput"}, width=12)
    if pairs:
        efficiency = statistics.median(x["padding_efficiency"] for x, _ in pairs)
        lines.append(f"audioloader padding efficiency {efficiency:.3f} (target >= {TARGETS['padding_efficiency']}) "
                     f"{'met' if efficiency >= TARGETS['padding_efficiency'] else 'MISSED'}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare-manifest", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--utterances", type=int, default=600, help="the main corpus")
    parser.add_argument("--large", type=int, default=2400, help="a corpus larger than the shuffle budget")
    parser.add_argument("--small", type=int, default=60, help="a corpus smaller than any buffer")
    parser.add_argument("--corpora", nargs="+", choices=("main", "large", "small"), default=["main", "large", "small"])
    parser.add_argument("--contenders", nargs="+", choices=("audioloader", "lhotse"), default=["audioloader", "lhotse"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per contender, corpus and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; figures are medians")
    parser.add_argument("--warmup", type=int, default=3, help="batches left out after the first")
    parser.add_argument("--max-duration", type=float, default=200.0, help="seconds of audio per batch")
    parser.add_argument("--cache-dir", default=".cache/bench")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = run_lhotse(spec) if spec["kind"] == "lhotse" else run_audioloader(spec)
        emit_result(result)
        return 0
    if args.prepare_manifest:
        _prepare_manifest(json.loads(args.prepare_manifest))
        return 0
    cache = Path(args.cache_dir).resolve()
    sizes = {"main": args.utterances, "large": args.large, "small": args.small}
    corpora = {name: make_corpus(cache, sizes[name]) for name in args.corpora}
    pythons = {"audioloader": sys.executable}
    if "lhotse" in args.contenders:
        pythons["lhotse"] = lhotse_python(cache)
        for corpus in corpora.values():
            lhotse_manifest(pythons["lhotse"], corpus)
    runs = {name: {c: [] for c in args.contenders} for name in corpora}
    for round_index in range(args.rounds):
        for name, corpus in corpora.items():
            order = args.contenders if round_index % 2 == 0 else list(reversed(args.contenders))
            for contender in order:
                spec = {"parquet": corpus["parquet"], "manifest": corpus["manifest"], "kind": contender,
                        "workers": args.workers, "seconds": args.seconds, "warmup": args.warmup,
                        "max_duration": args.max_duration}
                result = run_child(module_command(__spec__, "--child", json.dumps(spec), python=pythons[contender]),
                                   timeout=spec["seconds"] + 900, pss_every=5)
                runs[name][contender].append(result)
                print(f"round {round_index + 1} {name} {contender}: "
                      + (f"{result['audio_s_per_s']:.0f} audio s/s, first batch {result['first_batch_s']:.2f} s, "
                         f"peak PSS {result['peak_pss_mb']:.0f} MB" if result.get("ok") else "FAILED"),
                      file=sys.stderr, flush=True)
    print(f"\n{args.workers} workers each, {os.cpu_count()} cores, {args.rounds} interleaved round(s) of "
          f"{args.seconds:g} s; batches of up to {args.max_duration:g} s (audioloader: its default buckets, "
          "Lhotse: 16); 80-bin fbank; load average "
          f"at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, corpus in corpora.items():
        print("\n".join(report(name, corpus, runs[name])))
    print("others: cores other processes used while a contender ran (! = disturbed: re-run on a quiet machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
