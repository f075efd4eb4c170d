"""``audioloader bench``: AudioLoader against a plain torch DataLoader and the machine's ceiling.

Runs the standard comparison on the standard dataset (synthetic 10 s clips,
44.1 kHz FLAC, in Arrow shards; see ``benchmarks/dataset.py``), every
contender in its own fresh process, all producing the same batches (64 log-mel
spectrograms of 5 s crops at 32 kHz, 128 mels). Prints a table of throughput,
time to first batch, peak memory and checkpoint cost, the ratios to the user
baseline and to the ceiling, and the project's targets with met/missed.

Needs a source checkout (the ``benchmarks/`` folder next to the package) and
torchaudio (the user baseline uses it).

Figures and how they are taken (every figure is a ratio of contenders measured
in the same run, because absolute numbers on a shared machine drift):

- throughput: samples/s in a steady-state window (warm-up batches left out; in
  train mode until the shuffle buffer has grown to capacity);
- first batch: seconds from constructing the loader (after imports) to the
  first batch;
- peak RSS: the largest sum of resident memory over the contender's process
  and all its descendants (DataLoader workers included), sampled from /proc
  every 50 ms; "anon" leaves out file-backed pages (the memory-mapped shards,
  shared libraries), which the kernel can drop;
- checkpoint: bytes of ``torch.save(loader.state_dict())`` with the shuffle
  buffer full, and the seconds from ``load_state_dict`` to the first batch in a
  new process (the resumed batch is checked against the uninterrupted run);
- disturbance: CPU time used by *other* processes on the machine while a
  contender ran, in cores; a figure taken while others were busy is flagged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "add_arguments", "main", "run_benchmark"]

#: Output format version of ``--json``.
RESULT_VERSION = 1

#: The targets: (name, description, comparison, threshold).
TARGETS = {
    "throughput_vs_baseline": ("train throughput / user baseline, same 44.1 kHz FLAC shards", ">=", 2.0),
    "packed_flac_vs_baseline": ("train throughput on shards packed at 32 kHz FLAC / baseline on originals",
                                ">=", 5.0),
    "packed_pcm16_vs_baseline": ("train throughput on shards packed at 32 kHz PCM16 / baseline on originals",
                                 ">=", 5.0),
    "throughput_vs_ceiling": ("train throughput / ceiling (one-thread decode() rate x cores)", ">=", 0.9),
    "first_batch_eval_vs_baseline": ("eval time to first batch / baseline's", "<=", 0.25),
    "peak_rss_vs_baseline": ("train peak RSS of the process tree / baseline's", "<=", 1.0),
    "checkpoint_bytes_10000": ("checkpoint bytes at buffer 10000 (largest of both compositions)", "<=",
                               256 * 1024),
}

#: CPU used by other processes (in cores) above which a figure is flagged as disturbed.
DISTURBED_CORES = 0.25

QUICK = {"clips": 256, "train_buffer": 256, "train_min": 64, "measure_seconds": 2.0, "ceiling_seconds": 2.0,
         "resume_buffers": "64,256", "workers": "2", "warmup_batches": 1, "repeat": 1}
FULL = {"clips": 1000, "train_buffer": 1000, "train_min": 64, "measure_seconds": 6.0, "ceiling_seconds": 6.0,
        "resume_buffers": "1000,10000", "workers": "2,4,8", "warmup_batches": 2, "repeat": 2}


# -- arguments ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``audioloader bench``."""
    size = parser.add_argument_group("size (quick mode by default: about a minute once the data is cached)")
    size.add_argument("--full", action="store_true",
                      help="the full comparison: 1000 clips, 6 s windows, 2 rounds, threads 2,4,8, buffers "
                           "1000,10000 (about 8 minutes once the data is cached); any option below overrides it")
    size.add_argument("--clips", type=int, default=None, help="clips in the dataset (quick 256, full 1000)")
    size.add_argument("--seconds", type=float, default=10.0, help="length of every clip in s (default 10)")
    size.add_argument("--sample-rate", type=int, default=44100, help="rate of the stored audio in Hz (44100)")
    size.add_argument("--codec", choices=("flac", "wav", "ogg", "mp3"), default="flac",
                      help="codec of the stored audio (default flac)")
    size.add_argument("--channels", type=int, choices=(1, 2), default=1, help="channels of the stored audio")
    size.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    size.add_argument("--workers", default=None, metavar="N[,N...]",
                      help="AudioLoader decode threads to try in train mode (quick 2; full 2,4,8); the best "
                           "is used for the packed runs and the targets")
    size.add_argument("--train-buffer", type=int, default=None,
                      help="train-mode shuffle buffer capacity (quick 256, full 1000)")
    size.add_argument("--train-min", type=int, default=None, help="train-mode shuffle min fill (default 64)")
    size.add_argument("--measure-seconds", type=float, default=None,
                      help="steady-state window per contender in s (quick 2, full 6)")
    size.add_argument("--warmup-batches", type=int, default=None, help="batches left out before the window")
    size.add_argument("--resume-buffers", default=None, metavar="B[,B...]",
                      help="shuffle buffer capacities for the checkpoint/resume runs (quick 64,256; "
                           "full 1000,10000)")
    size.add_argument("--repeat", type=int, default=None,
                      help="rounds of the throughput runs (quick 1, full 2); each figure is the median over "
                           "rounds, each ratio the median of the per-round ratios")
    what = parser.add_argument_group("what to run")
    what.add_argument("--skip", default="", metavar="GROUP[,GROUP...]",
                      help="leave out groups: eval, baseline, soxr, ceiling, packed, resume")
    what.add_argument("--experiments", action="store_true",
                      help="also run variants next to the defaults (heap trimming off / every 64 decodes, "
                           "shuffle_before_decode=False/True, the old eval buffer), each compared with its "
                           "plain self")
    what.add_argument("--cache-dir", default=".cache/bench",
                      help="where generated datasets are kept (default .cache/bench)")
    what.add_argument("--timeout", type=float, default=900.0, help="seconds before a contender is killed")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    out.add_argument("--output", default=None, metavar="FILE", help="also write the JSON results to FILE")


