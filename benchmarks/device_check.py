"""The device check in one call: CUDA tests, the end-to-end training loop and scaling at N workers, one table.

Made for the lent GPU machine (16 cores, one H100 or H200, Python 3.12 with torch,
torchaudio, pyarrow, numpy and pytest, but without torchdata, soundfile, soxr,
tblib, cffi and pycparser): it installs the carried wheels of those, then runs

1. the CUDA tests (``-k cuda`` in tests/test_augment.py, tests/test_workers.py and
   tests/test_cuda_workers.py: CUDA initialised in the test process before loaders
   with worker processes are built; skipped without a GPU);
2. the bench dataset (``--clips`` clips of 10 s 44.1 kHz FLAC and their 32 kHz
   PCM16 repack), made with ``--workers`` threads;
3. ``python -m benchmarks.end_to_end.bench_train_loop --workers N`` (SmallCNN on the GPU fed by each
   loader; a stand-in step without a GPU);
4. ``python -m benchmarks.end_to_end.bench_scaling --workers N`` (processes against the N-process limit
   and the DataLoader);

one step per dataset, under one deadline (``--budget``, 450 s; a step that would
overrun it is stopped, the others keep their results), and prints one table.
Every step's output and JSON goes to ``--out``. On the device machine, from the
repository root, with the wheels in ``.whl/`` (docs/benchmarks.md says how to get them)::

    python3 -m benchmarks.device_check --wheels .whl --out $OUT        # 16 workers, 1,000 clips: ~8 minutes

Anywhere, as a check of the script itself (2 workers, 64 clips, short windows;
the CUDA tests are skipped without a GPU)::

    python -m benchmarks.device_check --quick
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Seconds kept for each step still to come when a step starts (a step that overruns is stopped, not the rest).
RESERVE_PER_STEP = 35.0

CUDA_TESTS = ["tests/test_augment.py", "tests/test_workers.py", "tests/test_cuda_workers.py"]


class Steps:
    """Runs the steps as child processes under one deadline and keeps their logs."""

    def __init__(self, out: Path, budget: float, env: dict[str, str], planned: int) -> None:
        self.out, self.env = out, env
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.to_come = planned  # steps not started yet
        self.status: dict[str, str] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def run(self, name: str, command: list[str]) -> str | None:
        """Run ``command``; its output (also in ``out/name.txt``), or None when it failed or ran out of time."""
        left = self.deadline - time.monotonic()
        self.to_come -= 1
        limit = left - RESERVE_PER_STEP * self.to_come
        if limit < 5:
            self.status[name] = "not run: out of time"
            print(f"== {name}: not run, {left:.0f} s left", flush=True)
            return None
        print(f"== {name} at {self.elapsed():.0f} s (at most {limit:.0f} s): {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=limit)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as stopped:
            output = _text(stopped.stdout) + _text(stopped.stderr)
            code = None
        (self.out / f"{name}.txt").write_text(output)
        took = time.monotonic() - started
        if code is None:
            self.status[name] = f"stopped at the deadline after {took:.0f} s"
        elif code != 0 and name != "cuda_tests":  # failed tests are a result; the table reports them
            self.status[name] = f"failed (exit {code}) after {took:.0f} s: {output.strip()[-300:]}"
        else:
            self.status[name] = f"{took:.0f} s"
        print(output[-2500:], flush=True)
        return output if code is not None and (code == 0 or name == "cuda_tests") else None


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def install_wheels(steps: Steps, wheels: Path, site: Path) -> None:
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"--wheels {wheels}: no .whl files there (docs/benchmarks.md says which to carry)")
    steps.run("install", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", str(site), *found])


def facts(env: dict[str, str]) -> dict[str, str]:
    code = ("import os, torch, pyarrow, numpy; import torchdata, soundfile, soxr; "
            "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'; "
            "print(len(os.sched_getaffinity(0)), gpu, torch.__version__, torchdata.__version__, "
            "pyarrow.__version__, sep='|')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"the project cannot be imported here (a wheel missing?):\n{done.stderr[-1500:]}")
    cores, gpu, torch_version, torchdata_version, pyarrow_version = done.stdout.strip().splitlines()[-1].split("|")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cores": cores, "gpu": gpu, "torch": torch_version, "torchdata": torchdata_version,
            "pyarrow": pyarrow_version, "commit": commit.stdout.strip() or "?"}


def test_summary(output: str | None) -> str:
    """pytest's last line, e.g. ``3 passed, 2 skipped`` (or why there is none)."""
    if output is None:
        return "not run to the end"
    found = re.findall(r"(\d+ (?:passed|failed|skipped|deselected|errors?))", output.splitlines()[-1] if output else "")
    failed = [line for line in output.splitlines() if line.startswith("FAILED")]
    return ", ".join(found) + ("".join(f"\n    {line}" for line in failed) if failed else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, default=None,
                        help="folder of wheels to install first (torchdata, soundfile, soxr, tblib, cffi, pycparser)")
    parser.add_argument("--workers", type=int, default=None, help="N (default: 16, or 2 with --quick)")
    parser.add_argument("--clips", type=int, default=None, help="bench dataset clips (default 1000; 64 --quick)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="measurement window of a training-loop configuration (default 10; 3 --quick); "
                             "scaling contenders get 0.6 of it")
    parser.add_argument("--datasets", default=None, help="flac,pcm16 (default; pcm16 with --quick)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for everything (default 450; 600 --quick)")
    parser.add_argument("--quick", action="store_true", help="a short run that needs no GPU (checks the script)")
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and JSON (default: a temporary one)")
    args = parser.parse_args()
    quick = args.quick
    workers = args.workers or (2 if quick else 16)
    clips = args.clips or (64 if quick else 1000)
    seconds = args.seconds or (3.0 if quick else 10.0)
    datasets = args.datasets or ("pcm16" if quick else "flac,pcm16")
    budget = args.budget or (600.0 if quick else 450.0)
    out = args.out or Path(tempfile.mkdtemp(prefix="audioloader-device-check-"))
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"

    site = Path(tempfile.gettempdir()) / "audioloader-device-site"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore", "AUDIOLOADER_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(p for p in (str(site) if args.wheels else "", str(ROOT),
                                                     os.environ.get("PYTHONPATH", "")) if p)}
    names = datasets.split(",")
    steps = Steps(out, budget, env, planned=2 + 2 * len(names) + (args.wheels is not None))
    if args.wheels is not None:
        install_wheels(steps, args.wheels, site)
    about = facts(env)
    print(f"== {about['cores']} cores, GPU {about['gpu']}, torch {about['torch']}, torchdata {about['torchdata']}, "
          f"pyarrow {about['pyarrow']}, commit {about['commit']}", flush=True)

    tests = steps.run("cuda_tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda",
                                     *CUDA_TESTS])
    steps.run("dataset", [sys.executable, "-c", (
        "from audioloader.tools.bench import dataset as d\n"
        f"s = d.DatasetSpec(clips={clips})\n"
        f"print(d.standard_dataset(s, {str(cache)!r}, workers={workers}))\n"
        f"print(d.packed_dataset(s, 32000, 'pcm16', {str(cache)!r}, workers={workers}))")])
    common = ["--clips", str(clips), "--cache-dir", str(cache), "--workers", str(workers)]
    for name in names:  # one step each, so that a step stopped at the deadline loses only its own results
        steps.run(f"train_loop_{name}", [sys.executable, "-m", "benchmarks.end_to_end.bench_train_loop", *common,
                                         "--datasets", name, "--seconds", f"{seconds:g}",
                                         "--output", str(out / f"train_loop_{name}.json")])
    for name in names:
        steps.run(f"scaling_{name}", [sys.executable, "-m", "benchmarks.end_to_end.bench_scaling", *common,
                                      "--datasets", name, "--seconds", f"{0.6 * seconds:g}",
                                      "--output", str(out / f"scaling_{name}.json")])

    print(report(about, workers, clips, test_summary(tests), steps, out, names))
    (out / "facts.json").write_text(json.dumps({**about, "workers": workers, "clips": clips, "seconds": seconds,
                                                "steps": steps.status}, indent=2))
    return 0 if all(s[0].isdigit() for s in steps.status.values()) else 1


