"""What the benchmark scripts share: the repository's folders, timing and medians, a contender run in a fresh
process with the peak PSS of its process tree, another checkout to measure, and plain-text tables.

Nothing here imports audioloader at the top: the peers' virtual environments (``remote/remote_peers.py``,
Lhotse's) import this module without the library. The process-tree sampler itself is the library's
(`audioloader.tools.bench.runner.TreeSampler`, the one ``audioloader bench`` measures with).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import numpy as np

#: The repository's root: every benchmark runs from here as ``python -m benchmarks.<folder>.<script>``.
ROOT = Path(__file__).resolve().parents[1]
#: Where the benchmarks keep the data they generate once (git ignores ``.cache/``).
CACHE = ROOT / ".cache" / "bench"
#: The line a contender's child prints its JSON result on (`run_child`).
RESULT_PREFIX = "RESULT "


# -- medians and timing ----------------------------------------------------------------------------------------


def median_of(results: Iterable[Mapping[str, Any]], field: str) -> float:
    """The median of ``field`` over several rounds' results (dicts)."""
    return statistics.median(r[field] for r in results)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``fn()`` in seconds, over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_ns_per_call(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """The median over ``rounds`` of the mean nanoseconds one call of ``fn()`` takes, ``calls`` calls a round."""
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(per_round)


def interleaved_medians(runs: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each of ``runs`` (name: a call that measures once and returns the figure, e.g. seconds) once a round, in
    turn, for ``rounds`` rounds, so a slow spell of the machine falls on all of them alike; each one's median."""
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            figures[name].append(run())
    return {name: statistics.median(values) for name, values in figures.items()}


def median_round(results: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], float]) -> Mapping[str, Any]:
    """The round (one contender's result dict) whose ``key`` is the median of the rounds that succeeded (``"ok"``;
    of an even count, the upper middle), so its figures all come from one run; the last round when none did."""
    ok = sorted((r for r in results if r.get("ok")), key=key)
    return ok[len(ok) // 2] if ok else results[-1]


def median_figures(results: Sequence[Mapping[str, Any]], fields: Iterable[str]) -> dict[str, Any]:
    """One result from several rounds: the first round's, each of ``fields`` replaced by its median over the
    rounds that report it (None when none does); the first failed round instead when a round failed."""
    failed = [r for r in results if not r.get("ok")]
    if failed:
        return dict(failed[0])
    out = dict(results[0])
    for field in fields:
        values = [r[field] for r in results if r.get(field) is not None]
        out[field] = statistics.median(values) if values else None
    return out


# -- a contender in a fresh process ----------------------------------------------------------------------------


def module_command(module: ModuleSpec | str | None, *args: str, python: str = sys.executable) -> list[str]:
    """The command line that runs benchmark ``module`` (its ``__spec__``, or its dotted name) with ``args`` in a
    fresh process: ``python -m benchmarks.<folder>.<script> ARGS``.

    Run it with ``cwd=ROOT`` (`run_child` does): ``python -m`` finds ``benchmarks`` in the working directory.
    """
    if not isinstance(module, str):
        if module is None:  # run as a file, not as a module
            raise SystemExit("run the benchmarks as modules from the repository's root: "
                             "python -m benchmarks.<folder>.<script> (see benchmarks/README.md)")
        module = module.name
    return [python, "-m", module, *args]


def run_child(command: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
              interval: float = 0.05, pss_every: int = 10) -> dict[str, Any]:
    """Run one contender (``command``, which prints ``RESULT <json>`` on a line of its own) in a fresh process
    from `ROOT`; its result, plus the peak PSS of its process tree and the cores other processes used meanwhile.

    Returns ``{"ok": True, **result, "peak_pss_mb", "peak_pss_by_process_mb" ({"main": [MiB], "children": [MiB,
    ...]} at the peak), "others_cores", "disturbed"}``, or ``{"ok": False, "error": <the end of its stderr>}``.
    The tree's memory is sampled every ``interval`` s, its PSS every ``pss_every`` samples (reading PSS walks the
    page tables).
    """
    from audioloader.tools.bench.runner import Disturbance, TreeSampler

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with Disturbance() as disturbance:
        proc = subprocess.Popen(list(command), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        sampler = TreeSampler(proc.pid, interval=interval, pss_every=pss_every)
        sampler.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\ntimed out after {timeout:g} s"
        sampler.stop()
    line = next((x for x in out.splitlines() if x.startswith(RESULT_PREFIX)), None)
    if line is None:
        return {"ok": False, "error": f"exited with {proc.returncode} without a result: {err[-2000:]}"}
    by_process = {role: [kb / 1024 for kb in kbs] for role, kbs in sampler.peak_pss_by_process_kb.items()}
    return {"ok": True, **json.loads(line[len(RESULT_PREFIX):]), "peak_pss_mb": sampler.peak_pss_kb / 1024,
            "peak_pss_by_process_mb": by_process, "others_cores": disturbance.cores,
            "disturbed": disturbance.disturbed}


def emit_result(result: Mapping[str, Any]) -> None:
    """Print a child's result where `run_child` reads it."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- another checkout ------------------------------------------------------------------------------------------


def checkout_python_path(project: str | os.PathLike[str], links: str | os.PathLike[str]) -> str:
    """``PYTHONPATH`` under which a fresh ``python -P -m benchmarks....`` imports *this* checkout's benchmarks (and
    its tests/, for the loopback S3 server) but ``project``'s audioloader (e.g. an older release's checkout).

    ``links``: a scratch folder where the links to this checkout's ``benchmarks`` and ``tests`` are made, first on
    the path; ``-P`` keeps the working directory (whose audioloader would win) off it.
    """
    project, links = Path(project).resolve(), Path(links)
    if not (project / "audioloader" / "__init__.py").is_file():
        raise SystemExit(f"{project} is not an audioloader checkout (no audioloader/__init__.py)")
    links.mkdir(parents=True, exist_ok=True)
    for name in ("benchmarks", "tests"):
        link = links / name
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    return os.pathsep.join([str(links), str(project)])


# -- tables ----------------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain-text table: a column as wide as its widest cell, text to the left, numbers to the right."""
    rows = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if _is_number(c) else c.ljust(w) for c, w in zip(cells, widths, strict=True))

    return "\n".join([line(header).rstrip(), *(line(r).rstrip() for r in rows)])


