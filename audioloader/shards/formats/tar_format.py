"""WebDataset tar shards and plain audio files as files of units: a unit is a run of whole samples, one contiguous
byte range, so splits, read-ahead, cache, identity checks and resume work on them as on Arrow record batches.

A tar file's members are grouped into samples by WebDataset's rule: consecutive members
sharing a key, the member name up to the first dot of its last path part
(``a/b/clip01.flac`` and ``a/b/clip01.json`` are sample ``a/b/clip01``). A sample's columns:

==============  ===========  ===========================================================================
column          type         from
==============  ===========  ===========================================================================
``__key__``     string       the sample's key
``audio``       binary       the first member with an audio extension (`AUDIO_EXTENSIONS`); null if none
``label``       int64        the ``.cls`` member (an integer as text), when a sample of the file has one
``text``        string       the ``.txt`` member
JSON fields     inferred     each top-level field of the ``.json`` member (its type inferred over the file)
other           string       any other member, as UTF-8 text, named by its extension
==============  ===========  ===========================================================================

Only headers are read to find samples (and the ``.json`` members, for their fields' types);
a unit's bytes are read in one range when its rows are read, and its members parsed from
memory (`TarHandle`). Compressed tars cannot be read by range: `gzip_refusal` says to pack them.

A plain audio file (``clips/a.flac``) is a file of one unit of one row: ``audio`` is the whole file
(`plain_meta`, `PlainHandle`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ShardReadError
from ..sources.resolve import AUDIO_EXTENSIONS

#: A unit of a tar holds whole samples up to this many bytes (at least one sample) ...
UNIT_BYTES = 1024 * 1024
#: ... and at most this many samples: what a random access (`ShardDataset.read_rows`) reads for one row.
UNIT_SAMPLES = 64

_BLOCK = 512
_KEY, _AUDIO = "__key__", "audio"
#: Member extensions with a column of their own (the rest: strings named by their extension).
_NAMED = {"cls": ("label", pa.int64()), "txt": ("text", pa.string())}

ReadAt = Callable[[int, int], Any]  # (offset, length) -> bytes-like


def gzip_refusal(path: str) -> ShardReadError:
    """The error for a compressed tar (or any gzip file) met as a shard."""
    return ShardReadError(f"{path} is compressed (gzip): a compressed tar cannot be read by byte range. Convert it "
                          "once with `audioloader pack --from webdataset SOURCE OUT` (or un-gzip it to a plain .tar)")


def _number(field: bytes) -> int:
    """A tar header's numeric field: octal text, or GNU base-256 (high bit set)."""
    if field and field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "replace")


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, or None."""
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "replace")
        pos += length
    return None


def members(read_at: ReadAt, start: int, end: int) -> Iterator[tuple[str, int, int, int]]:
    """``(name, first header offset, data offset, size)`` of each regular file member in bytes ``[start, end)``.

    ``read_at(offset, length)`` reads the archive. The first header offset includes a GNU long
    name or pax header that precedes the member. Directories and other entries are skipped.
    """
    pos, long_name, first = start, None, None
    while pos + _BLOCK <= end:
        header = bytes(read_at(pos, _BLOCK))
        if header == b"\0" * _BLOCK:  # end of archive
            return
        if first is None:
            first = pos
        unsigned = sum(header) - sum(header[148:156]) + 32 * 8
        stored = _number(header[148:156])
        # Old tars summed signed bytes (as tarfile allows): counted only when the unsigned sum does not match.
        if stored != unsigned and stored != unsigned - 256 * sum(b >= 128 for b in header[:148] + header[156:]):
            raise ValueError(f"tar header at byte {pos} has a bad checksum (not a tar file, or corrupt)")
        size, kind = _number(header[124:136]), header[156:157]
        data = pos + _BLOCK
        following = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK
        if kind in (b"L", b"x"):  # the next member's name (GNU long name, pax header)
            body = bytes(read_at(data, size))
            long_name = _text(body) if kind == b"L" else _pax_path(body) or long_name
        elif kind in (b"0", b"\0", b"7"):
            name = long_name
            if name is None:
                name = _text(header[0:100])
                if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
                    name = _text(header[345:500]) + "/" + name
            yield name, first, data, size
            long_name = first = None
        else:  # directories, links, global headers
            long_name = first = None
        pos = following


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name by WebDataset's rule (the extension lower-cased)."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def samples(listed: list[tuple[str, int, int, int]]) -> list[tuple[str, list[tuple[str, int, int, int]]]]:
    """Members grouped into samples: ``(key, members)`` for each run of consecutive members sharing a key."""
    grouped: list[tuple[str, list[tuple[str, int, int, int]]]] = []
    for member in listed:
        key, _ = split_name(member[0])
        if grouped and grouped[-1][0] == key:
            grouped[-1][1].append(member)
        else:
            grouped.append((key, [member]))
    return grouped


def _padded_end(member: tuple[str, int, int, int]) -> int:
    return member[2] + (member[3] + _BLOCK - 1) // _BLOCK * _BLOCK


def _json_type(values: list[Any]) -> pa.DataType:
    """The Arrow type of a JSON field's values over a file; mixed or unconvertible values: JSON text."""
    try:
        t = pa.array(values).type
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        return pa.string()
    return pa.string() if pa.types.is_null(t) else t


