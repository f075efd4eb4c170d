"""File access and format scanning: opening shards, sniffing the format, reading metadata and IPC headers."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import ShardReadError
from ..sources.resolve import ACCEPTED, is_audio_name
from ..storage.direct import size_changed
from ..storage.identity import object_identity
from ..storage.locations import Location, TableFile, mtime_ns
from ..storage.remote import RemoteFiles, SparseFile
from ..storage.retry import DEFAULT_RETRY, Retry, with_retries
from .tar_format import PLAIN_SCHEMA, gzip_refusal, plain_digest, scan_joined, scan_tar

FORMATS = ("ipc_file", "ipc_stream", "parquet", "orc", "tar", "audio_file")

# Files scanned in parallel at construction: local scans are quick, remote ones wait on the network.
SCAN_THREADS_LOCAL = 8
SCAN_THREADS_REMOTE = 64
#: Bytes read from the end of a remote file in its first request at construction: the footer of a Parquet or IPC
#: file (pyarrow's Parquet reader reads the same 64 KiB), an ORC file's tail, and the whole of a small file.
TAIL_BYTES = 64 * 1024
#: A remote file up to this size is read whole in that first request (one request instead of a tail and then its
#: record batch headers; 256 KiB take ~5 ms at 50 MB/s, a second request 20-100 ms).
WHOLE_FILE_BYTES = 256 * 1024
#: Remote IPC record batch headers not in the tail are fetched in runs: headers fewer bytes apart than this share
#: one request (the bodies between them are read and dropped).
_HEADER_GAP_BYTES = 256 * 1024

_CONTINUATION = b"\xff\xff\xff\xff"
_MSG_SCHEMA, _MSG_DICTIONARY, _MSG_RECORD_BATCH = 1, 2, 3


def open_local(loc: Location, mapped: bool = True) -> Any:
    """A local shard: a memory map (``mapped``), else a plain file.

    Arrow IPC is read through a memory map (its values are zero-copy views of it). Parquet and ORC
    are decoded into new buffers anyway, so they are read with plain reads: every page a memory map
    has touched stays mapped, and counted in the process's memory, until the file is closed
    (measured: the main process's PSS grew by the size of the Parquet file read, 400 MB in 60 batches).
    """
    try:
        return pa.memory_map(loc.fs_path, "r") if mapped else pa.OSFile(loc.fs_path, "r")
    except (OSError, pa.ArrowException) as error:
        raise ShardReadError(f"cannot open shard {loc.path}: {error}") from error


def _read_at(f: Any, nbytes: int, offset: int) -> bytes:
    data = f.read_at(nbytes, offset)
    return data.to_pybytes() if isinstance(data, pa.Buffer) else bytes(data)


def _sniff(loc: Location, f: Any, size: int) -> str:
    """The format from the first bytes: ``ARROW1`` (IPC file), ``PAR1`` (Parquet), ``ORC``, 0xFFFFFFFF (stream)."""
    head = _read_at(f, min(512, size), 0)
    if head[257:262] == b"ustar":
        return "tar"
    if head.startswith(b"\x1f\x8b"):
        raise gzip_refusal(loc.path)
    head = head[:8]
    if head.startswith(b"ARROW1"):
        return "ipc_file"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ORC"):
        return "orc"
    if head.startswith(_CONTINUATION):
        return "ipc_stream"
    if len(head) == 8:
        # A legacy stream (Arrow < 0.15) starts directly with the metadata length.
        length = struct.unpack("<i", head[:4])[0]
        if 0 < length < size and _legacy_stream_opens(f):
            return "ipc_stream"
    what = "an empty file" if size == 0 else (
        "Feather v1 (not supported)" if head.startswith(b"FEA1") else f"starts with {head[:8]!r}")
    raise ShardReadError(f"{loc.path} is not an Arrow IPC, Parquet or ORC file ({what}). Accepted formats: "
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


def _scan_messages(f: Any, start: int, end: int, digest: Any = None) -> list[tuple[int, int, int]]:
    """``[(offset, header type, rows)]`` of the IPC messages in ``[start, end)``, reading headers only.

    ``digest`` (a hashlib object), when given, is fed every message header.
    """
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
        if digest is not None:
            digest.update(meta)
        messages.append((pos, header_type, rows))
        pos += prefix + meta_length + body_length
        if pos > end:
            raise ValueError(f"message body at byte {pos} runs past the end of the file (truncated?)")
    return messages


@dataclass
class FileMeta:
    """What construction learns about one file (internal).

    ``mtime_ns`` (None when the storage reports none), ``digest`` and, for a remote file,
    ``etag`` (`identity.object_identity`: None when the storage reports none) identify the
    content: a shard rewritten in place is told apart by them.
    """

    format: str
    size: int
    schema: pa.Schema | None  # None: a table's data file a filter pruned by its metadata (never opened)
    unit_rows: tuple[int, ...]
    # IPC stream: byte offset of each record batch message, for seeking.
    offsets: tuple[int, ...] | None = None
    # IPC file: each record batch's (offset, metadata length, body length) from the footer (what the read-ahead
    # fetches: one contiguous range per batch).
    blocks: tuple[tuple[int, int, int], ...] | None = None
    mtime_ns: int | None = None
    digest: str = ""
    etag: str | None = None
    # Parquet: the footer, parsed once here and handed to every reader of the file.
    parquet_metadata: Any = None
    # Remote IPC file: its last bytes (footer, length, magic); remote ORC file: its last 16 KiB or more (postscript,
    # footer, stripe statistics). Read once here and served from memory to every reader (`SparseFile`).
    tail: bytes | None = None
    # False: known from a manifest (`audioloader.shards.manifest`), the footer not read yet (no blocks, offsets,
    # Parquet metadata or tail): the dataset reads it when the file is first read (`ShardDataset.located`).
    located: bool = True
    # A remote file's every byte, when its first read fetched it whole and the scan was asked to keep it
    # (`_scan_once`); the dataset takes it away at once (`ShardDataset.located`).
    whole: Any = None
    # A tar of a set described by a manifest beside it (`tarred_sets`), or a listed audio file: its rows'
    # columns (`tarred_sets.JoinedRows`), in the file's order.
    joined: Any = None


def _hasher() -> Any:
    return hashlib.blake2b(digest_size=8)


def _footer(f: Any) -> tuple[bytes, bytes]:
    """An IPC file's footer flatbuffer (its schema with metadata, every record batch's offset and sizes), and
    the 10 bytes after it (footer length and magic), each read once."""
    size = f.size()
    trailer = _read_at(f, 10, size - 10)
    footer_length = struct.unpack("<i", trailer[:4])[0]
    if not 0 < footer_length <= size - 18:
        raise ValueError(f"footer length {footer_length} does not fit a file of {size} bytes (truncated?)")
    return _read_at(f, footer_length, size - 10 - footer_length), trailer


def footer_blocks(footer: bytes, slot: int = 3) -> tuple[tuple[int, int, int], ...]:
    """``(offset, metadata length, body length)`` of each block of an IPC file footer (File.fbs ``Footer``):
    its record batches (``slot`` 3) or dictionaries (2)."""
    root = struct.unpack_from("<I", footer, 0)[0]
    pos = _fb_field(footer, root, slot)
    if pos is None:
        return ()
    vector = pos + struct.unpack_from("<I", footer, pos)[0]
    count = struct.unpack_from("<I", footer, vector)[0]
    return tuple(struct.unpack_from("<qi4xq", footer, vector + 4 + 24 * i) for i in range(count))


def _batch_rows(f: Any, sparse: SparseFile | None, blocks: Sequence[tuple[int, int, int]]) -> tuple[int, ...]:
    """Rows of each record batch, from its message header (remote: headers not yet in memory are fetched
    together first, in runs, concurrently)."""
    if sparse is not None:
        runs: list[list[int]] = []  # [start, stop) byte runs of headers not in memory
        for offset, meta_length, _ in blocks:
            if sparse.covers(offset, meta_length):
                continue
            if runs and offset - runs[-1][1] <= _HEADER_GAP_BYTES:
                runs[-1][1] = offset + meta_length
            else:
                runs.append([offset, offset + meta_length])
        fetched = sparse.remote.read_many(sparse.loc, [(a, b - a) for a, b in runs])
        for (start, _), data in zip(runs, fetched, strict=True):
            sparse.provide(start, data)
    rows = []
    for offset, meta_length, _ in blocks:
        head = _read_at(f, meta_length, offset)
        prefix = 8 if head.startswith(_CONTINUATION) else 4
        length = struct.unpack_from("<i", head, prefix - 4)[0]
        header_type, _, n = _message_header(head[prefix:prefix + length])
        if header_type != _MSG_RECORD_BATCH:
            raise ValueError(f"the footer's record batch at byte {offset} is not a record batch message")
        rows.append(n)
    return tuple(rows)


def _scan_ipc_file(f: Any, sparse: SparseFile | None, digest: Any) -> tuple[pa.Schema, tuple[int, ...], bytes,
                                                                            tuple[tuple[int, int, int], ...]]:
    """Schema, rows per record batch, the file's tail (footer + length + magic) and its record batch blocks.

    Remote (``sparse``): the schema comes from the footer (in memory), the rows from each batch's message
    header; bodies are never read.
    """
    footer, trailer = _footer(f)
    digest.update(footer)
    blocks = footer_blocks(footer)
    reader = pa.ipc.open_file(f)
    if sparse is None:  # local, zero-copy: get_batch touches only message headers
        return reader.schema, tuple(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)), \
            footer + trailer, blocks
    return reader.schema, _batch_rows(f, sparse, blocks), footer + trailer, blocks


def _scan_ipc_stream(f: Any, size: int, digest: Any) -> tuple[pa.Schema, tuple[int, ...], tuple[int, ...]]:
    messages = _scan_messages(f, 0, size, digest)
    if not messages or messages[0][1] != _MSG_SCHEMA:
        raise ValueError("the stream does not start with a schema message")
    if any(t == _MSG_DICTIONARY for _, t, _ in messages):
        raise ValueError("dictionary-encoded columns in an IPC stream are not supported; "
                         "cast them to plain types or write the IPC file format")
    first_batch = next((pos for pos, t, _ in messages if t == _MSG_RECORD_BATCH), size)
    schema = pa.ipc.read_schema(pa.py_buffer(_read_at(f, first_batch, 0)))
    batches = [(pos, rows) for pos, t, rows in messages if t == _MSG_RECORD_BATCH]
    return schema, tuple(r for _, r in batches), tuple(p for p, _ in batches)


def orc_module() -> Any:
    """``pyarrow.orc``, imported when an ORC file is met (pyarrow builds without ORC, e.g. on Windows, lack it)."""
    try:
        import pyarrow.orc
    except ImportError as error:
        raise ShardReadError(f"this pyarrow ({pa.__version__}) was built without ORC support ({error}); install a "
                             "pyarrow wheel with ORC (Linux and macOS wheels have it) or convert the ORC files to "
                             "Parquet") from None
    return pyarrow.orc


def cheapest_column(schema: pa.Schema) -> str:
    """The column whose values cost least to read: fixed-width ones by bit width, then strings, binaries, nested."""
    def cost(field: pa.Field) -> tuple[int, int]:
        t = field.type
        if t.num_fields == 0:
            try:
                return 0, t.bit_width
            except ValueError:  # variable width
                pass
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return 1, 0
        return (2, 0) if t.num_fields == 0 else (3, 0)
    return min(schema, key=cost).name


def _stripe_rows(orc_file: Any) -> tuple[int, ...]:
    """Rows per stripe of an ``pyarrow.orc.ORCFile``.

    pyarrow exposes the file's rows but not each stripe's, so each stripe but the
    last has its cheapest column read once (a few KB per stripe of integers; see
    `cheapest_column`) and the last one gets the rest. A file of one stripe reads nothing.
    """
    stripes, total = orc_file.nstripes, orc_file.nrows
    if stripes <= 1:
        return (total,) if stripes else ()
    column = cheapest_column(orc_file.schema)
    rows = [orc_file.read_stripe(i, columns=[column]).num_rows for i in range(stripes - 1)]
    return (*rows, total - sum(rows))


#: Bytes at the end of an ORC file that its reader reads first (the ORC library's guess for the tail's size).
_ORC_TAIL_GUESS = 16384


def _scan_orc(f: Any, local: bool, digest: Any) -> tuple[pa.Schema, tuple[int, ...], bytes | None]:
    """Schema, rows per stripe, and a remote file's tail (see `FileMeta.tail`).

    The digest takes the serialized file tail (postscript and footer: schema, stripes, statistics).
    """
    size, tail = f.size(), None
    if not local:  # the tail is in memory (the scan's first read): kept for every later handle
        tail = _read_at(f, min(size, _ORC_TAIL_GUESS), max(0, size - _ORC_TAIL_GUESS))
    orc_file = orc_module().ORCFile(f)
    needed = orc_file.stripe_statistics_length + orc_file.file_footer_length + orc_file.file_postscript_length + 1
    if tail is not None and needed > len(tail):  # a tail past the guess: keep all of it
        tail = _read_at(f, needed, size - needed)
    digest.update(orc_file.reader.serialized_file_tail())
    return orc_file.schema, _stripe_rows(orc_file), tail


def _local_mtime_ns(loc: Location) -> int:
    try:
        return os.stat(loc.fs_path).st_mtime_ns
    except OSError as error:
        raise ShardReadError(f"cannot open shard {loc.path}: {error}") from error


def _scan_opened(loc: Location, f: Any, sparse: SparseFile | None = None) -> FileMeta:
    """`scan_file` on an open file (remote: ``f`` reads ``sparse``): format, schema, units, the content digest."""
    size = f.size()
    fmt = _sniff_tail(sparse) or _sniff(loc, f, size)
    offsets = parquet_metadata = tail = blocks = joined = None
    digest = _hasher()
    if fmt == "ipc_file":
        schema, rows, tail, blocks = _scan_ipc_file(f, sparse, digest)
        tail = None if loc.fs is None else tail
    elif fmt == "ipc_stream":
        schema, rows, offsets = _scan_ipc_stream(f, size, digest)
    elif fmt == "orc":
        schema, rows, tail = _scan_orc(f, loc.fs is None, digest)
    elif fmt == "tar":  # every header: a remote tar is fetched whole first (its headers are spread through it)
        if sparse is not None and not sparse.covers(0, size):
            sparse.provide(0, sparse.remote.read_many(sparse.loc, [(0, size)])[0])
        read = lambda offset, n: _read_at(f, n, offset)  # noqa: E731
        if loc.joined is None:
            schema, rows, blocks = scan_tar(read, size, loc.path, digest)
        else:
            schema, rows, blocks, joined = scan_joined(read, size, loc.path, digest, loc.joined)
    else:
        parquet_metadata = pq.ParquetFile(f).metadata
        schema = parquet_metadata.schema.to_arrow_schema()
        rows = tuple(parquet_metadata.row_group(i).num_rows for i in range(parquet_metadata.num_row_groups))
        serialized = pa.BufferOutputStream()
        parquet_metadata.write_metadata_file(serialized)  # the footer: schema, row groups, sizes, statistics
        digest.update(serialized.getvalue())
    return FileMeta(fmt, size, schema, rows, offsets, blocks=blocks, digest=digest.hexdigest(),
                     parquet_metadata=parquet_metadata, tail=tail, joined=joined)


def _sniff_tail(sparse: SparseFile | None) -> str | None:
    """The format from a remote file's last bytes (in memory), or None (then its first bytes tell)."""
    if sparse is None or sparse.size() < 12:
        return None
    end = sparse.read_at(6, sparse.size() - 6).to_pybytes()
    return "ipc_file" if end == b"ARROW1" else "parquet" if end.endswith(b"PAR1") else None


