"""Input lists ``audioloader pack`` reads: CSV, TSV and JSONL files listing audio files, with any columns (the
user's "manifests"; named apart from the dataset manifest of `audioloader.shards.catalog.manifest`).

A manifest has one row per audio file (or per segment of one, see below) and a
column naming the file: ``path`` (or ``file_name`` as in Hugging Face
``audiofolder``, ``audio_filepath`` as in NeMo, ``audio``, ``file``). Relative
paths are relative to the manifest's folder. Every other column is carried into
the shards, typed: in CSV/TSV a column whose values are all integers becomes
``int64``, all numbers ``float64``, anything else ``string`` (``text`` is always a
string); an empty value is null. JSONL values keep their JSON types.

Special columns:

- ``label``: class names (ids in sorted name order) or integer class ids; without
  it the shards have no label column.
- ``start`` and ``end`` (or ``offset`` and ``duration``, NeMo's): the row is the
  segment ``[start, end)`` seconds of its file. Both are numbers, ``start >= 0``,
  ``end > start`` (a row with both empty is the whole file).
- ``duration`` without ``offset`` is dropped: the shards' ``duration`` is measured
  from each stored clip's header.
- ``text`` empty: the row is skipped ("empty transcript").

These names (and the path column's) are matched whatever their case: ``Start``,
``END``, ``Text`` or ``Label`` are read as ``start``, ``end``, ``text``, ``label``
and stored under those names. Two columns that differ only in case (``Start`` and
``start``) are refused. A column that looks like a segment time but is not one
of the names above (``begin``, ``stop``, ``onset``, ``start_time``, ...; ``offset``
beside ``onset``) is refused by name, with the fix (rename it ``start``/``end``, or
give it a name that does not look like a time to carry it as a plain column):
it is never silently carried as a plain column when it was meant to cut segments.

Everything here only reads the manifest and checks that the files exist;
`audioloader.tools.pack` reads the audio.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from audioloader.shards.storage.locations import is_url, local_path

from .remote_files import RemoteFile

__all__ = ["PATH_COLUMNS", "SEGMENT_LOOKALIKES", "SPECIAL_COLUMNS", "Entry", "Inputs", "Skips", "Table", "build_inputs",
           "canonical_columns", "read_table"]

#: Names of the column that holds each row's audio file, in order of preference.
PATH_COLUMNS = ("path", "file_name", "audio_filepath", "audio", "file")
#: Columns always stored as strings, even when every value looks like a number (a transcript "42").
STRING_COLUMNS = frozenset({"text"})
#: Columns with a meaning to pack (besides the path column); matched whatever their case.
SPECIAL_COLUMNS = ("label", "text", "start", "end", "offset", "duration")
#: Names (lower case) that look like a segment's start or end but are not the ones pack reads: refused by name.
SEGMENT_LOOKALIKES = {
    "begin": "start", "onset": "start", "start_time": "start", "starttime": "start",
    "start_sec": "start", "start_s": "start", "start_seconds": "start", "tstart": "start",
    "stop": "end", "end_time": "end", "endtime": "end", "end_sec": "end", "end_s": "end",
    "end_seconds": "end", "tend": "end",
}
#: Skipped rows named per reason in a summary.
EXAMPLES_PER_REASON = 3

_INT = re.compile(r"^[+-]?(0|[1-9]\d*)$")  # no leading zeros: "007" is an id, kept as a string
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


class Skips:
    """Rows left out, counted per reason, the first few of each named."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[str]] = {}

    def add(self, reason: str, what: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(what)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Entry:
    """One row to pack.

    Attributes:
        file: the audio file to read (a `RemoteFile` for a URL).
        rel: the value stored in the ``path`` column (as the manifest gives it, or relative to the source folder).
        where: where the row comes from, for messages (``"list.csv, line 7"``).
        label: class id, or None (unlabeled).
        values: the row's other columns, typed (see `Inputs.columns`).
        span: ``(start, end)`` seconds when the row is a segment of its file, else None.
    """

    file: Path | RemoteFile
    rel: str
    where: str
    label: int | None = None
    values: dict[str, Any] = field(default_factory=dict)
    span: tuple[float, float] | None = None


@dataclass
class Inputs:
    """What a source holds: its rows, their columns and labels, and what was left out.

    Attributes:
        format: the input format (`audioloader.tools.layouts.INPUT_FORMATS`).
        entries: the rows, in the order they are packed.
        columns: the extra columns ``{name: pyarrow type}``, in order (not ``path``, ``label``, ``duration``).
        label_names: class names in id order, or None for unlabeled rows.
        skips: rows left out while reading the source (missing files, empty transcripts, ...).
        segments: the two columns that made rows segments (``("start", "end")``), or None.
    """

    format: str
    entries: list[Entry]
    columns: dict[str, pa.DataType]
    label_names: list[str] | None
    skips: Skips
    segments: tuple[str, str] | None = None


@dataclass
class Table:
    """A manifest as read: column names, and per row its location and ``{column: value}``."""

    source: Path
    columns: list[str]
    rows: list[tuple[str, dict[str, Any]]]
    typed: bool  # JSON values (True) or strings to be typed (CSV/TSV)


# -- reading ----------------------------------------------------------------------------------------------


def read_table(path: Path, kind: str) -> Table:
    """Read a ``"csv"``, ``"tsv"`` or ``"jsonl"`` manifest; raises ValueError naming the line of a malformed row."""
    if kind == "jsonl":
        return _read_jsonl(path)
    return _read_delimited(path, "\t" if kind == "tsv" else ",")


def _read_delimited(path: Path, delimiter: str) -> Table:
    kind = "TSV" if delimiter == "\t" else "CSV"
    with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: tolerate an Excel BOM
        # TSV has no quoting (Common Voice's sentences hold quote marks); CSV quotes as Excel does.
        reader = csv.reader(fh, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty {kind}; expected a header line naming the columns, e.g. 'path,text'")
        columns = [h.strip() for h in header]
        if len(set(columns)) != len(columns) or "" in columns:
            raise ValueError(f"{path}, line 1: header {columns} has an empty or repeated column name")
        rows = []
        for row in reader:
            line = reader.line_num
            if not row or all(not v.strip() for v in row):
                continue  # blank line
            if len(row) != len(columns):
                raise ValueError(f"{path}, line {line}: {len(row)} value(s) {row}, but the header has "
                                 f"{len(columns)} columns {columns}")
            rows.append((f"{path.name}, line {line}", {c: v.strip() for c, v in zip(columns, row, strict=True)}))
    return Table(path, columns, rows, typed=False)


def _read_jsonl(path: Path) -> Table:
    columns: dict[str, None] = {}
    rows = []
    with open(path, encoding="utf-8-sig") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as error:
                raise ValueError(f"{path}, line {line}: not a JSON object ({error}); a JSONL manifest has one "
                                 'object a line, e.g. {"path": "a.wav", "text": "hello"}') from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {line}: a JSON {type(row).__name__}, expected an object "
                                 '{"path": ..., ...}')
            columns.update(dict.fromkeys(row))
            rows.append((f"{path.name}, line {line}", row))
    if not rows:
        raise ValueError(f"{path}: no rows; a JSONL manifest has one JSON object a line, e.g. "
                         '{"path": "a.wav", "text": "hello"}')
    return Table(path, list(columns), rows, typed=True)


# -- from a table to entries ------------------------------------------------------------------------------


def build_inputs(table: Table, fmt: str, base: Path | RemoteFile, *, rename: dict[str, str] | None = None,
                 rel_base: Path | None = None, skips: Skips | None = None) -> Inputs:
    """Entries of a manifest table: files resolved against ``base``, columns typed, labels and segments read.

    Args:
        table: the manifest.
        fmt: the input format's name (reported).
        base: the folder relative paths are resolved against (a `RemoteFile` for a manifest in object storage).
        rename: columns to rename (Common Voice: ``sentence`` -> ``text``).
        rel_base: store paths relative to this folder (default: as the manifest gives them).
        skips: where left-out rows are counted (a new `Skips` by default).
    """
    skips = skips if skips is not None else Skips()
    rename = rename or {}
    table = canonical_columns(table)
    if not table.rows:
        raise ValueError(f"{table.source}: no rows after the header")
    path_column = next((c for c in PATH_COLUMNS if c in table.columns), None)
    if path_column is None:
        raise ValueError(f"{table.source}, line 1: no column names the audio files; the columns are "
                         f"{table.columns}. Name it one of {', '.join(PATH_COLUMNS)}")
    names = [rename.get(c, c) for c in table.columns]
    segments = _segment_columns(table.source, names)
    # The shards' own `duration` is measured from each stored clip; a manifest's is only read as a segment's length.
    extras = [c for c in table.columns if c not in (path_column, "label") and rename.get(c, c) != "duration"]
    read = extras + [c for c in table.columns if rename.get(c, c) == "duration" and segments is not None]
    typed = {c: _seconds_column(table, c) if segments is not None and rename.get(c, c) in segments
             else _column(rename.get(c, c), [row.get(c) for _, row in table.rows], table.typed) for c in read}
    columns = {rename.get(c, c): typed[c][0] for c in extras}
    labels, label_names = _labels(table) if "label" in table.columns else (None, None)
    entries = []
    for i, (where, row) in enumerate(table.rows):
        path = row.get(path_column)
        if path is None or str(path).strip() == "":
            raise ValueError(f"{table.source.parent / where}: empty {path_column!r}; every row names its audio file")
        values = {rename.get(c, c): typed[c][1][i] for c in read}
        if "text" in values and (values["text"] is None or not str(values["text"]).strip()):
            skips.add("empty transcript", where)
            continue
        file = locate(str(path), base)
        if isinstance(file, Path) and not file.is_file():  # a remote file's absence shows when it is read
            skips.add("missing file", f"{where}: {file}")
            continue
        rel = (file.relative_to(rel_base).as_posix() if rel_base is not None else
               str(RemoteFile(str(path))) if is_url(str(path)) else Path(local_path(str(path))).as_posix())
        span = _span(table.source, where, values, segments)
        values.pop("duration", None)
        entries.append(Entry(file, rel, where, None if labels is None else labels[i], values, span))
    if not entries:
        raise ValueError(_nothing_left(table, skips, base))
    return Inputs(fmt, entries, columns, label_names, skips, segments)


def locate(path: str, base: Path | RemoteFile) -> Path | RemoteFile:
    """The file a manifest's ``path`` names: a store's URL as it is, a ``file://`` URL its path, else relative to
    ``base`` (unless absolute)."""
    if is_url(path):
        return RemoteFile(path)
    if local_path(path) != path:  # a file:// URL: that local file, wherever the manifest is
        return Path(local_path(path))
    if isinstance(base, RemoteFile):
        return base.join(path)
    return Path(path) if Path(path).is_absolute() else base / path


def _nothing_left(table: Table, skips: Skips, base: Path) -> str:
    reasons = "; ".join(f"{reason}: {count} (e.g. {skips.examples[reason][0]})" for reason, count in
                        skips.counts.items())
    hint = (f". Relative paths are resolved against the manifest's folder {str(base)!r}"
            if "missing file" in skips.counts else "")
    return f"{table.source}: no row left to pack ({reasons}){hint}"


def canonical_columns(table: Table) -> Table:
    """``table`` with the columns pack reads (`SPECIAL_COLUMNS`, the path column) renamed to lower case.

    ``Start,End`` is ``start,end``: a column pack gives a meaning to is never carried as a plain column
    because of its case. Of the path columns, only the one used is renamed (``Audio`` beside ``path``
    stays a plain column). Raises ValueError when two columns differ only in case.
    """
    lower: dict[str, list[str]] = {}
    for column in table.columns:
        lower.setdefault(column.lower(), []).append(column)
    for spellings in lower.values():
        if len(spellings) > 1:
            raise ValueError(f"{table.source}, line 1: columns {', '.join(map(repr, spellings))} differ only in "
                             "case; pack matches column names whatever their case: keep one of them, or rename "
                             "the others")
    wanted = [*SPECIAL_COLUMNS]
    if not any(c in table.columns for c in PATH_COLUMNS):
        wanted += [next((c for c in PATH_COLUMNS if c in lower), "")]
    renames = {lower[name][0]: name for name in wanted if name in lower and lower[name][0] != name}
    if not renames:
        return table
    rows = [(where, {renames.get(k, k): v for k, v in row.items()}) for where, row in table.rows]
    return Table(table.source, [renames.get(c, c) for c in table.columns], rows, table.typed)


def _segment_columns(source: Path, names: list[str]) -> tuple[str, str] | None:
    """The columns that make rows segments: ``("start", "end")``, NeMo's ``("offset", "duration")``, or None.

    Raises ValueError naming the column when one is missing, or when a column looks like a segment time
    that pack would not read (`SEGMENT_LOOKALIKES`; ``onset`` with ``offset``): never silently a plain column.
    """
    if "start" in names and "end" in names:
        return ("start", "end")
    lookalikes = [c for c in names if c.lower() in SEGMENT_LOOKALIKES]
    if "offset" in names and "duration" in names and not lookalikes:
        return ("offset", "duration")
    rename = "rename it 'start' or 'end'" if len(lookalikes) == 1 else "rename them 'start' and 'end'"
    if "start" in names or "end" in names:
        have, lacks = ("start", "end") if "start" in names else ("end", "start")
        partner = [c for c in lookalikes if SEGMENT_LOOKALIKES[c.lower()] == lacks]
        if partner:
            fix = f"is {partner[0]!r} the {lacks}? Rename it {lacks!r}"
        elif have == "start" and "duration" in names:
            fix = ("if 'duration' is each segment's length, rename 'start' to 'offset' (NeMo's offset,duration); "
                   "else add an 'end' column")
        else:
            fix = f"add the {lacks!r} column, or rename {have!r} if it is not a segment time"
        article = "an" if have == "end" else "a"
        raise ValueError(f"{source}, line 1: {article} {have!r} column but no {lacks!r}: a segment of a recording "
                         f"needs both (seconds); {fix}")
    if "offset" in names and any(c.lower() == "onset" for c in lookalikes):
        raise ValueError(f"{source}, line 1: columns 'onset' and 'offset' look like each segment's start and end; "
                         "pack reads segments from 'start' and 'end' (or NeMo's 'offset' and 'duration', the "
                         "offset being the start): rename them 'start' and 'end'")
    if lookalikes:
        raise ValueError(f"{source}, line 1: column(s) {', '.join(map(repr, lookalikes))} look like segment times, "
                         "which pack reads only from 'start' and 'end' (seconds; or NeMo's 'offset' and "
                         f"'duration'): {rename} to store each row's segment, or give them names that do not "
                         "look like times to carry them as plain columns")
    if "offset" in names:
        raise ValueError(f"{source}, line 1: an 'offset' column but no 'duration': a segment of a recording "
                         "needs both (seconds); add the column, or rename 'offset' if it is not a segment time")
    return None


def _seconds_column(table: Table, column: str) -> tuple[pa.DataType, list[float | None]]:
    """A segment time column as float64 seconds; a value that is not a number names its line."""
    values: list[float | None] = []
    for where, row in table.rows:
        value = row.get(column)
        if value is None or value == "":
            values.append(None)
            continue
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(f"{table.source.parent / where}: {column}={value!r} is not a number of seconds; fix "
                             f"the times in {table.source.name} or drop the row")
        values.append(number)
    return pa.float64(), values


def _span(source: Path, where: str, values: dict[str, Any], segments: tuple[str, str] | None
          ) -> tuple[float, float] | None:
    """The row's segment ``(start, end)`` in seconds, checked; None for a whole file."""
    if segments is None:
        return None
    a, b = (values.get(c) for c in segments)
    if a is None and b is None:
        return None
    fix = f"fix the times in {source.name} or drop the row"
    if a is None or b is None:
        missing = segments[0] if a is None else segments[1]
        raise ValueError(f"{source.parent / where}: {missing!r} is empty; a segment needs both "
                         f"{segments[0]!r} and {segments[1]!r} (leave both empty for the whole file); {fix}")
    start, end = a, b if segments[1] == "end" else a + b
    if start < 0:
        raise ValueError(f"{source.parent / where}: {segments[0]}={a} s is negative; {fix}")
    if end <= start:
        what = f"end={b} s is not after start={a} s" if segments[1] == "end" else f"duration={b} s is not positive"
        raise ValueError(f"{source.parent / where}: {what}; {fix}")
    return (start, end)


def _column(name: str, raw: list[Any], typed: bool) -> tuple[pa.DataType, list[Any]]:
    """A column's pyarrow type and its values converted to it (``None`` for empty/missing)."""
    if typed:
        return _json_column(name, raw)
    values = [None if v is None or v == "" else v for v in raw]
    present = [v for v in values if v is not None]
    if name not in STRING_COLUMNS and present:
        if all(_INT.match(v) for v in present):
            return pa.int64(), [None if v is None else int(v) for v in values]
        if all(_FLOAT.match(v) for v in present):
            return pa.float64(), [None if v is None else float(v) for v in values]
    return pa.string(), values


def _json_column(name: str, raw: list[Any]) -> tuple[pa.DataType, list[Any]]:
    if name in STRING_COLUMNS:
        return pa.string(), [None if v is None else str(v) for v in raw]
    try:
        array = pa.array(raw)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        # Mixed types (a number here, a string there): kept as JSON text rather than guessed.
        return pa.string(), [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                             for v in raw]
    if pa.types.is_null(array.type):
        return pa.string(), raw
    return array.type, array.to_pylist()


_INT_LABEL = re.compile(r"^[+-]?\d+$")


def _labels(table: Table) -> tuple[list[int], list[str]]:
    """Class ids per row and the class names: names in sorted order, or integer ids as given."""
    raw = []
    for where, row in table.rows:
        label = row.get("label")
        if label is None or str(label).strip() == "":
            raise ValueError(f"{table.source.parent / where}: empty 'label'; give every row a class, or leave the "
                             "label column out for unlabeled data")
        raw.append((where, str(label).strip() if not isinstance(label, int) else label))
    if all(isinstance(v, int) or _INT_LABEL.match(v) for _, v in raw):
        # Integer ids are used as given; names are their decimal strings so that
        # len(label_names) is still the number of classes.
        ids = [int(v) for _, v in raw]
        for (where, value), i in zip(raw, ids, strict=True):
            if i < 0:
                raise ValueError(f"{table.source.parent / where}: label {str(value)!r} is negative; class ids "
                                 "must be >= 0")
        return ids, [str(i) for i in range(max(ids) + 1)]
    names = sorted({str(v) for _, v in raw})
    index = {name: i for i, name in enumerate(names)}
    return [index[str(v)] for _, v in raw], names


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 text file's non-blank lines, stripped."""
    with open(path, encoding="utf-8-sig") as fh:
        for number, text in enumerate(fh, start=1):
            if text.strip():
                yield number, text.strip()
