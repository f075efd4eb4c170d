"""Where a remote shard's bytes are fetched: `RemoteFiles` (ranged reads: concurrent, retried, counted) and
`SparseFile` (a remote file whose fetched ranges are served from memory to pyarrow's readers).

Every byte of a remote shard that audioloader reads goes through `RemoteFiles.read`:
one ranged request per call, retried on a transient fault (`with_retries`), its
length checked (a short read is retried, never parsed). That one method is the
seam for anything that changes where bytes come from (a local cache of objects).

Reads run in a thread pool (pyarrow releases the GIL while it waits on the
network), so several requests are in flight at once: construction scans many
files' tails at the same time, the read-ahead (`audioloader.shards.readahead`)
fetches upcoming record batches / row groups, and a random-access read
(`ShardDataset.read_rows`) fetches all the units it needs at once.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from .direct import DirectStores, Response, size_changed
from .identity import object_identity
from .retry import Retry, with_retries

#: Requests a dataset keeps in flight at once (construction, random access, read-ahead). pyarrow's S3 client keeps
#: at most 25 connections, so more threads would wait for one. Measured (speech rows, 50 ms a request, 64 MiB of
#: read-ahead): 16 in flight read 8,811 rows/s, 24 read 12,974, 32 read 12,991, at no cost without latency.
DEFAULT_MAX_REQUESTS = 24
#: Open remote files kept per process (each holds no connection, only its size).
_OPEN_FILES = 1024
#: A fetch longer than this goes out as parts of this size, in flight together: a store serves each connection
#: at a capped rate (S3: tens of MB/s per connection), so one 20 MB GET of a large record batch is bound by one
#: connection's rate where its parts are not. AWS's own transfer tools split at 8 MiB; 4 MiB lets the default
#: read-ahead (64 MiB) keep every request busy.
PART_BYTES = 4 * 1024 * 1024


class Parts:
    """A ranged read in flight as one or more concurrent requests (`RemoteFiles.fetch`); `result` joins them."""

    __slots__ = ("futures",)

    def __init__(self, futures: list[Future]) -> None:
        self.futures = futures

    def result(self) -> pa.Buffer:
        """The bytes, once every part arrived (one copy when there are several parts); raises a part's error."""
        buffers = [future.result() for future in self.futures]
        return buffers[0] if len(buffers) == 1 else pa.py_buffer(b"".join(buffers))

    def cancel(self) -> None:
        for future in self.futures:
            future.cancel()


