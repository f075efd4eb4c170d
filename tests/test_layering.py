"""The package's layout: every import runs down the layers (docs/architecture.md), between packages and between
shards/'s sub-packages, no private name imported from another package, at most a dozen modules at the package root,
none over 600 lines.

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
    ("dsp", ("audioloader.dsp",)),  # pure functions on arrays: augmentations are handed their noise rows
    # shards/, in the order of its sub-packages: bytes, what a source names, what is in a file, what a start reads
    # instead of every file, the dataset; its own face (``__init__``: the names imported on first use) on top.
    ("shards.storage", ("audioloader.shards.storage",)),
    ("shards.sources", ("audioloader.shards.sources",)),
    ("shards.formats", ("audioloader.shards.formats",)),
    ("shards.catalog", ("audioloader.shards.catalog",)),
    ("shards.dataset", ("audioloader.shards.dataset",)),
    ("shards", ("audioloader.shards",)),
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


def shards_skeleton(tmp_path):
    """An ``audioloader`` package under ``tmp_path`` with empty ``shards/formats`` and ``shards/catalog``."""
    package = tmp_path / "audioloader"
    for folder in ("shards/formats", "shards/catalog"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "shards" / "__init__.py").write_text("")
    return package


def test_a_back_edge_inside_shards_is_caught(tmp_path):
    """The check itself, between shards/'s sub-packages: a format importing the catalog fails it, the catalog
    importing a format does not."""
    package = shards_skeleton(tmp_path)
    (package / "shards" / "catalog" / "manifest.py").write_text("from ..formats.scan import FileMeta\n")
    (package / "shards" / "formats" / "scan.py").write_text("FileMeta = object\n")
    assert back_edges(package) == []
    (package / "shards" / "formats" / "scan.py").write_text("from ..catalog import manifest\n")
    assert back_edges(package) == [
        "audioloader.shards.formats.scan (shards.formats) imports audioloader.shards.catalog.manifest (shards.catalog)"]


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


# ------------------------------------------------------------------------------ private names across packages

def private_imports(package: Path, within: str = "audioloader.shards") -> list[str]:
    """Every ``from m import _name`` (or of a name from a ``_module``) by a module under ``within`` from a module of
    another package (a sub-package of shards/ is a package of its own), as ``"importer: module._name"``: a name
    shared between packages is public, or the code lives where it is used."""
    modules = module_names(package)
    known = set(modules)
    found = []
    for name, path in modules.items():
        if not (name == within or name.startswith(within + ".")):
            continue
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            parts = own.split(".")
            base = ".".join([*(parts[:len(parts) - node.level + 1] if node.level else []),
                             *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                if target not in known:
                    continue  # another distribution (``from pyarrow import _x``): not ours to judge
                target_package = target if modules[target].name == "__init__.py" else target.rpartition(".")[0]
                if target_package == own:
                    continue
                private = [p for p in [*target.split(".")[len(target_package.split(".")):], alias.name]
                           if p.startswith("_") and not p.startswith("__")]
                if private:
                    found.append(f"{name}: {target}.{alias.name}" if target == base else f"{name}: {target}")
    return sorted(found)


def test_no_private_name_is_imported_from_another_package_of_shards():
    assert private_imports(PACKAGE) == []


def test_a_private_import_across_sub_packages_is_caught(tmp_path):
    """The check itself: a private name from another sub-package is caught, one from the same sub-package and a
    public one are not."""
    package = shards_skeleton(tmp_path)
    (package / "shards" / "formats" / "scan.py").write_text("_FileMeta = FileMeta = object\n")
    (package / "shards" / "formats" / "readers.py").write_text("from .scan import _FileMeta\n")
    (package / "shards" / "catalog" / "manifest.py").write_text("from ..formats.scan import FileMeta, _FileMeta\n")
    assert private_imports(package) == [
        "audioloader.shards.catalog.manifest: audioloader.shards.formats.scan._FileMeta"]


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
