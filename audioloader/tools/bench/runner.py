"""Running one contender in a fresh process and measuring its whole process tree (memory, CPU, disturbance)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from . import contenders
from .contenders import cores, tree_pids
from .settings import DISTURBED_CORES

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


def _pss_kb(pid: int) -> int:
    """Proportional set size of ``pid`` in KiB (0 if it is gone or the kernel has no smaps_rollup).

    A page shared by n processes counts 1/n in each, so the PSS of a process tree
    sums to its real footprint; summed RSS counts the pages that forked workers
    share with their parent (libtorch, the memory-mapped shards) once per process.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


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


def _others_cores(busy_before: int | None, busy_after: int | None, used_s: float, wall: float) -> float | None:
    """Cores other processes used over ``wall`` s: machine busy time less ``used_s`` (ours and the measured
    children's CPU seconds); None where /proc/stat is missing."""
    if busy_before is None or busy_after is None or wall <= 0:
        return None
    return max(0.0, ((busy_after - busy_before) / os.sysconf("SC_CLK_TCK") - used_s) / wall)


class Disturbance:
    """Cores that *other* processes used while a child ran: ``with Disturbance() as d: subprocess.run(...)``.

    Machine busy time (``/proc/stat``) minus the CPU time of the children waited
    for meanwhile (``RUSAGE_CHILDREN``: a child and the descendants it waited
    for) and of this process, over the wall time. ``d.cores`` is None where
    ``/proc/stat`` is missing; ``d.disturbed`` compares it with `DISTURBED_CORES`.
    """

    def __enter__(self) -> Disturbance:
        self._busy = _machine_busy_ticks()
        self._children = _children_cpu_seconds()
        self._own = time.process_time()
        self._start = time.perf_counter()
        self.cores: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        used = (_children_cpu_seconds() - self._children) + (time.process_time() - self._own)
        self.cores = _others_cores(self._busy, _machine_busy_ticks(), used, time.perf_counter() - self._start)

    @property
    def disturbed(self) -> bool:
        return self.cores is not None and self.cores > DISTURBED_CORES


def _children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class TreeSampler(threading.Thread):
    """Samples the memory and CPU time of a process and all its descendants every ``interval`` s.

    RSS every sample; PSS every ``pss_every`` samples (reading it walks the page
    tables: about 5 ms for a process of 700 MB, too much for every 50 ms), with
    each process's share at the peak (``peak_pss_by_process_kb``: the root process
    as ``"main"``, its descendants, workers and a fork server, as ``"children"``).
    """

    def __init__(self, pid: int, interval: float = 0.05, pss_every: int = 10) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_rss_kb = 0
        self.peak_anon_kb = 0
        self.peak_pss_kb = 0
        self.peak_pss_by_process_kb: dict[str, list[int]] = {}  # at the peak: {"main": [kb], "children": [kb...]}
        self.pss_every = pss_every
        self._samples = 0
        self.max_processes = 0
        self.cpu_ticks: dict[int, int] = {}  # last seen per pid (a worker's ticks outlive it)
        self._halt = threading.Event()
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
        if self._samples % self.pss_every == 0:
            each = {pid: _pss_kb(pid) for pid in pids}
            total = sum(each.values())
            if total > self.peak_pss_kb:
                self.peak_pss_kb = total
                self.peak_pss_by_process_kb = {
                    "main": [each.get(self.pid, 0)],
                    "children": sorted((kb for pid, kb in each.items() if pid != self.pid and kb), reverse=True)}
        self._samples += 1
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


def run_contender(spec: dict[str, Any], timeout: float, log, command: list[str] | None = None) -> dict[str, Any]:
    """Run one contender in a fresh process; its result plus memory, wall time and disturbance.

    ``command``: the child's command line, to which the spec is appended as JSON (default: this package's
    contenders, ``python -m audioloader.tools.bench._child``); the child prints its result on a line that
    starts with `contenders.RESULT_PREFIX` (a benchmark script can run its own contenders this way).
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(spec.get("env") or {})
    busy_before = _machine_busy_ticks()
    own_before = time.process_time()
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        argv = command or [sys.executable, "-m", "audioloader.tools.bench._child"]
        proc = subprocess.Popen([*argv, json.dumps(spec)],
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
            _kill_tree(proc.pid, tree_pids)
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
                  peak_pss_bytes=sampler.peak_pss_kb * 1024 or None,
                  peak_pss_by_process_bytes={k: [kb * 1024 for kb in v]
                                             for k, v in sampler.peak_pss_by_process_kb.items()} or None,
                  processes=sampler.max_processes, wall_s=wall, exit_s=time.perf_counter() - result_at,
                  exit_hang=exit_hang)
    if exit_hang:
        log(f"  warning: {spec['kind']} printed its result but did not exit within 30 s; killed "
            f"(stderr tail: {stderr_tail[-500:]!r})")
    others = _others_cores(busy_before, busy_after, sampler.cpu_seconds + time.process_time() - own_before, wall)
    if others is not None:
        result["others_cores"] = others
        result["disturbed"] = others > DISTURBED_CORES
    return result


def _kill_tree(pid: int, tree_pids) -> None:
    import signal

    for p in reversed(tree_pids(pid)):  # children first; every pid here descends from our own child
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def machine_info() -> dict[str, Any]:
    import torch
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"cores": cores(), "cpu": cpu, "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "loadavg_end": load}


