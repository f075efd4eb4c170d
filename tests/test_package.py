"""The package itself: imports and runs without torchaudio (the reference, dev-only) and pyiceberg (optional);
its public names load lazily and all resolve; the wheel holds every module and the distribution's metadata."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import make_shards

ROOT = Path(__file__).resolve().parents[1]


def test_library_works_without_torchaudio_and_pyiceberg(tmp_path):
    make_shards(tmp_path, [6], "ipc_file", batch_rows=3, seconds=0.3)
    script = textwrap.dedent(f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torchaudio", "pyiceberg"):
                    raise ImportError(name + " is blocked in this test")

        sys.meta_path.insert(0, Block())
        import audioloader as al
        from audioloader import nodes  # noqa: F401
        features = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)
        with al.AudioLoader({str(tmp_path)!r}, batch_size=3, train=False, features=features) as loader:
            batches = list(loader)
        assert sum(len(b["index"]) for b in batches) == 6
        assert "torchaudio" not in sys.modules and "pyiceberg" not in sys.modules
        try:
            al.ShardDataset(al.IcebergTable("audio.clips"))
            raise SystemExit("an IcebergTable without pyiceberg raised nothing")
        except ImportError as error:
            assert "pip install 'pyiceberg[sql-sqlite]'" in str(error), error
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_public_names_are_importable():
    import audioloader as al
    from audioloader.nodes import ArrowShardReader, Batcher, DecodeSpectrogram, ShuffleBuffer

    for name in ("AudioLoader", "MelSpectrogramConfig", "CheckpointMismatchError", "DecodeError", "SchemaError",
                 "ShardWriter", "Loader"):
        assert hasattr(al, name), name
    assert all(callable(node) for node in (ArrowShardReader, Batcher, DecodeSpectrogram, ShuffleBuffer))


# -- the lazy public names -------------------------------------------------------------------------------------


def test_every_public_name_resolves_to_its_module():
    import importlib

    import audioloader as al

    table = al._LAZY_NAMES
    assert set(al.__all__) == {*table, "__version__"}
    for name, module in table.items():
        assert getattr(al, name) is getattr(importlib.import_module(module, "audioloader"), name), name
    assert set(al.__all__) <= set(dir(al))
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        al.NoSuchName  # noqa: B018


@pytest.mark.slow  # 15 s: a fresh interpreter a module; test_public_names_are_importable by default
def test_each_public_module_imports_first():
    # Lazy names change the order modules are imported in: each must import as the first one (an import cycle
    # the eager __init__ hid, mix.py <-> nodes/weighted_mix.py, broke `al.Mix` as a script's first use).
    import audioloader as al

    first = {}
    for name, module in al._LAZY_NAMES.items():
        first.setdefault(module, name)

    def import_first(module: str, name: str) -> subprocess.CompletedProcess:
        script = (f"import importlib, audioloader as al\n"
                  f"assert al.{name} is importlib.import_module('audioloader{module}').{name}")
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)

    # One fresh interpreter a module (about 1 s each, most of it importing torch), as many at once as there are cores.
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = dict(zip(first.items(), pool.map(lambda item: import_first(*item), first.items()), strict=True))
    for (_, name), result in results.items():
        assert result.returncode == 0, f"audioloader.{name} first: {result.stderr[-2000:]}"


def test_star_import_gives_exactly_the_public_names():
    script = ("from audioloader import *\n"
              "import audioloader, json\n"
              "names = sorted(n for n in dir() if n not in ('audioloader', 'json') and not n.startswith('__'))\n"
              "print(json.dumps([names, sorted(n for n in audioloader.__all__ if not n.startswith('__'))]))\n"
              # Sub-packages are attributes after a bare `import audioloader`, as when it imported them eagerly.
              "import audioloader as al\n"
              "assert al.nodes.Batcher.__name__ == 'Batcher' and al.shards.ShardDataset is al.ShardDataset\n"
              "assert {'nodes', 'shards', 'tools', 'AudioLoader'} <= set(dir(al))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    got, expected = json.loads(result.stdout)
    assert got == expected and "AudioLoader" in got


@pytest.mark.parametrize("package", ["audioloader", "audioloader.shards"])
def test_type_checking_imports_match_the_lazy_table(package):
    # Editors and type checkers read the TYPE_CHECKING block; the interpreter reads _LAZY_NAMES: same names, same
    # modules, so that moving a module is caught here when only one of them was updated.
    import importlib

    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imported = {alias.name: "." * node.level + node.module
                for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imported == module._LAZY_NAMES
    assert set(module.__all__) - {"__version__"} == set(imported)


# -- the distribution ------------------------------------------------------------------------------------------


def _pyproject_field(name: str) -> str:
    # tomllib is Python 3.11+; the fields read here are simple one-line strings.
    match = re.search(rf'^{name} = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, name
    return match.group(1)


def _build_wheel(source: Path, out: Path) -> Path:
    """``pip wheel --no-deps`` of ``source``; skips the test when no setuptools >= 77 can be had (offline)."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
               str(out), str(source)]
    try:
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 77:
            command.insert(4, "--no-build-isolation")  # build with this environment's setuptools: offline
    except ImportError:
        pass
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        if "No matching distribution found for setuptools" in result.stderr:
            pytest.skip("no setuptools>=77 to build with (offline, and this environment's is older)")
        raise AssertionError(result.stderr[-3000:])
    (wheel,) = out.glob("*.whl")
    return wheel


def test_wheel_holds_the_packages_and_the_metadata(tmp_path):
    # Built from a copy, so that the checkout gets no build/ or *.egg-info of this test.
    source = tmp_path / "src"
    shutil.copytree(ROOT / "audioloader", source / "audioloader", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    wheel = _build_wheel(source, tmp_path / "dist")
    name, version = _pyproject_field("name"), _pyproject_field("version")
    assert wheel.name == f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        info = f"{name.replace('-', '_')}-{version}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    # Every package of the source tree (each folder with an __init__.py) and every module is in the wheel.
    modules = {p.relative_to(source).as_posix() for p in (source / "audioloader").rglob("*.py")}
    assert modules <= files, sorted(modules - files)[:5]
    assert {"audioloader/tools/bench/__init__.py", "audioloader/nodes/__init__.py"} <= files
    assert not [f for f in files if f.startswith(("tests/", "benchmarks/", "examples/"))]
    headers = [line for line in metadata.splitlines() if ": " in line]
    assert f"Name: {name}" in headers and f"Version: {version}" in headers
    assert {"Provides-Extra: bench", "Provides-Extra: docs", "Provides-Extra: dev"} <= set(headers)
    assert "License-Expression: BSD-3-Clause" in headers and f"{info}/licenses/LICENSE" in files
    assert any(line.startswith("Requires-Dist: torchaudio") and 'extra == "bench"' in line for line in headers)
    assert "audioloader = audioloader.tools.cli:main" in entry_points