def _scan_once(loc: Location, remote: RemoteFiles, cache: Any = None, keep_whole: bool = False) -> FileMeta:
    """`scan_file` without its checks; ``keep_whole``: a remote file read whole by its first request keeps those
    bytes in `FileMeta.whole` (for the caller to serve its first data from)."""
    # The modification time first: a rewrite during the scan then shows as a change later.
    mtime = _local_mtime_ns(loc) if loc.fs is None else loc.mtime_ns
    if is_audio_name(loc.path):  # a plain audio file: one row, its whole bytes; nothing read
        return _plain_scan(loc, mtime, remote)
    if loc.fs is not None and mtime is None and loc.size is None:  # a manifest's file: none known, none asked for
        mtime = _remote_mtime_ns(loc)
    etag = None
    if loc.fs is None:
        f = open_local(loc)
        try:
            meta = _scan_opened(loc, f)
        finally:
            f.close()
    elif loc.size is not None and (cache is None or remote.reads_directly(loc)):  # one GET: the tail, its identity
        n = loc.size if loc.size <= WHOLE_FILE_BYTES else min(loc.size, TAIL_BYTES)
        tail, etag, size = remote.read_identified(loc, loc.size - n, n) if n else (None, None, loc.size)
        _check_size(loc, size)
        sparse = SparseFile(loc, loc.size, remote, [(loc.size - n, tail)] if n else [])
        meta = _scan_opened(loc, sparse.as_arrow(), sparse)
        if keep_whole and n == loc.size:
            meta.whole = tail
    else:  # pyarrow's open (a HEAD: the size and identity), then the tail, or the cache's copy
        opened = remote.opened(loc)
        etag = object_identity(opened)
        size = loc.size if loc.size is not None else remote.size(loc)
        _check_size(loc, opened.size())
        # With a cache the file's bytes go there whole when it is first read: here only its tail.
        n = size if size <= WHOLE_FILE_BYTES and cache is None else min(size, TAIL_BYTES)
        copy = _cached_copy(cache, loc, size, etag, mtime)
        if copy is not None:  # scanned from the local copy
            try:
                meta = _scan_opened(dataclasses.replace(loc, fs=None, fs_path=copy[0]), copy[1])
            finally:
                copy[1].close()
        else:
            sparse = SparseFile(loc, size, remote, [(size - n, remote.read(loc, size - n, n))] if n else [])
            meta = _scan_opened(loc, sparse.as_arrow(), sparse)
    meta.mtime_ns, meta.etag = mtime, etag
    return meta


