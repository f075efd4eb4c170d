"""Shard discovery, format detection, metadata, splits, schema checks and reads.

A *source* (directory, glob, file, URL, or a list of them) resolves to a sorted
list of shard files. Each file is Arrow IPC file format, Arrow IPC stream format
(what Hugging Face ``save_to_disk`` writes) or Parquet, detected from its
content, not its name. Construction reads only footers and message headers, never
audio, and checks the schema of the used columns in every file.

Rows are addressed by a global ``index``: the file's offset in the sorted file
list plus the row number in that file. A `Split` is a run of consecutive rows of
one file, aligned to record batches (IPC) or row groups (Parquet); it is the
unit that passes and ranks are made of.

Local files are memory-mapped, so reading IPC data is zero-copy: audio values
come out as ``pyarrow.Buffer`` views of the mapping. Remote files (``s3://``,
``gs://``, ... through ``pyarrow.fs`` or fsspec) are read with random access.
"""

from __future__ import annotations

import bisect
import fnmatch
import glob
import heapq
import json
import operator
import os
import struct
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import SchemaError, ShardReadError

SHARD_EXTENSIONS = (".arrow", ".ipc", ".feather", ".parquet", ".pq")
FORMATS = ("ipc_file", "ipc_stream", "parquet")
ACCEPTED = "Arrow IPC file (.arrow/.feather v2), Arrow IPC stream (Hugging Face save_to_disk) or Parquet"

# Open file handles kept per thread (memory maps are cheap; this bounds open fds).
_HANDLES_PER_THREAD = 16
# Files scanned in parallel at construction (remote metadata reads are latency-bound).
_SCAN_THREADS = 8
_GLOB_CHARS = "*?["

_CONTINUATION = b"\xff\xff\xff\xff"
_MSG_SCHEMA, _MSG_DICTIONARY, _MSG_RECORD_BATCH = 1, 2, 3


class SourceNotFoundError(ShardReadError, FileNotFoundError):
    """Nothing matches the shard source (a missing path, an empty glob, a folder without shards)."""


@dataclass(frozen=True)
class ShardFile:
    """One shard file.

    Attributes:
        path: local absolute path or URL.
        format: ``"ipc_file"``, ``"ipc_stream"`` or ``"parquet"``.
        size: file size in bytes.
        num_rows: rows in the file.
        batch_rows: rows per record batch (IPC) or row group (Parquet), in file order.
        index_offset: global index of this file's row 0.
    """

    path: str
    format: str
    size: int
    num_rows: int
    batch_rows: tuple[int, ...]
    index_offset: int


@dataclass(frozen=True)
class Split:
    """Rows ``[start, stop)`` of ``files[file_id]``; ``split_id`` is its position in (file, row) order."""

    split_id: int
    file_id: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


class ShardRow(NamedTuple):
    """One row read by random access (`ShardDataset.read_rows`).

    Attributes:
        index: global row index.
        file: path or URL of the shard file.
        row: row number in that file.
        audio: encoded audio (``pyarrow.Buffer``, zero-copy where possible), or ``None`` if null.
        label: integer label, or ``None`` (null, or no label column).
        extras: ``{column: python value}`` for the extra columns.
    """

    index: int
    file: str
    row: int
    audio: Any
    label: int | None
    extras: dict[str, Any]


class BatchColumns(NamedTuple):
    """A record batch's used columns as Python lists (one entry per row).

    Attributes:
        audio: ``pyarrow.Buffer`` (zero-copy view) or ``None`` per row.
        labels: ``int | None`` per row, or ``None`` when there is no label column.
        extras: ``[(name, values)]`` for the extra columns.
        problems: ``None`` when no row has a problem, else ``str | None`` per row.
    """

    audio: list[Any]
    labels: list[int | None] | None
    extras: list[tuple[str, list[Any]]]
    problems: list[str | None] | None


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class _Location:
    """Where a file lives: ``fs is None`` means a local path we can memory-map."""

    path: str  # shown to users: local absolute path or URL
    fs: Any
    fs_path: str


def _is_url(text: str) -> bool:
    scheme = urllib.parse.urlparse(text).scheme
    return len(scheme) > 1 and "://" in text  # len > 1 keeps Windows drive letters local


