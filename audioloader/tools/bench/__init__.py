"""``audioloader bench``: AudioLoader against a plain torch DataLoader and the machine's ceiling.

Runs the standard comparison on the standard dataset (synthetic 10 s clips,
44.1 kHz FLAC, in Arrow shards; see `audioloader.tools.bench.dataset`), every
contender in its own fresh process, all producing the same batches (64 log-mel
spectrograms of 5 s crops at 32 kHz, 128 mels). Prints a table of throughput,
time to first batch, peak memory and checkpoint cost, the ratios to the user
baseline and to the ceiling, and the project's targets with met/missed.

Works from an installed package (the contenders, the dataset generator and the
user baseline are in this package). The user baseline uses torchaudio, which
audioloader itself does not need: without it the baseline contenders are
skipped, and the report says in one line how to get it (the ``bench`` extra).

The generated datasets are kept under the machine cache folder (``bench/`` of
``$AUDIOLOADER_CACHE``, else ``$XDG_CACHE_HOME/audioloader``, else
``~/.cache/audioloader``; ``--cache-dir`` elsewhere) and reused; the report ends
with where they are and how big, and ``--clear-cache`` deletes them.

Figures and how they are taken (every figure is a ratio of contenders measured
in the same run, because absolute numbers on a shared machine drift):

- throughput: samples/s in a steady-state window (warm-up batches left out; in
  train mode until the shuffle buffer has grown to capacity);
- first batch: seconds from constructing the loader (after imports) to the
  first batch;
- peak memory: the largest sum over the contender's process and all its
  descendants (worker processes included), from /proc: PSS (proportional set
  size, every 0.5 s: a page shared by n processes counts 1/n in each, so the
  sum is the tree's real footprint; the memory target uses it), RSS (every
  50 ms: counts pages that forked workers share, such as libtorch and the
  memory-mapped shards, once per process) and anon RSS (without file-backed
  pages, which the kernel can drop);
- checkpoint: bytes of ``torch.save(loader.state_dict())`` with the shuffle
  buffer full, and the seconds from ``load_state_dict`` to the first batch in a
  new process (the resumed batch is checked against the uninterrupted run);
- disturbance: CPU time used by *other* processes on the machine while a
  contender ran, in cores; a figure taken while others were busy is flagged.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import dataset
from .report import format_report, log_line, rate_of, ratios_of, targets_of
from .runner import machine_info, run_contender
from .settings import FULL, QUICK, RESULT_VERSION, TARGETS, Settings, add_arguments

__all__ = ["FULL", "QUICK", "RESULT_VERSION", "TARGETS", "Settings", "add_arguments", "format_report", "main",
           "run_benchmark", "torchaudio_note"]


# -- the plan ----------------------------------------------------------------------------------------------


def _throughput_spec(settings: Settings, kind: str, source: Path, **extra: Any) -> dict[str, Any]:
    spec = {"kind": kind, "source": str(source), "batch_size": settings.batch_size,
            "warmup_batches": settings.warmup_batches, "measure_seconds": settings.measure_seconds,
            "min_batches": 1}
    spec.update(extra)
    return spec


def _ceiling_spec(settings: Settings, source: Path, **extra: Any) -> dict[str, Any]:
    spec = {"kind": "ceiling", "source": str(source), "warmup_samples": 4,
            "measure_seconds": settings.ceiling_seconds, "min_samples": min(8, settings.clips),
            "max_samples": max(16, min(4000, int(settings.ceiling_seconds * 400)))}
    spec.update(extra)
    return spec


def _median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round's figures (rate, first batch and memory: medians over rounds) plus every round's rate."""
    ok = [r for r in runs if r.get("ok") and r.get("samples_per_s")]
    if not ok:
        return runs[-1]
    chosen = dict(sorted(ok, key=lambda r: r["samples_per_s"])[(len(ok) - 1) // 2])
    if len(runs) > 1:
        chosen["samples_per_s"] = statistics.median(r["samples_per_s"] for r in ok)
        chosen["rounds_samples_per_s"] = [r.get("samples_per_s") if r.get("ok") else None for r in runs]
        chosen["rounds_first_batch_s"] = [r.get("first_batch_s") if r.get("ok") else None for r in runs]
        for key in ("peak_rss_bytes", "peak_rss_anon_bytes", "peak_pss_bytes"):
            if all(r.get(key) is not None for r in ok):
                chosen[key] = int(statistics.median(r[key] for r in ok))
        if all(r.get("first_batch_s") is not None for r in ok):
            chosen["first_batch_s"] = statistics.median(r["first_batch_s"] for r in ok)
    return chosen


def _plan(settings: Settings, standard: Path) -> list[tuple[str, dict[str, Any]]]:
    """The contenders on the standard shards, in run order (one round)."""
    train = {"train": True, "buffer": settings.train_buffer, "min_fill": settings.train_min}
    w0 = settings.workers[0]
    plan: list[tuple[str, dict[str, Any]]] = []
    for w in settings.workers:
        plan.append((f"audioloader-train-w{w}", _throughput_spec(settings, "audioloader", standard, workers=w,
                                                                 **train)))
    if "eval" not in settings.skip:
        plan.append((f"audioloader-eval-w{w0}", _throughput_spec(settings, "audioloader", standard, workers=w0,
                                                                 train=False)))
    if "baseline" not in settings.skip:
        plan.append(("baseline-torchaudio", _throughput_spec(settings, "baseline", standard, workers=2,
                                                             resampler="torchaudio")))
    if "soxr" not in settings.skip:
        plan.append(("baseline-soxr", _throughput_spec(settings, "baseline", standard, workers=2,
                                                       resampler="soxr")))
    if "ceiling" not in settings.skip:
        plan.append(("ceiling", _ceiling_spec(settings, standard)))
    if settings.experiments:
        # Knobs next to the defaults: the heap trimming interval (audioloader/workers/memory.py; 0 = off) and
        # both compositions (buffer of decoded samples / of raw rows), same buffer sizes.
        for every in (0, 64):
            plan.append((f"audioloader-train-w{w0}+trim_every={every}", _throughput_spec(
                settings, "audioloader", standard, workers=w0, env={"AUDIOLOADER_MALLOC_TRIM_EVERY": str(every)},
                **train)))
        for before in (False, True):  # both orders explicitly, whichever is the default
            plan.append((f"audioloader-train-w{w0}+shuffle_before_decode={before}", _throughput_spec(
                settings, "audioloader", standard, workers=w0, shuffle_before_decode=before, **train)))
        if "eval" not in settings.skip:
            # The first design's eval buffer (1000 / min 0), which the eval preset no longer uses.
            plan.append((f"audioloader-eval-w{w0}+buffer=1000", _throughput_spec(
                settings, "audioloader", standard, workers=w0, train=False, buffer=1000)))
    return plan


def _packed_plan(settings: Settings, packed: dict[str, Path], workers: int) -> list[tuple[str, dict[str, Any]]]:
    train = {"train": True, "buffer": settings.train_buffer, "min_fill": settings.train_min}
    plan: list[tuple[str, dict[str, Any]]] = []
    for codec, folder in packed.items():
        name = f"audioloader-train-packed-{codec}-w{workers}"
        plan.append((name, _throughput_spec(settings, "audioloader", folder, workers=workers, **train)))
        if "ceiling" not in settings.skip:
            plan.append((f"ceiling-packed-{codec}", _ceiling_spec(settings, folder)))
    return plan


def run_benchmark(settings: Settings, log=None) -> dict[str, Any]:
    """Generate or reuse the data, run every contender, compute ratios and targets. Returns the results dict."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.perf_counter()
    spec = dataset.DatasetSpec(clips=settings.clips, seconds=settings.seconds, sample_rate=settings.sample_rate,
                               codec=settings.codec, channels=settings.channels)
    standard = dataset.standard_dataset(spec, settings.cache_dir, log=log)
    datasets = {"standard": _dataset_info(standard, dataset, f"{settings.sample_rate} Hz {settings.codec}")}
    packed: dict[str, Path] = {}
    if "packed" not in settings.skip:
        for codec in ("flac", "pcm16"):
            packed[codec] = dataset.packed_dataset(spec, 32000, codec, settings.cache_dir, log=log)
            datasets[f"packed_{codec}"] = _dataset_info(packed[codec], dataset, f"32000 Hz {codec}, mono")
    data_s = time.perf_counter() - started

    def go(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        log(f"running {name} ...")
        r = run_contender(spec, settings.timeout, log)
        r["contender"] = name
        log_line(name, r, log)
        return r

    def in_rounds(plan: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        # Interleaved rounds: a disturbance from other processes hits every contender alike.
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in plan}
        for i in range(settings.repeat):
            if settings.repeat > 1:
                log(f"round {i + 1}/{settings.repeat}")
            for name, spec_ in plan:
                rounds[name].append(go(name, spec_))
        return {name: _median_result(runs) for name, runs in rounds.items()}

    results = in_rounds(_plan(settings, standard))
    target_w = _target_workers(results, settings.workers)
    if packed:
        results.update(in_rounds(_packed_plan(settings, packed, target_w)))

    resume: dict[str, dict[str, Any]] = {}
    if "resume" not in settings.skip:
        with tempfile.TemporaryDirectory(prefix="audioloader-bench-") as tmp:
            for buffer in settings.resume_buffers:
                for before in (False, True):
                    name = f"{'shuffle-decode' if before else 'decode-shuffle'}-b{buffer}"
                    resume[name] = _run_resume(settings, standard, buffer, before, Path(tmp) / f"{name}.pt",
                                               go)

    out = {
        "version": RESULT_VERSION,
        "mode": settings.mode,
        "machine": machine_info(),
        "settings": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(settings).items()},
        "datasets": datasets,
        "contenders": results,
        "resume": resume,
        "target_workers": target_w,
        "seconds": {"data": data_s, "total": time.perf_counter() - started},
    }
    out["ratios"] = ratios_of(out)
    out["targets"] = targets_of(out)
    out["disturbed"] = sorted(n for n, r in {**results, **resume}.items() if r.get("disturbed"))
    return out


def _run_resume(settings: Settings, source: Path, buffer: int, before: bool, checkpoint: Path, go):
    base = {"source": str(source), "batch_size": settings.batch_size, "workers": settings.workers[0],
            "buffer": buffer, "shuffle_before_decode": before, "checkpoint": str(checkpoint), "batches": 2}
    label = f"resume-{'shuffle-decode' if before else 'decode-shuffle'}-b{buffer}"
    saved = go(f"{label} (save)", {**base, "kind": "resume_save"})
    if not saved.get("ok"):
        return {"ok": False, "buffer": buffer, "error": saved.get("error"), "save": saved}
    loaded = go(f"{label} (load)", {**base, "kind": "resume_load",
                                    "expected_next_index": saved["expected_next_index"]})
    out = {
        "ok": bool(loaded.get("ok")),
        "buffer": buffer,
        "shuffle_before_decode": before,
        "checkpoint_bytes": saved["checkpoint_bytes"],
        "fresh_first_batch_s": saved["first_batch_s"],
        "state_dict_s": saved["state_dict_s"],
        "restore_first_batch_s": loaded.get("restore_first_batch_s"),
        "exact": loaded.get("exact"),
        "save_peak_rss_bytes": saved["peak_rss_bytes"],
        "save_peak_rss_anon_bytes": saved["peak_rss_anon_bytes"],
        "load_peak_rss_bytes": loaded.get("peak_rss_bytes"),
        "load_peak_rss_anon_bytes": loaded.get("peak_rss_anon_bytes"),
        "others_cores": max(saved.get("others_cores") or 0.0, loaded.get("others_cores") or 0.0),
        "disturbed": bool(saved.get("disturbed") or loaded.get("disturbed")),
        "error": loaded.get("error"),
    }
    if out["restore_first_batch_s"] is not None and out["fresh_first_batch_s"]:
        out["restore_vs_fresh"] = out["restore_first_batch_s"] / out["fresh_first_batch_s"]
    return out


def _dataset_info(folder: Path, dataset, what: str) -> dict[str, Any]:
    return {"path": str(folder), "bytes": dataset.dataset_bytes(folder), "format": what}


def _target_workers(results: dict[str, dict[str, Any]], workers: list[int]) -> int:
    """The worker count the targets and the packed runs use: the library's default when it was measured
    (what a user gets), else the fastest measured. (Picking the fastest of near-equal rates on the standard
    data picked 8 processes on 2 cores once, which is 30 % slower on the packed PCM16 shards.)"""
    from audioloader.options import default_num_workers

    default = default_num_workers("process", train=True)
    if default in workers:
        return default
    rates = {w: rate_of(results, f"audioloader-train-w{w}") or 0.0 for w in workers}
    return max(rates, key=lambda w: (rates[w], -w))


# -- entry point -------------------------------------------------------------------------------------------


def torchaudio_note() -> str | None:
    """None when torchaudio imports; else the one line saying that the baseline is not measured and how to get it."""
    try:
        import torchaudio  # noqa: F401  (the user baseline needs it)
    except ModuleNotFoundError:
        from audioloader import _DISTRIBUTION

        return (f"the user baseline (baseline-torchaudio, baseline-soxr) is not measured: it needs torchaudio, "
                f"which is not installed; get it with: pip install \"{_DISTRIBUTION}[bench]\"")
    except Exception as error:  # installed, but its native library does not load with this torch (OSError & co)
        import torch

        cause = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        return (f"the user baseline (baseline-torchaudio, baseline-soxr) is not measured: torchaudio "
                f"{_installed('torchaudio')} is installed but does not load with torch {torch.__version__} "
                f"({cause}); each torchaudio build loads only with the torch release it was built for: install "
                f"the one that matches with: pip install --no-deps torchaudio=={torch.__version__.split('+')[0]}")
    return None


def _installed(distribution: str) -> str:
    """The installed version of ``distribution``, or "?" when its metadata cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


def _cache_line(cache_dir: str) -> str:
    folders, size = dataset.cache_usage(cache_dir)
    return (f"cache: {cache_dir} holds {folders} benchmark dataset(s), {size / 2**20:.0f} MiB, reused by the next "
            f"run; free it with: audioloader bench --clear-cache (or rm -rf {shlex.quote(cache_dir)})")


def _clear_cache(cache_dir: str) -> int:
    folders, size = dataset.clear_cache(cache_dir)
    print(f"cache: removed {folders} benchmark dataset(s), {size / 2**20:.0f} MiB, from {cache_dir}")
    return 0


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """Run ``audioloader bench``; returns 0, or 1 if a contender failed (targets missed are reported, not errors)."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="audioloader bench")
        add_arguments(parser)
        args = parser.parse_args(args)
    settings = Settings.from_args(args)
    if getattr(args, "clear_cache", False):
        return _clear_cache(settings.cache_dir)
    note = None if {"baseline", "soxr"} <= settings.skip else torchaudio_note()
    if note is not None:
        print(f"note: {note}", file=sys.stderr, flush=True)
        settings.skip |= {"baseline", "soxr"}
    out = run_benchmark(settings)
    out["notes"] = [note] if note else []
    text = json.dumps(out, indent=2, default=str)
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(format_report(out))
    # On stdout under the report, or on stderr when stdout is JSON.
    print(_cache_line(settings.cache_dir), file=sys.stderr if args.json else sys.stdout)
    failed = [n for n, r in {**out["contenders"], **out["resume"]}.items() if not r.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
