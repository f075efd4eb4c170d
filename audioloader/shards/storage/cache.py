"""A local cache of whole remote shard files, shared by the processes of one machine (`ObjectCache`).

Multi-pass training reads every remote shard again each pass; with a cache it is
downloaded once per machine and then read like a local file (memory-mapped, parsed
in place; nothing goes over the network). The unit is the whole
object, as in LitData and MosaicML Streaming: a cached copy is a plain shard file,
read by the local code path; and the ranks of a machine, which read different
splits of the same files, share one download of each file.

Layout of ``cache_dir`` (nothing else in it is ever touched, so it must be a folder of its own):

- ``AUDIOLOADER_CACHE``: the marker that makes a folder a cache (written when it is made).
- ``objects/<key>-<name>``: complete copies. ``key`` is a hash of the object's URL, size and
  identity (ETag or version, else its modification time), so a changed object has another
  key: it is downloaded again, never served stale, and its old copy ages out.
- ``objects/<key>-<name>.<pid>-<random>.part``: a download in progress, created at its full
  size (so other processes count the space as taken) and renamed to the copy when every byte
  is in and the size and identity checked. Readers open only complete copies: a reader never
  sees a torn file, and a crash (a killed process) leaves only a ``.part`` that a later
  writer deletes.
- ``locks/<key>``: one lock per object (``flock``: released by the kernel when its holder
  dies), held while the object is downloaded: processes that miss at once wait for the
  first one's download instead of downloading it again. ``space.lock``: held while space
  is counted, evicted and reserved.

Eviction is least recently used (a copy's modification time is set when it is opened)
and only ever deletes complete copies in ``objects/``; a copy that a reader has mapped
stays readable after it is deleted (POSIX: the space is freed when the last mapping goes).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ...errors import ShardChangedError, ShardReadError, redacted
from .direct import DirectStores, size_changed
from .identity import identities_differ, object_identity
from .retry import Retry, with_retries

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows
    fcntl = None

MARKER = "AUDIOLOADER_CACHE"
#: Bytes per ranged request when a copy is downloaded (one request for most shards; bounded memory for big ones).
DOWNLOAD_CHUNK = 64 << 20

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any, what: str) -> int:
    """A byte count from an int or a string such as ``"500MB"`` or ``"20 GiB"``; ValueError naming ``what``."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{what}={value!r}: give bytes as an int, or a number with a unit (B, KB, MB, GB, TB, "
                             "KiB, MiB, GiB, TiB), e.g. '200GB'")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}={value!r}: must be a positive number of bytes (an int, or e.g. '200GB')")
    return value


_COPY = re.compile(r"^[0-9a-f]{32}-[^/]*$")  # a complete copy's name: "<key>-<name>", never a ".part"
_PART = re.compile(r"^([0-9a-f]{32})-.*\.\d+-[0-9a-f]+\.part$")