def _filesystem_for(url: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` for a URL: pyarrow's own first, else fsspec."""
    try:
        return pafs.FileSystem.from_uri(url)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as arrow_error:
        try:
            import fsspec  # optional: covers hf://, memory://, az://, http(s)://, ...
        except ImportError:
            raise ValueError(f"cannot open {url!r}: pyarrow has no filesystem for this scheme "
                             f"({arrow_error}); install fsspec and the scheme's package "
                             "(e.g. s3fs, gcsfs), or pass filesystem=") from None
        try:
            fs, path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as fsspec_error:
            raise ValueError(f"cannot open {url!r}: no filesystem for this scheme in pyarrow "
                             f"({arrow_error}) or fsspec ({fsspec_error}); install the scheme's "
                             "fsspec package or pass filesystem=") from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _url_for(scheme: str, fs_path: str) -> str:
    return fs_path if "://" in fs_path else f"{scheme}://{fs_path.lstrip('/')}"


def _has_shard_extension(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    # Hidden and underscore files are bookkeeping (.crc, _SUCCESS, _metadata), as in pyarrow.dataset.
    return not base.startswith((".", "_")) and base.lower().endswith(SHARD_EXTENSIONS)


def _hf_state_files(read_text, folder: str) -> list[str] | None:
    """Data files listed in a Hugging Face ``save_to_disk`` ``state.json``, or None.

    Such a folder may also hold ``cache-*.arrow`` files written by ``Dataset.map``;
    ``state.json`` says which files are the dataset.
    """
    try:
        state = json.loads(read_text(folder.rstrip("/") + "/state.json"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    if not names or not all(isinstance(n, str) and "/" not in n for n in names):
        return None
    return [folder.rstrip("/") + "/" + n for n in names]


def _read_local_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _expand_local(item: str) -> tuple[list[str], str]:
    """Local files for one source entry, and a description of what was searched."""
    path = os.path.abspath(os.path.expanduser(item))
    if any(c in item for c in _GLOB_CHARS):
        matches = sorted(glob.glob(path, recursive=True))
        files: list[str] = []
        for match in matches:
            files.extend(_expand_local(match)[0] if os.path.isdir(match) else [match])
        return files, f"glob {path!r} ({len(matches)} matches)"
    if os.path.isdir(path):
        listed = _hf_state_files(_read_local_text, path)
        if listed is not None:
            return listed, f"Hugging Face dataset folder {path!r} (state.json)"
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            found.extend(os.path.join(root, n) for n in names if _has_shard_extension(n))
        return found, f"folder {path!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if os.path.isfile(path):
        return [path], f"file {path!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder ({path})")


def _glob_match(path: str, pattern: str) -> bool:
    """Glob matching as for local paths: ``*`` stays within one folder unless the pattern has ``**``."""
    if "**" not in pattern and path.count("/") != pattern.count("/"):
        return False
    return fnmatch.fnmatchcase(path, pattern)


def _expand_remote(item: str, fs: Any, fs_path: str) -> tuple[list[str], str]:
    """Files (as fs paths) for one entry on a pyarrow filesystem."""
    if any(c in fs_path for c in _GLOB_CHARS):
        parts = fs_path.split("/")
        fixed = next(i for i, p in enumerate(parts) if any(c in p for c in _GLOB_CHARS))
        base = "/".join(parts[:fixed])
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and _glob_match(i.path, fs_path)]
        return files, f"glob {item!r} ({len(files)} matches)"
    info = fs.get_file_info(fs_path)
    if info.type == pafs.FileType.Directory:
        def read_text(p: str) -> str:
            with fs.open_input_stream(p) as f:
                return f.read().decode("utf-8")
        listed = _hf_state_files(read_text, fs_path)
        if listed is not None:
            return listed, f"Hugging Face dataset folder {item!r} (state.json)"
        infos = fs.get_file_info(pafs.FileSelector(fs_path, recursive=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and _has_shard_extension(i.path)]
        return files, f"folder {item!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if info.type == pafs.FileType.File:
        return [fs_path], f"file {item!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder")


def _expand(item: Any, filesystem: Any) -> tuple[list[_Location], str]:
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if not isinstance(item, str):
        raise TypeError(f"a shard source must be a path, URL, glob or a list of them; got {type(item).__name__}")
    if filesystem is not None and not isinstance(filesystem, pafs.LocalFileSystem):
        parsed = urllib.parse.urlparse(item)
        fs_path = parsed.netloc + parsed.path if _is_url(item) else item
        files, searched = _expand_remote(item, filesystem, fs_path)
        return [_Location(p, filesystem, p) for p in files], searched
    if item.startswith("file://"):
        item = urllib.parse.unquote(urllib.parse.urlparse(item).path)
    if filesystem is not None or not _is_url(item):
        files, searched = _expand_local(item)
        return [_Location(p, None, p) for p in files], searched
    fs, fs_path = _filesystem_for(item)
    if isinstance(fs, pafs.LocalFileSystem):
        files, searched = _expand_local(fs_path)
        return [_Location(p, None, p) for p in files], searched
    scheme = urllib.parse.urlparse(item).scheme
    files, searched = _expand_remote(item, fs, fs_path)
    return [_Location(_url_for(scheme, p), fs, p) for p in files], searched


def resolve_source(source: Any, filesystem: Any = None) -> list[_Location]:
    """Sorted, de-duplicated shard locations for a source (see `ShardDataset`)."""
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ValueError("the shard source is an empty list; pass a folder, glob, file or URL")
    found: dict[str, _Location] = {}
    searched = []
    for item in items:
        locations, what = _expand(item, filesystem)
        searched.append(what)
        for loc in locations:
            found.setdefault(loc.path, loc)
    if not found:
        raise SourceNotFoundError(
            "no shard files match the source; searched " + "; ".join(searched)
            + f". Shards are {ACCEPTED} files; in folders only names ending in "
            + ", ".join(SHARD_EXTENSIONS) + " are taken (name a file directly to use another name)")
    return [found[p] for p in sorted(found)]


# --------------------------------------------------------------------------- file access


def _open_random(loc: _Location) -> Any:
    """A random-access pyarrow file: a memory map for local files."""
    try:
        if loc.fs is None:
            return pa.memory_map(loc.fs_path, "r")
        return loc.fs.open_input_file(loc.fs_path)
    except (OSError, pa.ArrowException) as error:
        raise ShardReadError(f"cannot open shard {loc.path}: {error}") from error


def _read_at(f: Any, nbytes: int, offset: int) -> bytes:
    data = f.read_at(nbytes, offset)
    return data.to_pybytes() if isinstance(data, pa.Buffer) else bytes(data)


def _sniff(loc: _Location, f: Any, size: int) -> str:
    """The format from the first bytes: ``ARROW1`` (IPC file), ``PAR1`` (Parquet), 0xFFFFFFFF (stream)."""
    head = _read_at(f, min(8, size), 0)
    if head.startswith(b"ARROW1"):
        return "ipc_file"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(_CONTINUATION):
        return "ipc_stream"
    if len(head) == 8:
        # A legacy stream (Arrow < 0.15) starts directly with the metadata length.
        length = struct.unpack("<i", head[:4])[0]
        if 0 < length < size and _legacy_stream_opens(f):
            return "ipc_stream"
    what = "an empty file" if size == 0 else (
        "Feather v1 (not supported)" if head.startswith(b"FEA1") else f"starts with {head[:8]!r}")
    raise ShardReadError(f"{loc.path} is not an Arrow IPC or Parquet file ({what}). Accepted formats: "
                         f"{ACCEPTED}; remove the file from the source or convert it (e.g. `audioloader pack`)")


def _legacy_stream_opens(f: Any) -> bool:
    try:
        f.seek(0)
        pa.ipc.open_stream(f)
        return True
    except (pa.ArrowException, OSError, EOFError):
        return False


def _fb_field(buf: bytes, table: int, slot: int) -> int | None:
    """Absolute position of field ``slot`` of the flatbuffer table at ``table``, or None if absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vtable_size = struct.unpack_from("<H", buf, vtable)[0]
    entry = 4 + 2 * slot
    if entry >= vtable_size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + entry)[0]
    return table + offset if offset else None


def _message_header(meta: bytes) -> tuple[int, int, int]:
    """``(header type, body length, rows)`` of an IPC ``Message`` flatbuffer (Message.fbs).

    Reading just this lets remote streams be indexed without downloading bodies.
    """
    root = struct.unpack_from("<I", meta, 0)[0]
    pos = _fb_field(meta, root, 1)
    header_type = meta[pos] if pos is not None else 0
    pos = _fb_field(meta, root, 3)
    body_length = struct.unpack_from("<q", meta, pos)[0] if pos is not None else 0
    rows = 0
    pos = _fb_field(meta, root, 2)
    if header_type == _MSG_RECORD_BATCH and pos is not None:
        batch = pos + struct.unpack_from("<I", meta, pos)[0]
        length_pos = _fb_field(meta, batch, 0)
        rows = struct.unpack_from("<q", meta, length_pos)[0] if length_pos is not None else 0
    return header_type, body_length, rows


def _scan_messages(f: Any, start: int, end: int) -> list[tuple[int, int, int]]:
    """``[(offset, header type, rows)]`` of the IPC messages in ``[start, end)``, reading headers only."""
    messages, pos = [], start
    while pos + 8 <= end:
        head = _read_at(f, min(4096, end - pos), pos)
        prefix = 8 if head.startswith(_CONTINUATION) else 4
        meta_length = struct.unpack_from("<i", head, prefix - 4)[0]
        if meta_length == 0:  # end-of-stream marker
            break
        if meta_length < 0 or pos + prefix + meta_length > end:
            raise ValueError(f"message at byte {pos} runs past the end of the file (truncated?)")
        meta = head[prefix:prefix + meta_length]
        if len(meta) < meta_length:
            meta = _read_at(f, meta_length, pos + prefix)
        header_type, body_length, rows = _message_header(meta)
        messages.append((pos, header_type, rows))
        pos += prefix + meta_length + body_length
        if pos > end:
            raise ValueError(f"message body at byte {pos} runs past the end of the file (truncated?)")
    return messages


@dataclass
class _FileMeta:
    """What construction learns about one file (internal)."""

    format: str
    size: int
    schema: pa.Schema
    unit_rows: tuple[int, ...]
    # IPC stream: byte offset of each record batch message, for seeking.
    offsets: tuple[int, ...] | None = None


def _scan_ipc_file(f: Any, local: bool) -> tuple[pa.Schema, tuple[int, ...]]:
    reader = pa.ipc.open_file(f)
    n = reader.num_record_batches
    if local:  # zero-copy: touches only message headers
        return reader.schema, tuple(reader.get_batch(i).num_rows for i in range(n))
    # Remote: read headers only, never bodies (the footer gives their count).
    footer_length = struct.unpack("<i", _read_at(f, 4, f.size() - 10))[0]
    messages = _scan_messages(f, 8, f.size() - 10 - footer_length)
    rows = tuple(r for _, t, r in messages if t == _MSG_RECORD_BATCH)
    if len(rows) != n:  # an unusual writer: fall back to the footer's blocks
        included = pa.ipc.IpcReadOptions(included_fields=[0])
        reader = pa.ipc.open_file(f, options=included)
        rows = tuple(reader.get_batch(i).num_rows for i in range(n))
    return reader.schema, rows


def _scan_ipc_stream(f: Any, size: int) -> tuple[pa.Schema, tuple[int, ...], tuple[int, ...]]:
    messages = _scan_messages(f, 0, size)
    if not messages or messages[0][1] != _MSG_SCHEMA:
        raise ValueError("the stream does not start with a schema message")
    if any(t == _MSG_DICTIONARY for _, t, _ in messages):
        raise ValueError("dictionary-encoded columns in an IPC stream are not supported; "
                         "cast them to plain types or write the IPC file format")
    first_batch = next((pos for pos, t, _ in messages if t == _MSG_RECORD_BATCH), size)
    schema = pa.ipc.read_schema(pa.py_buffer(_read_at(f, first_batch, 0)))
    batches = [(pos, rows) for pos, t, rows in messages if t == _MSG_RECORD_BATCH]
    return schema, tuple(r for _, r in batches), tuple(p for p, _ in batches)


def _scan_file(loc: _Location) -> _FileMeta:
    """Format, size, schema and batch / row-group boundaries of one file, without reading audio."""
    f = _open_random(loc)
    try:
        size = f.size()
        fmt = _sniff(loc, f, size)
        offsets = None
        if fmt == "ipc_file":
            schema, rows = _scan_ipc_file(f, loc.fs is None)
        elif fmt == "ipc_stream":
            schema, rows, offsets = _scan_ipc_stream(f, size)
        else:
            metadata = pq.ParquetFile(f).metadata
            schema = metadata.schema.to_arrow_schema()
            rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
        return _FileMeta(fmt, size, schema, rows, offsets)
    except ShardReadError:
        raise
    except (OSError, EOFError, ValueError, struct.error, IndexError, pa.ArrowException) as error:
        raise ShardReadError(f"cannot read shard {loc.path}: {str(error).rstrip('.')}. The file may be truncated or "
                             f"corrupt; re-write it or remove it from the source ({ACCEPTED})") from error
    finally:
        f.close()


def _scan_all(locations: list[_Location]) -> list[_FileMeta]:
    if len(locations) < 4:
        return [_scan_file(loc) for loc in locations]
    with ThreadPoolExecutor(max_workers=min(_SCAN_THREADS, len(locations)),
                            thread_name_prefix="audioloader-scan") as pool:
        return list(pool.map(_scan_file, locations))


# --------------------------------------------------------------------------- schema


def _is_binary(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or (hasattr(pa.types, "is_binary_view") and pa.types.is_binary_view(t)))


def _check_audio_type(path: str, name: str, t: pa.DataType) -> None:
    if _is_binary(t):
        return
    if pa.types.is_struct(t):
        index = t.get_field_index("bytes")
        if index >= 0 and _is_binary(t.field(index).type):
            return
    raise SchemaError(f"{path}: audio column {name!r} has type {t}; expected binary or large_binary "
                      "(encoded audio bytes) or a struct with a binary 'bytes' field (Hugging Face Audio, "
                      "struct<bytes: binary, path: string>). Pass audio_column= naming the column that holds "
                      "the encoded audio, or re-write the shards with `audioloader pack`")


def _check_label_type(path: str, name: str, t: pa.DataType) -> None:
    if not pa.types.is_integer(t):
        raise SchemaError(f"{path}: label column {name!r} has type {t}; expected an integer type (class ids). "
                          "Map labels to integers (e.g. Hugging Face ClassLabel), pass label_column= naming an "
                          "integer column, or label_column=None for unlabeled data")


def _check_schema(path: str, schema: pa.Schema, audio: str, label: str | None, extras: Sequence[str]) -> None:
    available = ", ".join(repr(n) for n in schema.names) or "(none)"
    for role, name in [("audio", audio), ("label", label)] + [("extra", c) for c in extras]:
        if name is not None and schema.get_field_index(name) < 0:
            fix = {"audio": "Pass audio_column= with one of them",
                   "label": "Pass label_column= with one of them, or label_column=None for unlabeled data",
                   "extra": "Fix columns= (the extra columns to carry) to name existing columns"}[role]
            raise SchemaError(f"{path}: {role} column {name!r} not found; available columns: {available}. {fix}")
    _check_audio_type(path, audio, schema.field(audio).type)
    if label is not None:
        _check_label_type(path, label, schema.field(label).type)


def _label_names(schema: pa.Schema, label: str | None) -> list[str] | None:
    """Class names from our writer's ``audioloader`` metadata or a Hugging Face ClassLabel."""
    metadata = schema.metadata or {}
    try:
        if b"audioloader" in metadata:
            labels = json.loads(metadata[b"audioloader"]).get("labels")
            if isinstance(labels, list):
                return [str(x) for x in labels]
        if label is not None and b"huggingface" in metadata:
            feature = json.loads(metadata[b"huggingface"])["info"]["features"].get(label, {})
            if feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
                return [str(x) for x in feature["names"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # foreign or malformed metadata: names are optional
    return None


# --------------------------------------------------------------------------- splits


def _file_splits(file_id: int, unit_rows: Sequence[int], split_rows: int, divide_units: bool) -> list[Split]:
    """Splits of one file: consecutive units merged up to ``split_rows`` rows.

    With ``divide_units`` (IPC, where slicing a batch is zero-copy) a unit with
    more than ``2 * split_rows`` rows is cut into near-equal row ranges.
    """
    ranges: list[tuple[int, int]] = []
    acc_start = acc_rows = pos = 0
    for rows in unit_rows:
        if rows == 0:
            continue
        if divide_units and rows > 2 * split_rows:
            if acc_rows:
                ranges.append((acc_start, pos))
                acc_rows = 0
            pieces = -(-rows // split_rows)
            ranges.extend((pos + rows * k // pieces, pos + rows * (k + 1) // pieces) for k in range(pieces))
        else:
            if acc_rows and acc_rows + rows > split_rows:
                ranges.append((acc_start, pos))
                acc_rows = 0
            if acc_rows == 0:
                acc_start = pos
            acc_rows += rows
        pos += rows
    if acc_rows:
        ranges.append((acc_start, pos))
    return [Split(-1, file_id, a, b) for a, b in ranges]


def _numbered(splits: Sequence[Split]) -> list[Split]:
    ordered = sorted(splits, key=lambda s: (s.file_id, s.start))
    return [Split(i, s.file_id, s.start, s.stop) for i, s in enumerate(ordered)]


def subdivide(splits: Sequence[Split], count: int) -> list[Split]:
    """At least ``count`` splits (when there are that many rows): halve the largest until there are.

    Deterministic: the largest split (ties: lowest ``split_id``) is cut in half
    each step; the result is renumbered in (file, row) order. Used so every rank
    has data when ``world_size`` exceeds the natural number of splits.
    """
    if len(splits) >= count:
        return list(splits)
    heap = [(-s.num_rows, s.split_id, s) for s in splits]
    heapq.heapify(heap)
    serial = len(splits)
    while len(heap) < count and heap and -heap[0][0] > 1:
        _, _, s = heapq.heappop(heap)
        middle = s.start + s.num_rows // 2
        for part in (Split(-1, s.file_id, s.start, middle), Split(-1, s.file_id, middle, s.stop)):
            heapq.heappush(heap, (-part.num_rows, serial, part))
            serial += 1
    return _numbered([s for _, _, s in heap])


# --------------------------------------------------------------------------- readers


class _IpcFileHandle:
    """Random access to one IPC file's record batches, projected to the used columns."""

    def __init__(self, f: Any, schema: pa.Schema, columns: Sequence[str], local: bool):
        self._file, self._columns = f, list(columns)
        if local:
            # On a memory map every read is a zero-copy view; included_fields would copy.
            self._reader = pa.ipc.open_file(f)
        else:
            # Remotely, fetch only the used columns' buffers.
            included = sorted(schema.get_field_index(c) for c in columns)
            self._reader = pa.ipc.open_file(f, options=pa.ipc.IpcReadOptions(included_fields=included))

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return [self._reader.get_batch(i).select(self._columns)]

    def close(self) -> None:
        self._file.close()


class _IpcStreamHandle:
    """Random access to one IPC stream's record batches via the message offsets found at construction."""

    def __init__(self, f: Any, schema: pa.Schema, offsets: Sequence[int], columns: Sequence[str]):
        self._file, self._schema, self._offsets, self._columns = f, schema, offsets, list(columns)

    def unit(self, i: int) -> list[pa.RecordBatch]:
        self._file.seek(self._offsets[i])
        message = pa.ipc.read_message(self._file)
        return [pa.ipc.read_record_batch(message, self._schema).select(self._columns)]

    def close(self) -> None:
        self._file.close()


class _ParquetHandle:
    """One Parquet file: a unit is a row group, read whole (Parquet cannot seek inside one)."""

    def __init__(self, f: Any, columns: Sequence[str]):
        self._file = f
        self._parquet = pq.ParquetFile(f)
        self._columns = list(columns)

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return self._parquet.read_row_group(i, columns=self._columns).to_batches()

    def close(self) -> None:
        self._file.close()


def _audio_values(column: pa.Array) -> tuple[list[Any], np.ndarray | None]:
    """Per-row zero-copy ``pyarrow.Buffer`` views (``None`` for nulls), and the null mask or None.

    For a struct column (Hugging Face Audio) the ``bytes`` field is used; a row is
    null when the struct or its bytes are null.
    """
    valid = None
    if pa.types.is_struct(column.type):
        if column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False)
        column = column.field("bytes")
    if column.null_count:
        child_valid = column.is_valid().to_numpy(zero_copy_only=False)
        valid = child_valid if valid is None else valid & child_valid
    n = len(column)
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        _, offsets_buf, data = column.buffers()
        dtype = np.int32 if pa.types.is_binary(column.type) else np.int64
        offsets = np.frombuffer(offsets_buf, dtype=dtype)[column.offset:column.offset + n + 1].tolist()
        if data is None:
            data = pa.py_buffer(b"")
        values = [data.slice(offsets[i], offsets[i + 1] - offsets[i]) for i in range(n)]
    else:  # binary_view and other layouts: per-scalar (still zero-copy)
        values = [column[i].as_buffer() if column[i].is_valid else None for i in range(n)]
    if valid is not None:
        values = [v if ok else None for v, ok in zip(values, valid.tolist(), strict=True)]
    return values, None if valid is None else ~valid


# --------------------------------------------------------------------------- dataset


class ShardDataset:
    """The shard files of a source: metadata, splits, schema checks and reads.

    Args:
        source: a folder (searched recursively for ``.arrow .ipc .feather .parquet .pq``;
            a Hugging Face ``save_to_disk`` folder uses its ``state.json``), a glob, a file
            (any name: the format is sniffed), a URL (``s3://``, ``gs://``, ``file://``,
            any fsspec scheme), or a list of these.
        audio_column: encoded audio, binary/large_binary or a struct with a binary ``bytes`` field.
        label_column: integer class ids, or ``None`` for unlabeled data.
        columns: extra columns carried with each row (any type, converted to Python values).
        split_rows: target rows per split (batches / row groups are merged up to this).
        filesystem: a ``pyarrow.fs.FileSystem`` in which the source paths are resolved.

    Attributes:
        files: the `ShardFile` list, sorted by path.
        splits: the `Split` list in (file, row) order.
        num_rows: total rows.
        schema: the first file's full schema (with its metadata).
        label_names: class names from schema metadata, or ``None``.

    Raises:
        SourceNotFoundError: nothing matches the source (a ``ShardReadError`` and ``FileNotFoundError``).
        ShardReadError: a file is not Arrow/Parquet, or is truncated/unreadable.
        SchemaError: a column is missing, has the wrong type, or files disagree.
        ValueError: bad arguments, or the source has no rows.
    """

    def __init__(self, source: Any, *, audio_column: str = "audio", label_column: str | None = "label",
                 columns: Sequence[str] = (), split_rows: int = 512, filesystem: Any = None):
        self.audio_column, self.label_column = audio_column, label_column
        self.columns = self._check_arguments(audio_column, label_column, columns, split_rows, filesystem)
        self.split_rows = split_rows
        self._locations = resolve_source(source, filesystem)
        metas = _scan_all(self._locations)
        self._check_schemas(metas)
        self._metas = metas
        self.files = self._make_files(metas)
        self.num_rows = sum(f.num_rows for f in self.files)
        if self.num_rows == 0:
            raise ValueError(f"the source has no rows: {len(self.files)} file(s), all empty "
                             f"(first: {self.files[0].path}); write rows into the shards or pass another source")
        self._offsets = [f.index_offset for f in self.files]
        self._unit_starts = [tuple(np.cumsum((0, *f.batch_rows)).tolist()) for f in self.files]
        self.splits = _numbered([s for i, f in enumerate(self.files) for s in
                                 _file_splits(i, f.batch_rows, split_rows, f.format != "parquet")])
        self.schema = metas[0].schema
        self.label_names = _label_names(self.schema, label_column)
        self._tls = threading.local()

    # ----------------------------------------------------------------- construction helpers

    @staticmethod
    def _check_arguments(audio: Any, label: Any, columns: Any, split_rows: Any, filesystem: Any) -> list[str]:
        if not isinstance(audio, str) or not audio:
            raise TypeError(f"audio_column must be a column name (str), got {audio!r}")
        if label is not None and (not isinstance(label, str) or not label):
            raise TypeError(f"label_column must be a column name (str) or None, got {label!r}")
        if isinstance(columns, str):
            raise TypeError(f"columns must be a sequence of column names, got the string {columns!r}; "
                            f"use columns=[{columns!r}]")
        extras = list(columns)
        for c in extras:
            if not isinstance(c, str):
                raise TypeError(f"columns must hold column names (str), got {c!r}")
            if c in (audio, label):
                raise ValueError(f"columns={extras!r} repeats the audio/label column {c!r}; list only extra columns")
        if len(set(extras)) != len(extras):
            raise ValueError(f"columns={extras!r} names a column twice")
        if isinstance(split_rows, bool) or not isinstance(split_rows, int) or split_rows < 1:
            raise ValueError(f"split_rows must be a positive int, got {split_rows!r}")
        if filesystem is not None and not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}; "
                            "wrap an fsspec filesystem with pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))")
        return extras

    def _check_schemas(self, metas: list[_FileMeta]) -> None:
        used = [self.audio_column, *([self.label_column] if self.label_column else []), *self.columns]
        first = None
        for loc, meta in zip(self._locations, metas, strict=True):
            _check_schema(loc.path, meta.schema, self.audio_column, self.label_column, self.columns)
            if first is None:
                first = (loc, meta)
                continue
            for name in used:
                theirs, ours = first[1].schema.field(name).type, meta.schema.field(name).type
                if theirs != ours:
                    raise SchemaError(f"column {name!r} has type {theirs} in {first[0].path} but {ours} in "
                                      f"{loc.path}; all shards must agree on the used columns. Re-write the "
                                      "odd shards with the same schema, or read them as separate sources")

    def _make_files(self, metas: list[_FileMeta]) -> list[ShardFile]:
        files, offset = [], 0
        for loc, meta in zip(self._locations, metas, strict=True):
            rows = sum(meta.unit_rows)
            files.append(ShardFile(loc.path, meta.format, meta.size, rows, meta.unit_rows, offset))
            offset += rows
        return files

    # ----------------------------------------------------------------- identity

    @property
    def used_columns(self) -> list[str]:
        """Columns read from the files: audio, label (if any), extras."""
        return [self.audio_column, *([self.label_column] if self.label_column else []), *self.columns]

    def fingerprint(self) -> dict[str, Any]:
        """Plain data identifying what reads depend on: files (path, size, rows), columns, split size."""
        return {
            "files": [[f.path, f.size, f.num_rows] for f in self.files],
            "columns": {"audio": self.audio_column, "label": self.label_column, "extras": list(self.columns)},
            "split_rows": self.split_rows,
        }

    def locate(self, index: int) -> tuple[int, int]:
        """``(file_id, row in file)`` of a global row index; IndexError when out of range."""
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"a row index must be an int, got {type(index).__name__} {index!r}") from None
        if not 0 <= index < self.num_rows:
            raise IndexError(f"row index {index!r} is out of range: the source has {self.num_rows} rows "
                             f"(indices 0..{self.num_rows - 1}) in {len(self.files)} file(s)")
        file_id = bisect.bisect_right(self._offsets, index) - 1
        return file_id, index - self._offsets[file_id]

    # ----------------------------------------------------------------- reads

    def _handle(self, file_id: int) -> Any:
        """This thread's open handle for a file (an LRU per thread, so reads are thread-safe)."""
        cache: OrderedDict[int, Any] | None = getattr(self._tls, "handles", None)
        if cache is None:
            cache = self._tls.handles = OrderedDict()
        handle = cache.get(file_id)
        if handle is not None:
            cache.move_to_end(file_id)
            return handle
        handle = self._open_handle(file_id)
        cache[file_id] = handle
        if len(cache) > _HANDLES_PER_THREAD:
            cache.popitem(last=False)[1].close()
        return handle

    def _open_handle(self, file_id: int) -> Any:
        loc, meta = self._locations[file_id], self._metas[file_id]
        f = _open_random(loc)
        try:
            if meta.format == "ipc_file":
                return _IpcFileHandle(f, meta.schema, self.used_columns, loc.fs is None)
            if meta.format == "ipc_stream":
                return _IpcStreamHandle(f, meta.schema, meta.offsets or (), self.used_columns)
            return _ParquetHandle(f, self.used_columns)
        except (OSError, pa.ArrowException) as error:
            f.close()
            raise ShardReadError(f"cannot open shard {loc.path}: {error}") from error

    def _read_unit(self, file_id: int, unit: int) -> list[pa.RecordBatch]:
        try:
            return self._handle(file_id).unit(unit)
        except ShardReadError:
            raise
        except (OSError, EOFError, pa.ArrowException) as error:
            path = self.files[file_id].path
            raise ShardReadError(f"cannot read batch/row group {unit} of shard {path}: {error}. "
                                 "Was the file changed or truncated after the loader was built?") from error

    def read_split(self, split: Split, start_row: int = 0) -> Iterator[pa.RecordBatch]:
        """Record batches holding rows ``[split.start + start_row, split.stop)`` of the split's file.

        Only the used columns; zero-copy for local IPC files and streams (slices of
        the memory map). Batches before ``start_row`` are not read; a Parquet row
        group is read whole and sliced.
        """
        begin, stop = split.start + start_row, split.stop
        starts = self._unit_starts[split.file_id]
        unit = bisect.bisect_right(starts, begin) - 1
        while begin < stop and unit < len(starts) - 1:
            if starts[unit + 1] > begin:
                yield from _slice_batches(self._read_unit(split.file_id, unit), starts[unit], begin, stop)
                begin = starts[unit + 1]
            unit += 1

    def columns_of(self, batch: pa.RecordBatch) -> BatchColumns:
        """The used columns of a batch as per-row Python values (one conversion per batch)."""
        audio, audio_null = _audio_values(batch.column(self.audio_column))
        labels = label_null = None
        if self.label_column is not None:
            label_array = batch.column(self.label_column)
            labels = label_array.to_pylist()
            if label_array.null_count:
                label_null = ~label_array.is_valid().to_numpy(zero_copy_only=False)
        extras = [(name, batch.column(name).to_pylist()) for name in self.columns]
        problems = None
        if audio_null is not None or label_null is not None:
            problems = [None] * batch.num_rows
            if label_null is not None:
                for i in np.flatnonzero(label_null).tolist():
                    problems[i] = "label is null"
            if audio_null is not None:
                for i in np.flatnonzero(audio_null).tolist():
                    problems[i] = "audio is null"
        return BatchColumns(audio, labels, extras, problems)

    def read_rows(self, indices: Sequence[int]) -> list[ShardRow]:
        """Random access: one `ShardRow` per index, in the given order (duplicates allowed).

        Each needed record batch / row group is read once. Safe to call from any
        thread (each thread has its own file handles).
        """
        located = [(self.locate(i), k) for k, i in enumerate(indices)]
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for (file_id, row), k in located:
            unit = bisect.bisect_right(self._unit_starts[file_id], row) - 1
            groups.setdefault((file_id, unit), []).append((row, k))
        out: list[ShardRow | None] = [None] * len(located)
        for (file_id, unit), rows in sorted(groups.items()):  # file order reuses open handles
            batches = self._read_unit(file_id, unit)
            unit_start = self._unit_starts[file_id][unit]
            for row, k in rows:
                batch, at = _batch_at(batches, row - unit_start)
                out[k] = self._row_from(batch.slice(at, 1), file_id, row)
        return out  # type: ignore[return-value]

    def _row_from(self, one_row: pa.RecordBatch, file_id: int, row: int) -> ShardRow:
        cols = self.columns_of(one_row)
        f = self.files[file_id]
        return ShardRow(f.index_offset + row, f.path, row, cols.audio[0],
                        cols.labels[0] if cols.labels is not None else None,
                        {name: values[0] for name, values in cols.extras})

    # ----------------------------------------------------------------- pickling

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_tls"]  # open handles stay with the process that opened them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tls = threading.local()

    def __repr__(self) -> str:
        formats = sorted({f.format for f in self.files})
        return (f"ShardDataset({len(self.files)} files ({', '.join(formats)}), {self.num_rows} rows, "
                f"{len(self.splits)} splits, audio={self.audio_column!r}, label={self.label_column!r})")


def _batch_at(batches: Sequence[pa.RecordBatch], row: int) -> tuple[pa.RecordBatch, int]:
    """The batch of a unit holding ``row`` (counted from the unit's start) and the row within it."""
    for batch in batches:
        if row < batch.num_rows:
            return batch, row
        row -= batch.num_rows
    raise IndexError(f"row {row} past the end of the unit")


def _slice_batches(batches: Sequence[pa.RecordBatch], unit_start: int, begin: int,
                   stop: int) -> Iterator[pa.RecordBatch]:
    """The parts of a unit's batches (unit starts at file row ``unit_start``) in rows ``[begin, stop)``."""
    pos = unit_start
    for batch in batches:
        lo, hi = max(begin, pos), min(stop, pos + batch.num_rows)
        if lo < hi:
            yield batch if hi - lo == batch.num_rows else batch.slice(lo - pos, hi - lo)
        pos += batch.num_rows