def report(about: dict[str, str], workers: int, clips: int, tests: str, steps: Steps, out: Path,
           datasets: list[str]) -> str:
    """The one table: what each step gave, or why it gave nothing."""
    lines = [f"\n## Device check: {about['cores']} cores, GPU {about['gpu']}, commit {about['commit']}, "
             f"N = {workers} workers, {clips} clips, {steps.elapsed():.0f} s in all", ""]
    lines += ["| step | result |", "|---|---|"]
    lines.append(f"| CUDA tests | {tests.splitlines()[0] if tests else '-'} |")
    for line in tests.splitlines()[1:]:
        lines.append(f"| | {line.strip()} |")
    for name in datasets:
        lines += _train_loop_rows(out / f"train_loop_{name}.json", name)
    for name in datasets:
        lines += _scaling_rows(out / f"scaling_{name}.json", workers, name)
    for name, status in steps.status.items():
        if not status[0].isdigit():
            lines.append(f"| {name} | {status} |")
    lines.append(f"\nlogs and JSON: {out}")
    return "\n".join(lines)


def _train_loop_rows(path: Path, dataset: str) -> list[str]:
    if not path.exists():
        return [f"| training loop, {dataset} | no result |"]
    data = json.loads(path.read_text())
    alone = data["step_alone"]
    rows = [f"| training loop, {dataset}: step alone ({alone.get('device', '?')}) | {alone.get('step_ms', 0):.1f} ms = "
            f"{alone.get('samples_per_s', 0):,.0f} samples/s |"]
    for dataset, label, r in data["rows"]:
        value = (f"{r['samples_per_s']:,.0f} samples/s, data wait {r['wait_fraction']:.1%}, "
                 f"step {r['step_ms']:.0f} ms" if r.get("ok") else f"FAILED {str(r.get('error'))[-200:]}")
        rows.append(f"| training loop, {dataset}, {label} | {value} |")
    return rows


def _scaling_rows(path: Path, n: int, name: str) -> list[str]:
    if not path.exists():
        return [f"| scaling, {name} | no result |"]
    results = json.loads(path.read_text())["results"]
    rows = []
    for dataset, table in results.items():
        def rate(name: str, table: dict = table) -> float | None:
            r = table.get(name) or {}
            return r.get("samples_per_s") if r.get("ok") else None

        processes, limit, loader = rate(f"processes-{n}"), rate(f"decode-processes-{n}"), rate(f"dataloader-{n}")
        main = (table.get(f"processes-{n}") or {}).get("main_process_cores")
        parts = [f"processes {processes:,.0f}" if processes else "processes -",
                 f"limit {limit:,.0f}" if limit else "limit -"]
        if processes and limit:
            parts.append(f"**{processes / limit:.2f} of the limit**")
        if main is not None and processes:
            parts.append(f"main process {main:.2f} cores = {1e6 * main / processes:.0f} us a sample")
        if processes and loader:
            parts.append(f"{processes / loader:.2f}x DataLoader-{n}")
        threads = rate(f"threads-{n}")
        if threads:
            parts.append(f"threads {threads:,.0f}")
        rows.append(f"| scaling, {dataset}, N = {n} | {', '.join(parts)} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
