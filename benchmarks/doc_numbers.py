"""Numbers quoted in the docs' prose, taken from the same JSON files the charts are drawn from.

A measured number in README.md or docs/*.md is written between two HTML comments (GitHub shows
neither) that say where it comes from; the text between them is what the data says:

    the demo took <!--n demo.demo_seconds:.0f-->74<!--/n--> s on 2 cores
    <!--n range_of(remote_latency.train_vs_local("speech", 50)):.2f-->0.76-1.11<!--/n-->× of local disk

The key (before the first ``:`` outside brackets and quotes) is a Python expression over the data files,
each named by its stem: ``docs/figures/data/NAME.json`` (a chart's numbers) or ``docs/numbers/NAME.json``
(numbers without a chart, such as the demo's time). ``NAME.field`` is a top-level field of the JSON
(then ``["key"]`` or ``[0]`` for what is inside it); ``NAME.function(...)`` is a function of that file's
numbers registered below with ``@derived("NAME")``; ``range_of(values)``, ``min`` and ``max`` work on
lists. The optional spec after the ``:`` formats each number: a format spec (``.2f``, ``,.0f``, ``.1%``;
halves round up, as a reader rounds) or a template holding one (``{:.2f}×``). Values render as: a
number by the spec, a pair ``(low, high)`` or a ``{"min": .., "max": ..}`` as ``low-high`` (one number
when both read the same), a list as ``a / b / c``, a string as it is. A span stays on one line (a table
row may be one span over several cells) and is not read inside fenced code blocks.

    python -m benchmarks.figures            # redraws stale charts and rewrites every span from its data
    python -m benchmarks.figures --check    # tests/test_docs.py: exit 1 naming each span that differs

To quote a new measurement: put it in a JSON file (with ``title``, ``command``, ``date``, ``commit``,
``machine``), write the span with a rough text, and run ``python -m benchmarks.figures``; a derived
number (a ratio, a range over rows) gets a small function here, next to the others of its file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT

#: The pages whose spans are checked and rewritten.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Chart data (benchmarks/figures.py draws a chart from each) and numbers without a chart.
DATA_DIRS = [ROOT / "docs" / "figures" / "data", ROOT / "docs" / "numbers"]

_SPAN = re.compile(r"<!--n\s+(?P<key>.+?)\s*-->(?P<text>.*?)<!--/n-->")
_FENCE = re.compile(r"^ {0,3}(```+|~~~+)")


class NumberError(ValueError):
    """A span whose key cannot be read or evaluated."""


@dataclass(frozen=True)
class Span:
    page: Path
    line: int  # 1-based
    key: str
    text: str


# -- the data files and the functions of their numbers -----------------------------------------------------------

#: data file stem -> function name -> function(data, *args) of that file's numbers.
DERIVED: dict[str, dict[str, Callable[..., Any]]] = {}


def derived(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function of ``NAME.json``'s numbers, called in a span as ``NAME.function(args)``."""
    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        DERIVED.setdefault(name, {})[function.__name__] = function
        return function
    return register


def range_of(values: Iterable[float]) -> tuple[float, float]:
    """The lowest and the highest of the values, rendered ``low-high``."""
    values = list(values)
    return min(values), max(values)


