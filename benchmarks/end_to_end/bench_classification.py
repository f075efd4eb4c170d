"""Classification training, audioloader against Lhotse, as a user would run each: samples/s, first batch, peak PSS.

Data: the ``audioloader bench`` standard dataset (`audioloader.tools.bench.dataset`,
made once and cached): ``--clips`` clips of 10 s, 44.1 kHz mono FLAC, 10 classes.
audioloader reads its packed Arrow shards; Lhotse reads the same clips as the FLAC
files they were packed from (``src/class_NN/clip_NNNNNN.flac``), through a cut
manifest prepared once (a ``Recording`` a file, one supervision a cut whose
``custom["label"]`` is the class: the natural Lhotse way).

Both contenders deliver batches of ``--batch-size`` log-mel spectrograms of a random
5 s crop resampled to 32 kHz, 128 mel bands, 1024-sample (32 ms) windows every 320
samples (10 ms), plus the labels, with ``--workers`` worker processes, endless
(training) streams, each in a fresh process tree:

- ``audioloader``: ``AudioLoader(shards, batch_size=B, train=True, seed=0,
  features=MelSpectrogramConfig(), workers=Workers(num_workers=N))``: the defaults
  otherwise (shuffle buffer, interleaving, worker kind);
- ``lhotse`` (1.33, in the virtual environment `benchmarks.end_to_end.lhotse_env.lhotse_python` creates:
  never a dependency): ``CutSet.from_file(manifest).repeat()``,
  ``DynamicCutSampler(cuts, max_cuts=B, shuffle=True)``, a ``torch.utils.data.Dataset``
  that crops each cut (``cut.truncate(offset=U(0, 5 s), duration=5)``), resamples it
  (``cut.resample(32000)``) and computes ``Fbank`` on the fly
  (``OnTheFlyFeatures``), under ``DataLoader(batch_size=None, num_workers=N)``;
- ``lhotse-per-cut``: the same with ``OnTheFlyFeatures(..., use_batch_extract=False)``:
  fbank one cut at a time (Lhotse's default computes it on the whole padded batch at
  once, whose intermediate tensors take about 480 MB a worker at these sizes).

Where the features differ (Lhotse's ``FbankConfig`` cannot express torchaudio's
``MelSpectrogram`` exactly): Lhotse frames with ``snip_edges=False`` (500 frames, not
501), floors the mel energies at 1e-10 before the log (audioloader adds 1e-6) and
resamples with its own windowed-sinc resampler (torchaudio's kind; audioloader: soxr
HQ); its window (``hanning``), pre-emphasis (0), DC removal (off), dither (0), band
edges (0 Hz to Nyquist) and mel scale (HTK, unnormalised) are set to audioloader's.
Both decode only the cropped window of each FLAC file (a seek), not the whole 10 s.

Reported per contender (medians over ``--rounds`` interleaved rounds): samples per
second over a steady window of ``--seconds`` after the warm-up (``--warmup``
batches, and for audioloader as many as its shuffle buffer takes to grow to
capacity, as in ``audioloader bench``), time to the first batch (from building the
loader, after imports), peak PSS of the process tree (workers included;
`audioloader.tools.bench.runner.TreeSampler`), and the cores other processes used
meanwhile (``!`` = disturbed). Issue 27's targets (same run): audioloader >= 1.5x
Lhotse's samples/s, peak PSS <= Lhotse's.

    python -m benchmarks.end_to_end.bench_classification [--clips 256] [--workers 2] [--batch-size 64]
        [--seconds 20] [--rounds 2] [--warmup 3] [--contenders audioloader lhotse lhotse-per-cut]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, emit_result, module_command, ratio_lines, rounds_line, run_child
from benchmarks.end_to_end.lhotse_env import lhotse_python

BATCH_SIZE = 64
CROP_S, RATE, N_FFT, HOP, N_MELS = 5.0, 32000, 1024, 320, 128
CONTENDERS = ("audioloader", "lhotse", "lhotse-per-cut")
TARGETS = {"samples_per_s": 1.5, "peak_pss_mb": 1.0}  # audioloader / Lhotse: at least, at most


# ---------------------------------------------------------------------------------------------- data


def dataset(clips: int) -> dict:
    """The standard bench dataset of ``clips`` clips (generated once): its shards and the FLAC files behind them."""
    from audioloader.tools.bench.dataset import DatasetSpec, standard_dataset

    spec = DatasetSpec(clips=clips)
    shards = standard_dataset(spec)
    return {"shards": str(shards), "files": str(shards.parent / "src"), "key": spec.key}


def lhotse_manifest(python: str, data: dict, cache: Path) -> str:
    """The cut manifest a Lhotse user prepares once, made in Lhotse's environment (``--prepare-manifest``)."""
    manifest = cache / f"lhotse-cuts-{data['key']}.jsonl.gz"
    if not manifest.exists():
        subprocess.run(module_command(__spec__, "--prepare-manifest", json.dumps({**data, "manifest": str(manifest)}),
                                      python=python), cwd=ROOT, check=True)
    return str(manifest)


