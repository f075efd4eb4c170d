"""Tar sets described by a manifest beside them: NeMo tarred audio (`NemoTarred`) and Lhotse Shar (`LhotseShar`).

Each tar is a file of units, as a WebDataset tar (`tar_format`), whose rows are the
manifest's rows for that tar, in the tar's order, joined to their audio member
(`JoinedRows`): the manifest's fields are the columns (NeMo: ``audio_filepath``,
``duration``, ``text``, ``shard_id``, ...; Shar: the cut's ``id``, ``duration``,
its first supervision's ``text``, ``speaker``, ``language`` and its ``custom`` fields)
and a column-only read (the ``duration`` bucketing reads) reads no audio.

A tar's rows are numbered in the order of their members in it (one pass over a tar reads
its rows in order; NeMo's ``convert_to_tarred_audio_dataset.py`` and Lhotse's ``SharWriter``
write the manifest in that order anyway). The tars' headers are read at construction (a
remote tar is read whole then: with ``cache_dir``, a later start reads the machine's copy).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import ShardReadError
from ..storage.locations import Location, filesystem_for, has_scheme, url_for
from ..storage.retry import DEFAULT_RETRY, Retry, with_retries
from .resolve import SourceNotFoundError

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass(frozen=True)
class JoinedRows:
    """The rows of one tar of a set, in its members' order, and the member each joins.

    Attributes:
        table: the rows' columns (no audio).
        keys: per row, its audio member's name (``by="name"``: NeMo) or key (``by="key"``: the name without its
            extension, Shar).
        by: ``"name"`` or ``"key"``.
        where: the manifest, for messages.
    """

    table: pa.Table
    keys: tuple[str, ...]
    by: str
    where: str

    def key_of(self, member_name: str) -> str:
        """The join key of a member's name."""
        return member_name if self.by == "name" else member_name.rsplit(".", 1)[0]

    def digest(self) -> bytes:
        """What identifies these rows (fed into the tar's digest: a changed manifest is another file's content)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        return hashlib.blake2b(sink.getvalue().to_pybytes() + "\0".join(self.keys).encode(), digest_size=8).digest()


def _expand_braces(pattern: str) -> list[str]:
    """``audio_{0..3}.tar`` -> ``audio_0.tar ... audio_3.tar`` (NeMo's ``_OP_0..3_CL_`` too), every brace group."""
    pattern = pattern.replace("_OP_", "{").replace("_CL_", "}")
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.group(1), match.group(2)
    width = len(first) if first.startswith("0") and len(first) > 1 else 0
    out = []
    for n in range(int(first), int(last) + 1):
        out.extend(_expand_braces(pattern[:match.start()] + f"{n:0{width}d}" + pattern[match.end():]))
    return out


def _opener(url: str, filesystem: Any, retry: Retry) -> tuple[Any, str, str | None]:
    """``(filesystem or None for local, its path, URL scheme or None)`` of a path or URL."""
    if filesystem is not None:
        parsed = urllib.parse.urlparse(url)
        return filesystem, (parsed.netloc + parsed.path if has_scheme(url) else url), None
    if has_scheme(url) and not url.startswith("file://"):
        fs, path = filesystem_for(url, retry)
        if isinstance(fs, pafs.LocalFileSystem):
            return None, path, None
        return fs, path, urllib.parse.urlparse(url).scheme
    if url.startswith("file://"):
        url = urllib.parse.unquote(urllib.parse.urlparse(url).path)
    return None, os.path.abspath(os.path.expanduser(url)), None


def _read_bytes(fs: Any, path: str, where: str, retry: Retry) -> bytes:
    if fs is None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise SourceNotFoundError(f"{where}: no such file ({path})") from None

    def read() -> bytes:
        with fs.open_input_stream(path) as f:
            return f.read()

    try:
        return with_retries(read, what=where, retry=retry, store=where)
    except FileNotFoundError:
        raise SourceNotFoundError(f"{where}: no such object") from None


def _jsonl(data: bytes, where: str) -> list[dict[str, Any]]:
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    rows = []
    for n, line in enumerate(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as error:
                raise ShardReadError(f"{where}, line {n}: not JSON ({error})") from error
    return rows


def _location(fs: Any, path: str, scheme: str | None, joined: JoinedRows) -> Location:
    # No size: a tar of a set is never taken from the metadata index (its rows come from the set's manifest).
    return Location(url_for(scheme, path) if scheme else path, fs, path, joined=joined)


def _table(rows: list[dict[str, Any]], where: str) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise ShardReadError(f"{where}: its fields do not make columns ({error})") from error


@dataclass(frozen=True)
class NemoTarred:
    """A NeMo tarred audio set: ``AudioLoader(al.Source(al.NemoTarred("train.jsonl", "audio_{0..127}.tar"),
    label_column=None))``.

    Args:
        manifest: the tarred manifest (NeMo's ``manifest_filepath``): JSON lines with ``audio_filepath`` (the
            member's name in its tar), ``shard_id`` (which tar) and any other fields (``duration``, ``text``, ...),
            each a column. Local path or URL; ``.gz`` read too.
        tars: the tars (NeMo's ``tarred_audio_filepaths``): a pattern with ``{0..N}`` (or NeMo's ``_OP_0..N_CL_``),
            or a list; tar ``k`` of the expanded list holds the rows with ``shard_id == k``.
    """

    manifest: str
    tars: str | Sequence[str]

    def resolve_locations(self, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[Location]:
        """One `Location` a tar that has rows, each with its `JoinedRows`."""
        fs, path, _ = _opener(os.fspath(self.manifest), filesystem, retry)
        rows = _jsonl(_read_bytes(fs, path, f"NeMo manifest {self.manifest}", retry), str(self.manifest))
        tars = _expand_braces(self.tars) if isinstance(self.tars, str) else [os.fspath(t) for t in self.tars]
        by_shard: dict[int, list[dict[str, Any]]] = {}
        for n, row in enumerate(rows, 1):
            if "audio_filepath" not in row or "shard_id" not in row:
                raise ShardReadError(f"{self.manifest}, line {n}: a tarred manifest's row needs 'audio_filepath' and "
                                     f"'shard_id'; it has {sorted(row)}")
            shard = row["shard_id"]
            if not isinstance(shard, int) or not 0 <= shard < len(tars):
                raise ShardReadError(f"{self.manifest}, line {n}: shard_id {shard!r} names no tar: tars= gives "
                                     f"{len(tars)} (shard_id 0..{len(tars) - 1})")
            by_shard.setdefault(shard, []).append(row)
        if not by_shard:
            raise ShardReadError(f"{self.manifest} has no rows")
        locations = []
        for shard, members in sorted(by_shard.items()):
            tar_fs, tar_path, scheme = _opener(tars[shard], filesystem, retry)
            keys = tuple(os.path.basename(r["audio_filepath"]) for r in members)
            joined = JoinedRows(_table(members, str(self.manifest)), keys, "name", str(self.manifest))
            locations.append(_location(tar_fs, tar_path, scheme, joined))
        return locations

    def __str__(self) -> str:
        return f"NemoTarred({self.manifest!r}, {self.tars!r})"


def cut_columns(cut: dict[str, Any]) -> dict[str, Any]:
    """A Lhotse cut's columns: ``id``, ``duration``, ``start``, ``channel``; its first supervision's ``text``,
    ``speaker``, ``language``, ``gender``; its ``custom`` fields (a field of those names first)."""
    row = {name: cut.get(name) for name in ("id", "duration", "start", "channel") if name in cut}
    supervisions = cut.get("supervisions") or []
    if supervisions:
        first = supervisions[0]
        for name in ("text", "speaker", "language", "gender"):
            if first.get(name) is not None:
                row[name] = first[name]
    for name, value in (cut.get("custom") or {}).items():
        row.setdefault(name, value)
    return row


@dataclass(frozen=True)
class LhotseShar:
    """A Lhotse Shar folder read in place: ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar`` (its audio, member
    ``<cut id>.<format>``); other fields' tars are not read. ``AudioLoader(al.Source(al.LhotseShar("shar/"),
    label_column=None))``; the columns are `cut_columns`.

    Args:
        folder: the Shar folder (local path or URL).
    """

    folder: str

    def resolve_locations(self, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[Location]:
        fs, path, scheme = _opener(os.fspath(self.folder), filesystem, retry)
        path = path.rstrip("/")
        if fs is None:
            names = sorted(os.listdir(path)) if os.path.isdir(path) else []
        else:
            infos = with_retries(lambda: fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)),
                                 what=f"the listing of {self.folder}", retry=retry, store=str(self.folder))
            names = sorted(i.path.rsplit("/", 1)[-1] for i in infos)
        cuts = [n for n in names if re.fullmatch(r"cuts\.\d+\.jsonl(\.gz)?", n)]
        if not cuts:
            raise SourceNotFoundError(f"{self.folder} holds no Lhotse Shar cuts (cuts.NNNNNN.jsonl.gz)")
        locations = []
        for name in cuts:
            number = name.split(".")[1]
            recording = f"recording.{number}.tar"
            if recording not in names:
                raise ShardReadError(f"{self.folder}: {name} has no {recording} beside it (its audio); only Shar "
                                     "sets with recordings are read")
            where = f"{self.folder}/{name}"
            cut_rows = [c for c in _jsonl(_read_bytes(fs, f"{path}/{name}", where, retry), where)]
            table = _table([cut_columns(c) for c in cut_rows], where)
            joined = JoinedRows(table, tuple(c["id"] for c in cut_rows), "key", where)
            locations.append(_location(fs, f"{path}/{recording}", scheme, joined))
        return locations

    def __str__(self) -> str:
        return f"LhotseShar({self.folder!r})"


#: Columns naming a listed file's audio, the first present taken (pack's ``path``, NeMo's ``audio_filepath``, a
#: Hugging Face audiofolder's ``file_name``, ...).
PATH_COLUMNS = ("path", "audio_filepath", "file_name", "file", "filepath", "audio_path")


@dataclass(frozen=True)
class ListedRow:
    """A listed audio file's columns: row ``row`` of its manifest's ``table`` (shared by every file of it)."""

    table: pa.Table
    row: int
    where: str

    def schema(self) -> pa.Schema:
        fields = [pa.field("audio", pa.binary())] + [f for f in self.table.schema if f.name != "audio"]
        return pa.schema(fields, metadata={b"audioloader_container": b"files"})

    def digest(self) -> bytes:
        return json.dumps(self.table.slice(self.row, 1).to_pylist(), sort_keys=True, default=str).encode()


def _read_rows(data: bytes, name: str, where: str) -> pa.Table:
    """A manifest's rows: JSON lines, or a CSV / TSV file with a header."""
    if name.endswith((".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        import pyarrow.csv as pacsv

        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        delimiter = "\t" if ".tsv" in name else ","
        try:
            return pacsv.read_csv(pa.BufferReader(data), parse_options=pacsv.ParseOptions(delimiter=delimiter))
        except pa.ArrowException as error:
            raise ShardReadError(f"{where}: not a CSV/TSV file with a header ({error})") from error
    return _table(_jsonl(data, where), where)


@dataclass(frozen=True)
class AudioFiles:
    """Audio files named by a manifest, one a row, its other fields columns: ``al.Source(al.AudioFiles(
    "train.jsonl"), label_column=None)`` (a NeMo manifest, a CSV / TSV with a header, or JSON lines).

    Args:
        manifest: the manifest (local path or URL). A row's file is in its first column of `PATH_COLUMNS`:
            a path relative to the manifest's folder, an absolute path, or a URL of the manifest's store.
    """

    manifest: str

    def resolve_locations(self, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[Location]:
        where = os.fspath(self.manifest)
        fs, path, scheme = _opener(where, filesystem, retry)
        table = _read_rows(_read_bytes(fs, path, f"manifest {where}", retry), path.lower(), where)
        column = next((c for c in PATH_COLUMNS if c in table.column_names), None)
        if column is None or table.num_rows == 0:
            raise ShardReadError(f"{where}: {'no rows' if column is None and table.num_rows == 0 else 'no column'} "
                                 f"naming the audio files; give each row one of {', '.join(PATH_COLUMNS)}")
        folder = path.rsplit("/", 1)[0]
        locations, seen = [], {}
        for row, name in enumerate(table.column(column).to_pylist()):
            if not isinstance(name, str) or not name:
                raise ShardReadError(f"{where}, row {row}: {column!r} is {name!r}, not a file's path")
            if has_scheme(name):
                file_fs, file_path, file_scheme = _opener(name, filesystem, retry)
            else:
                file_fs, file_scheme = fs, scheme
                file_path = name if name.startswith("/") else f"{folder}/{name}"
                file_path = os.path.normpath(file_path) if fs is None else file_path
            if seen.setdefault(file_path, row) != row:  # one row a file: a second would be dropped silently
                raise ShardReadError(f"{where}: rows {seen[file_path]} and {row} both name {name!r}; list each "
                                     "file once (or pack the rows: `audioloader pack`)")
            joined = ListedRow(table, row, where)
            locations.append(Location(url_for(file_scheme, file_path) if file_scheme else file_path, file_fs,
                                       file_path, joined=joined))
        return locations

    def __str__(self) -> str:
        return f"AudioFiles({self.manifest!r})"
