"""Every benchmark still runs: each module imports, each script answers ``--help``, and each folder's smallest
configuration runs (in this process where it needs no child process; the ones that start fresh processes, each
importing torch, are marked slow). Also the layout benchmarks/README.md promises: a package run with
``python -m benchmarks.<folder>.<script>``, no ``sys.path`` edits, no script importing another script."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
FOLDERS = sorted(p.parent.name for p in BENCHMARKS.glob("*/__init__.py"))


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module(p) for p in BENCHMARKS.rglob("*.py"))


def _is_script(path: Path) -> bool:
    """A script has a ``if __name__ == "__main__":`` block; a helper module has none."""
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in ast.parse(path.read_text()).body)


SCRIPTS = sorted(_module(p) for p in BENCHMARKS.rglob("*.py") if _is_script(p))
#: The scripts a user runs (with options); the others are children their parent starts with a JSON spec.
COMMANDS = sorted(_module(p) for p in BENCHMARKS.rglob("*.py") if _is_script(p) and "argparse" in p.read_text())


def run_main(module: str, *argv: str) -> str:
    """Run ``python -m module argv`` in this process (torch and the library are imported once for all); its stdout."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [module, *argv]
    sys.modules.pop(module, None)  # imported by another test: runpy runs a fresh copy as __main__
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as done:  # sys.exit(main()), or argparse after --help
        assert done.code in (0, None), f"{module} {' '.join(argv)} exited with {done.code}"
    finally:
        sys.argv = saved
    return out.getvalue()


# -- the layout ------------------------------------------------------------------------------------------------


def test_benchmarks_are_folders_with_a_readme_that_names_each():
    readme = (BENCHMARKS / "README.md").read_text()
    assert set(FOLDERS) == {"end_to_end", "pack", "pipeline", "remote", "scale"}
    assert not [p.name for p in BENCHMARKS.glob("bench_*.py")], "a benchmark script outside a folder"
    for module in SCRIPTS:
        name = module.split(".")[-1]
        assert name in readme, f"benchmarks/README.md does not list {module}"


def test_no_benchmark_edits_sys_path_or_imports_a_script():
    scripts = set(SCRIPTS)
    problems = []
    for path in BENCHMARKS.rglob("*.py"):
        text = path.read_text()
        if "sys.path" in text:
            problems.append(f"{path.relative_to(ROOT)} edits sys.path")
        for node in ast.walk(ast.parse(text)):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [f"{node.module}.{a.name}" for a in getattr(node, "names", []) if isinstance(node, ast.ImportFrom)]
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            imported = [n for n in names if n in scripts]
            if imported:
                problems.append(f"{path.relative_to(ROOT)} imports the script {imported[0]}")
    assert problems == []


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_module_imports(module):
    importlib.import_module(module)


@pytest.mark.parametrize("module", COMMANDS)
def test_every_benchmark_script_answers_help(module):
    assert "usage:" in run_main(module, "--help")


def test_a_script_run_as_a_file_says_how_to_run_it():
    done = subprocess.run([sys.executable, "-c", "from benchmarks.common import module_command; module_command(None)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "python -m benchmarks.<folder>.<script>" in done.stderr


def test_the_shared_round_summaries():
    """benchmarks/common.py's medians of rounds and the lines of a table of rounds against a peer."""
    from benchmarks import common

    rounds = [{"ok": True, "samples_per_s": rate, "first_batch_s": 1.0, "peak_pss_mb": 500.0 + rate,
               "others_cores": 0.5, "disturbed": rate == 30.0} for rate in (30.0, 10.0, 20.0)]
    assert common.median_round(rounds, lambda r: r["samples_per_s"]) is rounds[2]
    assert common.median_figures(rounds, ["samples_per_s", "absent"]) == {**rounds[0], "samples_per_s": 20.0,
                                                                           "absent": None}
    failed = {"ok": False, "error": "no result"}
    assert common.median_figures([*rounds, failed], ["samples_per_s"]) == failed
    line = common.rounds_line("ours", rounds, "samples_per_s", middle=lambda ok: "mid ")
    assert line.split() == ["ours", "20.0", "30", "/", "10", "/", "20", "1.00", "520", "mid", "0.50!"]
    assert common.rounds_line("ours", [*rounds, failed], "samples_per_s").split() == ["ours", "FAILED", "no", "result"]
    theirs = [{**r, "samples_per_s": 10.0} for r in rounds]
    assert common.ratio_lines(rounds, theirs, "ours / theirs", {"rate": "samples_per_s", "memory": "peak_pss_mb"},
                              {"rate": 1.5}, {"rate"}) == [
        "ours / theirs rate            2.00x (rounds 3.00 / 1.00 / 2.00; target >= 1.5x) met",
        "ours / theirs memory          1.00x (rounds 1.00 / 1.00 / 1.00)"]


# -- each folder's smallest configuration ----------------------------------------------------------------------


def _module_run(module: str, *argv: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# The smallest configurations run in fresh processes: the scale simulator sets module-level settings of the
# library (its part size, its store's identities) for the job it simulates, which must not leak into later tests.
def test_pipeline_reader_smallest():
    out = _module_run("benchmarks.pipeline.bench_reader", "--files", "4", "--rows-per-file", "16", "--repeat", "1",
                   "--formats", "ipc_file")
    assert "ipc_file" in out and "rows/s" in out


def test_scale_orc_and_simulator_smallest(tmp_path):
    assert "orc / parquet" in _module_run("benchmarks.scale.bench_orc", "--files", "4", "--stripes", "2", "--rows",
                                          "16", "--repeats", "1")
    result = tmp_path / "scale.json"
    _module_run("benchmarks.scale.bench_scale", "--files", "200", "--ranks", "4", "--ranks-per-machine", "2",
             "--memory-ranks", "0", "--json", str(result))
    job = json.loads(result.read_text())["job"]
    assert job["metadata_requests"] > 0 and job["GET"] > 0


@pytest.mark.slow
def test_remote_s3_smallest():
    out = _module_run("benchmarks.remote.bench_s3", "--rows", "64", "--batches", "1", "--repeats", "1",
                      "--features", "small", "--formats", "ipc", "--variants", "train")
    assert "peak_pss_mb" in out and "s3/local" in out


@pytest.mark.slow
def test_end_to_end_segments_smallest(tmp_path):
    out = _module_run("benchmarks.end_to_end.bench_segments", "--recordings", "1", "--minutes", "0.5", "--seconds",
                      "1", "--warmup", "1", "--workers", "1", "--cache-dir", str(tmp_path))
    assert "windows" in out


@pytest.mark.slow
def test_pack_smallest():
    out = _module_run("benchmarks.pack.bench_pack", "--files", "8", "--seconds", "0.5", "--repeats", "1")
    assert "speed-up" in out
