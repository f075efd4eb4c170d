"""The loopback S3 store of the remote benchmarks and one contender's run against it: moto behind a shaping
proxy (`tests/s3_server.py`), each contender a fresh process whose result line, peak PSS of its process tree,
CPU seconds and the proxy's request counters (in total and at the child's marks) are collected. Shared by
`bench_remote` and `bench_formats` (a helper module: no ``__main__``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, checkout_python_path
from benchmarks.remote import remote_report
from benchmarks.remote.protocol import MARK_PREFIX, RESULT_PREFIX

#: The bucket every remote benchmark writes its data to.
BUCKET = "bench"


# -- running one contender ------------------------------------------------------------------------------------


def runner_module():
    """`audioloader.tools.bench.runner` (process-tree sampling, machine info), imported when first needed."""
    from audioloader.tools.bench import runner

    return runner


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_child(command: list[str], env: dict[str, str], timeout: float, on_mark=None) -> dict[str, Any]:
    """Run one contender; its result line plus peak memory of its process tree, CPU and wall seconds.

    ``on_mark(label)`` is called for each ``BENCH-MARK label`` line the child prints (it waits for the answer
    meanwhile); what it returns is kept under ``result["marks"][label]``.
    """
    runner = runner_module()
    marks: dict[str, Any] = {}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True)
        sampler = runner.TreeSampler(proc.pid)
        sampler.start()
        lines: list[str] = []

        def read() -> None:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(MARK_PREFIX):
                    label = line[len(MARK_PREFIX):].strip()
                    marks[label] = on_mark(label) if on_mark else None
                    with contextlib.suppress(OSError):
                        proc.stdin.write("\n")
                        proc.stdin.flush()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            runner._kill_tree(proc.pid, runner.tree_pids)
            proc.wait()
        sampler.stop()
        reader.join(10)
        with contextlib.suppress(OSError):
            proc.stdin.close()
        err.seek(0)
        stderr = err.read()[-3000:]
    line = next((x for x in lines if x.startswith(RESULT_PREFIX)), None)
    if line is None:
        why = f"timed out after {timeout:g} s (--timeout)" if timed_out else f"exited with {proc.returncode}"
        result: dict[str, Any] = {"ok": False, "error": f"{why} without a result", "stderr": stderr}
    else:
        result = json.loads(line[len(RESULT_PREFIX):])
        if not result.get("ok"):
            result["stderr"] = stderr
    result.update(peak_pss_bytes=sampler.peak_pss_kb * 1024 or None, peak_rss_bytes=sampler.peak_rss_kb * 1024,
                  cpu_s=sampler.cpu_seconds, processes=sampler.max_processes, marks=marks)
    return result


def _requests(counters: dict[str, int]) -> dict[str, int]:
    return {k: counters.get(k, 0) for k in ("requests", "GET", "HEAD", "LIST", "bytes")}


class Bench:
    """The server, the proxy, the environments, and the list of results of this run."""

    def __init__(self, args: argparse.Namespace, log) -> None:
        from tests.s3_server import S3_ENVIRONMENT, S3Server

        self.args, self.log = args, log
        self.env = {**os.environ, **S3_ENVIRONMENT, "PYTHONUNBUFFERED": "1"}
        self.server = S3Server(proxy_process=True, ranges_in_place=True)
        self.fs = self.server.filesystem()
        self.fs.create_dir(BUCKET)
        self.results: list[dict[str, Any]] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-remote-")

    def close(self) -> None:
        self.server.close()
        self.tmp.cleanup()

    @staticmethod
    def child_command() -> list[str]:
        """audioloader's contender; ``-P``: the checkout measured comes from `child_env`'s path, not the cwd."""
        return [sys.executable, "-P", "-m", "benchmarks.remote.remote_child"]

    def child_env(self, project: Path) -> dict[str, str]:
        """The environment of `child_command` measuring ``project``'s audioloader with this checkout's child."""
        return {**self.env, "PYTHONPATH": checkout_python_path(project, Path(self.tmp.name) / "links")}

    def source(self, prefix: str, latency: float | None, local: Path) -> str:
        if latency is None:
            return str(local)
        endpoint = self.server.proxy.endpoint
        return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    def run(self, meta: dict[str, Any], spec: dict[str, Any], command: list[str],
            env: dict[str, str]) -> dict[str, Any]:
        """Shape the proxy for ``meta["latency_ms"]``, run ``command + [spec]``, add the proxy's counters (in
        total and at the child's marks: ``marks["constructed"]``) and CPU figures."""
        command = [*command, json.dumps({**spec, "marks": True})]
        runner = runner_module()
        latency = meta.get("latency_ms")
        bandwidth = self.args.bandwidth * 1e6 if self.args.bandwidth else None
        proxy = self.server.proxy
        proxy.configure(latency=(latency or 0) / 1000, bandwidth=bandwidth)
        proxy.reset_counters()
        name = meta["name"]
        self.log(f"running {name} ...")
        server_cpu, proxy_cpu, own = _cpu_s(self.server.pid), _cpu_s(proxy.pid), time.process_time()
        busy = runner._machine_busy_ticks()
        started = time.perf_counter()
        result = run_child(command, env, self.args.timeout, on_mark=lambda label: _requests(proxy.stats()))
        wall = time.perf_counter() - started
        counters = proxy.stats()
        server_s, proxy_s = _cpu_s(self.server.pid) - server_cpu, _cpu_s(proxy.pid) - proxy_cpu
        others = runner._others_cores(busy, runner._machine_busy_ticks(),
                                      result["cpu_s"] + server_s + proxy_s + time.process_time() - own, wall)
        result.update(meta, wall_s=wall, server_cores=server_s / wall, proxy_cores=proxy_s / wall,
                      others_cores=others, bandwidth_mb_s=self.args.bandwidth if latency is not None else None,
                      requests=_requests(counters),
                      bytes_read=counters.get("bytes", 0), max_in_flight=counters.get("max_in_flight", 0))
        self.results.append(result)
        self.log("  " + remote_report.one_line(result))
        return result