@dataclass
class Settings:
    """The resolved options (quick or full preset, then explicit overrides)."""

    clips: int
    seconds: float
    sample_rate: int
    codec: str
    channels: int
    batch_size: int
    workers: list[int]
    train_buffer: int
    train_min: int
    measure_seconds: float
    ceiling_seconds: float
    warmup_batches: int
    resume_buffers: list[int]
    repeat: int
    skip: set[str]
    cache_dir: str
    timeout: float
    experiments: bool = False
    mode: str = "quick"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        preset = FULL if args.full else QUICK

        def pick(name: str) -> Any:
            value = getattr(args, name, None)
            return preset[name] if value is None else value

        settings = cls(
            clips=int(pick("clips")), seconds=float(args.seconds), sample_rate=int(args.sample_rate),
            codec=args.codec, channels=int(args.channels), batch_size=int(args.batch_size),
            workers=_int_list("--workers", pick("workers")), train_buffer=int(pick("train_buffer")),
            train_min=int(pick("train_min")), measure_seconds=float(pick("measure_seconds")),
            ceiling_seconds=float(preset["ceiling_seconds"] if args.measure_seconds is None
                                  else args.measure_seconds),
            warmup_batches=int(pick("warmup_batches")),
            resume_buffers=_int_list("--resume-buffers", pick("resume_buffers")),
            repeat=int(pick("repeat")), skip={s.strip() for s in args.skip.split(",") if s.strip()},
            cache_dir=args.cache_dir, timeout=float(args.timeout), experiments=bool(args.experiments),
            mode="full" if args.full else "quick")
        settings.check()
        return settings

    def check(self) -> None:
        groups = {"eval", "baseline", "soxr", "ceiling", "packed", "resume"}
        if self.skip - groups:
            raise ValueError(f"--skip {','.join(sorted(self.skip - groups))}: unknown group; "
                             f"choose from {', '.join(sorted(groups))}")
        for name in ("clips", "batch_size", "train_buffer", "repeat"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be >= 1")
        if not 0 <= self.train_min <= self.train_buffer:
            raise ValueError(f"--train-min={self.train_min}: must be in [0, --train-buffer={self.train_buffer}]")
        if self.measure_seconds < 0 or self.warmup_batches < 0:
            raise ValueError("--measure-seconds and --warmup-batches must be >= 0")
        if not self.workers or min(self.workers) < 1:
            raise ValueError(f"--workers {self.workers}: give one or more thread counts >= 1")


def _int_list(option: str, text: Any) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated integers, e.g. 2,4") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{option} {text!r}: values must be >= 1")
    return values


