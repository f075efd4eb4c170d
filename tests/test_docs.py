"""The documentation a newcomer reads is executed and its links resolve.

Every ```python block of README.md and docs/*.md runs: a page's blocks in order, in
one namespace, in a temporary folder holding small synthetic data at the paths the
docs use (``shards/``, ``eval_shards/``, ``speech_shards/librispeech``, ``recordings/``).
A block that cannot run on a CPU-only machine without credentials is marked just
above its fence with ``<!-- not-run: the reason -->``; those are counted and listed
(`test_not_run_blocks_are_few_and_named`). Signatures that are not code are ```py blocks.
A deprecated keyword in a snippet (a ``FutureWarning`` from audioloader) fails the page,
so the docs keep to the current API.

Measured numbers in the prose cannot drift from their data: each is a span ``<!--n KEY-->text<!--/n-->`` that
``python -m benchmarks.figures`` writes from docs/figures/data/*.json or docs/numbers/*.json and that the checks
below compare (how to quote one: docs/benchmarks.md, "Numbers in the prose"; benchmarks/doc_numbers.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The most blocks the docs may leave unrun (each needs a reason in its marker).
MAX_NOT_RUN = 6

#: Per page: a replacement that shrinks a training run to a smoke test without changing what it shows. Each
#: must match its page (`test_shrinks_still_match`), so a snippet that changes does not silently run at full size.
SHRINK = {
    "README.md": [("num_steps = 100_000", "num_steps = 3"), ("step % 1000 == 0", "step % 2 == 0")],
    "getting_started.md": [("num_steps = 100_000", "num_steps = 3"), ("step % 1000 == 0", "step % 2 == 0")],
}

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.*?)\s*-->")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: str | None  # the marker's reason


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the ``not-run`` marker on the line above each, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, start = opening["fence"], i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        above = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = _NOT_RUN.search(above)
        blocks.append(Block(page.name, start + 1, opening["info"].strip(), "\n".join(body) + "\n",
                            marker["reason"] if marker else None))
        i += 1
    return blocks


def python_blocks(page: Path) -> list[Block]:
    return [b for b in code_blocks(page) if b.language == "python"]


# -- the data the snippets read --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_data(tmp_path_factory) -> Path:
    """The folders the docs name, written once: classification shards (2 classes, 6 and 4 clips), a packed
    LibriSpeech tree (with transcripts and speakers) and rows holding windows of recordings."""
    from audioloader.tools.pack import pack
    from audioloader.tools.synthetic import make_classification_dataset
    from tests.test_ingest import make_librispeech
    from tests.test_segments import segment_rows, write_segments

    root = tmp_path_factory.mktemp("docs-data")
    make_classification_dataset(root / "shards", 3, num_classes=2, num_shards=2, max_seconds=6.0)
    make_classification_dataset(root / "eval_shards", 2, num_classes=2, num_shards=1, first_clip=50)
    pack(make_librispeech(tmp_path_factory.mktemp("download") / "LibriSpeech") / "train-clean-100",
         root / "speech_shards" / "librispeech", progress=False)
    write_segments(root / "recordings", segment_rows()[:6])
    return root


def run_page(page: Path) -> int:
    """Run the page's python blocks in the current folder; returns how many ran. Fails naming the block and its line."""
    namespace: dict = {"__name__": "__docs__"}
    shrinks = SHRINK.get(page.name, [])
    ran = 0
    try:
        with warnings.catch_warnings():
            # A deprecated keyword in a snippet warns from the snippet's own line (module "__docs__").
            warnings.filterwarnings("error", category=FutureWarning, module="__docs__")
            warnings.filterwarnings("error", category=FutureWarning, module=r"audioloader(\.|$)")
            for block in python_blocks(page):
                if block.not_run is not None:
                    continue
                code = block.code
                for old, new in shrinks:
                    code = code.replace(old, new)
                name = f"{page.name}:{block.line}"
                try:
                    exec(compile(code, name, "exec"), namespace)
                except BaseException as error:
                    raise AssertionError(f"{page.name}, the python block at line {block.line} failed "
                                         f"({type(error).__name__}: {error}):\n{code}") from error
                ran += 1
    finally:
        for value in namespace.values():  # loaders the snippets left open
            if not isinstance(value, type) and callable(getattr(value, "shutdown", None)):
                value.shutdown()
    return ran


#: The buckets and prefixes the S3 snippets of docs/storage.md read, each holding a copy of ``shards/``.
S3_PREFIXES = ("my-bucket/speech/train", "bucket/data", "bucket/speech")


