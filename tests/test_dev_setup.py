"""dev.py's choice of torch build: the CPU build where no NVIDIA GPU is found, from PyTorch's CPU index when it
answers and PyPI's default wheel when it does not; the CUDA build where a GPU is; ``AUDIOLOADER_TORCH`` decides
instead. The GPU check and the index probe are replaced here: nothing is installed or downloaded."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_dev(monkeypatch):
    """dev.py (a script at the checkout's root, not a module of the package), loaded afresh."""
    spec = importlib.util.spec_from_file_location("audioloader_dev_script", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def dev(monkeypatch):
    """dev.py with no GPU and a reachable CPU index (its GPU check and its probe replaced)."""
    module = load_dev(monkeypatch)
    monkeypatch.delenv(module.TORCH_ENV, raising=False)
    monkeypatch.setattr(module, "nvidia_gpu_present", lambda: False)
    monkeypatch.setattr(module, "cpu_index_unreachable", lambda timeout=module.PROBE_TIMEOUT_S: None)
    return module


def never(*args, **kwargs):
    raise AssertionError("called although the choice did not need it")


def test_no_gpu_installs_the_cpu_build_from_pytorchs_index(dev):
    choice = dev.choose_torch(platform="linux")
    assert (choice.build, choice.index_url) == ("cpu", "https://download.pytorch.org/whl/cpu")
    assert "no NVIDIA GPU found" in choice.reason and "AUDIOLOADER_TORCH=cuda" in choice.reason


def test_an_unreachable_cpu_index_falls_back_to_pypi_in_one_line(dev, monkeypatch):
    monkeypatch.setattr(dev, "cpu_index_unreachable", lambda timeout=dev.PROBE_TIMEOUT_S: "Name or service not known")
    choice = dev.choose_torch(platform="linux")
    assert (choice.build, choice.index_url) == ("cpu", None)
    assert "\n" not in choice.reason
    assert "cannot be reached (Name or service not known)" in choice.reason and "PyPI's default wheel" in choice.reason


def test_the_probe_is_quick_and_never_raises(monkeypatch):
    module = load_dev(monkeypatch)
    seen = []

    def urlopen(url, timeout):
        seen.append((url, timeout))
        raise TimeoutError("timed out")

    monkeypatch.setattr(module.urllib.request, "urlopen", urlopen)
    assert module.cpu_index_unreachable() == "timed out"
    assert seen == [("https://download.pytorch.org/whl/cpu/torch/", module.PROBE_TIMEOUT_S)]
    assert module.PROBE_TIMEOUT_S <= 5


def test_a_gpu_keeps_the_cuda_build_without_probing(dev, monkeypatch):
    monkeypatch.setattr(dev, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(dev, "cpu_index_unreachable", never)
    choice = dev.choose_torch(platform="linux")
    assert (choice.build, choice.index_url) == ("cuda", None)
    assert "an NVIDIA GPU is present" in choice.reason


def test_the_variable_decides_instead_of_the_gpu_check(dev, monkeypatch):
    monkeypatch.setattr(dev, "nvidia_gpu_present", lambda: True)
    choice = dev.choose_torch({"AUDIOLOADER_TORCH": "CPU"}, platform="linux")
    assert (choice.build, choice.index_url) == ("cpu", dev.CPU_INDEX)
    monkeypatch.setattr(dev, "nvidia_gpu_present", never)
    monkeypatch.setattr(dev, "cpu_index_unreachable", never)
    choice = dev.choose_torch({"AUDIOLOADER_TORCH": "cuda"}, platform="linux")
    assert (choice.build, choice.index_url) == ("cuda", None)


def test_a_wrong_value_of_the_variable_is_refused_by_name(dev):
    with pytest.raises(SystemExit, match=r"AUDIOLOADER_TORCH='gpu' is not one of cpu, cuda, auto"):
        dev.choose_torch({"AUDIOLOADER_TORCH": "gpu"}, platform="linux")


def test_off_linux_pypis_default_wheel_is_the_cpu_build(dev, monkeypatch):
    monkeypatch.setattr(dev, "cpu_index_unreachable", never)
    choice = dev.choose_torch(platform="darwin")
    assert (choice.build, choice.index_url) == ("cpu", None)


def test_gpu_check_reads_the_driver_or_nvidia_smi(monkeypatch, tmp_path):
    module = load_dev(monkeypatch)
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    monkeypatch.setattr(module, "NVIDIA_GPUS", gpus)
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    assert module.nvidia_gpu_present() is False  # the driver's folder, empty; no nvidia-smi
    (gpus / "0000:00:1e.0").mkdir()
    assert module.nvidia_gpu_present() is True
    monkeypatch.setattr(module, "NVIDIA_GPUS", tmp_path / "absent")
    monkeypatch.setattr(module.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    answers = {"rc": 0, "out": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"}
    monkeypatch.setattr(module.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, answers["rc"], answers["out"], ""))
    assert module.nvidia_gpu_present() is True
    answers.update(rc=9, out="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    assert module.nvidia_gpu_present() is False


def test_torch_requirements_follow_the_dev_extra(dev):
    assert dev.torch_requirements() == ["torch==2.11.0", "torchaudio==2.11.0"]


def test_the_dev_extra_pins_torch_and_torchaudio_to_one_release(dev):
    """torchaudio loads only with the torch it was built for (2.11.1 does not load with torch 2.11.0 although its
    metadata allows it): a range on either side lets pip resolve a pair that cannot be imported."""
    torch_spec, torchaudio_spec = dev.torch_requirements()
    assert torch_spec.startswith("torch==") and "*" not in torch_spec
    assert torchaudio_spec == "torchaudio==" + torch_spec.removeprefix("torch==")


BROKEN_PAIR = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
               "OSError: /venv/lib/python3.11/site-packages/torchaudio/lib/libtorchaudio.so: undefined symbol: "
               "torch_exception_get_what_without_backtrace\n")


def fake_install(dev, monkeypatch, tmp_path, torch_rc: int, import_stderr: str = "") -> list[list[str]]:
    """Run ensure_environment against a fake .venv in tmp_path, recording pip's commands (each exits 0, the
    install of torch from an index ``torch_rc``; the check that torch and torchaudio import fails with
    ``import_stderr`` when it is given)."""
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(dev, "VENV", venv)
    monkeypatch.setattr(dev, "STAMP", venv / ".audioloader-installed")
    commands = []

    def run(argv, check=False, **kwargs):
        commands.append([str(a) for a in argv])
        if argv[1:3] == ["-c", "import torch, torchaudio"]:
            return subprocess.CompletedProcess(argv, 1 if import_stderr else 0, "", import_stderr)
        if argv[1] == "-c":  # the versions installed
            return subprocess.CompletedProcess(argv, 0, "torch 2.11.0+cu130\ntorchaudio 2.11.1\n", "")
        rc = torch_rc if "--index-url" in argv else 0
        if check and rc:
            raise subprocess.CalledProcessError(rc, argv)
        return subprocess.CompletedProcess(argv, rc, "", "")

    monkeypatch.setattr(dev.subprocess, "run", run)
    dev.ensure_environment()
    assert (venv / ".audioloader-installed").exists()
    return commands


def test_setup_checks_that_torchaudio_imports_after_installing(dev, monkeypatch, tmp_path):
    commands = fake_install(dev, monkeypatch, tmp_path, torch_rc=0)
    extra_at = next(i for i, c in enumerate(commands) if c[-1].endswith("[dev]"))
    check_at = next(i for i, c in enumerate(commands) if c[1:] == ["-c", "import torch, torchaudio"])
    assert check_at > extra_at


def test_a_pair_that_does_not_import_stops_setup_with_the_fix(dev, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        fake_install(dev, monkeypatch, tmp_path, torch_rc=0, import_stderr=BROKEN_PAIR)
    message = str(stopped.value)
    assert "torch 2.11.0+cu130 and torchaudio 2.11.1 were installed" in message
    assert "undefined symbol: torch_exception_get_what_without_backtrace" in message
    assert "pip install --no-deps torchaudio==2.11.0" in message
    assert not (tmp_path / ".venv" / ".audioloader-installed").exists()  # the next run installs and checks again


def test_setup_installs_the_cpu_build_before_the_dev_extra(dev, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(dev.sys, "platform", "linux")
    commands = fake_install(dev, monkeypatch, tmp_path, torch_rc=0)
    torch_at = next(i for i, c in enumerate(commands) if "--index-url" in c)
    extra_at = next(i for i, c in enumerate(commands) if c[-1].endswith("[dev]"))
    assert torch_at < extra_at
    assert commands[torch_at][-4:] == [*dev.torch_requirements(), "--index-url", dev.CPU_INDEX]
    assert "the CPU build from https://download.pytorch.org/whl/cpu" in capsys.readouterr().out


def test_setup_never_fails_because_of_the_cpu_index(dev, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(dev.sys, "platform", "linux")
    commands = fake_install(dev, monkeypatch, tmp_path, torch_rc=1)  # reachable, but the install broke off
    assert any(c[-1].endswith("[dev]") for c in commands)
    assert "failed (exit 1); PyPI's default wheel comes with the dev extra instead" in capsys.readouterr().out
    monkeypatch.setattr(dev, "cpu_index_unreachable", lambda timeout=dev.PROBE_TIMEOUT_S: "Name or service not known")
    commands = fake_install(dev, monkeypatch, tmp_path / "again", torch_rc=1)
    assert not any("--index-url" in c for c in commands) and any(c[-1].endswith("[dev]") for c in commands)