class ObjectCache:
    """Whole remote objects cached in ``directory``, at most ``limit`` bytes (None: no limit), LRU-evicted.

    Thread- and process-safe: any number of loaders, ranks and processes on one machine may share a directory.
    Pickles as its settings (a worker process opens the same directory).

    Attributes:
        directory, limit: as given.
        counters: ``cache_hits`` (opened from a copy), ``cache_misses`` (downloaded), ``cache_waits`` (a miss
            that another process or thread was already downloading: waited for, not downloaded again),
            ``cache_bytes_downloaded``, ``cache_evictions``, ``cache_bytes_evicted``.
        held_bytes: the folder's bytes (copies and downloads in progress) when this process last counted
            them (before a download), or None.
    """

    def __init__(self, directory: str, limit: int | None, retry: Retry) -> None:
        if fcntl is None:
            raise ValueError("Storage(cache_dir=...) needs POSIX file locks (Linux, macOS), which this platform "
                             "lacks; leave cache_dir out here")
        self.directory, self.limit, self.retry = os.path.abspath(os.path.expanduser(directory)), limit, retry
        self.counters: dict[str, int] = dict.fromkeys(
            ("cache_hits", "cache_misses", "cache_waits", "cache_bytes_downloaded", "cache_evictions",
             "cache_bytes_evicted"), 0)
        self._stats: Any = None  # a loader's `LoaderStats`, counted into as well (`report_to`)
        self.held_bytes: int | None = None
        self._lock = threading.Lock()
        self._direct = DirectStores()
        self._prepare()

    def report_to(self, stats: Any) -> None:
        """Count into ``stats`` (a `LoaderStats`) too: the counters above, and the gauges ``cache_hit_rate``
        (hits / (hits + misses) of every cache reporting there) and ``cache_bytes`` (`held_bytes`)."""
        self._stats = stats

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "limit": self.limit, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], state["limit"], state["retry"])

    # ----------------------------------------------------------------- the folder

    def _prepare(self) -> None:
        """Make the folder a cache, or check that it is one: never adopt (and so evict from) a folder of other files."""
        marker = os.path.join(self.directory, MARKER)
        if not os.path.exists(marker):
            if os.path.isdir(self.directory) and any(not n.startswith(".") for n in os.listdir(self.directory)):
                raise ValueError(f"Storage(cache_dir={self.directory!r}): the folder holds other files and is not an "
                                 "audioloader cache; the cache deletes what it evicts, so give it a folder of its own "
                                 "(new or empty), e.g. a subfolder")
            os.makedirs(self.directory, exist_ok=True)
            with open(marker, "w", encoding="utf-8") as f:
                f.write("A cache of remote shard files made by audioloader (Storage(cache_dir=...)); safe to delete "
                        "when no loader runs.\n")
        for sub in ("objects", "locks"):
            os.makedirs(os.path.join(self.directory, sub), exist_ok=True)

    def _objects(self) -> str:
        return os.path.join(self.directory, "objects")

    def key_of(self, url: str, size: int, identity: str) -> str:
        return hashlib.blake2b(f"{redacted(url)}\0{size}\0{identity}".encode(), digest_size=16).hexdigest()

    def path_of(self, url: str, size: int, identity: str) -> str:
        """Where the copy of the object at ``url`` with this size and identity lives (whether it is there or not)."""
        name = re.sub(r"[^A-Za-z0-9._-]", "_", redacted(url).rstrip("/").rsplit("/", 1)[-1])[-100:]
        return os.path.join(self._objects(), f"{self.key_of(url, size, identity)}-{name}")

    # ----------------------------------------------------------------- reading

    def lookup(self, loc: Any, size: int, identity: str) -> tuple[str, pa.MemoryMappedFile] | None:
        """``(path, memory map)`` of the complete copy of ``loc`` with this size and identity, or None (no download)."""
        path = self.path_of(loc.path, size, identity)
        mapped = _map_if_complete(path, size)
        return None if mapped is None else (path, mapped)

    def open(self, loc: Any, size: int, identity: str) -> pa.MemoryMappedFile:
        """A memory map of the cached copy of the remote file ``loc`` (a `locations.Location`), downloading it
        first when there is none (once across processes). Raises `ShardChangedError` if the object's size or
        identity is no longer ``size`` / ``identity`` (it changed after the loader was built),
        found by the download's first request."""
        path = self.path_of(loc.path, size, identity)
        mapped = _map_if_complete(path, size)
        if mapped is not None:
            self._count("cache_hits")
            return mapped
        self._check_fits(loc, size)
        key = os.path.basename(path)[:32]
        with _flock(os.path.join(self.directory, "locks", key)):
            mapped = _map_if_complete(path, size)  # downloaded by another process while this one waited
            if mapped is not None:
                self._count("cache_waits")
                self._count("cache_hits")
                return mapped
            for stale in _parts_of(self._objects(), key):  # crashed downloads of this object: we hold its lock
                _remove(stale)
            part = f"{path}.{os.getpid()}-{secrets.token_hex(4)}.part"
            self._reserve(part, size, loc)
            try:
                self._download(loc, part, size, identity)
                os.replace(part, path)  # atomic: readers see no copy, then a complete one
            finally:
                _remove(part)
        self._count("cache_misses")
        self._count("cache_bytes_downloaded", size)
        mapped = _map_if_complete(path, size)
        if mapped is None:  # evicted between the rename and here by a process that needed space at once
            raise ShardReadError(f"the cached copy of shard {loc.path} was evicted as soon as it was written: "
                                 f"Storage(cache_limit={self.limit:,}) is too small for the shards read at once; "
                                 "raise it")
        return mapped

    def check_holds(self, files: list[tuple[int, str]]) -> None:
        """A ValueError naming the largest of ``files`` (``(size, path)``) when the limit cannot hold it: at
        construction, not at its first read."""
        if self.limit is None or not files:
            return
        size, path = max(files)
        if size > self.limit:
            raise ValueError(f"Storage(cache_limit={self.limit:,}) is smaller than shard {path} ({size:,} bytes): the "
                             "cache keeps whole shard files, so its limit must be at least the largest shard's size, "
                             "and better several times that (every rank of the machine reads a few shards at once; "
                             "docs/storage.md says how to size it). Raise cache_limit, or leave cache_dir out")

    def _check_fits(self, loc: Any, size: int) -> None:
        if self.limit is not None and size > self.limit:
            raise ShardReadError(
                f"shard {loc.path} has {size:,} bytes, more than Storage(cache_limit={self.limit:,}): the cache holds "
                f"whole shard files, so its limit must be at least the largest shard's size, and better several "
                f"times that (every rank reads a few shards at once). Raise cache_limit, or leave cache_dir out")

    def _download(self, loc: Any, part: str, size: int, identity: str) -> None:
        """Every byte of the object into ``part`` (created at its size), its size and identity checked by the first
        request, before any byte is kept; retried whole on a transient fault. Through obstore (`direct`) each chunk
        is one GET (the first one says the size and ETag; the others are conditional on that ETag), else pyarrow's
        stream (a HEAD, then GETs)."""
        direct = self._direct.of(loc)

        def attempt() -> None:
            with open(part, "r+b") as out:
                chunks = self._direct_chunks(direct, loc, size, identity) if direct is not None else \
                    self._stream_chunks(loc, size, identity)
                copied = 0
                for chunk in chunks:
                    try:
                        out.write(chunk)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        raise ShardReadError(f"the disk of the cache {self.directory} is full ({error}) while "
                                             f"downloading shard {loc.path}: free space there, or lower "
                                             "Storage(cache_limit=...) below the disk's free space") from None
                    copied += len(chunk)
                if copied != size:
                    raise ShardChangedError(f"shard {loc.path} changed after the loader was built: {copied:,} bytes "
                                            f"downloaded, {size:,} when it was scanned; build the loader again")
                out.flush()
                os.fsync(out.fileno())  # the rename must not publish a copy whose bytes a crash could lose

        with_retries(attempt, what=f"the download of shard {loc.path} into the cache {self.directory}",
                     retry=self.retry, store=loc.path, on_throttle=self._count_throttle)

    def _direct_chunks(self, direct: Any, loc: Any, size: int, identity: str) -> Iterator[Any]:
        """The object's bytes, `DOWNLOAD_CHUNK` a GET (obstore): the first response's size and ETag are checked
        before its bytes are given; later GETs send ``If-Match`` with that ETag (a rewrite mid-download is refused)."""
        if_match = None
        for offset in range(0, size, DOWNLOAD_CHUNK):
            length = min(DOWNLOAD_CHUNK, size - offset)
            response = direct.read(loc.fs_path, offset, length, if_match)
            if response.size is not None and response.size != size:
                raise size_changed(loc, response.size)
            _check_identity(loc, identity, response.identity)
            if len(response.data) != length:  # a short read: the connection broke mid-body
                raise EOFError(f"short read: {len(response.data)} of {length} bytes at offset {offset}")
            if response.identity is not None and response.identity.startswith("ETag:"):
                if_match = response.identity[len("ETag:"):]
            yield response.data

    def _stream_chunks(self, loc: Any, size: int, identity: str) -> Iterator[bytes]:
        """The object's bytes through pyarrow's stream (its open is a HEAD, whose headers are checked first)."""
        with loc.fs.open_input_stream(loc.fs_path) as source:
            _check_identity(loc, identity, object_identity(source))  # before any byte is read
            while True:
                chunk = source.read(DOWNLOAD_CHUNK)
                if not chunk:
                    return
                yield chunk

    def _count_throttle(self, refused: bool, seconds: float) -> None:
        if self._stats is not None:  # as `ArrowShardReader` counts a dataset's own requests
            self._stats.count("throttled_requests", int(refused))
            self._stats.add_seconds("throttle_wait", seconds)

    # ----------------------------------------------------------------- space

    def _reserve(self, part: str, size: int, loc: Any) -> None:
        """Create ``part`` at ``size`` bytes once the cache has room for it, evicting least recently used copies.

        Downloads in progress count at their full size. When they alone leave no room, wait for one of them
        to finish (its lock), then count again.
        """
        while True:
            with _flock(os.path.join(self.directory, "space.lock")):
                busy = self._make_room(size)
                if busy is None:
                    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    try:
                        os.ftruncate(fd, size)
                    finally:
                        os.close(fd)
                    return
            with _flock(os.path.join(self.directory, "locks", busy)):
                pass  # that download ended: its space is a copy now (evictable) or free

    def _make_room(self, size: int) -> str | None:
        """Evict until ``size`` more bytes fit; None when they do, else the key of a download in progress to
        wait for. Under the space lock."""
        if self.limit is None:
            return None
        copies, used, busy = [], 0, None
        with os.scandir(self._objects()) as entries:
            for entry in entries:
                part = _PART.match(entry.name)
                if part is not None:
                    if _is_locked(os.path.join(self.directory, "locks", part.group(1))):
                        used += _size(entry)
                        busy = part.group(1)
                    else:  # its downloader died: the space is free
                        _remove(entry.path)
                elif _COPY.match(entry.name):
                    stat = _stat(entry)
                    if stat is not None:
                        copies.append((stat.st_mtime_ns, entry.path, stat.st_size))
                        used += stat.st_size
        copies.sort()
        while used + size > self.limit and copies:
            _, path, nbytes = copies.pop(0)
            if _remove(path):
                used -= nbytes
                self._count("cache_evictions")
                self._count("cache_bytes_evicted", nbytes)
        self.held_bytes = used + size
        return None if used + size <= self.limit else busy

    def usage(self) -> int:
        """Bytes of complete copies and downloads in progress in the folder now."""
        with os.scandir(self._objects()) as entries:
            return sum(_size(e) for e in entries if _COPY.match(e.name) or _PART.match(e.name))

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n
        stats = self._stats
        if stats is not None:
            stats.count(name, n)
            hits, misses = stats.counters.get("cache_hits", 0), stats.counters.get("cache_misses", 0)
            stats.set_gauge("cache_hit_rate", hits / (hits + misses) if hits + misses else 0.0)
            if self.held_bytes is not None:
                stats.set_gauge("cache_bytes", self.held_bytes)


