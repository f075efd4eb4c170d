"""File access and format scanning: opening shards, sniffing the format, reading metadata and IPC headers."""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ShardReadError
from .sources import ACCEPTED, _Location

FORMATS = ("ipc_file", "ipc_stream", "parquet")

# Files scanned in parallel at construction (remote metadata reads are latency-bound).
_SCAN_THREADS = 8

_CONTINUATION = b"\xff\xff\xff\xff"
_MSG_SCHEMA, _MSG_DICTIONARY, _MSG_RECORD_BATCH = 1, 2, 3


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
