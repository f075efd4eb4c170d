"""Lhotse's environment for the end-to-end comparisons (bench_speech.py, bench_classification.py): a virtual
environment made once beside the benchmark's data, never a dependency of audioloader."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

#: The Lhotse the comparisons run against.
LHOTSE = "lhotse==1.33.*"


def lhotse_python(cache: Path) -> str:
    """A virtual environment with Lhotse, made once: it sees this environment's packages (torch, numpy, soundfile)
    through a .pth file and installs only what Lhotse adds; this environment is never changed."""
    venv = cache / "lhotse-1.33-venv"
    python = venv / "bin" / "python"
    if (venv / "ok").exists():
        return str(python)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    theirs = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    Path(theirs, "_parent_environment.pth").write_text(ours + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", LHOTSE], check=True)
    (venv / "ok").write_text("ok")
    return str(python)