def rows_where(data: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    """The rows of ``data["rows"]`` whose fields equal ``match``."""
    return [r for r in data["rows"] if all(r.get(k) == v for k, v in match.items())]


def the_row(data: dict[str, Any], **match: Any) -> dict[str, Any]:
    """The one row whose fields equal ``match`` (a clear error when there is none or several)."""
    rows = rows_where(data, **match)
    if len(rows) != 1:
        raise NumberError(f"{len(rows)} rows match {match} (need exactly one)")
    return rows[0]


@derived("peers")
def times(data: dict[str, Any], contender: str, other: str = "baseline-torchaudio") -> float:
    """Samples/s of ``contender`` over those of ``other`` (the user baseline unless named)."""
    return the_row(data, contender=contender)["samples_per_s"] / the_row(data, contender=other)["samples_per_s"]


@derived("peers")
def first_batches(data: dict[str, Any], *contenders: str) -> list[float]:
    """The seconds to the first batch of each contender named."""
    return [the_row(data, contender=name)["first_batch_s"] for name in contenders]


@derived("scaling")
def of_limit(data: dict[str, Any], dataset: str, series: str, workers: int) -> float:
    """Samples/s of one series at N workers over the per-sample function's limit at the same N."""
    at = data["workers"].index(workers)
    panel = data["series"][dataset]
    return panel[series][at] / panel["per-sample function in N processes (limit)"][at]


@derived("speech_lhotse")
def vs_lhotse(data: dict[str, Any], column: str) -> list[float]:
    """audioloader's ``column`` over Lhotse's, per corpus in the order of the rows."""
    corpora = list(dict.fromkeys(r["corpus"] for r in data["rows"]))
    return [the_row(data, corpus=c, contender="audioloader")[column]
            / the_row(data, corpus=c, contender="Lhotse")[column] for c in corpora]


@derived("speech_lhotse")
def column(data: dict[str, Any], name: str, contender: str) -> list[float]:
    """``name`` of one contender, per corpus in the order of the rows."""
    return [r[name] for r in rows_where(data, contender=contender)]


@derived("metadata_memory")
def held_mb(data: dict[str, Any]) -> tuple[float, float]:
    """The metadata a rank holds after construction now, MB: the lowest and highest of the measurements."""
    after = [data["rank0_tracemalloc_mb"]["after"], *(m["after"] for m in data["metadata_bytes_mb"].values())]
    return range_of(after)


@derived("metadata_memory")
def target(data: dict[str, Any]) -> str:
    """Whether every measurement of the metadata a rank holds is within the target: "met" or "not met"."""
    return "met" if held_mb(data)[1] <= data["target_mb"] else "not met"


def _rate(data: dict[str, Any], dataset: str, contender: str, fmt: str, latency: float | None) -> float:
    return the_row(data, project="this", dataset=dataset, contender=contender, format=fmt,
                   latency_ms=latency)["samples_per_s"]


@derived("remote_latency")
def vs_local(data: dict[str, Any], dataset: str, contender: str, fmt: str, latency: float) -> float:
    """A training loader's samples/s at ``latency`` ms a request over the same loader on local disk."""
    return _rate(data, dataset, contender, fmt, latency) / _rate(data, dataset, contender, fmt, None)


@derived("remote_latency")
def train_vs_local(data: dict[str, Any], dataset: str, latency: float) -> list[float]:
    """`vs_local` of every training loader (log-mel and waveform) and format on ``dataset``."""
    return [vs_local(data, dataset, contender, fmt, latency)
            for contender in ("train-mel", "train-waveform") for fmt in ("ipc", "parquet")]


@derived("remote_latency")
def vs_peers(data: dict[str, Any], dataset: str, contender: str, peers: tuple[str, ...] = ("litdata", "streaming"),
             latency: float = 50.0) -> list[float]:
    """audioloader's samples/s (each format) over each peer's, one loader, at ``latency`` ms."""
    return [_rate(data, dataset, contender, fmt, latency)
            / the_row(data, project=None, peer=peer, dataset=dataset, contender=contender)["samples_per_s"]
            for fmt in ("ipc", "parquet") for peer in peers]


@derived("remote_latency")
def table_vs_local(data: dict[str, Any], dataset: str, contender: str, latency: float = 50.0) -> str:
    """Table cells: local, at ``latency``, × local; for IPC then Parquet (samples/s as whole numbers)."""
    cells = []
    for fmt in ("ipc", "parquet"):
        local, remote = _rate(data, dataset, contender, fmt, None), _rate(data, dataset, contender, fmt, latency)
        cells += [render(local, ",.0f"), render(remote, ",.0f"), render(remote / local, ".2f")]
    return " | ".join(cells)


@derived("remote_latency")
def table_peers(data: dict[str, Any], dataset: str, contender: str, latency: float = 50.0) -> str:
    """Table cells: audioloader IPC, Parquet, LitData, Streaming, s3fs samples/s; the fastest in bold."""
    rates = [_rate(data, dataset, contender, fmt, latency) for fmt in ("ipc", "parquet")]
    rates += [the_row(data, project=None, peer=peer, dataset=dataset, contender=contender)["samples_per_s"]
              for peer in ("litdata", "streaming", "s3fs")]
    texts = [render(rate, ",.0f") for rate in rates]
    best = rates.index(max(rates))
    texts[best] = f"**{texts[best]}**"
    return " | ".join(texts)



@derived("manifest_start")
def start_cells(data: dict[str, Any], run: str, seconds: str = ".1f") -> str:
    """Table cells of one start at 1,000 files: requests at construction, LISTs, requests a file, construct s, first
    batch s (the seconds with ``seconds``)."""
    numbers = data["runs"][run]
    return " | ".join([render(numbers["construct_requests"], ","), render(numbers["construct_lists"]),
                       render(numbers["requests_a_file"]), render(numbers["construct_s"], seconds),
                       render(numbers["first_batch_s"], seconds)])

# -- reading, evaluating, rendering ------------------------------------------------------------------------------


class DataFile:
    """One JSON file as a span sees it: ``NAME.field`` is a top-level field, ``NAME.function`` a derived one."""

    def __init__(self, name: str, numbers: dict[str, Any]):
        self._name, self._numbers = name, numbers

    def __getattr__(self, attr: str) -> Any:
        function = DERIVED.get(self._name, {}).get(attr)
        if function is not None:
            return lambda *args, **kwargs: function(self._numbers, *args, **kwargs)
        if attr in self._numbers:
            return self._numbers[attr]
        raise NumberError(f"{self._name}.json has no field {attr!r} and doc_numbers.py no function "
                          f"@derived({self._name!r}) of that name")


def load_data(dirs: Iterable[Path] = DATA_DIRS) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` of ``dirs`` by stem (a stem in two folders is an error: a span could not say which)."""
    data: dict[str, dict[str, Any]] = {}
    where: dict[str, Path] = {}
    for folder in dirs:
        for file in sorted(Path(folder).glob("*.json")):
            if file.stem in where:
                raise NumberError(f"{file} and {where[file.stem]} have the same name: spans could not tell them apart")
            where[file.stem] = file
            data[file.stem] = json.loads(file.read_text(encoding="utf-8"))
    return data


def split_key(key: str) -> tuple[str, str]:
    """``(expression, spec)``: the key split at its first ``:`` outside brackets and quotes."""
    depth, quote = 0, None
    for at, char in enumerate(key):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == ":" and depth == 0:
            return key[:at].strip(), key[at + 1:].strip()
    return key.strip(), ""


def evaluate(expression: str, data: dict[str, dict[str, Any]]) -> Any:
    """The value a span's expression names (see the module doc). The docs are the project's own text, run
    like their code snippets; only the data files, `range_of`, ``min`` and ``max`` are in scope."""
    scope = {name: DataFile(name, numbers) for name, numbers in data.items()}
    scope.update(range_of=range_of, min=min, max=max)
    try:
        return eval(compile(expression, "<span>", "eval"), {"__builtins__": {}}, scope)
    except NumberError:
        raise
    except Exception as error:
        raise NumberError(f"{type(error).__name__}: {error}") from error


def _half_up(value: float, spec: str) -> float:
    """``value`` rounded half up to the places ``spec`` shows (format() rounds 218.5 to 218)."""
    places = re.search(r"\.(\d+)([f%])", spec)
    if not places or not isinstance(value, float):
        return value
    digits = int(places[1]) + (2 if places[2] == "%" else 0)
    return float(Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def render(value: Any, spec: str = "") -> str:
    """The text a span shows for ``value`` (see the module doc for the forms)."""
    if isinstance(value, dict) and set(value) == {"min", "max"}:
        value = (value["min"], value["max"])
    if isinstance(value, tuple) and len(value) == 2:
        low, high = render(value[0], spec), render(value[1], spec)
        return low if low == high else f"{low}-{high}"
    if isinstance(value, list | tuple):
        return " / ".join(render(v, spec) for v in value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NumberError(f"cannot show a {type(value).__name__} ({value!r})")
    template = spec if "{" in spec else "{:" + spec + "}"
    inner = re.search(r"\{:?([^}]*)\}", template)
    return template.format(_half_up(value, inner[1] if inner else ""))


def spans(page: Path) -> list[Span]:
    """The page's spans, outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        opening = _FENCE.match(line)
        if opening and (fence is None or opening[1].startswith(fence)):
            fence = opening[1] if fence is None else None
            continue
        if fence is None:
            out += [Span(page, number, m["key"], m["text"]) for m in _SPAN.finditer(line)]
    return out


def _where(span: Span) -> str:
    try:
        return f"{span.page.relative_to(ROOT)}:{span.line}"
    except ValueError:
        return f"{span.page}:{span.line}"


def expected(span: Span, data: dict[str, dict[str, Any]]) -> str:
    """What ``span`` should show, from the data."""
    expression, spec = split_key(span.key)
    try:
        return render(evaluate(expression, data), spec)
    except NumberError as error:
        raise NumberError(f"{_where(span)}: <!--n {span.key}--> cannot be read: {error}") from None


def stale_numbers(pages: Iterable[Path] = PAGES, dirs: Iterable[Path] = DATA_DIRS) -> list[str]:
    """One line per span whose text is not what its data says (or whose key is wrong); empty when all agree."""
    data = load_data(dirs)
    problems = []
    for page in pages:
        for span in spans(page):
            try:
                want = expected(span, data)
            except NumberError as error:
                problems.append(str(error))
                continue
            if span.text != want:
                problems.append(f"{_where(span)}: says {span.text!r}, its data {want!r} (<!--n {span.key}-->)")
    return problems


def update_numbers(pages: Iterable[Path] = PAGES, dirs: Iterable[Path] = DATA_DIRS) -> list[Path]:
    """Rewrite every span's text from its data; returns the pages that changed. A key that cannot be read
    raises (naming page and line) before any page is written."""
    data = load_data(dirs)
    new_texts = {}
    for page in pages:
        lines = page.read_text(encoding="utf-8").split("\n")
        for span in spans(page):
            want = expected(span, data)
            lines[span.line - 1] = _SPAN.sub(
                lambda m, span=span, want=want: m[0] if m["key"] != span.key else
                f"<!--n {m['key']}-->{want}<!--/n-->", lines[span.line - 1])
        text = "\n".join(lines)
        if text != page.read_text(encoding="utf-8"):
            new_texts[page] = text
    for page, text in new_texts.items():
        page.write_text(text, encoding="utf-8")
    return list(new_texts)