@contextlib.contextmanager
def s3_for(page: Path, data: Path, monkeypatch):
    """For a page whose snippets read ``s3://`` URLs: a local S3 server (moto) holding the data they name, found
    through the standard environment (``AWS_ENDPOINT_URL`` and static keys), so the snippets run as written."""
    if "s3://" not in "".join(b.code for b in python_blocks(page) if b.not_run is None):
        yield
        return
    from tests.s3_server import S3_ENVIRONMENT, S3Server

    for name, value in S3_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    server = S3Server()
    try:
        for prefix in S3_PREFIXES:
            server.upload(data / "shards", prefix)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{server.direct_endpoint}")
        yield
    finally:
        server.close()


#: Pages whose snippets take over 30 s (speech.md tunes batch sizes by an out-of-memory search): run with -m slow.
SLOW_PAGES = {"speech.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p
                                  for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_documentation_snippets_run(page, docs_data, tmp_path, monkeypatch):
    """Every ```python block of the page runs as written, in order, on the small data (see the module doc)."""
    for folder in docs_data.iterdir():
        shutil.copytree(folder, tmp_path / folder.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / ".audioloader-cache"))
    with s3_for(page, docs_data, monkeypatch):
        ran = run_page(page)
    assert ran or all(b.not_run for b in python_blocks(page))


def test_a_removed_keyword_fails_its_page(docs_data, tmp_path, monkeypatch):
    """The docs stay on the current API: a snippet passing one of 0.2's flat keywords fails with its TypeError."""
    page = tmp_path / "page.md"
    page.write_text('```python\nimport audioloader as al\n\n'
                    'al.AudioLoader("shards/", train=False, num_workers=0).shutdown()\n```\n', encoding="utf-8")
    shutil.copytree(docs_data / "shards", tmp_path / "shards")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match=r"page.md, the python block at line 1 failed \(TypeError: "
                                             r"AudioLoader\(num_workers=\.\.\.\) was removed in 0\.4"):
        run_page(page)


def test_concepts_draws_every_node_of_the_default_chain():
    """docs/concepts.md's "Data flow" names every node class audioloader/chain.py builds chains from."""
    import ast

    tree = ast.parse((ROOT / "audioloader" / "chain.py").read_text(encoding="utf-8"))
    nodes = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
             and (".nodes" in f".{n.module}" or n.module == "torchdata.nodes")
             for alias in n.names if alias.name[0].isupper() and alias.name != "BaseNode"}
    assert {"ShuffleBuffer", "DurationBucketer", "Batcher", "CatchFailures", "Prefetcher", "PinMemory"} <= nodes
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    start = text.index("## Data flow")
    flow = text[start:text.index("\n## ", start + 1)]
    assert sorted(name for name in nodes if name not in flow) == [], "docs/concepts.md's Data flow misses a node"


_CODE_SPAN = re.compile(r"`([^`]+)`")


def layer_rows(page: Path) -> list[tuple[str, list[str], list[str]]]:
    """The rows of the table under a page's "## The layers": ``(layer, code spans of its package cell, code spans of
    its what-it-holds cell)``."""
    text = page.read_text(encoding="utf-8")
    section = text[text.index("## The layers"):]
    end = section.find("\n## ")
    section = section[:end] if end >= 0 else section
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] != "layer" and set(cells[0]) - set("-:"):
            rows.append((cells[0], _CODE_SPAN.findall(cells[1]), _CODE_SPAN.findall(cells[2])))
    return rows


def module_table_problems(page: Path, package: Path) -> list[str]:
    """What the layer table of ``page`` gets wrong about ``package``'s modules: each module it names must exist, and
    each module must be named. A row's package cell names folders (``shards/``: its ``__init__.py``) or modules at the
    package root; its what-it-holds cell names modules (``x.py``) and sub-packages (``bench/``) inside the row's one
    folder (or at the root, for a row without a folder). Other code spans (``chain.build_chain``) are not paths."""
    problems, named, folder_rows = [], set(), {}
    for layer, packages, holds in layer_rows(page):
        folders = [name for name in packages if name.endswith("/")]
        base = folders[0] if len(folders) == 1 else ""
        folder_rows.update({folder: layer for folder in folders})
        for name, where in [*((name, "") for name in packages), *((name, base) for name in holds)]:
            if not name.endswith((".py", "/")):
                continue
            path = where + name + ("__init__.py" if name.endswith("/") else "")
            named.add(path)
            if not (package / path).is_file():
                problems.append(f"{page.name}: the {layer!r} row of the layer table names `{name}`, which is not a "
                                f"module of {package.name}/ ({package.name}/{path} does not exist): correct or drop it")
    for path in sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")):
        if path in named:
            continue
        top = path.split("/")[0] + "/" if "/" in path else None
        where = (f"the {folder_rows[top]!r} row (package `{top}`)" if top in folder_rows else
                 f"a new row for `{top}`" if top else "the row of its layer (tests/test_layering.py's LAYERS)")
        problems.append(f"{package.name}/{path} is in no row of {page.name}'s layer table: add it, with a few words on "
                        f"what it holds, to {where}")
    return problems


