"""How a `ShardDataset` reads one unit (record batch / row group / stripe): a local file through a memory map,
a remote one from bytes fetched in as few requests as its ranges allow (`RemoteFiles`, concurrently for many
units), parsed by pyarrow from memory (`SparseFile`)."""

from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from ...errors import ShardChangedError, ShardReadError
from ..formats.readers import ConformedHandle as _ConformedHandle
from ..formats.readers import IpcFileHandle as _IpcFileHandle
from ..formats.readers import IpcStreamHandle as _IpcStreamHandle
from ..formats.readers import OrcHandle as _OrcHandle
from ..formats.readers import ParquetHandle as _ParquetHandle
from ..formats.scan import cache_identity
from ..formats.scan import cheapest_column as _cheapest_column
from ..formats.scan import open_local as _open_local
from ..formats.tar_format import PlainHandle, TarHandle
from ..storage.remote import Parts, SparseFile
from ..storage.units import coalesce, unit_ranges

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
    """The unit-reading half of `ShardDataset` (a mixin: it uses the dataset's ``_locations``, ``_metas``,
    ``files``, ``remote``, ``_tls``, ``schema``, ``used_columns`` and ``check_unchanged``)."""

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
        columns = self.used_columns if columns is None else list(columns)
        target = pa.schema([self.schema.field(c) for c in columns])
        present = [c for c in columns if c in meta.schema.names]
        # A file with none of the columns still reads one, for its rows' count (ORC gives no rows for no columns).
        handle = self._open_format_handle(file_id, present or [_cheapest_column(meta.schema)], download)
        if present != columns or any(meta.schema.field(c).type != target.field(c).type for c in present):
            return _ConformedHandle(handle, target)  # schema evolution: missing columns, narrower types
        return handle

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
        present = [c for c in self.used_columns if c in schema.names]
        return present or [_cheapest_column(schema)]

    def read_unit_from(self, file_id: int, unit: int, provided: list[tuple[int, pa.Buffer]]) -> list[pa.RecordBatch]:
        """A remote unit read from bytes already fetched (``[(offset, buffer)]``, covering `unit_ranges`; none when
        the file's first read fetched it whole: those bytes, or fetched now if they were dropped since)."""
        if not provided:
            whole = self._whole_file(file_id)
            provided = [] if whole is None else [(0, whole)]

        def read() -> list[pa.RecordBatch]:
            handle = self._handle(file_id)
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
        return self._remote_or_local(file_id, f"batch/row group {unit}", lambda: self._handle(file_id).unit(unit),
                                     lambda: self._drop_handle(file_id))

    def _next_units(self, units: Sequence[tuple[int, int]], start: int) -> list[tuple[int, int]]:
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