def plain_meta(size: int, joined: Any = None) -> FileMeta:
    """The `FileMeta` of a plain audio file of ``size`` bytes: one unit of one row, its whole bytes; ``joined``
    (`tarred_sets.ListedRow`): a listed file's columns."""
    schema = PLAIN_SCHEMA if joined is None else joined.schema()
    return FileMeta("audio_file", size, schema, (1,), blocks=((0, 0, size),), joined=joined,
                     digest=plain_digest(size, b"" if joined is None else joined.digest()))


def _plain_scan(loc: Location, mtime: int | None, remote: RemoteFiles) -> FileMeta:
    """A plain audio file's `plain_meta`: its size from the listing (or manifest), a local stat, or one request
    for a listed remote file (its size and modification time)."""
    size = loc.size
    if loc.fs is None:
        try:
            size = os.stat(loc.fs_path).st_size
        except OSError as error:
            raise ShardReadError(f"cannot open audio file {loc.path}: {error}") from error
    elif size is None:
        info = with_retries(lambda: loc.fs.get_file_info(loc.fs_path), what=f"the size of {loc.path}",
                            retry=remote.retry, store=loc.path)
        if info.size is None or info.size < 0:
            raise ShardReadError(f"audio file {loc.path} does not exist (or is not a file)")
        size, mtime = info.size, mtime_ns(info)
    meta = plain_meta(size, loc.joined)
    meta.mtime_ns = mtime
    return meta


