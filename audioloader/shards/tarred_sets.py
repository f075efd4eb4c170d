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

from ..errors import ShardReadError
from .retry import DEFAULT_RETRY, Retry, with_retries
from .sources import SourceNotFoundError, _filesystem_for, _is_url, _Location, _url_for

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
        return filesystem, (parsed.netloc + parsed.path if _is_url(url) else url), None
    if _is_url(url) and not url.startswith("file://"):
        fs, path = _filesystem_for(url, retry)
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


def _location(fs: Any, path: str, scheme: str | None, joined: JoinedRows) -> _Location:
    # No size: a tar of a set is never taken from the metadata index (its rows come from the set's manifest).
    return _Location(_url_for(scheme, path) if scheme else path, fs, path, joined=joined)


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

    def resolve_locations(self, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[_Location]:
        """One `_Location` a tar that has rows, each with its `JoinedRows`."""
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

    def resolve_locations(self, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[_Location]:
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
