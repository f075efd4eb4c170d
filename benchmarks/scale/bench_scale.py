"""The start of a large job, simulated with the real code: requests, bytes, metadata memory and seconds of every
rank and machine before its first batch, under a model of S3 (`benchmarks.scale.simulator` says what is real and
what is modelled).

    .venv/bin/python -m benchmarks.scale.bench_scale --files 1000000 --ranks 1024 --ranks-per-machine 8 \\
        --latency-ms 50 --machine-mbps 800 [--index manifest|v03|none] [--project DIR] [--sample-machines 2]

``--project DIR`` measures the audioloader of another checkout (e.g. 0.3's: ``git archive v0.3 | tar -x -C
/tmp/al03``): the simulation then runs in a fresh process that imports audioloader from DIR and this checkout's
benchmarks (`benchmarks.common.checkout_python_path`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import audioloader
from benchmarks.common import ROOT, checkout_python_path, module_command
from benchmarks.scale import simulator


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = simulator.parse_args(argv)
    if args.project and not Path(audioloader.__file__).resolve().is_relative_to(Path(args.project).resolve()):
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as links:
            env = {**os.environ, "PYTHONPATH": checkout_python_path(args.project, links)}
            command = module_command(__spec__, *argv)
            return subprocess.run([command[0], "-P", *command[1:]], cwd=ROOT, env=env).returncode
    simulator.simulate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
