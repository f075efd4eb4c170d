"""The metadata index: what construction learns about each shard file, kept in one small file, so that a rank
builds its dataset from a listing and one read instead of a read (or more) per file.

``_audioloader_index.arrow`` in a folder of shards (the leading underscore keeps it
out of the shard listing) is an Arrow IPC file with a row per shard: its name in
the folder, size and modification time (what the listing says: the index's
identity check), an ETag when known, format, rows per record batch / row group /
stripe, stream offsets, IPC record batch blocks, the identity digest, the schema,
and the footer bytes readers need (IPC footer, ORC tail, Parquet footer).

It is written by ``audioloader pack``, by `write_index` (``audioloader index
FOLDER`` on the command line), or, when a remote folder has none (or a stale
one), built by the first construction and kept in the machine cache folder
(``index/`` under `audioloader.shards.machine_cache.cache_root`: ``$AUDIOLOADER_CACHE``, else
``$XDG_CACHE_HOME/audioloader``, else ``~/.cache/audioloader``), keyed by the folder's URL.

An entry is used only while the listing reports the same size and modification
time for the file (and the same ETag, where both know one); any other file is
scanned as without an index, so a stale index is never used silently (the files
it no longer describes are counted in ``ShardDataset.index_stats``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats.scan import FileMeta, scan_all
from ..sources.resolve import INDEX_NAME, resolve_source
from ..storage.locations import filesystem_for, has_scheme
from ..storage.machine_cache import cache_root
from ..storage.retry import DEFAULT_RETRY
from .manifest import replace_atomically

_VERSION = b"1"
#: A store's modification times may be this coarse (S3: 1 s); see `matches`.
_MTIME_RESOLUTION_NS = 2_000_000_000

_SCHEMA = pa.schema([
    ("name", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("scanned_ns", pa.int64()),
    ("etag", pa.string()),
    ("format", pa.string()), ("unit_rows", pa.list_(pa.int64())), ("offsets", pa.list_(pa.int64())),
    ("blocks", pa.list_(pa.int64())), ("digest", pa.string()), ("schema", pa.binary()), ("tail", pa.binary()),
], metadata={b"audioloader_index": _VERSION})


def index_table(names: Sequence[str], metas: Sequence[FileMeta], portable: bool = False) -> pa.Table:
    """The index of files ``names`` (relative to the index's folder) with their scanned metadata.

    ``portable``: for shards that will be copied elsewhere (``audioloader pack``): no modification
    times, which a copy changes; an entry is then checked by the file's size (and ETag) only.
    """
    def tail(meta: FileMeta) -> bytes | None:
        if meta.parquet_metadata is not None:
            sink = pa.BufferOutputStream()
            meta.parquet_metadata.write_metadata_file(sink)
            return sink.getvalue().to_pybytes()
        return meta.tail

    columns = {
        "name": list(names), "size": [m.size for m in metas],
        "mtime_ns": [None if portable else m.mtime_ns for m in metas], "scanned_ns": [time.time_ns()] * len(metas),
        "etag": [m.etag for m in metas], "format": [m.format for m in metas],
        "unit_rows": [list(m.unit_rows) for m in metas], "offsets": [None if m.offsets is None else list(m.offsets)
                                                                     for m in metas],
        "blocks": [None if m.blocks is None else [v for block in m.blocks for v in block] for m in metas],
        "digest": [m.digest for m in metas], "schema": [m.schema.serialize().to_pybytes() for m in metas],
        "tail": [tail(m) for m in metas],
    }
    return pa.table(columns, schema=_SCHEMA)


def write_table(table: pa.Table, path: str, fs: Any = None) -> None:
    """Write an index atomically where it can be (a local file: a temporary file renamed over it)."""
    if fs is not None:
        with fs.open_output_stream(path) as out, pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)
        return
    def write(out: Any) -> None:
        with pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)

    replace_atomically(path, write, prefix=".index-")  # the shards' permissions, not mkstemp's 0600


def parse(data: Any) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` of an index file's bytes; ``{}`` when they are not an audioloader index."""
    try:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowException, OSError, ValueError):
        return {}
    if (table.schema.metadata or {}).get(b"audioloader_index") != _VERSION:
        return {}
    return {row["name"]: row for row in table.to_pylist()}


def meta_of(entry: dict[str, Any]) -> FileMeta:
    """The `FileMeta` an index entry describes (no I/O)."""
    flat = entry["blocks"]
    blocks = None if flat is None else tuple(tuple(flat[i:i + 3]) for i in range(0, len(flat), 3))
    parquet_metadata = tail = None
    if entry["format"] == "parquet":
        parquet_metadata = pq.read_metadata(pa.BufferReader(entry["tail"]))
    else:
        tail = entry["tail"]
    return FileMeta(entry["format"], entry["size"], pa.ipc.read_schema(pa.py_buffer(entry["schema"])),
                     tuple(entry["unit_rows"]), None if entry["offsets"] is None else tuple(entry["offsets"]),
                     blocks=blocks, mtime_ns=entry["mtime_ns"], digest=entry["digest"], etag=entry["etag"],
                     parquet_metadata=parquet_metadata, tail=tail)