def _prepare_manifest(data: dict) -> None:
    from lhotse import CutSet, Recording, SupervisionSegment

    cuts = []
    for path in sorted(Path(data["files"]).glob("class_*/*.flac")):
        recording = Recording.from_file(path)
        cut = recording.to_cut()
        label = int(path.parent.name.split("_")[1])
        cut.supervisions = [SupervisionSegment(id=recording.id, recording_id=recording.id, start=0.0,
                                               duration=recording.duration, custom={"label": label})]
        cuts.append(cut)
    partial = data["manifest"] + ".partial.jsonl.gz"
    CutSet.from_cuts(cuts).to_file(partial)
    os.replace(partial, data["manifest"])


# ---------------------------------------------------------------------------------------------- contenders


def run_audioloader(spec: dict) -> dict:
    import audioloader as al

    # `import audioloader` is lazy: import what building a loader uses now, so that the first batch is timed after
    # imports, as Lhotse's is.
    import audioloader.audio_loader
    import audioloader.chain
    import audioloader.nodes
    import audioloader.workers.pool

    started = time.perf_counter()
    loader = al.AudioLoader(spec["shards"], batch_size=spec["batch_size"], train=True, seed=0,
                            features=al.MelSpectrogramConfig(), workers=al.Workers(num_workers=spec["workers"]))
    # Until the shuffle buffer is full the loader decodes two rows a delivered sample: start-up, not steady state.
    growth = loader.shuffle_buffer_size - loader.shuffle_min_size
    warmup = max(spec["warmup"], math.ceil(growth / spec["batch_size"]) + 1)
    # Rows that failed to decode are left in a batch, marked invalid: count the delivered ones.
    batches = ((int(b["valid"].sum()) if "valid" in b else len(b["label"]), tuple(b["spectrogram"].shape))
               for b in loader)
    result = measure(batches, spec, started, warmup)
    loader.shutdown()
    return {**result, "shuffle_buffer": loader.shuffle_buffer_size, "worker_type": loader.worker_type}


class CroppedFbank:
    """Lhotse's side: a map-style dataset over a sampler's ``CutSet`` of a batch: random 5 s crop, 32 kHz, fbank."""

    def __init__(self, seed: int, batch_extract: bool = True) -> None:
        from lhotse import Fbank, FbankConfig
        from lhotse.dataset import OnTheFlyFeatures

        config = FbankConfig(sampling_rate=RATE, frame_length=N_FFT / RATE, frame_shift=HOP / RATE,
                             remove_dc_offset=False, preemph_coeff=0.0, window_type="hanning", dither=0.0,
                             low_freq=0.0, high_freq=0.0, num_filters=N_MELS)
        self.features = OnTheFlyFeatures(Fbank(config), use_batch_extract=batch_extract)
        self.seed = seed

    def __getitem__(self, cuts):
        import random

        import torch

        # The crops a function of (seed, the batch's first cut): the workers are forked with one state, so a
        # generator made once would give both the same offsets. A repeated cut's id has a _repeatN suffix.
        rng = random.Random(f"{self.seed}-{next(iter(cuts)).id}")
        cropped = cuts.map(lambda c: c.truncate(offset=rng.uniform(0.0, max(0.0, c.duration - CROP_S)),
                                                duration=min(CROP_S, c.duration))).resample(RATE)
        features, _ = self.features(cropped)  # float32 [B, frames, n_mels]
        labels = torch.tensor([c.supervisions[0].custom["label"] for c in cropped])
        return {"features": features, "labels": labels}


def run_lhotse(spec: dict) -> dict:
    import torch
    from lhotse import CutSet
    from lhotse.dataset import DynamicCutSampler

    started = time.perf_counter()
    cuts = CutSet.from_file(spec["manifest"]).repeat()  # an endless stream, as audioloader's training
    sampler = DynamicCutSampler(cuts, max_cuts=spec["batch_size"], shuffle=True, seed=0)
    dataset = CroppedFbank(seed=0, batch_extract=spec["kind"] == "lhotse")
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None,
                                         num_workers=spec["workers"])
    batches = ((len(b["labels"]), tuple(b["features"].shape)) for b in loader)
    return measure(batches, spec, started, spec["warmup"])