def _confirmed_tar(loc: Location, expected: FileMeta, remote: RemoteFiles) -> FileMeta:
    """A remote tar file known from a manifest (its units recorded there), confirmed at its first read with one
    request (pyarrow's open, a HEAD): the object's identity and size as the store reports them. The caller compares
    them with the manifest (`manifest.mismatch`): a rewritten object has another ETag. (A local tar is scanned
    again instead: its headers are a quick read, and their digest is compared.)"""
    opened = remote.opened(loc)
    _check_size(loc, opened.size())
    return dataclasses.replace(expected, etag=object_identity(opened), located=True)


def _check_size(loc: Location, size: int | None) -> None:
    """`ShardChangedError` when the store reports another size than the listing (or manifest) said."""
    if loc.size is not None and size is not None and size != loc.size:
        raise size_changed(loc, size)


def cache_identity(meta: FileMeta) -> str | None:
    """What a remote file's copy in a cache is checked against besides its size: its ETag, else its modification
    time; None when the storage reports neither (such a file is not cached)."""
    if meta.etag is not None:
        return meta.etag
    return None if meta.mtime_ns is None else f"mtime:{meta.mtime_ns}"


def _cached_copy(cache: Any, loc: Location, size: int, etag: str | None, mtime: int | None) -> Any:
    """``(path, memory map)`` of the copy of a remote file already in ``cache`` (an `ObjectCache`), or None."""
    if cache is None or loc.fs is None:
        return None
    identity = cache_identity(FileMeta("", size, None, (), etag=etag, mtime_ns=mtime))
    return None if identity is None else cache.lookup(loc, size, identity)