def rounds_line(name: str, results: Sequence[Mapping[str, Any]], rate: str, rate_format: str = ".1f",
                middle: Callable[[list[Mapping[str, Any]]], str] = lambda ok: "", width: int = 14) -> str:
    """One contender's line in a table of rounds (`run_child` results): the median of ``rate`` and each round's, the
    median first batch (s) and peak PSS of the process tree (MB), the cells ``middle(rounds)`` returns (each
    followed by a space), and the most cores other processes used meanwhile ("!": a round was disturbed); "FAILED"
    and the end of the first failure's error when a round failed."""
    ok = [r for r in results if r.get("ok")]
    if len(ok) < len(results):
        return f"{name:{width}s} FAILED {next(r for r in results if not r.get('ok'))['error'][-800:]}"
    rounds = " / ".join(f"{r[rate]:.0f}" for r in ok)
    mark = "!" if any(r["disturbed"] for r in ok) else " "
    return (f"{name:{width}s} {median_of(ok, rate):9{rate_format}} {rounds:>13s} "
            f"{median_of(ok, 'first_batch_s'):13.2f} {median_of(ok, 'peak_pss_mb'):11.0f} {middle(ok)}"
            f"{max(r['others_cores'] or 0.0 for r in ok):6.2f}{mark}")


def ratio_lines(ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]], label: str,
                figures: Mapping[str, str], targets: Mapping[str, float], higher_is_better: Iterable[str],
                width: int = 14) -> list[str]:
    """``label`` (e.g. "audioloader / lhotse") for each of ``figures`` (name: the results' field): our figure over
    theirs per round (rounds paired in order, both ok) and the median, with the verdict against ``targets[name]``
    where there is one (at least for the names in ``higher_is_better``, at most for the others)."""
    pairs = [(a, b) for a, b in zip(ours, theirs, strict=False) if a.get("ok") and b.get("ok")]
    higher = set(higher_is_better)
    lines = []
    for name, field in figures.items() if pairs else ():
        values = [a[field] / b[field] for a, b in pairs]
        ratio, target = statistics.median(values), targets.get(name)
        verdict = ")"
        if target is not None:
            met = ratio >= target if name in higher else ratio <= target
            verdict = f"; target {'>=' if name in higher else '<='} {target:g}x) {'met' if met else 'MISSED'}"
        lines.append(f"{label} {name:{width}s} {ratio:5.2f}x (rounds {' / '.join(f'{v:.2f}' for v in values)}{verdict}")
    return lines


def _is_number(cell: str) -> bool:
    try:
        float(cell.rstrip("x%×"))
    except ValueError:
        return False
    return True


def av_encode(signal: np.ndarray, rate: int, container: str, codec: str, bit_rate: int | None = None) -> bytes:
    """Encode float32 ``[n]`` or ``[n, channels]`` with FFmpeg (PyAV), bit-exact flags set (no version strings in
    the MP4/FLAC bytes): a benchmark's and a test's clips in codecs libsndfile does not write."""
    import av

    x = signal[:, None] if signal.ndim == 1 else signal
    layout = "mono" if x.shape[1] == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.options = {"flags": "+bitexact"}
        if bit_rate:
            stream.bit_rate = bit_rate
        names = [f.name for f in stream.codec_context.codec.audio_formats]
        fmt = next(f for f in ("fltp", "flt", "s16", "s16p") if f in names)
        data = (x.T.astype(np.float32) if fmt.startswith("flt")
                else np.round(np.clip(x.T, -1, 1) * 32767).astype(np.int16))
        for i in range(0, data.shape[1], 960):
            part = data[:, i:i + 960]
            part = np.ascontiguousarray(part if fmt.endswith("p") else part.T.reshape(1, -1))
            frame = av.AudioFrame.from_ndarray(part, format=fmt, layout=layout)
            frame.sample_rate, frame.pts = rate, i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