# -- finding the benchmarks folder -------------------------------------------------------------------------


def repo_root() -> Path:
    """The source checkout holding ``benchmarks/`` (the contenders and the dataset generator)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "contenders.py").is_file():
        raise FileNotFoundError(
            f"audioloader bench needs the benchmarks/ folder of a source checkout next to the package "
            f"(looked in {root}); run it from a clone of the repository installed with `pip install -e .`")
    return root


def _import_benchmarks():
    root = str(repo_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import contenders, dataset

    return contenders, dataset


# -- measuring one process tree ----------------------------------------------------------------------------


def _status_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of ``pid`` in KiB; zeros if it is gone."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, anon


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def _machine_busy_ticks() -> int | None:
    """Busy CPU ticks of the whole machine (all cores) from /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait.
    return sum(values[:8]) - values[3] - values[4]


class TreeSampler(threading.Thread):
    """Samples the memory and CPU time of a process and all its descendants every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_rss_kb = 0
        self.peak_anon_kb = 0
        self.max_processes = 0
        self.cpu_ticks: dict[int, int] = {}  # last seen per pid (a worker's ticks outlive it)
        self._halt = threading.Event()
        from benchmarks.contenders import tree_pids

        self._tree_pids = tree_pids

    def sample(self) -> None:
        pids = self._tree_pids(self.pid)
        rss = anon = alive = 0
        for pid in pids:
            r, a = _status_kb(pid)
            rss += r
            anon += a
            alive += r > 0
            ticks = _cpu_ticks(pid)
            if ticks:
                self.cpu_ticks[pid] = max(ticks, self.cpu_ticks.get(pid, 0))
        self.peak_rss_kb = max(self.peak_rss_kb, rss)
        self.peak_anon_kb = max(self.peak_anon_kb, anon)
        self.max_processes = max(self.max_processes, alive)

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu_ticks.values()) / os.sysconf("SC_CLK_TCK")


def run_contender(spec: dict[str, Any], timeout: float, log) -> dict[str, Any]:
    """Run one contender in a fresh process; its result plus memory, wall time and disturbance."""
    contenders, _ = _import_benchmarks()
    root = repo_root()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(spec.get("env") or {})
    tick = os.sysconf("SC_CLK_TCK")
    busy_before = _machine_busy_ticks()
    own_before = time.process_time()
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.contenders", json.dumps(spec)], cwd=root,
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        lines: list[str] = []
        got_result = threading.Event()

        def read() -> None:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(contenders.RESULT_PREFIX):
                    got_result.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        got_result.wait(timeout)
        result_at = time.perf_counter()
        exit_hang = False
        try:
            # A contender that printed its result but does not exit is a bug worth seeing (a thread left
            # running, a hang at interpreter shutdown): give it 30 s, then kill it and say so.
            proc.wait(30 if got_result.is_set() else 1)
        except subprocess.TimeoutExpired:
            exit_hang = got_result.is_set()
            _kill_tree(proc.pid, contenders.tree_pids)
            proc.wait()
        wall = time.perf_counter() - started
        sampler.stop()
        reader.join(5)
        err.seek(0)
        stderr_tail = err.read()[-3000:]
    busy_after = _machine_busy_ticks()
    result_line = next((line for line in lines if line.startswith(contenders.RESULT_PREFIX)), None)
    if result_line is None:
        why = "timed out" if not got_result.is_set() and wall >= timeout else f"exited with {proc.returncode}"
        result: dict[str, Any] = {"ok": False, "error": f"contender {why} without a result",
                                  "stderr": stderr_tail}
    else:
        result = json.loads(result_line[len(contenders.RESULT_PREFIX):])
        if not result.get("ok"):
            result["stderr"] = stderr_tail
    result.update(peak_rss_bytes=sampler.peak_rss_kb * 1024, peak_rss_anon_bytes=sampler.peak_anon_kb * 1024,
                  processes=sampler.max_processes, wall_s=wall, exit_s=time.perf_counter() - result_at,
                  exit_hang=exit_hang)
    if exit_hang:
        log(f"  warning: {spec['kind']} printed its result but did not exit within 30 s; killed "
            f"(stderr tail: {stderr_tail[-500:]!r})")
    if busy_before is not None and busy_after is not None and wall > 0:
        own = time.process_time() - own_before
        others = (busy_after - busy_before) / tick - sampler.cpu_seconds - own
        result["others_cores"] = max(0.0, others / wall)
        result["disturbed"] = result["others_cores"] > DISTURBED_CORES
    return result


def _kill_tree(pid: int, tree_pids) -> None:
    import signal

    for p in reversed(tree_pids(pid)):  # children first; every pid here descends from our own child
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


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
        for key in ("peak_rss_bytes", "peak_rss_anon_bytes"):
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
        # Knobs next to the defaults: the heap trimming interval (audioloader/_memory.py; 0 = off) and
        # both compositions (buffer of decoded samples / of raw rows), same buffer sizes.
        for every in (0, 64):
            plan.append((f"audioloader-train-w{w0}+trim_every={every}", _throughput_spec(
                settings, "audioloader", standard, workers=w0, env={"AUDIOLOADER_MALLOC_TRIM_EVERY": str(every)},
                **train)))
        for before in (False, True):  # both orders explicitly, whichever is the default
            plan.append((f"audioloader-train-w{w0}+shuffle_before_decode={before}", _throughput_spec(
                settings, "audioloader", standard, workers=w0, shuffle_before_decode=before, **train)))
        if "eval" not in settings.skip:
            # DESIGN.md's eval buffer (1000 / min 0), which the eval preset no longer uses.
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
    _, dataset = _import_benchmarks()
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
        _log_line(name, r, log)
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
    best_w = _best_workers(results, settings.workers)
    if packed:
        results.update(in_rounds(_packed_plan(settings, packed, best_w)))

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
        "machine": _machine(),
        "settings": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(settings).items()},
        "datasets": datasets,
        "contenders": results,
        "resume": resume,
        "best_workers": best_w,
        "seconds": {"data": data_s, "total": time.perf_counter() - started},
    }
    out["ratios"] = _ratios(out)
    out["targets"] = _targets(out)
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


def _best_workers(results: dict[str, dict[str, Any]], workers: list[int]) -> int:
    rates = {w: _rate(results, f"audioloader-train-w{w}") or 0.0 for w in workers}
    return max(rates, key=lambda w: (rates[w], -w))


def _machine() -> dict[str, Any]:
    import torch

    from benchmarks.contenders import cores

    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"cores": cores(), "cpu": cpu, "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "loadavg_end": load}


# -- ratios and targets ------------------------------------------------------------------------------------


def _rate(results: dict[str, Any], name: str) -> float | None:
    r = results.get(name) or {}
    return r.get("samples_per_s") if r.get("ok") else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ratio(results: dict[str, Any], a: str, b: str, key: str = "samples_per_s") -> float | None:
    """``a / b`` of ``key``; with several rounds, the median of the per-round ratios (robust to drift)."""
    ra, rb = results.get(a) or {}, results.get(b) or {}
    if not (ra.get("ok") and rb.get("ok")):
        return None
    rounds_key = {"samples_per_s": "rounds_samples_per_s", "first_batch_s": "rounds_first_batch_s"}.get(key)
    xs, ys = ra.get(rounds_key) if rounds_key else None, rb.get(rounds_key) if rounds_key else None
    if xs and ys and len(xs) == len(ys):
        per_round = [x / y for x, y in zip(xs, ys, strict=True) if x is not None and y]
        if per_round:
            return statistics.median(per_round)
    return _div(ra.get(key), rb.get(key))


def _ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """Every contender against the user baseline, the ceiling (of the same shards), and its plain self (variants)."""
    c = out["contenders"]
    w = out["best_workers"]
    ratios: dict[str, float | None] = {}
    for name in c:
        if not name.startswith("ceiling"):
            ratios[f"{name} / baseline-torchaudio"] = _ratio(c, name, "baseline-torchaudio")
    for name in c:
        if name.startswith("audioloader-train"):
            codec = next((k for k in ("flac", "pcm16") if f"-packed-{k}-" in name), None)
            ceiling = f"ceiling-packed-{codec}" if codec else "ceiling"
            ratios[f"{name} / {ceiling}"] = _ratio(c, name, ceiling)
            ratios[f"{name} per CPU-s / {ceiling}'s"] = _ratio(c, name, ceiling, "samples_per_cpu_s")
    for name in c:
        if "+" in name:
            base = name.split("+")[0]
            if base in c:
                ratios[f"{name} / {base}"] = _ratio(c, name, base)
    ratios["baseline-soxr / baseline-torchaudio"] = _ratio(c, "baseline-soxr", "baseline-torchaudio")
    for name in c:
        if name.startswith("audioloader-eval"):
            ratios[f"{name} first batch / baseline's"] = _ratio(c, name, "baseline-torchaudio", "first_batch_s")
    for name in (f"audioloader-train-w{w}", *(n for n in c if n.startswith("audioloader-eval") and "+" not in n),
                 *(n for n in c if n.startswith("audioloader-train") and "+" in n)):
        if name in c:
            ratios[f"{name} peak RSS / baseline's"] = _ratio(c, name, "baseline-torchaudio", "peak_rss_bytes")
            ratios[f"{name} peak anon RSS / baseline's"] = _ratio(c, name, "baseline-torchaudio",
                                                                  "peak_rss_anon_bytes")
    return ratios


def _targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    c, w, ratios = out["contenders"], out["best_workers"], out["ratios"]
    eval_name = next((n for n in c if n.startswith("audioloader-eval") and "+" not in n), "audioloader-eval")
    train = f"audioloader-train-w{w}"
    values: dict[str, tuple[float | None, str]] = {
        "throughput_vs_baseline": (ratios.get(f"{train} / baseline-torchaudio"), f"{train} vs baseline-torchaudio"),
        "packed_flac_vs_baseline": (ratios.get(f"audioloader-train-packed-flac-w{w} / baseline-torchaudio"),
                                    f"audioloader-train-packed-flac-w{w} vs baseline-torchaudio"),
        "packed_pcm16_vs_baseline": (ratios.get(f"audioloader-train-packed-pcm16-w{w} / baseline-torchaudio"),
                                     f"audioloader-train-packed-pcm16-w{w} vs baseline-torchaudio"),
        "throughput_vs_ceiling": (ratios.get(f"{train} / ceiling"), f"{train} vs ceiling"),
        "first_batch_eval_vs_baseline": (ratios.get(f"{eval_name} first batch / baseline's"),
                                         f"{eval_name} vs baseline-torchaudio"),
        "peak_rss_vs_baseline": (ratios.get(f"{train} peak RSS / baseline's"), f"{train} vs baseline-torchaudio"),
    }
    at_10000 = [r["checkpoint_bytes"] for r in out["resume"].values() if r.get("buffer") == 10000
                and r.get("checkpoint_bytes") is not None]
    detail = "largest of decode-shuffle and shuffle-decode at buffer 10000"
    if not at_10000:
        detail = "buffer 10000 not run (" + _checkpoint_projection(out["resume"]) + ")"
    values["checkpoint_bytes_10000"] = (max(at_10000) if at_10000 else None, detail)
    targets = []
    for name, (what, op, threshold) in TARGETS.items():
        value, detail = values[name]
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        targets.append({"name": name, "description": what, "op": op, "threshold": threshold, "value": value,
                        "met": met, "detail": detail})
    return targets


def _checkpoint_projection(resume: dict[str, dict[str, Any]]) -> str:
    """A linear fit of checkpoint bytes against buffer size, projected to 10000 (needs two buffer sizes)."""
    by_buffer: dict[int, int] = {}
    for r in resume.values():
        if r.get("checkpoint_bytes"):
            by_buffer[r["buffer"]] = max(r["checkpoint_bytes"], by_buffer.get(r["buffer"], 0))
    if len(by_buffer) < 2:
        return "no projection: fewer than two buffer sizes"
    (b0, s0), (b1, s1) = sorted(by_buffer.items())[0], sorted(by_buffer.items())[-1]
    projected = s0 + (s1 - s0) * (10000 - b0) / (b1 - b0)
    return f"projected {projected / 1024:.0f} KiB from buffers {b0} and {b1}"


# -- printing ----------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{suffix}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _log_line(name: str, r: dict[str, Any], log) -> None:
    if not r.get("ok"):
        log(f"  {name}: FAILED: {r.get('error')}")
        return
    parts = []
    if r.get("samples_per_s") is not None:
        parts.append(f"{r['samples_per_s']:.1f} samples/s")
    if r.get("first_batch_s") is not None:
        parts.append(f"first batch {r['first_batch_s']:.2f} s")
    if r.get("restore_first_batch_s") is not None:
        parts.append(f"restore {r['restore_first_batch_s']:.2f} s, exact={r.get('exact')}")
    if r.get("checkpoint_bytes") is not None:
        parts.append(f"checkpoint {r['checkpoint_bytes'] / 1024:.1f} KiB")
    parts.append(f"peak RSS {_mib(r.get('peak_rss_bytes'))} MiB")
    if r.get("others_cores") is not None:
        parts.append(f"others {r['others_cores']:.2f} cores")
    log(f"  {name}: " + ", ".join(parts))


def format_report(out: dict[str, Any]) -> str:
    """The human-readable report: setup, the throughput table, the resume table, the targets."""
    m, s, c, ratios = out["machine"], out["settings"], out["contenders"], out["ratios"]
    lines = [
        f"audioloader bench ({out['mode']}): {s['clips']} clips x {s['seconds']:g} s, "
        f"{s['sample_rate']} Hz {s['codec']} {s['channels']} ch; batch {s['batch_size']}; "
        f"train buffer {s['train_buffer']} / min fill {s['train_min']}; {s['repeat']} round(s)",
        f"machine: {m['cores']} cores ({m['cpu']}), python {m['python']}, torch {m['torch']}",
    ]
    train = c.get(f"audioloader-train-w{out['best_workers']}") or {}
    if train.get("shuffle_before_decode") is not None:
        lines.append(f"audioloader train composition (the default for these shards): shuffle_before_decode="
                     f"{train['shuffle_before_decode']}")
    lines.append("")
    header = ("contender", "samples/s", "x baseline", "x ceiling", "per CPU-s", "first batch s",
              "peak RSS MiB", "anon MiB", "cores used", "others")
    rows = []
    failures = []
    for name, r in c.items():
        if not r.get("ok"):
            rows.append((name, "FAILED", *[""] * 8))
            failures.append(f"  {name}: {r.get('error')}")
            continue
        ceiling = next((v for k, v in ratios.items() if k.startswith(f"{name} / ceiling")), None)
        rows.append((
            name, _fmt(r.get("samples_per_s"), ".1f"),
            _fmt(ratios.get(f"{name} / baseline-torchaudio"), ".2f", "x"),
            _fmt(ceiling, ".2f", "x"),
            _fmt(r.get("samples_per_cpu_s"), ".1f"),
            _fmt(r.get("first_batch_s"), ".2f"),
            _mib(r.get("peak_rss_bytes")), _mib(r.get("peak_rss_anon_bytes")),
            _fmt(r.get("cores_used"), ".2f"),
            _fmt(r.get("others_cores"), ".2f") + (" !" if r.get("disturbed") else ""),
        ))
    lines += _table(header, rows)
    lines += failures
    lines.append("  ceiling = one-thread DecodeSpectrogram.decode() rate x cores, no framework (of the same shards); "
                 "per CPU-s = samples per CPU second of the process tree;")
    lines.append("  others = cores used by other processes meanwhile (! = disturbed: re-run)")
    variants = [(f"{name} / {name.split('+')[0]}", ratios.get(f"{name} / {name.split('+')[0]}"))
                for name in c if "+" in name and f"{name} / {name.split('+')[0]}" in ratios]
    if variants:
        lines += ["", "variants (--experiments), each against its plain self:"]
        for key, value in variants:
            name, base = key.split(" / ")
            r, b = c.get(name, {}), c.get(base, {})
            extra = []
            if r.get("first_batch_s") and b.get("first_batch_s"):
                extra.append(f"first batch {b['first_batch_s']:.2f} -> {r['first_batch_s']:.2f} s")
            if r.get("peak_rss_anon_bytes") and b.get("peak_rss_anon_bytes"):
                extra.append(f"anon RSS {_mib(b['peak_rss_anon_bytes'])} -> {_mib(r['peak_rss_anon_bytes'])} MiB")
            lines.append(f"  {name}: {_fmt(value, '.2f', 'x')} samples/s" + (f"; {', '.join(extra)}" if extra else ""))
    if out["resume"]:
        lines.append("")
        header = ("checkpoint/resume", "buffer", "checkpoint KiB", "fresh first batch s",
                  "load -> first batch s", "x fresh", "exact", "save anon MiB", "load anon MiB")
        rows, failures = [], []
        for name, r in out["resume"].items():
            if not r.get("ok"):
                rows.append((name, str(r.get("buffer", "")), "FAILED", *[""] * 6))
                failures.append(f"  {name}: {r.get('error')}")
                continue
            rows.append((name, str(r["buffer"]), _fmt(r["checkpoint_bytes"] / 1024, ".1f"),
                         _fmt(r["fresh_first_batch_s"], ".2f"), _fmt(r["restore_first_batch_s"], ".2f"),
                         _fmt(r.get("restore_vs_fresh"), ".2f", "x"), str(r["exact"]),
                         _mib(r.get("save_peak_rss_anon_bytes")), _mib(r.get("load_peak_rss_anon_bytes"))))
        lines += _table(header, rows)
        lines += failures
        lines.append("  decode-shuffle: the default chain (buffer of decoded spectrograms); shuffle-decode: "
                     "shuffle_before_decode=True (buffer of raw rows); min fill = capacity")
    lines += ["", "targets:"]
    for t in out["targets"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        value = t["value"]
        is_bytes = t["name"] == "checkpoint_bytes_10000"
        shown = "-" if value is None else f"{value / 1024:.1f} KiB" if is_bytes else f"{value:.2f}x"
        limit = f"{t['threshold'] / 1024:.0f} KiB" if is_bytes else f"{t['threshold']:g}x"
        lines.append(f"  [{verdict:^12}] {t['name']}: {shown} (target {t['op']} {limit}; {t['detail']})")
    if out["disturbed"]:
        lines.append("")
        lines.append(f"warning: other processes used > {DISTURBED_CORES} cores during: "
                     f"{', '.join(out['disturbed'])}; figures taken then are unreliable, re-run")
    lines.append(f"\n(best decode threads in train mode: {out['best_workers']}; total {out['seconds']['total']:.0f} s)")
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    def line(values):
        return "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True)))
    return [line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)]


# -- entry point -------------------------------------------------------------------------------------------


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """Run ``audioloader bench``; returns 0, or 1 if a contender failed (targets missed are reported, not errors)."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="audioloader bench")
        add_arguments(parser)
        args = parser.parse_args(args)
    settings = Settings.from_args(args)
    try:
        import torchaudio  # noqa: F401  (the user baseline needs it)
    except ImportError:
        if not {"baseline", "soxr"} <= settings.skip:
            raise ValueError("the user baseline needs torchaudio (pip install torchaudio), or pass "
                             "--skip baseline,soxr") from None
    out = run_benchmark(settings)
    text = json.dumps(out, indent=2, default=str)
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(format_report(out))
    failed = [n for n, r in {**out["contenders"], **out["resume"]}.items() if not r.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