def _remote_mtime_ns(loc: Location) -> int | None:
    return mtime_ns(loc.fs.get_file_info(loc.fs_path))


def listed_meta(listed: TableFile) -> FileMeta:
    """The `FileMeta` of a table's data file that is not scanned: its table's word for its format, size and
    rows (one unit), no schema. Its digest is of that metadata: the table's snapshot pins the content."""
    digest = _hasher()
    digest.update(f"{listed.format}:{listed.size}:{listed.rows}".encode())
    return FileMeta(listed.format, listed.size, None, (listed.rows,), digest=digest.hexdigest())


def _check_listed(loc: Location, meta: FileMeta) -> FileMeta:
    """``meta``, if it agrees with what the file's table says about it (a table's rows must be the files' rows)."""
    listed = loc.listed
    if listed is not None and (meta.format, meta.size, sum(meta.unit_rows)) != (listed.format, listed.size,
                                                                                 listed.rows):
        raise ShardReadError(f"data file {loc.path} is {meta.format}, {meta.size} bytes, {sum(meta.unit_rows)} rows, "
                             f"but its table's metadata says {listed.format}, {listed.size} bytes, {listed.rows} "
                             "rows: the file was changed outside the table; restore it or repair the table")
    return meta


def scan_file(loc: Location, remote: RemoteFiles, cache: Any = None, keep_whole: bool = False,
               known: FileMeta | None = None) -> FileMeta:
    """Format, size, schema, batch / row-group boundaries and identity of one file, without reading audio.

    Remote: each request is retried on a transient fault (`RemoteFiles.read`). ``known``: what a manifest says of
    the file; a remote tar's units known there are not scanned again, only its identity read (`_confirmed_tar`).
    """
    if known is not None and known.format == "tar" and known.blocks is not None and loc.fs is not None \
            and cache is None:
        return _confirmed_tar(loc, known, remote)
    try:
        return _check_listed(loc, _scan_once(loc, remote, cache, keep_whole))
    except ShardReadError:
        raise
    except (OSError, EOFError, ValueError, struct.error, IndexError, pa.ArrowException) as error:
        raise ShardReadError(f"cannot read shard {loc.path}: {str(error).rstrip('.')}. The file may be truncated or "
                             f"corrupt; re-write it or remove it from the source ({ACCEPTED})") from error


def scan_all(locations: list[Location], retry: Retry = DEFAULT_RETRY, remote: RemoteFiles | None = None,
              cache: Any = None, keep_whole: bool = False, known: Sequence[FileMeta] | None = None
              ) -> list[FileMeta]:
    """Every file's `FileMeta`, scanned concurrently (remote files: many at once, latency-bound); a remote file
    with a copy in ``cache`` (an `ObjectCache`) is scanned there."""
    remote = remote if remote is not None else RemoteFiles(retry)
    known = known if known is not None else [None] * len(locations)
    if len(locations) < 4:
        return [scan_file(loc, remote, cache, keep_whole, k) for loc, k in zip(locations, known, strict=True)]
    threads = SCAN_THREADS_REMOTE if any(loc.fs is not None for loc in locations) else SCAN_THREADS_LOCAL
    with ThreadPoolExecutor(max_workers=min(threads, len(locations)), thread_name_prefix="audioloader-scan") as pool:
        return list(pool.map(lambda loc, k: scan_file(loc, remote, cache, keep_whole, k), locations, known))