def scan_tar(read_at: ReadAt, size: int, path: str, digest: Any) -> tuple[pa.Schema, tuple[int, ...],
                                                                           tuple[tuple[int, int, int], ...]]:
    """Schema, rows a unit and each unit's ``(offset, 0, length)`` block of a tar file of ``size`` bytes.

    Reads every header and the ``.json`` members (for their fields' types); ``digest`` (hashlib)
    is fed every member's name, offset and size.
    """
    grouped = samples(list(members(read_at, 0, size)))
    extensions: dict[str, None] = {}
    json_fields: dict[str, list[Any]] = {}
    ranges = []
    for n, (_, listed) in enumerate(grouped):
        start, stop = listed[0][1], _padded_end(listed[-1])
        for name, _, data, length in listed:
            digest.update(f"{name}\0{data}\0{length}\n".encode())
            extension = split_name(name)[1]
            if extension == "json":
                fields = _parse_json(read_at(data, length), path, name)
                for field in json_fields:
                    json_fields[field].append(fields.get(field))
                for field, value in fields.items():
                    if field not in json_fields:
                        json_fields[field] = [None] * n + [value]
            elif extension not in AUDIO_EXTENSIONS:
                extensions.setdefault(extension, None)
        for values in json_fields.values():
            values.extend([None] * (n + 1 - len(values)))
        ranges.append((start, stop))
    unit_rows, blocks = _grouped_units(ranges)
    fields = [pa.field(_KEY, pa.string()), pa.field(_AUDIO, pa.binary())]
    named = set()
    for extension in extensions:
        column, t = _NAMED.get(extension, (extension, pa.string()))
        if extension != "json" and column not in (_KEY, _AUDIO):
            fields.append(pa.field(column, t))
            named.add(column)
    fields += [pa.field(f, _json_type(v)) for f, v in json_fields.items() if f not in named and f not in (_KEY,
                                                                                                          _AUDIO)]
    return pa.schema(fields, metadata={b"audioloader_container": b"webdataset"}), unit_rows, blocks


