#!/usr/bin/env python3
"""Set up the development environment and run the project's jobs.

Needs nothing but Python 3.10+. The first call creates ``.venv`` and installs
audioloader (the distribution ``audioloader-arrow``) with its ``dev`` extra (torch 2.11 + torchaudio 2.11, see
pyproject.toml); later calls reinstall only when pyproject.toml changed.

    python3 dev.py demo [ARGS...]   # the main job: `audioloader demo`
    python3 dev.py test [--slow] [PYTEST ARGS...]
    python3 dev.py bench [ARGS...]  # `audioloader bench`
    python3 dev.py lint             # ruff
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".audioloader-installed"


def _venv_bin(name: str) -> Path:
    folder = "Scripts" if os.name == "nt" else "bin"
    return VENV / folder / name


def _requirements_hash() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_environment() -> None:
    """Create .venv and install the project into it unless it is up to date."""
    if sys.version_info < (3, 10):  # noqa: UP036 - dev.py may be run by any python3
        sys.exit(f"audioloader needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    if not _venv_bin("python").exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    wanted = _requirements_hash()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    print("installing audioloader-arrow[dev] into .venv (first run takes a minute or two)", flush=True)
    python = str(_venv_bin("python"))
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    # Up to 0.2 this project's distribution was named "audioloader" (a name PyPI gives another project): a .venv
    # made then still holds it, which would leave two installs of the package behind. Absent: nothing happens.
    subprocess.run([python, "-m", "pip", "uninstall", "--disable-pip-version-check", "-y", "-q", "audioloader"],
                   check=False, capture_output=True)
    subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(wanted)


def _run(argv: list[str]) -> int:
    return subprocess.run(argv, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "lint", "setup"}:
        print(__doc__)
        return 2
    job, rest = argv[0], argv[1:]
    ensure_environment()
    python = str(_venv_bin("python"))
    if job == "setup":
        return 0
    if job == "demo":
        return _run([python, "-m", "audioloader", "demo", *rest])
    if job == "bench":
        return _run([python, "-m", "audioloader", "bench", *rest])
    if job == "lint":
        return _run([python, "-m", "ruff", "check", "."])
    if "--slow" in rest:
        rest = [arg for arg in rest if arg != "--slow"]
        rest = ["-m", "slow or not slow", *rest]
    return _run([python, "-m", "pytest", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
