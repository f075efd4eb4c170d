"""How a `ShardDataset` reads one unit (record batch / row group / stripe): a local file through a memory map,
a remote one from bytes fetched in as few requests as its ranges allow (`RemoteFiles`, concurrently for many
units), parsed by pyarrow from memory (`SparseFile`).

`UnitReads` owns the files' locations and metadata (footers of files known from a manifest read on first use) and
each thread's open handles; the dataset holds one, and its `RowReads` reads units through it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ShardChangedError, ShardReadError
from ..catalog.file_table import remote_mask
from ..catalog.manifest import mismatch
from ..formats.readers import ConformedHandle as _ConformedHandle
from ..formats.readers import IpcFileHandle as _IpcFileHandle
from ..formats.readers import IpcStreamHandle as _IpcStreamHandle
from ..formats.readers import OrcHandle as _OrcHandle
from ..formats.readers import ParquetHandle as _ParquetHandle
from ..formats.scan import SCAN_THREADS_REMOTE as _SCAN_THREADS_REMOTE
from ..formats.scan import FileMeta as _FileMeta
from ..formats.scan import cache_identity
from ..formats.scan import cheapest_column as _cheapest_column
from ..formats.scan import open_local as _open_local
from ..formats.scan import scan_all as _scan_all
from ..formats.scan import scan_file as _scan_file
from ..formats.tar_format import PlainHandle, TarHandle
from ..storage.changes import check_local
from ..storage.identity import ETagCheck, md5_etag, object_identity
from ..storage.remote import PART_BYTES, Parts, RemoteFiles, SparseFile
from ..storage.units import coalesce, unit_ranges

#: Bytes of small remote files a dataset keeps after their first read fetched them whole with their footer (files
#: known from a manifest), so that their units cost no second request: 64 files of 256 KiB, what the read-ahead
#: locates at once.
WHOLE_FILES_BYTES = 16 * 1024 * 1024
#: Bytes of remote units a random-access read (`ShardDataset.read_rows`) fetches at once.
RANDOM_ACCESS_BYTES = 64 * 1024 * 1024
#: ``read_unit(file_id, unit) -> [RecordBatch]``: reads one unit (see `ShardDataset.read_kept`).
UnitReader = Callable[[int, int], list[pa.RecordBatch]]

#: Units ahead of a random-access read whose files' footers are read together (files known from a manifest).
_LOCATE_AHEAD = 256
# Open file handles kept per thread (memory maps are cheap; this bounds open fds).
_HANDLES_PER_THREAD = 16
# Remote handles hold no descriptor, only a parsed footer: keep more, so a pass in random
# split order does not parse the footers again.
_REMOTE_HANDLES_PER_THREAD = 256


#: ``madvise(2)``'s advice to drop a range's pages from the page tables (Linux: a read-only file mapping's pages
#: are read again from the page cache when touched).
_MADV_DONTNEED = 4


def _load_madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None


_MADVISE = _load_madvise()


def _mapped_range(f: Any) -> tuple[int, int] | None:
    """``(address, bytes)`` of a read-only memory map (a zero-copy view of all of it), None for other files.

    Only the range of a map that its handle keeps open is ever given to ``madvise``: the handle's file is
    closed only when the handle leaves this thread's cache.
    """
    if not isinstance(f, pa.MemoryMappedFile) or f.size() == 0:
        return None
    position = f.tell()
    f.seek(0)
    whole = f.read_buffer(f.size())
    f.seek(position)
    return whole.address, whole.size


class UnitReads:
    """Reads a dataset's files a unit at a time, and owns what that takes: each file's location and metadata (a
    file known from a manifest has its footer read on first use: `located`), each thread's open handles, and the
    small remote files kept whole after their first read. Thread-safe (handles are per thread; footers are read
    under a lock per file). Picklable: a copy (a worker process's) opens handles and reads footers of its own.

    Args:
        locations: each file's `_Location` (a list, or a manifest's `ManifestLocations`).
        metas: each file's `_FileMeta` (a list, or a manifest's `ManifestMetas`); the footers read are kept in it.
        files: the dataset's `FileTable` (paths for messages, formats).
        schema: the files' unified schema (`schema.unify`): every unit is read in its types.
        columns: the columns read (the dataset's ``used_columns``).
        remote: the `RemoteFiles` every remote byte is fetched through (its ``retry`` retries the scans too).
        cache: the `ObjectCache` of remote files, or None.
        manifest_where: the manifest ``metas`` come from, as errors name it.
    """

    def __init__(self, locations: Sequence[Any], metas: Sequence[_FileMeta], files: Any, schema: pa.Schema,
                 columns: Sequence[str], remote: RemoteFiles, cache: Any, manifest_where: str = "the manifest"):
        self._locations, self._metas = locations, metas
        self.files, self.schema, self.columns = files, schema, list(columns)
        self.remote, self.cache, self.manifest_where = remote, cache, manifest_where
        self._open_state()

    def _open_state(self) -> None:
        """What stays with the process (and the object) that made it: handles, locks, files kept whole."""
        self._tls = threading.local()  # ``handles``: this thread's open handles, an LRU
        self._locating: dict[int, threading.Lock] = {}
        self._locating_lock = threading.Lock()
        self._whole: OrderedDict[int, pa.Buffer] = OrderedDict()  # small files fetched whole with their footer
        self._whole_bytes, self._whole_lock = 0, threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_tls", "_locating", "_locating_lock", "_whole", "_whole_bytes", "_whole_lock"):
            del state[name]  # open handles stay with the process that opened them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_state()

    def reading(self, columns: Sequence[str]) -> UnitReads:
        """The same files read for other ``columns``: locations and metadata shared, handles of its own."""
        return UnitReads(self._locations, self._metas, self.files, self.schema, columns, self.remote, self.cache,
                         self.manifest_where)

    @property
    def locations(self) -> Sequence[Any]:
        """Each file's `_Location` (a ``Sequence``: a manifest's are made on demand)."""
        return self._locations

    @property
    def metas(self) -> Sequence[_FileMeta]:
        """Each file's `_FileMeta` as known now (``located`` False: a manifest's, its footer not read yet)."""
        return self._metas

    # ----------------------------------------------------------------- where the files are

    def remote_files(self) -> np.ndarray:
        """Whether each file is remote (bool a file; `is_remote`), without making the files' locations."""
        return remote_mask(self._locations)

    def is_remote(self, file_id: int) -> bool:
        """Whether a file is read through a remote filesystem (its rows are copies, not memory-map views)."""
        fs = getattr(self._locations, "fs", 0)  # one filesystem for all: a manifest's files
        return (self._locations[file_id].fs if fs == 0 else fs) is not None

    def is_memory_mapped(self, file_id: int) -> bool:
        """Whether a file's audio values are views of a memory map (a local Arrow IPC file or stream), which
        cost page cache, not process memory; a Parquet or ORC unit is decompressed into process memory."""
        return self.files.format(file_id) in ("ipc_file", "ipc_stream") and not self.is_remote(file_id)

    def mapped_state(self, file_id: int) -> tuple[int, int | None] | None:
        """A memory-mapped file's ``(size, mtime_ns)`` as known here (`RawSample.mapped`); None for other files."""
        meta = self._metas[file_id]
        return (int(meta.size), meta.mtime_ns) if self.is_memory_mapped(file_id) else None

    def check_unchanged(self, file_id: int) -> None:
        """Raise `ShardReadError` naming the file if a local shard's size or modification time changed.

        Called before each record batch / row group of a local file is read: a
        memory-mapped file truncated under the reader would otherwise kill the
        process with SIGBUS when the missing pages are touched.
        """
        loc, meta = self._locations[file_id], self._metas[file_id]
        if loc.fs is None:
            check_local(loc.path, meta.size, meta.mtime_ns)

    def holds_etag_content(self, file_id: int, etag: str) -> bool:
        """Whether a remote file's bytes now are the content an earlier ETag of it was computed from: the same
        bytes uploaded another way (one PUT, or another part size) have another ETag. Reads the whole file once
        (`identity.ETagCheck`); False where ``etag`` is no MD5-based ETag (a version id, an encrypted object's
        ETag: nothing to compare the bytes with)."""
        loc, size = self._locations[file_id], self._metas[file_id].size
        if loc.fs is None or md5_etag(etag) is None:
            return False
        check = ETagCheck(etag, size)
        for offset in range(0, size, PART_BYTES):
            check.update(self.remote.read(loc, offset, min(PART_BYTES, size - offset)))
        return check.matches()

    # ----------------------------------------------------------------- footers of files known from a manifest

    def located(self, file_id: int) -> _FileMeta:
        """A file's `_FileMeta` with its footer read: a file known from a manifest has its footer read now (one
        request for a remote file's tail, and pyarrow's HEAD) and checked against the manifest.

        Raises:
            ShardChangedError: the file is not what the manifest says (size, ETag, footer), naming both.
        """
        meta = self._metas[file_id]
        if meta.located:
            return meta
        with self._locating_lock:
            lock = self._locating.setdefault(file_id, threading.Lock())
        with lock:  # one read of a footer, however many threads want it
            meta = self._metas[file_id]
            if not meta.located:
                self._metas[file_id] = meta = self._checked(file_id, self._first_scan(file_id))
        return meta

    def _first_scan(self, file_id: int) -> _FileMeta:
        """The first scan of a file known from a manifest. With a cache, the file goes into the cache (once a
        machine; its identity: the manifest's ETag, else pyarrow's HEAD) and its footer is read from the copy: its
        bytes are fetched once, not its tail and then the whole file again."""
        loc, expected = self._locations[file_id], self._metas[file_id]
        if self.cache is None or loc.fs is None:  # (a remote tar's units are known: only its identity is read)
            return _scan_file(loc, self.remote, self.cache, keep_whole=True, known=expected)
        etag = expected.etag or object_identity(self.remote.opened(loc))
        identity = cache_identity(dataclasses.replace(expected, etag=etag))
        if identity is None:  # nothing tells a copy from a changed object: not cached
            return _scan_file(loc, self.remote, self.cache, keep_whole=True)
        self.cache.open(loc, expected.size, identity).close()
        copy = self.cache.path_of(loc.path, expected.size, identity)
        found = _scan_file(dataclasses.replace(loc, fs=None, fs_path=copy, size=None, mtime_ns=None), self.remote)
        found.mtime_ns, found.etag = None, etag  # the copy's mtime is not the object's: the manifest's is kept
        return found

    def unlocated(self, file_ids: Sequence[int]) -> list[int]:
        """Those of ``file_ids`` whose footers are not read yet (files known from a manifest), each once, sorted."""
        return sorted({i for i in file_ids if not self._metas[i].located})

    def locate_files(self, file_ids: Sequence[int]) -> int:
        """Read the footers of files known from a manifest, concurrently (`located` for each; no-op for the rest);
        returns how many were read."""
        wanted = self.unlocated(file_ids)
        if len(wanted) < 2:
            for file_id in wanted:
                self.located(file_id)
            return len(wanted)
        if self.cache is not None:  # into the cache and scanned there (`_first_scan`), many at once
            with ThreadPoolExecutor(min(len(wanted), _SCAN_THREADS_REMOTE)) as pool:
                found = list(pool.map(self._first_scan, wanted))
        else:
            found = _scan_all([self._locations[i] for i in wanted], self.remote.retry, self.remote, keep_whole=True,
                              known=[self._metas[i] for i in wanted])
        for file_id, meta in zip(wanted, found, strict=True):
            with self._locating_lock:
                if not self._metas[file_id].located:
                    self._metas[file_id] = self._checked(file_id, meta)
        return len(wanted)

    def _checked(self, file_id: int, found: _FileMeta) -> _FileMeta:
        """``found`` (a file's scan) when it is what the manifest says, with what the manifest knows and the scan
        does not (ETag, modification time); else `ShardChangedError`."""
        expected = self._metas[file_id]
        problem = mismatch(expected, found)
        if problem is not None:
            raise ShardChangedError(f"shard {self._locations[file_id].path} is not what {self.manifest_where} says: "
                                    f"{problem}. It changed after the manifest was written; write the manifest again "
                                    "(`audioloader index FOLDER`) or restore the file, then build the loader again")
        found.etag = found.etag or expected.etag
        found.mtime_ns = found.mtime_ns if found.mtime_ns is not None else expected.mtime_ns
        if found.whole is not None:  # the footer came with the whole file: its first data is served from it
            self._keep_whole(file_id, found.whole)
            found.whole = None
        return found

    def _keep_whole(self, file_id: int, data: pa.Buffer) -> None:
        """Keep a small file's bytes, fetched whole by its first read, for its units (at most `WHOLE_FILES_BYTES`
        a dataset, least recently kept dropped first: a dropped file's units are fetched again)."""
        with self._whole_lock:
            self._whole[file_id] = data
            self._whole_bytes += data.size
            while self._whole_bytes > WHOLE_FILES_BYTES and len(self._whole) > 1:
                self._whole_bytes -= self._whole.popitem(last=False)[1].size

    def _whole_file(self, file_id: int) -> pa.Buffer | None:
        """The bytes of a file its first read fetched whole, while kept (see `_keep_whole`)."""
        with self._whole_lock:
            return self._whole.get(file_id)

    # ----------------------------------------------------------------- handles

    def _remote_or_local(self, file_id: int, what: str, read: Any, on_failure: Any = None) -> Any:
        """``read()``, after a change check for a local file; a remote file's requests are retried each
        (`RemoteFiles.read`). Errors name the file."""
        path = self.files[file_id].path
        try:
            if self._locations[file_id].fs is None:
                self.check_unchanged(file_id)
            return read()
        except ShardReadError:
            raise
        except (OSError, EOFError, pa.ArrowException) as error:
            if on_failure is not None:
                on_failure()
            raise ShardReadError(f"cannot read {what} of shard {path}: {error}. "
                                 "Was the file changed or truncated after the loader was built?") from error

    def handle(self, file_id: int) -> Any:
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
        local = self._locations[file_id].fs is None or self.cache is not None  # cached copies hold a descriptor
        if len(cache) > (_HANDLES_PER_THREAD if local else _REMOTE_HANDLES_PER_THREAD):
            cache.popitem(last=False)[1].close()
        return handle

    def release_mapped_pages(self, file_id: int | None = None) -> None:
        """Unmap the pages that this thread's reads of memory-mapped files (``file_id``'s, or every file's) left
        mapped; they stay in the page cache, and a later read maps them again (a minor fault).

        Every page a memory map has touched stays mapped into the process until it is unmapped, and counts in its
        memory (RSS, PSS): over a pass, the whole dataset (measured: 740 MB of a 1,300 MB process tree after
        1,280 FLAC clips; a decode worker's share grew with each row it decoded). A reader that is done with
        the rows it read calls this: the worker processes before each chunk, the reader after each block.
        """
        cache: OrderedDict[int, Any] | None = getattr(self._tls, "handles", None)
        if not cache or _MADVISE is None:
            return
        for fid, handle in cache.items():
            if handle.mapped_range is not None and file_id in (None, fid):
                _MADVISE(ctypes.c_void_p(handle.mapped_range[0]), ctypes.c_size_t(handle.mapped_range[1]),
                         _MADV_DONTNEED)

    def _drop_handle(self, file_id: int) -> None:
        """Close this thread's handle of a file (after a failed remote read: its connection may be broken)."""
        cache = getattr(self._tls, "handles", None)
        handle = cache.pop(file_id, None) if cache is not None else None
        if handle is not None:
            handle.close()

    def _open_handle(self, file_id: int, columns: Sequence[str] | None = None, download: bool = True) -> Any:
        """A handle reading ``columns`` (default: the used ones) of a file, in the unified schema's types.

        ``download``: a remote file not yet in the cache is downloaded into it (else read remotely).
        """
        meta = self._metas[file_id]
        if meta.schema is None:
            raise IndexError(f"{self.files[file_id].path} was pruned by the filter (its table metadata rules it "
                             "out), so its rows are not this source's rows and it is never read")
        columns = self.columns if columns is None else list(columns)
        target = pa.schema([self.schema.field(c) for c in columns])
        present = [c for c in columns if c in meta.schema.names]
        # A file with none of the columns still reads one, for its rows' count (ORC gives no rows for no columns).
        handle = self._open_format_handle(file_id, present or [_cheapest_column(meta.schema)], download)
        if present != columns or any(meta.schema.field(c).type != target.field(c).type for c in present):
            return _ConformedHandle(handle, target)  # schema evolution: missing columns, narrower types
        return handle

    def read_columns(self, file_id: int, columns: Sequence[str], units: Sequence[int], what: str,
                     download: bool = True) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
        """``(unit, batches)`` for each of a file's ``units`` in order, with ``columns`` only, read through one
        handle of their own (this thread's cached one reads the used columns), closed at the end.

        ``what``: the columns as errors name them (``"column 'duration'"``); ``download``: a remote file not yet in
        the cache is downloaded into it (else read remotely: a filter may keep few of its rows).
        """
        handle = None

        def read(unit: int) -> list[pa.RecordBatch]:
            nonlocal handle
            if handle is None:
                handle = self._open_handle(file_id, columns, download)
            return handle.unit(unit)

        def forget() -> None:
            nonlocal handle
            if handle is not None:
                handle.close()
            handle = None

        try:
            for unit in units:
                yield unit, self._remote_or_local(file_id, f"{what} of batch/row group {unit}",
                                                  lambda unit=unit: read(unit), forget)
        finally:
            forget()

    def _open_format_handle(self, file_id: int, columns: list[str], download: bool = True) -> Any:
        loc, meta = self._locations[file_id], self.located(file_id)
        sparse = None
        copy = self._cached_copy(file_id, download)
        local = loc.fs is None or copy is not None  # a cached copy is read like a local file: memory-mapped
        if local:
            f = copy if copy is not None else _open_local(loc, mapped=meta.format in ("ipc_file", "ipc_stream"))
            if f.size() != meta.size:
                f.close()
                raise ShardChangedError(f"shard {loc.path} changed after the loader was built: it has {f.size()} "
                                     f"bytes, {meta.size} when it was scanned. Do not rewrite shards while a loader "
                                     "reads them; build the loader again to read the new content")
        else:  # no request here: the footer is in memory, and unit bytes are fetched when read
            tail = [(meta.size - len(meta.tail), pa.py_buffer(meta.tail))] if meta.tail else []
            sparse = SparseFile(loc, meta.size, self.remote, tail)
            f = sparse.as_arrow()
        try:
            if meta.format == "ipc_file":
                handle: Any = _IpcFileHandle(f, meta.schema, columns, local)
            elif meta.format == "ipc_stream":
                handle = _IpcStreamHandle(f, meta.schema, meta.offsets or (), columns)
            elif meta.format == "orc":
                handle = _OrcHandle(f, columns)
            elif meta.format == "tar":
                handle = TarHandle(sparse or f, meta, columns, loc.path)  # the sparse file: its slices zero-copy
            elif meta.format == "audio_file":
                handle = PlainHandle(sparse or f, meta.size, columns, meta.joined)
            else:
                handle = _ParquetHandle(f, columns, meta.parquet_metadata)
        except (OSError, pa.ArrowException) as error:
            f.close()
            if isinstance(error, ShardReadError):
                raise
            raise ShardReadError(f"cannot open shard {loc.path}: {error}") from error
        handle.sparse = sparse
        handle.mapped_range = _mapped_range(f) if local else None
        return handle

    def _cached_copy(self, file_id: int, download: bool = True) -> Any:
        """A memory map of a remote file's copy in the cache (downloaded first if needed and ``download``), or
        None: no cache, a local file, no copy and not ``download``, or a remote file whose storage reports
        neither an ETag nor a modification time (its copy could not be told from a changed object's)."""
        loc, meta = self._locations[file_id], self._metas[file_id]
        identity = cache_identity(meta)
        if self.cache is None or loc.fs is None or identity is None:
            return None
        if not download:
            found = self.cache.lookup(loc, meta.size, identity)
            return None if found is None else found[1]
        return self.cache.open(loc, meta.size, identity)

    def unit_ranges(self, file_id: int, unit: int) -> list[tuple[int, int]] | None:
        """The byte ranges a read of a remote file's unit needs (`units.unit_ranges`); None for a local file,
        a file the cache keeps (read from its local copy), or where they are not known (ORC)."""
        if self._locations[file_id].fs is None or self.cache is not None:
            return None
        meta = self.located(file_id)
        if self._whole_file(file_id) is not None:
            return [(0, meta.size)]  # fetched whole with its footer: `fetch` serves it from memory
        return unit_ranges(meta, unit, self._present_columns(file_id))

    def fetch(self, file_id: int, offset: int, length: int) -> Parts:
        """Bytes ``[offset, offset + length)`` of a remote file: from its first read's bytes while they are kept
        (a small file read whole with its footer), else requested (`RemoteFiles.fetch`)."""
        whole = self._whole_file(file_id)
        if whole is not None and offset + length <= whole.size:
            done: Future = Future()
            done.set_result(whole.slice(offset, length))
            return Parts([done])
        return self.remote.fetch(self._locations[file_id], offset, length)

    def _present_columns(self, file_id: int) -> list[str]:
        schema = self._metas[file_id].schema
        present = [c for c in self.columns if c in schema.names]
        return present or [_cheapest_column(schema)]

    def read_unit_from(self, file_id: int, unit: int, provided: list[tuple[int, pa.Buffer]]) -> list[pa.RecordBatch]:
        """A remote unit read from bytes already fetched (``[(offset, buffer)]``, covering `unit_ranges`; none when
        the file's first read fetched it whole: those bytes, or fetched now if they were dropped since)."""
        if not provided:
            whole = self._whole_file(file_id)
            provided = [] if whole is None else [(0, whole)]

        def read() -> list[pa.RecordBatch]:
            handle = self.handle(file_id)
            for offset, buffer in provided:
                handle.sparse.provide(offset, buffer)
            try:
                return handle.unit(unit)
            finally:
                for offset, _ in provided:
                    handle.sparse.forget(offset)

        return self._remote_or_local(file_id, f"batch/row group {unit}", read, lambda: self._drop_handle(file_id))

    def fetch_units(self, units: Sequence[tuple[int, int]]) -> dict[tuple[int, int], list[tuple[int, pa.Buffer]]]:
        """The bytes of remote units ``[(file_id, unit)]``, fetched concurrently (coalesced per file, long runs in
        parts: `RemoteFiles.fetch`): what `read_unit_from` takes. Units whose ranges are unknown (ORC) are left out."""
        wanted: dict[int, list[tuple[int, int]]] = {}
        known = []
        for file_id, unit in units:
            ranges = self.unit_ranges(file_id, unit)
            if ranges is not None:
                wanted.setdefault(file_id, []).extend(ranges)
                known.append((file_id, unit))
        futures = [(file_id, offset, self.fetch(file_id, offset, length))
                   for file_id, ranges in wanted.items() for offset, length in coalesce(ranges)]
        fetched: dict[int, list[tuple[int, pa.Buffer]]] = {}
        for file_id, offset, future in futures:
            fetched.setdefault(file_id, []).append((offset, future.result()))
        return {(file_id, unit): fetched.get(file_id, []) for file_id, unit in known}  # []: in memory already

    def read_unit(self, file_id: int, unit: int) -> list[pa.RecordBatch]:
        """One record batch / row group / stripe (a `UnitReader`; what `ReadAhead` reads a unit it did not fetch
        with): a remote one's bytes in as few requests as its ranges allow (retried each), a local one after a
        change check."""
        if self._locations[file_id].fs is not None and self.unit_ranges(file_id, unit) is not None:
            return self.read_unit_from(file_id, unit, self.fetch_units([(file_id, unit)])[(file_id, unit)])
        return self._remote_or_local(file_id, f"batch/row group {unit}", lambda: self.handle(file_id).unit(unit),
                                     lambda: self._drop_handle(file_id))

    def next_units(self, units: Sequence[tuple[int, int]], start: int) -> list[tuple[int, int]]:
        """``units[start:]`` up to ``RANDOM_ACCESS_BYTES`` of remote bytes (at least one), ranges known."""
        taken, total = [], 0
        self.locate_files([file_id for file_id, _ in units[start:start + _LOCATE_AHEAD]])
        for file_id, unit in units[start:]:
            ranges = self.unit_ranges(file_id, unit)
            if ranges is None:
                continue
            total += sum(length for _, length in ranges)
            if taken and total > RANDOM_ACCESS_BYTES:
                break
            taken.append((file_id, unit))
        return taken