def _check_identity(loc: Any, identity: str, now: str | None) -> None:
    """`ShardChangedError` when the object's identity now (a response's) is not the one it was scanned with."""
    if identities_differ(identity, now):
        raise ShardChangedError(f"shard {loc.path} changed after the loader was built (identity {identity} -> "
                                f"{now}); build the loader again to read the new content")


def _map_if_complete(path: str, size: int) -> pa.MemoryMappedFile | None:
    """A memory map of the copy at ``path`` when it is there whole (its name is only ever given to whole copies;
    the size is checked all the same), marked as just used; None when there is none."""
    try:
        mapped = pa.memory_map(path, "r")
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as error:
        if getattr(error, "errno", None) == errno.ENOENT or "No such file" in str(error):
            return None
        raise ShardReadError(f"cannot open the cached copy {path}: {error}") from error
    if mapped.size() != size:  # not written by this cache: never trust it
        mapped.close()
        _remove(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used = oldest modification time
    return mapped


@contextlib.contextmanager
def _flock(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the file at ``path`` (made if missing); the kernel drops it if this process dies.

    Each call opens its own descriptor, so threads of one process exclude each other too.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _is_locked(path: str) -> bool:
    """Whether another descriptor holds the lock at ``path`` now (a download in progress)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _parts_of(folder: str, key: str) -> list[str]:
    with os.scandir(folder) as entries:
        return [e.path for e in entries if e.name.startswith(key) and _PART.match(e.name)]


def _stat(entry: os.DirEntry) -> os.stat_result | None:
    try:
        return entry.stat()
    except FileNotFoundError:
        return None


def _size(entry: os.DirEntry) -> int:
    stat = _stat(entry)
    return 0 if stat is None else stat.st_size


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False
