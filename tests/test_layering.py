"""The package's layout: every import runs down the layers (docs/architecture.md), at most a dozen modules at the
package root, none over 600 lines.

Imports are read with `ast` from the source (every ``import`` statement, at the top of a module or inside a function),
so the check needs no import of the library and sees lazy imports too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "audioloader"

#: The layers, lowest first; a module may import from its own layer and the layers below it. A module's layer is
#: the entry with the longest prefix of its dotted name. ``audioloader`` itself (``__init__``) is the front's
#: public face.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("audioloader.errors", "audioloader.samples", "audioloader.stats", "audioloader.checks")),
    ("dsp", ("audioloader.dsp",)),  # pure functions on arrays: augmentations are handed their noise rows
    ("shards", ("audioloader.shards",)),
    ("workers", ("audioloader.workers",)),
    ("nodes", ("audioloader.nodes",)),
    ("front", ("audioloader",)),  # every other module at the package root, and the package itself
    ("integrations", ("audioloader.integrations",)),  # each imports its framework; nothing imports them
    ("tools", ("audioloader.tools", "audioloader.__main__")),
]

#: Back edges that are there on purpose: ``(importer, imported)``, with the reason.
ALLOWED = {
    # What the fork server imports once so that worker processes start in milliseconds: the whole library.
    # Nothing imports it; the fork server is given its name (`audioloader.workers.pool`).
    ("audioloader.workers.preload", "audioloader"),
    # The Ray integration runs `audioloader pack`'s parts as Ray tasks: it is glue around that tool, which only
    # the integration (and `audioloader pack --ray`) imports.
    ("audioloader.integrations.ray", "audioloader.tools.manifests"),
    ("audioloader.integrations.ray", "audioloader.tools.pack"),
    ("audioloader.integrations.ray", "audioloader.tools.pack_journal"),
    ("audioloader.integrations.ray", "audioloader.tools.pack_store"),
}

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


def test_nothing_imports_the_fork_servers_preload():
    modules = module_names(PACKAGE)
    importers = [name for name, path in modules.items()
                 if "audioloader.workers.preload" in imports_of(name, path, set(modules))]
    assert importers == []


def test_at_most_a_dozen_modules_at_the_package_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it by responsibility"


# ------------------------------------------------------------------------------ private attributes

#: The one module that may reach into torchdata's private attributes (docs/architecture.md).
COMPAT_MODULE = "audioloader/nodes/_torchdata_compat.py"

#: namedtuple's own methods: the underscore only keeps them clear of field names; they are its public API.
NAMEDTUPLE_API = {"_asdict", "_field_defaults", "_fields", "_make", "_replace"}

#: Reaches into another object's private attribute that stay on purpose: ``(file, "object._name")``: the reason.
#: Each reads or patches a library that has no public way to do it, in a small function that says so.
ALLOWED_REACHES = {
    ("audioloader/loader.py", "sys._getframe"):
        "the standard library's documented way to look at the callers (is Lightning taking a checkpoint?)",
    ("audioloader/loader.py", "fit_loop._data_fetcher"):
        "Lightning has no public way to see the batches its fetcher took ahead of training",
    ("audioloader/loader.py", "fetcher._combined_loader"): "as fit_loop._data_fetcher: the fetcher's mode",
    ("audioloader/loader.py", "combined._mode"): "as fit_loop._data_fetcher: the fetcher's mode",
    ("audioloader/integrations/lightning.py", "trainer.fit_loop._data_fetcher"):
        "Lightning has no public way to tell a training_step that takes its own batches",
    ("audioloader/workers/process_worker.py", "os._exit"):
        "the standard library's documented exit of a process without cleanup (a worker whose consumer died)",
    ("audioloader/workers/threads.py", "sys._current_frames"):
        "the standard library's documented way to show where a thread that does not stop is waiting",
    ("audioloader/workers/pool.py", "executor._threads"):
        "ThreadPoolExecutor has no public way to wait for its threads with a report of one that hangs",
    ("audioloader/workers/forks.py", "multiprocessing.process._children"):
        "multiprocessing has no public way to drop the parent's workers from a forked child's exit hooks",
    ("audioloader/workers/cuda.py", "torch.cuda._lazy_init"):
        "torch has no public hook to refuse CUDA in a worker process; it initialises CUDA there",
    ("audioloader/workers/cuda.py", "module._lazy_init"): "as torch.cuda._lazy_init, in the modules that import it",
}


def _bound_package_modules(name: str, path: Path, tree: ast.AST, known: set[str]) -> set[str]:
    """The names that module ``name`` binds to modules of the package (``from . import checks``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            base_name = ".".join([*base, *([node.module] if node.module else [])])
            bound |= {alias.asname or alias.name for alias in node.names if f"{base_name}.{alias.name}" in known}
        elif isinstance(node, ast.Import):
            bound |= {alias.asname or alias.name.partition(".")[0] for alias in node.names
                      if alias.name.partition(".")[0] == "audioloader"}
    return bound


def _reached(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``(object, attribute)`` of ``x._name`` or ``getattr/setattr/hasattr/delattr(x, "_name", ...)``."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value
    return None


def private_reaches(package: Path) -> list[str]:
    """Every reach into another object's private attribute under ``package``, as ``"file:line: object._name"``:
    an attribute with a leading underscore (not a dunder, not namedtuple's API) of anything but ``self``, ``cls``,
    ``super()`` or a module of the package; the compat module and `ALLOWED_REACHES` left out."""
    modules = module_names(package)
    known = set(modules)
    found = []
    for name, path in modules.items():
        file = str(path.relative_to(package.parent))
        if file == COMPAT_MODULE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        own = {"self", "cls"} | _bound_package_modules(name, path, tree, known)
        for node in ast.walk(tree):
            reached = _reached(node)
            if reached is None:
                continue
            value, attr = reached
            if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")) or attr in NAMEDTUPLE_API:
                continue
            if (isinstance(value, ast.Name) and value.id in own) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"):
                continue
            reach = f"{ast.unparse(value)}.{attr}"
            if (file, reach) not in ALLOWED_REACHES:
                found.append(f"{file}:{node.lineno}: {reach}")
    return sorted(found)


def test_no_reach_into_another_objects_private_attributes():
    """A module uses another object's public names; only the compat module reads torchdata's private fields."""
    assert private_reaches(PACKAGE) == []


def test_every_allowed_private_reach_is_still_there():
    allowed = dict(ALLOWED_REACHES)
    ALLOWED_REACHES.clear()
    try:
        left = private_reaches(PACKAGE)
    finally:
        ALLOWED_REACHES.update(allowed)
    stale = [entry for entry in allowed if not any(line.startswith(entry[0] + ":") and line.endswith(
        ": " + entry[1]) for line in left)]
    assert stale == []


def test_a_private_reach_is_caught(tmp_path):
    """The check itself: another object's private attribute is caught, read or by ``getattr``; one's own, a
    module of the package's, a dunder and namedtuple's ``_replace`` are not."""
    package = tmp_path / "audioloader"
    (package / "nodes").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "checks.py").write_text("")
    (package / "nodes" / "__init__.py").write_text("")
    (package / "nodes" / "reader.py").write_text(
        "from .. import checks\n"
        "class Reader:\n"
        "    def f(self, other, segment):\n"
        "        self._row = checks._x + super()._y + len(other.__dict__)\n"
        "        return segment._replace(start=0), other._row, getattr(other, '_lanes', None)\n")
    assert private_reaches(package) == ["audioloader/nodes/reader.py:5: other._lanes",
                                        "audioloader/nodes/reader.py:5: other._row"]