class RemoteFiles:
    """Ranged reads of remote objects, through their pyarrow filesystem.

    Args:
        retry: how a failed request is retried.
        max_requests: requests in flight at once (threads of the pool).

    Attributes:
        requests, bytes: requests made and bytes received (successful ones), since creation.
        throttled, throttle_seconds: requests the store refused for going too fast (503 SlowDown, 429), and
            seconds waited because of such refusals (backoffs, and waits for a slot in the store's learned rate:
            `audioloader.shards.throttle`), since creation.

    Thread-safe. Pickles as its settings: open files and the pool stay in the process that made them.
    """

    def __init__(self, retry: Retry, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
        self.retry, self.max_requests = retry, max_requests
        self.requests = self.bytes = self.throttled = 0
        self.throttle_seconds = 0.0
        self._lock = threading.Lock()
        self._files: OrderedDict[tuple[int, str], Any] = OrderedDict()
        self._opening: dict[tuple[int, str], threading.Lock] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._stores = DirectStores()  # per filesystem, its direct reads or None
        self._identities: OrderedDict[str, str] = OrderedDict()  # identities the first reads of files saw
        self.on_read: Callable[[int], Any] | None = None  # called with each request's bytes (stats)
        self.on_throttle: Callable[[bool, float], Any] | None = None  # (refused, seconds waited) (stats)

    # ----------------------------------------------------------------- the seam

    def read(self, loc: Any, offset: int, length: int) -> pa.Buffer:
        """Bytes ``[offset, offset + length)`` of the remote file at ``loc`` (a `locations.Location`), in one
        request, retried; `ShardReadError` naming the file after the last attempt."""
        direct = self._direct(loc)
        if direct is not None:  # one GET, no HEAD; refused by the store if the object changed since its first read
            return self._read_direct(direct, loc, offset, length).data

        def attempt() -> pa.Buffer:
            f = self._file(loc)
            if loc.size is not None and f.size() != loc.size:  # its open's HEAD said: another object, not a fault
                raise size_changed(loc, f.size())
            data = f.read_at(length, offset)
            if len(data) != length:  # a short read: the connection broke mid-body
                raise EOFError(f"short read: {len(data)} of {length} bytes at offset {offset}")
            return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)

        data = with_retries(attempt, what=f"bytes {offset}-{offset + length - 1} of shard {loc.path}",
                            retry=self.retry, on_failure=lambda: self._forget(loc), store=loc.path,
                            on_throttle=self.count_throttle)
        with self._lock:
            self.requests += 1
            self.bytes += length
        if self.on_read is not None:
            self.on_read(length)
        return data

    def count_throttle(self, refused: bool, seconds: float) -> None:
        """A request refused for going too fast (``refused``) and/or ``seconds`` waited for the store's rate."""
        with self._lock:
            self.throttled += refused
            self.throttle_seconds += seconds
        if self.on_throttle is not None:
            self.on_throttle(refused, seconds)

    def read_identified(self, loc: Any, offset: int, length: int) -> tuple[pa.Buffer, str | None, int | None]:
        """``(bytes, identity, size)``: `read`, and the object's identity (`identity.object_identity`) and size
        as the store reported them. Through obstore (`direct`) one GET says both; else pyarrow's HEAD (its open)
        does, then the GET."""
        direct = self._direct(loc)
        if direct is not None:
            response = self._read_direct(direct, loc, offset, length, first=True)
            return response.data, response.identity, response.size
        opened = self.opened(loc)
        return self.read(loc, offset, length), object_identity(opened), opened.size()

    def _direct(self, loc: Any) -> Any:
        """The obstore stores reading ``loc``'s filesystem without a HEAD (`direct.store_for`), or None."""
        return self._stores.of(loc)

    def reads_directly(self, loc: Any) -> bool:
        """Whether reads of ``loc`` go through obstore: one GET, which says the object's identity and size."""
        return self._direct(loc) is not None

    def _read_direct(self, direct: Any, loc: Any, offset: int, length: int, first: bool = False) -> Response:
        with self._lock:
            known = None if first else self._identities.get(loc.fs_path)
        if_match = known[len("ETag:"):] if known is not None and known.startswith("ETag:") else None

        def attempt() -> Response:
            response = direct.read(loc.fs_path, offset, length, if_match)
            if loc.size is not None and response.size is not None and response.size != loc.size:
                raise size_changed(loc, response.size)  # another object (a short read, if smaller): never retried
            if len(response.data) != length:  # a short read: the connection broke mid-body
                raise EOFError(f"short read: {len(response.data)} of {length} bytes at offset {offset}")
            return response

        response = with_retries(attempt, what=f"bytes {offset}-{offset + length - 1} of shard {loc.path}",
                                retry=self.retry, store=loc.path, on_throttle=self.count_throttle)
        with self._lock:
            self.requests += 1
            self.bytes += length
            if response.identity is not None:
                self._identities[loc.fs_path] = response.identity
                self._identities.move_to_end(loc.fs_path)
                if len(self._identities) > _OPEN_FILES:
                    self._identities.popitem(last=False)
        if self.on_read is not None:
            self.on_read(length)
        return response

    # ----------------------------------------------------------------- concurrency

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` in the pool (requests in flight: at most ``max_requests``)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_requests, thread_name_prefix="audioloader-fetch")
            pool = self._pool
        return pool.submit(fn, *args)

    def fetch(self, loc: Any, offset: int, length: int) -> Parts:
        """Start reading bytes ``[offset, offset + length)`` in the pool, as parts of at most `PART_BYTES`
        requested at once (each a `read`); `Parts.result` waits for them."""
        ends = range(offset, offset + length, PART_BYTES)
        return Parts([self.submit(self.read, loc, start, min(PART_BYTES, offset + length - start)) for start in ends])

    def read_many(self, loc: Any, ranges: Sequence[tuple[int, int]]) -> list[pa.Buffer]:
        """The bytes of each ``(offset, length)``, fetched concurrently (long ones in parts, as `fetch`); in the
        given order."""
        if len(ranges) == 1 and ranges[0][1] <= PART_BYTES:
            return [self.read(loc, *ranges[0])]
        return [parts.result() for parts in [self.fetch(loc, offset, length) for offset, length in ranges]]

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(item) for item in items]``, run concurrently in the pool (each may `read`; never nest maps)."""
        if len(items) < 2:
            return [fn(item) for item in items]
        futures = [self.submit(fn, item) for item in items]
        return [future.result() for future in futures]

    # ----------------------------------------------------------------- open files

    def _file(self, loc: Any) -> Any:
        key = (id(loc.fs), loc.fs_path)
        with self._lock:
            f = self._files.get(key)
            if f is not None:
                self._files.move_to_end(key)
                return f
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:  # one open (one HEAD) per file, however many threads want it at once
            with self._lock:
                f = self._files.get(key)
            if f is None:
                f = loc.fs.open_input_file(loc.fs_path)  # read_at is thread-safe: one handle serves every thread
                with self._lock:
                    self._files[key] = f
                    self._opening.pop(key, None)
                    if len(self._files) > _OPEN_FILES:
                        self._files.popitem(last=False)[1].close()
        return f

    def opened(self, loc: Any) -> Any:
        """The open pyarrow file of ``loc`` (opened now if needed: pyarrow's HEAD, whose headers carry the ETag)."""
        return with_retries(lambda: self._file(loc), what=f"shard {loc.path}", retry=self.retry,
                            on_failure=lambda: self._forget(loc), store=loc.path, on_throttle=self.count_throttle)

    def _forget(self, loc: Any) -> None:
        """Drop a file's handle after a failed request (its connection may be broken)."""
        with self._lock:
            f = self._files.pop((id(loc.fs), loc.fs_path), None)
        if f is not None:
            f.close()

    def size(self, loc: Any) -> int:
        """A remote file's size (asks the store when its listing did not say)."""
        return with_retries(lambda: self._file(loc).size(), what=f"the size of shard {loc.path}", retry=self.retry,
                            on_failure=lambda: self._forget(loc), store=loc.path, on_throttle=self.count_throttle)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            files, self._files = list(self._files.values()), OrderedDict()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for f in files:
            f.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"retry": self.retry, "max_requests": self.max_requests}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["retry"], state["max_requests"])


class SparseFile(io.RawIOBase):
    """A remote file as a seekable, readable file: reads inside ranges given to it (`provide`) are served from
    memory (zero-copy slices), others are fetched (`RemoteFiles.read`) and counted in ``misses``.

    pyarrow's readers (IPC, Parquet, ORC) read through it (`as_arrow`): construction provides a file's tail,
    the read-ahead provides a record batch's or row group's ranges before pyarrow reads it.
    """

    def __init__(self, loc: Any, size: int, remote: RemoteFiles, ranges: Sequence[tuple[int, pa.Buffer]] = ()) -> None:
        super().__init__()
        self.loc, self._size, self.remote = loc, size, remote
        self._starts: list[int] = []
        self._buffers: list[pa.Buffer] = []
        self.misses = 0
        self._pos = 0
        for offset, buffer in ranges:
            self.provide(offset, buffer)

    def provide(self, offset: int, buffer: pa.Buffer) -> None:
        """Serve ``[offset, offset + len(buffer))`` from ``buffer`` from now on."""
        i = bisect.bisect_left(self._starts, offset)
        self._starts.insert(i, offset)
        self._buffers.insert(i, buffer)

    def forget(self, offset: int) -> None:
        """Stop serving the range provided at ``offset`` (its memory is released when pyarrow lets go of it)."""
        i = bisect.bisect_left(self._starts, offset)
        if i < len(self._starts) and self._starts[i] == offset:
            del self._starts[i], self._buffers[i]

    def _covering(self, offset: int, end: int) -> tuple[int, pa.Buffer] | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        # Provided ranges may overlap (a tail and a batch): look back a few for one that covers the read.
        for j in range(i, max(-1, i - 4), -1):
            if self._starts[j] + len(self._buffers[j]) >= end:
                return self._starts[j], self._buffers[j]
        return None

    def covers(self, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` is served from memory."""
        return self._covering(offset, min(self._size, offset + length)) is not None

    def read_at(self, nbytes: int, offset: int) -> pa.Buffer:
        end = min(self._size, offset + nbytes)
        if end <= offset:
            return pa.py_buffer(b"")
        found = self._covering(offset, end)
        if found is not None:
            return found[1].slice(offset - found[0], end - offset)
        self.misses += 1
        return self.remote.read(self.loc, offset, end - offset)

    def size(self) -> int:
        return self._size

    # io.RawIOBase, for pa.PythonFile
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> pa.Buffer:
        n = self._size - self._pos if size is None or size < 0 else size
        data = self.read_at(n, self._pos)
        self._pos += len(data)
        return data

    def as_arrow(self) -> pa.PythonFile:
        """This file as a pyarrow random-access file (reads stay zero-copy)."""
        return pa.PythonFile(self, mode="r")