def matches(entry: dict[str, Any] | None, loc: Any) -> bool:
    """Whether an index entry still describes the listed file at ``loc``: the same size, ETag (where both know
    one) and modification time (unless the index is portable).

    A modification time is trusted only when the file was scanned at least `_MTIME_RESOLUTION_NS` after it:
    S3 reports whole seconds, so a rewrite in the second of the scan would keep the time the index has.
    """
    if entry is None or loc.size is None or entry["size"] != loc.size:
        return False
    if entry["mtime_ns"] is not None and (loc.mtime_ns != entry["mtime_ns"]
                                          or entry["scanned_ns"] - entry["mtime_ns"] < _MTIME_RESOLUTION_NS):
        return False
    etag = getattr(loc, "etag", None)
    return entry["etag"] is None or etag is None or entry["etag"] == etag


def cache_path(folder_url: str) -> Path:
    """Where the index of a remote folder is cached on this machine (``folder_url``: no query string)."""
    key = hashlib.blake2b(folder_url.encode(), digest_size=16).hexdigest()
    return cache_root() / "index" / f"{key}.arrow"


def _folder(paths: Sequence[str]) -> str:
    """The deepest folder (no trailing "/") holding every path."""
    prefix = os.path.commonprefix([p.rsplit("/", 1)[0] + "/" for p in paths])  # noqa: RUF071 (URLs, not OS paths)
    return prefix[:prefix.rfind("/")]


def _cached_entries(locations: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Entries of this machine's cached index of the remote ``locations``' folder, by file system path."""
    path = cache_path(_folder([loc.path for loc in locations]))
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    folder = _folder([loc.fs_path for loc in locations])
    return {f"{folder}/{name}": entry for name, entry in parse(pa.py_buffer(data)).items()}


def indexed(locations: Sequence[Any], index_locations: Sequence[Any], remote: Any) -> tuple[dict[int, FileMeta],
                                                                                                dict[str, int]]:
    """``({position: meta}, stats)`` for the remote ``locations`` an index describes and still matches.

    The indexes the listing showed beside the shards (``index_locations``) are read (one request each);
    without one, this machine's cached index of the folder. ``stats``: ``{"indexed", "stale", "unindexed"}``:
    files taken from an index, files an index described differently from the listing (scanned), files
    without an entry (scanned).
    """
    entries: dict[str, dict[str, Any]] = {}
    for index_loc in index_locations:
        if index_loc.size:
            folder = index_loc.fs_path.rsplit("/", 1)[0]
            data = remote.read(index_loc, 0, index_loc.size)
            entries.update((f"{folder}/{name}", entry) for name, entry in parse(data).items())
    if not entries and locations:
        entries = _cached_entries(locations)
    metas, stale = {}, 0
    for position, loc in enumerate(locations):
        entry = entries.get(loc.fs_path)
        if matches(entry, loc):
            metas[position] = meta = meta_of(entry)
            meta.mtime_ns = loc.mtime_ns  # the listing's (a portable index has none)
        elif entry is not None:
            stale += 1
    return metas, {"indexed": len(metas), "stale": stale, "unindexed": len(locations) - len(metas) - stale}


def remember(locations: Sequence[Any], metas: Sequence[FileMeta]) -> None:
    """Cache the index of remote ``locations`` on this machine (best effort: a read-only home just skips it)."""
    folder = _folder([loc.fs_path for loc in locations])
    names = [loc.fs_path[len(folder) + 1:] for loc in locations]
    with contextlib.suppress(OSError, pa.ArrowException):
        write_table(index_table(names, metas), str(cache_path(_folder([loc.path for loc in locations]))))


def write_index(source: Any, filesystem: Any = None, portable: bool = False) -> str:
    """Write ``_audioloader_index.arrow`` into a folder of shards (local or remote, e.g. ``s3://bucket/data``) and
    return its path: construction over the folder then reads it instead of every file's footer.

    Scans every shard of the folder (as a `ShardDataset` would). Write it again after adding or
    rewriting shards (a stale entry is not used, only scanned again). ``portable``: leave the
    modification times out (for local shards about to be uploaded: see `index_table`).
    """
    text = os.fspath(source)
    locations = resolve_source(text, filesystem)
    metas = scan_all(locations, DEFAULT_RETRY)
    folder = _folder([loc.fs_path for loc in locations])
    names = [loc.fs_path[len(folder) + 1:] for loc in locations]
    fs = locations[0].fs
    if fs is None and filesystem is None and has_scheme(text) and not text.startswith("file://"):
        fs = filesystem_for(text)[0]
    write_table(index_table(names, metas, portable), f"{folder}/{INDEX_NAME}", fs)
    return f"{_folder([loc.path for loc in locations])}/{INDEX_NAME}"