def test_the_architecture_tables_name_every_module_and_no_other():
    assert module_table_problems(ROOT / "docs" / "architecture.md", ROOT / "audioloader") == []


def test_a_module_left_out_or_gone_is_caught(tmp_path):
    """The check itself, on a small package: a module missing from the table and a name without a module."""
    package = tmp_path / "lib"
    for path in ("__init__.py", "front.py", "shards/__init__.py", "shards/reads.py", "tools/bench/__init__.py",
                 "tools/__init__.py", "tools/cli.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text("")
    page = tmp_path / "architecture.md"
    page.write_text("# A\n\n## The layers\n\n| layer | package | what it holds |\n|---|---|---|\n"
                    "| files | `shards/` | reads (`reads.py`) and `ShardDataset` (`dataset.py`) |\n"
                    "| front | `__init__.py`, `front.py` | `front.build` |\n"
                    "| tools | `tools/` | the command (`cli.py`) and `bench/` |\n\n## The chain\n\n`gone.py`\n")
    assert module_table_problems(page, package) == [
        "architecture.md: the 'files' row of the layer table names `dataset.py`, which is not a module of lib/ "
        "(lib/shards/dataset.py does not exist): correct or drop it"]
    (package / "shards" / "dataset.py").write_text("")
    (package / "shards" / "readahead.py").write_text("")
    (package / "nodes").mkdir()
    (package / "nodes" / "batcher.py").write_text("")
    (package / "checks.py").write_text("")
    assert module_table_problems(page, package) == [
        "lib/checks.py is in no row of architecture.md's layer table: add it, with a few words on what it holds, to "
        "the row of its layer (tests/test_layering.py's LAYERS)",
        "lib/nodes/batcher.py is in no row of architecture.md's layer table: add it, with a few words on what it "
        "holds, to a new row for `nodes/`",
        "lib/shards/readahead.py is in no row of architecture.md's layer table: add it, with a few words on what it "
        "holds, to the 'files' row (package `shards/`)"]


def _names_at_depth_one(text: str, start: int) -> set[str]:
    """The quoted names directly inside the ``{...}`` that opens at ``text[start]`` (not those nested deeper)."""
    depth, names = 0, set()
    for match in re.finditer(r'[{}\[\]]|"(\w+)"', text[start:]):
        token = match.group(0)
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
            if depth == 0:
                return names
        elif depth == 1:
            names.add(match.group(1))
    raise AssertionError(f"unbalanced braces after {text[start:start + 80]!r}")


def documented_stats_keys() -> dict[str, set[str]]:
    """The keys docs/api.md lists for ``AudioLoader.stats()``, per part: top level, counters, seconds, gauges,
    memory, and memory's shuffle_buffer and bucketer."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    start = text.index("- `stats() -> dict`:")
    entry = text[start:text.index("\n- `", start + 1)]
    memory = entry.index("{", entry.index("`memory` what is held"))
    keys = {"top": _names_at_depth_one(entry, entry.index("{")), "memory": _names_at_depth_one(entry, memory)}
    for part in ("counters", "seconds", "gauges"):
        keys[part] = _names_at_depth_one(entry, entry.index(f'"{part}": {{') + len(part) + 4)
    for part in ("shuffle_buffer", "bucketer"):
        keys[part] = _names_at_depth_one(entry, entry.index(f'"{part}": {{', memory) + len(part) + 4)
    return keys


@pytest.mark.parametrize("train, bucketing", [(True, False), (False, False), (True, True), (False, True)])
def test_a_fresh_loaders_stats_hold_every_documented_key(docs_data, train, bucketing):
    """stats() before the first batch holds every key docs/api.md lists (counters at 0): a script reading
    `stats()["counters"]["bad_rows"]` must not get a KeyError when no row was bad (issue 29)."""
    import audioloader as al

    documented = documented_stats_keys()
    assert {"rows_read", "bad_rows", "skipped_rows"} <= documented["counters"] and "mel" in documented["seconds"]
    options = dict(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=20.0)) if bucketing else {}
    with al.AudioLoader(docs_data / "shards", train=train, workers=al.Workers(num_workers=0), **options) as loader:
        stats = loader.stats()
    assert documented["top"] <= set(stats), documented["top"] - set(stats)
    for part in ("counters", "seconds", "gauges"):
        assert documented[part] <= set(stats[part]), (part, documented[part] - set(stats[part]))
    assert all(stats["counters"][name] == 0 for name in documented["counters"])
    assert all(stats["seconds"][name] == 0.0 for name in documented["seconds"])
    memory = stats["memory"]
    holders = {"shuffle_buffer"} if not bucketing else {"bucketer"} | ({"shuffle_buffer"} if train else set())
    assert documented["memory"] - {"shuffle_buffer", "bucketer"} | holders <= set(memory)
    for holder in holders:
        assert documented[holder] <= set(memory[holder]), (holder, documented[holder] - set(memory[holder]))


def test_not_run_blocks_are_few_and_named(capsys):
    unrun = [b for page in PAGES for b in python_blocks(page) if b.not_run is not None]
    listing = "\n".join(f"  {b.page}:{b.line}: {b.not_run}" for b in unrun)
    with capsys.disabled():
        print(f"\n{len(unrun)} documentation block(s) not run:\n{listing}")
    assert all(b.not_run for b in unrun), f"a not-run marker without a reason:\n{listing}"
    assert len(unrun) <= MAX_NOT_RUN, f"too many blocks are not run ({len(unrun)}):\n{listing}"


def test_shrinks_still_match():
    for name, shrinks in SHRINK.items():
        page = next(p for p in PAGES if p.name == name)
        code = "".join(b.code for b in python_blocks(page))
        for old, _ in shrinks:
            assert old in code, f"{name}: the test shrinks {old!r}, which its snippets no longer contain"


def test_code_blocks_and_markers_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- not-run: needs CUDA -->\n\n```python\nx = 1\n```\n```py\nsig(a, *, b)\n```\n")
    assert [(b.language, b.code, b.not_run) for b in code_blocks(page)] == [
        ("python", "x = 1\n", "needs CUDA"), ("py", "sig(a, *, b)\n", None)]


# -- links -------------------------------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")


def prose(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with inline code spans blanked (numbered from 1)."""
    out, fence = [], None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening["fence"]
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        out.append((number, re.sub(r"`[^`]*`", lambda m: m[0] if "](" not in m[0] else "``", line)))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on the page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(page):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match["text"])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, line in prose(page):
        for match in _LINK.finditer(line):
            target = match["target"]
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no heading with that anchor in {file.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_anchors_resolve(page):
    assert broken_links(page) == []


#: A page of the docs cited in the code: ``docs/concepts.md, "Memory"``, ``docs/storage.md ("Read-ahead", ...``,
#: ``docs/benchmarks.md#some-anchor``.
_CITED = re.compile(r"\b(?P<page>docs/[a-z_]+\.md)"
                    r"(?:#(?P<anchor>[\w-]+)|(?:,\s*|\s+\(\s*)[\"“](?P<title>[^\"”\n]+)[\"”])?")


def cited_sections(text: str, where: str) -> list[str]:
    """What ``text`` cites of docs/ and is not there: a page, an anchor, or a section title that no heading of the
    page starts with or holds (``"Memory"`` for "## Memory: a byte budget")."""
    missing = []
    for match in _CITED.finditer(text):
        page = ROOT / match["page"]
        line = f"{where}:{text.count(chr(10), 0, match.start()) + 1}: {match[0]}"
        if not page.exists():
            missing.append(f"{line} (no such page)")
        elif match["anchor"] and match["anchor"] not in anchors(page):
            missing.append(f"{line} (no heading with that anchor)")
        elif match["title"]:
            headings = [_HEADING.match(text_line)["text"].lower() for _, text_line in prose(page)
                        if _HEADING.match(text_line)]
            if not any(match["title"].lower() in heading for heading in headings):
                missing.append(f"{line} (no heading holds those words)")
    return missing


def test_what_the_code_cites_of_the_docs_exists():
    """The code's comments and docstrings send a reader to docs/ for the contract and the measurements behind a
    default (docs/design.md, "Order"); each page and section they name is there."""
    missing = []
    for folder in ("audioloader", "benchmarks", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__):
                missing += cited_sections(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert missing == []


#: A path in the repository named in prose or code: ``audioloader/dsp/hashing.py``, ``benchmarks/remote/``.
_REPO_PATH = re.compile(r"(?<![\w/.-])(?:audioloader|benchmarks|docs|examples|tests)/[\w/.-]*\w")


def named_paths_missing(text: str, where: str) -> list[str]:
    """The repository paths ``text`` names that are not there (a template such as ``docs/numbers/NAME.json`` or a
    glob is not a path)."""
    return [f"{where}:{text.count(chr(10), 0, match.start()) + 1}: {match[0]}" for match in _REPO_PATH.finditer(text)
            if not re.search(r"[*<{]|\b[A-Z]{2,}\b", match[0]) and not (ROOT / match[0]).exists()]


def test_every_repository_path_the_docs_and_code_name_exists():
    """A file the docs, the benchmarks' notes or the code's comments send a reader to is there: when a module moves,
    what names it moves with it (CHANGELOG.md, a history, keeps the old names; tests/ write made-up paths)."""
    files = [*PAGES, *sorted((ROOT / "benchmarks").rglob("*.md")),
             *(path for folder in ("audioloader", "benchmarks", "examples")
               for path in sorted((ROOT / folder).rglob("*.py")))]
    missing = [line for path in files
               for line in named_paths_missing(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert missing == [], "a path that is not in the repository (moved? say where it is now)"


def test_a_path_that_moved_is_found():
    text = "see benchmarks/bench_s3.py and docs/numbers/NAME.json,\nbenchmarks/remote/bench_s3.py and tests/helpers.py"
    assert named_paths_missing(text, "x.md") == ["x.md:1: benchmarks/bench_s3.py"]


def test_a_citation_of_a_gone_section_is_found():
    text = 'see docs/concepts.md, "Memory"; (docs/design.md, "Elsewhere"); docs/gone.md; docs/api.md#no-such-anchor'
    assert cited_sections(text, "x.py") == [
        'x.py:1: docs/design.md, "Elsewhere" (no heading holds those words)', "x.py:1: docs/gone.md (no such page)",
        "x.py:1: docs/api.md#no-such-anchor (no heading with that anchor)"]


def test_github_slugs():
    assert github_slug("DDP / torchrun") == "ddp--torchrun"
    assert github_slug("Augmentation cost (`benchmarks/pipeline/bench_augment.py`)") == (
        "augmentation-cost-benchmarkspipelinebench_augmentpy")
    assert github_slug("Why worker processes, and how is this different from DataLoader's?") == (
        "why-worker-processes-and-how-is-this-different-from-dataloaders")
    assert github_slug("Memory: a byte budget") == "memory-a-byte-budget"


# -- the benchmark charts ------------------------------------------------------------------------------------------

def run_figures(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.figures", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_charts_match_their_numbers():
    """Every docs/figures/*.png was drawn from its JSON as it is now (`figures.py --check`, no matplotlib needed)."""
    result = run_figures("--check")
    assert result.returncode == 0, result.stderr


def test_chart_check_fails_when_the_numbers_change(tmp_path):
    data, out = tmp_path / "data", tmp_path / "figures"
    shutil.copytree(ROOT / "docs" / "figures" / "data", data)
    out.mkdir()
    for png in (ROOT / "docs" / "figures").glob("*.png"):
        shutil.copy(png, out / png.name)
    assert run_figures("--check", "--data", data, "--out", out).returncode == 0
    numbers = json.loads((data / "peers.json").read_text())
    numbers["rows"][0]["samples_per_s"] += 1
    (data / "peers.json").write_text(json.dumps(numbers, indent=2))
    (out / "scaling.png").unlink()
    result = run_figures("--check", "--data", data, "--out", out)
    assert result.returncode == 1
    assert "peers.png: drawn from other numbers" in result.stderr and "scaling.png: missing" in result.stderr
    assert "run `python -m benchmarks.figures`" in result.stderr


def test_benchmarks_page_shows_every_chart():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for data in sorted((ROOT / "docs" / "figures" / "data").glob("*.json")):
        assert f"](figures/{data.stem}.png)" in text, f"docs/benchmarks.md does not show figures/{data.stem}.png"
        numbers = json.loads(data.read_text())
        assert {"title", "command", "date", "commit", "machine"} <= set(numbers), data.name


# -- numbers in the prose ----------------------------------------------------------------------------------------
#
# A measured number in the prose is a span `<!--n KEY-->text<!--/n-->` whose text benchmarks/figures.py writes from
# the JSON the charts are drawn from (docs/figures/data/) or from docs/numbers/ (no chart); see
# benchmarks/doc_numbers.py and docs/benchmarks.md, "Numbers in the prose". To quote a new measurement in a page:
# add its JSON, write the span, run `python -m benchmarks.figures`; the checks below then hold it to its data.

#: Spans that must be there (page -> keys): the numbers a newcomer reads first, which drifted before (issue 29).
REQUIRED_SPANS = {
    "README.md": {"demo.demo_seconds", "demo.demo_accuracy", "demo.quick_seconds", "demo.test_minutes",
                  'peers.times("audioloader-train-w2")'},
    "getting_started.md": {"demo.demo_seconds", "demo.quick_seconds", "demo.demo_accuracy"},
    "cli.md": {"demo.quick_seconds"},
    "benchmarks.md": {'range_of(remote_latency.train_vs_local("speech", 50))',
                      'range_of(remote_latency.train_vs_local("speech", 100))', "metadata_memory.target()"},
    # A target stated as met or not (and the figure "now") comes from the measurement, so it cannot go stale.
    "storage.md": {"metadata_memory.held_mb()", "metadata_memory.target_mb", "metadata_memory.target()"},
}


@pytest.fixture(scope="module")
def bench():
    """benchmarks/doc_numbers.py and benchmarks/figures.py."""
    from types import SimpleNamespace

    from benchmarks import doc_numbers, figures

    return SimpleNamespace(numbers=doc_numbers, figures=figures)


def test_numbers_in_the_prose_match_their_data(bench):
    assert bench.numbers.stale_numbers() == []


@pytest.mark.parametrize("name", sorted(REQUIRED_SPANS))
def test_measured_numbers_are_quoted_from_their_data(bench, name):
    """The demo's time and accuracy, --quick's time, the test suite's time and the summary's ratios are spans."""
    page = next(p for p in PAGES if p.name == name)
    keys = {bench.numbers.split_key(span.key)[0] for span in bench.numbers.spans(page)}
    assert sorted(REQUIRED_SPANS[name] - keys) == [], f"{name} states these numbers without their data"


#: A target's verdict in the prose: "is met", "**not met**", "missed" (not a list of them: "met/missed").
_VERDICT = re.compile(r"(?<![/\w])(?:not met|met|missed)(?![/\w])")


def typed_verdicts(text: str, span: re.Pattern) -> list[str]:
    """The paragraphs of ``text`` that state a target as met or not, with a number, but hold no span."""
    return [p.strip()[:120] for p in re.split(r"\n\s*\n", text)
            if _VERDICT.search(span.sub("", p)) and re.search(r"\d", p) and not span.search(p)]


def test_a_target_stated_as_met_or_not_is_quoted_from_its_data(bench):
    """Outside the measurement log (docs/benchmarks.md, whose sections each carry their command and date), a
    paragraph that says a target is met or not says it with a span: the verdict and its number come from the JSON
    of the measurement, and a new measurement rewrites them."""
    typed = [f"{page.name}: {p}" for page in PAGES if page.name != "benchmarks.md"
             for p in typed_verdicts(page.read_text(encoding="utf-8"), bench.numbers._SPAN)]
    assert typed == [], "a target's verdict typed by hand (quote it from its data: benchmarks/doc_numbers.py)"


def test_a_verdict_typed_by_hand_is_found(bench):
    stale = "At 1,000,000 files a rank holds 1.3 GB:\nthe 64 MB target is not met yet.\n\nPrints met/missed: 3 targets."
    assert typed_verdicts(stale, bench.numbers._SPAN) == ["At 1,000,000 files a rank holds 1.3 GB:\nthe 64 MB target "
                                                          "is not met yet."]
    quoted = ("a rank holds <!--n metadata_memory.held_mb():.0f-->21<!--/n--> MB: the target is "
              "<!--n metadata_memory.target()-->met<!--/n-->")
    assert typed_verdicts(quoted, bench.numbers._SPAN) == []


#: A figure said to hold "now" or "today" (or "currently"), outside code.
_NOW = re.compile(r"(?<![/\w`])(?:now|today|currently)(?![/\w`])", re.IGNORECASE)
#: A measured number: a size, a time, a share, a ratio or a rate ("21 MB", "0.27 s", "3.2×", "1,005 requests/s").
_MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:[KMGT]i?B\b|ms\b|µs\b|s\b|seconds?\b|minutes?\b|hours?\b"
                       r"|%|×|x\b|(?:samples|files|rows|requests|batches)/s\b)")
_NUMBER_CELL = re.compile(r"^\s*\**[\d,.]+\**(?:\s*/\s*[\d,.]+)*\s*$")


def statements(text: str) -> list[str]:
    """The paragraphs and table rows of a page, outside fenced code."""
    found, paragraph, fenced = [], [], False
    for line in [*text.splitlines(), ""]:
        if re.match(r"^ {0,3}(```|~~~)", line):
            fenced = not fenced
        if fenced or line.lstrip().startswith(("|", "```", "~~~")) or not line.strip():
            found += ["\n".join(paragraph)] if paragraph else []
            paragraph = []
            found += [line] if not fenced and line.lstrip().startswith("|") else []
        else:
            paragraph.append(line)
    return found


def typed_figures_of_now(text: str, span: re.Pattern) -> list[str]:
    """The paragraphs and table rows of ``text`` that say what holds now (or today) with a measured number typed by
    hand (outside a span and inline code): a size, time, share, ratio or rate, or a table row's number cell."""
    typed = []
    for statement in statements(text):
        bare = re.sub(r"`[^`]*`", "", span.sub("", statement))
        if not _NOW.search(bare):
            continue
        numbers = _MEASURED.findall(bare)
        if bare.lstrip().startswith("|"):
            numbers += [cell.strip() for cell in bare.strip().strip("|").split("|") if _NUMBER_CELL.match(cell)]
        if numbers:
            typed.append(f"{statement.strip()[:100]} ({', '.join(numbers)})")
    return typed


def test_a_figure_stated_as_now_is_quoted_from_its_data(bench):
    """Outside the measurement log (docs/benchmarks.md), a number said to hold now or today (a rank's metadata, a
    start's requests and seconds) is a span: it comes from the benchmark's JSON (docs/numbers/, docs/figures/data/),
    so a new measurement rewrites it and a stale one fails `test_numbers_in_the_prose_match_their_data`."""
    typed = [f"{page.name}: {t}" for page in PAGES if page.name != "benchmarks.md"
             for t in typed_figures_of_now(page.read_text(encoding="utf-8"), bench.numbers._SPAN)]
    assert typed == [], "a figure of now typed by hand (quote it from its data: benchmarks/doc_numbers.py)"


def test_a_figure_of_now_typed_by_hand_is_found(bench):
    stale = ("A rank's metadata is now about 1.3 KB a file.\n\n| run | s |\n|---|---:|\n"
             "| now, with a manifest | 0.27 |\n\n```\ntoday 5 s\n```\n\nNow `pack` writes it (0.3 wrote 2 files).")
    assert typed_figures_of_now(stale, bench.numbers._SPAN) == [
        "A rank's metadata is now about 1.3 KB a file. (1.3 KB)", "| now, with a manifest | 0.27 | (0.27)"]
    quoted = ("A rank holds <!--n metadata_memory.held_mb():.0f-->21<!--/n--> MB now.\n\n"
              "| now, with a manifest | <!--n manifest_start.start_cells(\"manifest_cold\")-->2 | 0<!--/n--> |")
    assert typed_figures_of_now(quoted, bench.numbers._SPAN) == []


def test_nothing_cites_a_file_outside_the_repository():
    """The repository stands alone: no design page, benchmark folder or machine path of the place it was made."""
    outside = re.compile(r"DESIGN\.md|\.\./shared\b|shared/device-bench|/work/")
    skip = {".git", ".venv", ".cache", "build", "dist", "bench-out", "__pycache__"}
    cited = []
    for path in ROOT.rglob("*"):
        if (path.suffix not in {".py", ".md", ".toml", ".json", ".cfg", ".txt", ".sh", ".yml", ".yaml"}
                or skip & set(path.relative_to(ROOT).parts) or not path.is_file()):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if outside.search(line) and path != Path(__file__):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert cited == []


def test_benchmarks_summary_takes_every_ratio_from_the_data(bench):
    """No "0.87-1.11×" typed by hand in the summary: every ratio there is a span."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    summary = text[text.index("## Summary"):text.index("\n## ", text.index("## Summary") + 1)]
    typed = re.findall(r"[\d.,-]*\d×", bench.numbers._SPAN.sub("", summary))
    assert typed == [], f"docs/benchmarks.md's summary types ratios by hand: {typed}"


def test_numbers_files_say_where_they_come_from():
    files = sorted((ROOT / "docs" / "numbers").glob("*.json"))
    assert files
    for file in files:
        numbers = json.loads(file.read_text(encoding="utf-8"))
        assert {"title", "command", "date", "commit", "machine"} <= set(numbers), file.name


def test_a_number_that_drifts_fails_the_check_and_is_rewritten(tmp_path):
    data, numbers, out = tmp_path / "data", tmp_path / "numbers", tmp_path / "figures"
    for folder in (data, numbers, out):
        folder.mkdir()
    (numbers / "demo.json").write_text(json.dumps({"demo_seconds": 73.8, "quick_seconds": {"min": 9.6, "max": 13}}))
    page = tmp_path / "page.md"
    page.write_text("# Demo\n\nabout <!--n demo.demo_seconds:.0f-->50<!--/n--> s, --quick "
                    "<!--n demo.quick_seconds:g-->9.6-13<!--/n--> s\n\n```\n<!--n demo.nothing-->x<!--/n-->\n```\n",
                    encoding="utf-8")
    where = ("--pages", page, "--data", data, "--numbers", numbers, "--out", out)
    result = run_figures("--check", *where)
    assert result.returncode == 1
    assert f"{page}:3: says '50', its data '74' (<!--n demo.demo_seconds:.0f-->)" in result.stderr
    assert "9.6-13" not in result.stderr and "nothing" not in result.stderr  # right, and inside a code block
    assert run_figures(*where).returncode == 0
    assert "about <!--n demo.demo_seconds:.0f-->74<!--/n--> s" in page.read_text(encoding="utf-8")
    assert run_figures("--check", *where).returncode == 0


def test_spans_render_ranges_lists_and_templates(bench, tmp_path):
    n = bench.numbers
    assert n.render(218.5, ",.0f") == "219"  # halves round up, as a reader rounds (format() gives 218)
    assert n.render(0.97, ".1%") == "97.0%"
    assert n.render((0.7561, 1.1058), ".2f") == "0.76-1.11"
    assert n.render({"min": 7, "max": 9}) == "7-9"
    assert n.render((1.001, 0.999), ".2f") == "1.00"  # both ends read the same
    assert n.render([1.725, 1.866], "{:.2f}×") == "1.73× / 1.87×"
    assert n.split_key('range_of(x.f("a:b")):{:.2f}×') == ('range_of(x.f("a:b"))', "{:.2f}×")
    page = tmp_path / "page.md"
    page.write_text("<!--n demo.missing-->1<!--/n-->\n", encoding="utf-8")
    problems = n.stale_numbers([page], [ROOT / "docs" / "numbers"])
    assert len(problems) == 1
    assert f"{page}:1: <!--n demo.missing--> cannot be read: demo.json has no field 'missing'" in problems[0]


# -- what the charts show ----------------------------------------------------------------------------------------


def overlaps(fig) -> list[str]:
    """Pairs of texts on the figure (bar labels, annotations, footer) that overlap each other or a legend."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in [*fig.texts, *(t for ax in fig.axes for t in ax.texts)] if t.get_visible() and t.get_text()]
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    boxes = [(repr(t.get_text()), t.get_window_extent(renderer)) for t in texts]
    found = [f"{a} and {b}" for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]
    found += [f"{a} and a legend" for a, box in boxes for legend in legends
              if box.overlaps(legend.get_window_extent(renderer))]
    return found


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "docs" / "figures" / "data").glob("*.json")))
def test_chart_labels_are_readable(bench, name):
    """No label of a chart sits on another or under a legend, and the footer shows the commit, not a dict."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = bench.figures.DRAW[name](plt, json.loads((ROOT / "docs" / "figures" / "data" / f"{name}.json").read_text()))
    try:
        assert overlaps(fig) == []
        assert not [t.get_text() for t in fig.texts if "{" in t.get_text()]
    finally:
        plt.close(fig)


def test_footer_shows_a_commit_for_one_project_or_several(bench):
    assert bench.figures.commit_text("0de2f33") == "0de2f33"
    assert bench.figures.commit_text({"this": "7067cd7"}) == "7067cd7"
    assert bench.figures.commit_text({"before": "3624b66", "after": "7067cd7"}) == "before 3624b66, after 7067cd7"