def _grouped_units(ranges: list[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[tuple[int, int, int], ...]]:
    """Rows a unit and each unit's ``(offset, 0, length)``: consecutive rows (``[start, stop)`` byte ranges, in
    order) merged up to `UNIT_BYTES` and `UNIT_SAMPLES`."""
    unit_rows: list[int] = []
    blocks: list[tuple[int, int, int]] = []
    for start, stop in ranges:
        if blocks and unit_rows[-1] < UNIT_SAMPLES and max(stop, blocks[-1][0] + blocks[-1][2]) - blocks[-1][0] \
                <= UNIT_BYTES:
            offset = blocks[-1][0]
            blocks[-1] = (offset, 0, max(stop, offset + blocks[-1][2]) - offset)
            unit_rows[-1] += 1
        else:
            blocks.append((start, 0, stop - start))
            unit_rows.append(1)
    return tuple(unit_rows), tuple(blocks)


def _joinable(name: str, joined: Any) -> bool:
    """Whether a member can be a row's audio: any member joined by its name (NeMo), an audio one by its key."""
    return joined.by == "name" or split_name(name)[1].rsplit(".", 1)[-1] in AUDIO_EXTENSIONS


def scan_joined(read_at: ReadAt, size: int, path: str, digest: Any, joined: Any) -> tuple[
        pa.Schema, tuple[int, ...], tuple[tuple[int, int, int], ...], Any]:
    """`scan_tar` of a tar whose rows come from a set's manifest (`tarred_sets.JoinedRows`), and those rows in the
    tar's order (a file's rows are numbered in the order of their members in it): each row's range is its audio
    member's."""
    listed = list(members(read_at, 0, size))
    position: dict[str, int] = {}
    for k, (name, _, data, length) in enumerate(listed):
        digest.update(f"{name}\0{data}\0{length}\n".encode())
        if _joinable(name, joined):
            position.setdefault(joined.key_of(name), k)
    found = []
    for n, key in enumerate(joined.keys):
        k = position.get(key)
        if k is None:
            raise ShardReadError(f"{path} has no audio member {key!r}, which row {n} of its rows in {joined.where} "
                                 "names; fix the manifest or the tar")
        found.append(k)
    order = sorted(range(len(found)), key=lambda r: (found[r], r))  # the tar's order: one pass reads it
    if order != list(range(len(found))):
        joined = dataclasses.replace(joined, table=joined.table.take(order), keys=tuple(joined.keys[r] for r in order))
    digest.update(joined.digest())
    unit_rows, blocks = _grouped_units([(listed[found[r]][1], _padded_end(listed[found[r]])) for r in order])
    fields = [pa.field(_AUDIO, pa.binary())] + [f for f in joined.table.schema if f.name != _AUDIO]
    kind = b"nemo" if joined.by == "name" else b"shar"
    return pa.schema(fields, metadata={b"audioloader_container": kind}), unit_rows, blocks, joined


def _parse_json(data: Any, path: str, member: str) -> dict[str, Any]:
    try:
        value = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError) as error:
        raise ShardReadError(f"{path}: member {member!r} is not valid JSON ({error}); fix or remove it") from error
    if not isinstance(value, dict):
        raise ShardReadError(f"{path}: member {member!r} holds a JSON {type(value).__name__}, not an object: its "
                             "top-level fields become columns; wrap it in an object")
    return value


def _buffer_of(data: Any) -> pa.Buffer:
    return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)


