"""The package's layout: every import runs down the layers (docs/architecture.md), at most a dozen modules at the
package root, none over 600 lines.

Imports are read with `ast` from the source (every ``import`` statement, at the top of a module or inside a function),
so the check needs no import of the library and sees lazy imports too.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "audioloader"

#: The layers, lowest first; a module may import from its own layer and the layers below it. A module's layer is
#: the entry with the longest prefix of its dotted name. ``audioloader`` itself (``__init__``) is the front's
#: public face.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("audioloader.errors", "audioloader.samples", "audioloader.stats", "audioloader.checks")),
    ("shards", ("audioloader.shards",)),
    ("dsp", ("audioloader.dsp",)),  # above shards: augmentations read noise and impulse-response shards
    ("workers", ("audioloader.workers",)),
    ("nodes", ("audioloader.nodes",)),
    ("front", ("audioloader",)),  # every other module at the package root, and the package itself
    ("tools", ("audioloader.tools", "audioloader.__main__")),
    ("integrations", ("audioloader.integrations",)),  # each imports its framework; nothing imports them
]

#: Back edges that are there on purpose: ``(importer, imported)``, with the reason. None now: keep it so.
ALLOWED: set[tuple[str, str]] = set()

MAX_ROOT_MODULES = 12
MAX_LINES = 600


def module_names(package: Path) -> dict[str, Path]:
    """``{dotted name: file}`` of every module under ``package`` (a package is named by its ``__init__``)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that module ``name`` (at ``path``) imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            base_name = ".".join([*base, *([node.module] if node.module else [])])
            # ``from . import checks`` imports the module audioloader.checks; ``from .x import y`` imports x.
            targets = [f"{base_name}.{alias.name}" if f"{base_name}.{alias.name}" in known else base_name
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import audioloader.shards.dataset`` names a module; a.b.c -> a.b
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    """The position in `LAYERS` of the module's layer (longest matching prefix)."""
    best, best_length = None, -1
    for position, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = position, len(prefix)
    if best is None:
        raise AssertionError(f"module {name} is in no layer: add it to LAYERS in tests/test_layering.py")
    return best


def back_edges(package: Path) -> list[str]:
    """Every import of a module from a higher layer than the importer's, as readable lines."""
    modules = module_names(package)
    known = set(modules)
    out = []
    for name, path in modules.items():
        for target in sorted(imports_of(name, path, known)):
            if target != name and layer_of(target) > layer_of(name) and (name, target) not in ALLOWED:
                out.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    return out


def test_every_import_runs_down_the_layers():
    assert back_edges(PACKAGE) == []


def test_a_back_edge_is_caught(tmp_path):
    """The check itself: a node importing the front fails it, a front module importing a node does not."""
    package = tmp_path / "audioloader"
    (package / "nodes").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nodes" / "__init__.py").write_text("")
    (package / "mix.py").write_text("from .nodes.weighted_mix import stop_criterion\n")
    (package / "nodes" / "weighted_mix.py").write_text("def f():\n    from ..mix import Mix\n")
    assert back_edges(package) == ["audioloader.nodes.weighted_mix (nodes) imports audioloader.mix (front)"]
    (package / "nodes" / "weighted_mix.py").write_text("from . import batcher\n")
    (package / "nodes" / "batcher.py").write_text("import audioloader.errors\n")
    (package / "errors.py").write_text("")
    assert back_edges(package) == []


def test_the_fork_server_preloads_modules_that_exist():
    """`audioloader.workers.pool` names what the fork server imports (it skips a name it cannot import, silently:
    a module renamed would only make every worker start slower)."""
    from audioloader.workers.pool import _PRELOAD

    modules = module_names(PACKAGE)

    def exists(name: str) -> bool:
        return name in modules if name.startswith("audioloader.") else importlib.util.find_spec(name) is not None

    assert "audioloader.nodes.decode_spectrogram" in _PRELOAD  # the decode job: what every worker runs
    assert [name for name in _PRELOAD if not exists(name)] == []


def test_at_most_a_dozen_modules_at_the_package_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it by responsibility"