def measure(batches, spec: dict, started: float, warmup: int) -> dict:
    """First batch, then samples per second over a steady window of ``(batch size, feature shape)`` pairs."""
    _, shape = next(batches)
    first_batch_s = time.perf_counter() - started
    for _ in range(warmup):
        next(batches)
    start, samples, count = time.perf_counter(), 0, 0
    while time.perf_counter() - start < spec["seconds"] or count < 5:
        size, _ = next(batches)
        samples += size
        count += 1
    elapsed = time.perf_counter() - start
    return {"samples_per_s": samples / elapsed, "first_batch_s": first_batch_s, "batches": count,
            "warmup_batches": warmup, "shape": list(shape)}


# ---------------------------------------------------------------------------------------------- report


def report(runs: dict[str, list[dict]]) -> list[str]:
    lines = [f"{'contender':14s} {'samples/s':>9s} {'(rounds)':>13s} {'first batch s':>13s} {'peak PSS MB':>11s} "
             f"{'batch shape':>16s} {'others':>7s}"]
    for contender, results in runs.items():
        lines.append(rounds_line(contender, results, "samples_per_s",
                                 middle=lambda ok: f"{'x'.join(map(str, ok[0]['shape'])):>16s} "))
    for contender, results in runs.items():
        ok = [r for r in results if r.get("ok")]
        if ok and len(ok) == len(results):
            split = "; ".join(_by_process(r) for r in ok)
            lines.append(f"{contender:14s} peak PSS by process (main + workers, MB), rounds: {split}")
    figures = {key: key for key in ("samples_per_s", "first_batch_s", "peak_pss_mb")}
    for peer in (c for c in runs if c.startswith("lhotse")):
        lines += ratio_lines(runs.get("audioloader", []), runs[peer], f"audioloader / {peer:14s}", figures, TARGETS,
                             higher_is_better={"samples_per_s"})
    return lines


def _by_process(result: dict) -> str:
    split = result.get("peak_pss_by_process_mb", {})
    return " + ".join(f"{mb:.0f}" for mb in split.get("main", []) + split.get("children", []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare-manifest", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--clips", type=int, default=256, help="clips of the standard dataset (issue 27: 1280)")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per contender and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; figures are medians")
    parser.add_argument("--warmup", type=int, default=3, help="batches left out after the first")
    parser.add_argument("--cache-dir", default=".cache/bench", help="Lhotse's environment and cut manifests")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = run_audioloader(spec) if spec["kind"] == "audioloader" else run_lhotse(spec)
        emit_result(result)
        return 0
    if args.prepare_manifest:
        _prepare_manifest(json.loads(args.prepare_manifest))
        return 0
    cache = Path(args.cache_dir).resolve()
    data = dataset(args.clips)
    pythons = {"audioloader": sys.executable}
    manifest = None
    if any(c.startswith("lhotse") for c in args.contenders):
        pythons["lhotse"] = pythons["lhotse-per-cut"] = lhotse_python(cache)
        manifest = lhotse_manifest(pythons["lhotse"], data, cache)
    runs: dict[str, list[dict]] = {c: [] for c in args.contenders}
    for round_index in range(args.rounds):
        order = args.contenders if round_index % 2 == 0 else list(reversed(args.contenders))
        for contender in order:
            spec = {"shards": data["shards"], "manifest": manifest, "kind": contender, "workers": args.workers,
                    "batch_size": args.batch_size, "seconds": args.seconds, "warmup": args.warmup}
            result = run_child(module_command(__spec__, "--child", json.dumps(spec), python=pythons[contender]),
                               timeout=spec["seconds"] + 900, pss_every=5)
            runs[contender].append(result)
            print(f"round {round_index + 1} {contender}: "
                  + (f"{result['samples_per_s']:.1f} samples/s, first batch {result['first_batch_s']:.2f} s, "
                     f"peak PSS {result['peak_pss_mb']:.0f} MB" if result.get("ok") else "FAILED"),
                  file=sys.stderr, flush=True)
    print(f"\n{args.clips} clips of 10 s 44.1 kHz FLAC; {args.workers} workers each, {os.cpu_count()} cores, "
          f"{args.rounds} interleaved round(s) of {args.seconds:g} s; batches of {args.batch_size}; 128-band log-mel "
          "of a 5 s crop at 32 kHz; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(report(runs)))
    print("others: cores other processes used while a contender ran (! = disturbed: re-run on a quiet machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