def binary_array(values: list[Any]) -> pa.Array:
    """A binary array of ``pyarrow.Buffer`` s / bytes (``None``: null), in one copy of the bytes."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(memoryview(v) for v in values if v is not None)
    valid = None
    if any(v is None for v in values):
        valid = pa.py_buffer(np.packbits(np.array([v is not None for v in values]), bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.binary(), len(values), [valid, pa.py_buffer(offsets), pa.py_buffer(data)])


class TarHandle:
    """Reads a tar file's units: each unit's range in one read (a local file, or a remote one's bytes the
    read-ahead provided: `remote.SparseFile`), its members parsed from memory into a record batch of ``columns``.

    ``f``: anything with ``read_at(nbytes, offset)``; ``meta``: the file's `formats.scan.FileMeta`.
    """

    sparse: Any = None
    mapped_range: Any = None

    def __init__(self, f: Any, meta: Any, columns: list[str], path: str) -> None:
        self._file, self._meta, self._columns, self._path, self._joined = f, meta, columns, path, meta.joined
        self._starts = np.concatenate([[0], np.cumsum(meta.unit_rows)]).tolist()

    def _read(self, i: int) -> tuple[int, pa.Buffer, list[tuple[str, int, int, int]]]:
        """Unit ``i``'s offset, bytes (one read) and members."""
        offset, _, length = self._meta.blocks[i]
        data = _buffer_of(self._file.read_at(length, offset))
        if len(data) != length:
            raise OSError(f"short read: {len(data)} of {length} bytes at byte {offset} (truncated?)")
        return offset, data, list(members(lambda at, n: data.slice(at - offset, n), offset, offset + length))

    def _joined_unit(self, i: int) -> list[pa.RecordBatch]:
        """A unit of a set's tar: its rows' columns from the set's manifest; its bytes read only for audio."""
        start, n = self._starts[i], self._meta.unit_rows[i]
        rows = self._joined.table.slice(start, n)
        arrays = {c: rows.column(c).combine_chunks() for c in self._columns if c != _AUDIO}
        if _AUDIO in self._columns:
            offset, data, listed = self._read(i)
            found = {self._joined.key_of(name): (at, size) for name, _, at, size in listed
                     if _joinable(name, self._joined)}
            keys = self._joined.keys[start:start + n]
            if any(k not in found for k in keys):
                raise OSError(f"unit {i} at byte {offset} lacks the members its rows name: the tar changed")
            arrays[_AUDIO] = binary_array([data.slice(found[k][0] - offset, found[k][1]) for k in keys])
        return [pa.RecordBatch.from_arrays([arrays[c] for c in self._columns], names=self._columns)]

    def unit(self, i: int) -> list[pa.RecordBatch]:
        if self._joined is not None:
            return self._joined_unit(i)
        offset, data, listed = self._read(i)
        grouped = samples(listed)
        if len(grouped) != self._meta.unit_rows[i]:
            raise OSError(f"unit {i} at byte {offset} holds {len(grouped)} samples, {self._meta.unit_rows[i]} when "
                          "the file was scanned: it changed")
        schema = self._meta.schema
        values: dict[str, list[Any]] = {c: [] for c in self._columns}
        wanted = set(self._columns)
        for key, listed in grouped:
            row: dict[str, Any] = {_KEY: key}
            jsons = []
            for name, _, at, size in listed:
                extension = split_name(name)[1]
                body = data.slice(at - offset, size)
                if extension in AUDIO_EXTENSIONS:
                    row.setdefault(_AUDIO, body)
                elif extension == "json":
                    jsons.append((name, body))
                else:
                    column, t = _NAMED.get(extension, (extension, pa.string()))
                    if column in wanted:  # members of columns not read are not decoded
                        text = body.to_pybytes().decode("utf-8", "replace")
                        row[column] = self._label(text, name) if t == pa.int64() else text
            if jsons and not wanted.issubset(row):  # a member's own column wins over a JSON field of its name
                for name, body in jsons:
                    for field, value in _parse_json(body, self._path, name).items():
                        row.setdefault(field, value)
            for c in self._columns:
                values[c].append(row.get(c))
        return [pa.RecordBatch.from_arrays([self._array(c, values[c], schema) for c in self._columns],
                                           names=self._columns)]

    def _label(self, text: str, member: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise ShardReadError(f"{self._path}: member {member!r} holds {text[:40]!r}, not an integer class id "
                                 "(.cls members are labels)") from None

    @staticmethod
    def _array(column: str, values: list[Any], schema: pa.Schema) -> pa.Array:
        t = schema.field(column).type
        if column == _AUDIO:
            return binary_array(values)
        if pa.types.is_string(t):
            values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
        return pa.array(values, t)

    def close(self) -> None:
        self._file.close()


# ----------------------------------------------------------------------------- plain audio files

PLAIN_SCHEMA = pa.schema([pa.field(_AUDIO, pa.binary())], metadata={b"audioloader_container": b"files"})


def plain_digest(size: int, row: bytes = b"") -> str:
    """A plain audio file's digest: of its size and its listed columns' digest (its content is identified by its
    ETag or modification time)."""
    return hashlib.blake2b(f"audio_file:{size}:".encode() + row, digest_size=8).hexdigest()


class PlainHandle:
    """Reads a plain audio file as one unit of one row (its whole bytes as ``audio``)."""

    sparse: Any = None
    mapped_range: Any = None

    def __init__(self, f: Any, size: int, columns: list[str], joined: Any = None) -> None:
        self._file, self._size, self._columns, self._joined = f, size, columns, joined

    def unit(self, i: int) -> list[pa.RecordBatch]:
        if i != 0:
            raise IndexError(f"a plain audio file has one unit, not {i + 1}")
        arrays = {}
        if self._joined is not None:  # a listed file's columns: no byte read for them
            row = self._joined.table.slice(self._joined.row, 1)
            arrays = {c: row.column(c).combine_chunks() for c in self._columns if c != _AUDIO}
        if _AUDIO in self._columns:
            data = _buffer_of(self._file.read_at(self._size, 0))
            if len(data) != self._size:
                raise OSError(f"short read: {len(data)} of {self._size} bytes (truncated?)")
            arrays[_AUDIO] = binary_array([data])
        return [pa.RecordBatch.from_arrays([arrays[c] for c in self._columns], names=self._columns)]

    def close(self) -> None:
        self._file.close()
