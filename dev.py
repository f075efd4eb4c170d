#!/usr/bin/env python3
"""Set up the development environment and run the project's jobs.

Needs nothing but Python 3.10+. The first call creates ``.venv`` and installs
audioloader (the distribution ``audioloader-arrow``) with its ``dev`` extra (torch 2.11 + torchaudio 2.11, see
pyproject.toml); later calls reinstall only when pyproject.toml changed.

torch comes as its CPU build where no NVIDIA GPU is found (on Linux PyPI's default wheel brings CUDA: a .venv of
5.4 GB instead of 1.2 GB), from download.pytorch.org/whl/cpu; where that index cannot be reached, PyPI's default
wheel, with one line saying so. ``AUDIOLOADER_TORCH=cpu`` or ``cuda`` decides instead of the GPU check; delete
.venv to change the build of an existing one.

    python3 dev.py demo [ARGS...]   # the main job: `audioloader demo`
    python3 dev.py test [--slow] [PYTEST ARGS...]
    python3 dev.py bench [ARGS...]  # `audioloader bench`
    python3 dev.py lint             # ruff
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".audioloader-installed"

#: The variable that picks torch's build instead of the GPU check: cpu, cuda, or auto (the default).
TORCH_ENV = "AUDIOLOADER_TORCH"
#: PyTorch's index of CPU-only wheels (torch and torchaudio, and what they depend on).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: Seconds the CPU index may take to answer before PyPI's default wheel is used instead.
PROBE_TIMEOUT_S = 3.0
#: One entry per NVIDIA GPU the driver sees (Linux).
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def _venv_bin(name: str) -> Path:
    folder = "Scripts" if os.name == "nt" else "bin"
    return VENV / folder / name


def _requirements_hash() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


@dataclass(frozen=True)
class TorchChoice:
    """Where torch and torchaudio come from: ``index_url`` None is the default index (PyPI's default wheel)."""

    build: str  # "cpu" or "cuda": what was asked for or found
    index_url: str | None
    reason: str  # one line for the person waiting on the install


def nvidia_gpu_present() -> bool:
    """Whether an NVIDIA GPU is here, without torch: the driver lists one, or ``nvidia-smi -L`` names one."""
    try:
        if NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir()):
            return True
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def cpu_index_unreachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the CPU index cannot be used now (a short reason), or None when it answers within ``timeout`` s."""
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=timeout):
            return None
    except urllib.error.URLError as error:  # no name resolution, refused, an HTTP error
        return str(getattr(error, "reason", error))
    except Exception as error:  # a timeout, a reset connection, a broken answer: the install goes on without it
        return str(error) or type(error).__name__


def choose_torch(environ: dict[str, str] | None = None, platform: str | None = None) -> TorchChoice:
    """The torch build to install: ``AUDIOLOADER_TORCH`` if set, else CUDA where an NVIDIA GPU is found and the
    CPU build where none is; the CPU build from `CPU_INDEX` on Linux when it answers, PyPI's default otherwise
    (elsewhere PyPI's default wheel is the CPU build already)."""
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    asked = environ.get(TORCH_ENV, "").strip().lower() or "auto"
    if asked not in {"auto", "cpu", "cuda"}:
        sys.exit(f"{TORCH_ENV}={environ[TORCH_ENV]!r} is not one of cpu, cuda, auto: set {TORCH_ENV}=cpu for "
                 f"torch's CPU build, cuda for its CUDA build, or leave it unset to decide by whether an NVIDIA GPU "
                 f"is present")
    if asked == "cuda":
        return TorchChoice("cuda", None, f"torch: PyPI's default wheel, with CUDA ({TORCH_ENV}=cuda)")
    if asked == "auto" and nvidia_gpu_present():
        return TorchChoice("cuda", None, f"torch: PyPI's default wheel, with CUDA (an NVIDIA GPU is present; "
                                         f"{TORCH_ENV}=cpu for the CPU build)")
    why = f"{TORCH_ENV}=cpu" if asked == "cpu" else f"no NVIDIA GPU found; {TORCH_ENV}=cuda for the CUDA build"
    if not platform.startswith("linux"):
        return TorchChoice("cpu", None, f"torch: PyPI's default wheel, the CPU build on this platform ({why})")
    unreachable = cpu_index_unreachable()
    if unreachable is not None:
        return TorchChoice("cpu", None, f"torch: PyPI's default wheel (with CUDA, ~4 GB more): {CPU_INDEX} cannot "
                                        f"be reached ({unreachable})")
    return TorchChoice("cpu", CPU_INDEX, f"torch: the CPU build from {CPU_INDEX} ({why})")


def torch_requirements() -> list[str]:
    """torch's and torchaudio's requirements as the ``dev`` extra of pyproject.toml states them."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^dev = \[(.*?)^\]", text, flags=re.MULTILINE | re.DOTALL)
    specs = re.findall(r'"((torch|torchaudio)\s*[=<>!~][^"]*)"', extra[1] if extra else "")
    found = {name: spec for spec, name in specs}
    return [found.get(name, name) for name in ("torch", "torchaudio")]


def install_torch(pip: list[str], choice: TorchChoice) -> None:
    """Install torch and torchaudio from ``choice.index_url`` first, so that the ``dev`` extra finds them there.
    Never fails: if that install does not work, the extra brings PyPI's default wheel."""
    print(choice.reason, flush=True)
    if choice.index_url is None:
        return
    done = subprocess.run([*pip, *torch_requirements(), "--index-url", choice.index_url], check=False)
    if done.returncode != 0:
        print(f"torch: the install from {choice.index_url} failed (exit {done.returncode}); PyPI's default wheel "
              "comes with the dev extra instead", flush=True)


#: Prints the installed torch and torchaudio versions, whether or not they import.
_VERSIONS = ("from importlib.metadata import version as v\n"
             "for name in ('torch', 'torchaudio'):\n"
             "    try: print(name, v(name))\n"
             "    except Exception: print(name, 'not installed')")


def check_torchaudio(python: str) -> None:
    """Stop (without marking .venv installed) when torch and torchaudio do not import together in it.

    torchaudio's native library loads only with the torch release it was built against, whatever its metadata
    allows (torchaudio 2.11.1 declares torch>=2.11, yet its libtorchaudio.so fails on torch 2.11.0 with an
    undefined symbol), so an install can succeed and leave a pair that cannot be imported: every test that
    compares features with torchaudio would then fail. Say so now, with the versions and the fix."""
    probe = subprocess.run([python, "-c", "import torch, torchaudio"], capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        return
    lines = (probe.stderr or probe.stdout or "").strip().splitlines()
    cause = lines[-1] if lines else f"exit status {probe.returncode}"
    found = subprocess.run([python, "-c", _VERSIONS], capture_output=True, text=True, check=False).stdout
    versions = dict(line.split(" ", 1) for line in found.strip().splitlines() if " " in line)
    torch_version = versions.get("torch", "?").split("+")[0]
    sys.exit(f"dev.py: torch {versions.get('torch', '?')} and torchaudio {versions.get('torchaudio', '?')} were "
             f"installed into {VENV} but do not import together:\n    {cause}\n"
             f"torchaudio loads only with the torch release it was built for. pyproject.toml's dev extra pins a "
             f"pair that does ({', '.join(torch_requirements())}); if you changed those pins, pin torchaudio to "
             f"torch's own version, or repair this .venv with:\n"
             f"    {_venv_bin('python')} -m pip install --no-deps torchaudio=={torch_version}\n"
             f"then run dev.py again (it checks again; delete {VENV} to start over).")


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
    install_torch(pip, choose_torch())
    subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    check_torchaudio(python)
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
