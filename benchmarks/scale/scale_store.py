"""A simulated object store for `bench_scale.py`: a pyarrow filesystem (`SimStore`) that the real loader code reads
through (``Storage(filesystem=...)``), serving synthetic shard files, and counting each request the way pyarrow's
``S3FileSystem`` would make it against S3.

What counts as a request (pyarrow 2x's S3 filesystem, checked against moto in `bench_scale.py --real`):

- ``get_file_info(path)``: a HEAD of the object; a path that is no object (a folder) adds a LIST (one key);
- ``get_file_info(FileSelector(recursive=True))``: a LIST per 1,000 keys under the prefix (at least one);
- ``open_input_file(path)`` / ``open_input_stream(path)``: a HEAD (pyarrow asks for the size);
- each ``read`` of an open file: a ranged GET of what it asked for.

Requests are counted per ``(rank, phase)`` (`SimStore.charge_to`), with their bytes, and split by whether the
caller's own thread made them (in sequence) or a thread of audioloader's pools (``audioloader-fetch``,
``audioloader-scan``: many in flight at once): the time model (`bench_scale.phase_seconds`) charges latency on
that basis.
No time passes here: serving is instant, and the model turns the counts into seconds.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

#: Keys a LIST returns at most (ListObjectsV2).
LIST_PAGE = 1000
#: Thread name prefixes of audioloader's pools (`RemoteFiles.submit`, the footer scan's `formats.scan.scan_all`).
POOL_PREFIXES = ("audioloader-fetch", "audioloader-scan")


@dataclass
class Tally:
    """Requests and bytes of one (rank, phase): ``requests[kind]`` by kind (LIST, HEAD, GET), ``pooled``: those made
    by fetch-pool threads (concurrent), ``bytes`` of GET bodies, ``list_keys``: keys the LISTs returned."""

    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pooled: int = 0
    bytes: int = 0
    list_keys: int = 0
    objects: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # GET bytes per object

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    @property
    def sequential(self) -> int:
        return self.total - self.pooled


class _Object:
    """A stored object: its bytes are ``data`` (shared by every synthetic file with the same content)."""

    __slots__ = ("data", "mtime_ns")

    def __init__(self, data: bytes, mtime_ns: int) -> None:
        self.data, self.mtime_ns = data, mtime_ns


class _CountingFile(io.RawIOBase):
    """An open object: each ``read`` is a ranged GET (counted). A stream (``open_input_stream``) counts one GET for
    reads that go on where the last one ended: pyarrow reads a Python stream in 256 KiB pieces where S3's
    ``read_buffer()`` is one GET (audioloader reads streams whole, or in 64 MiB pieces)."""

    def __init__(self, store: SimStore, path: str, data: bytes, stream: bool = False) -> None:
        super().__init__()
        self.store, self.path, self.data, self.pos = store, path, data, 0
        self.stream, self._end = stream, -1

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: len(self.data)}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def size(self) -> int:
        return len(self.data)

    def read(self, n: int = -1) -> bytes:
        start = self.pos
        end = len(self.data) if n is None or n < 0 else min(len(self.data), self.pos + n)
        out = self.data[self.pos:end]
        self.pos = end
        if out:
            continued = self.stream and start == self._end
            self.store.count("GET", len(out), self.path, requests=0 if continued else 1)
            self._end = end
        return out

    def readall(self) -> bytes:
        return self.read(-1)


class SimStore(pafs.FileSystemHandler):
    """Objects in memory, keyed ``bucket/key``; every call counted as S3 requests (see the module docstring).

    `add` stores an object; `add_many` stores many names sharing one content (1,000,000 files cost a dict entry
    each). `charge_to(rank, phase)` says whose requests the following calls are (per thread: each rank's code
    runs in the calling thread and its fetch pool, so it is set process-wide between ranks).
    """

    def __init__(self) -> None:
        self.objects: dict[str, _Object] = {}
        self._sorted: list[str] | None = None
        self.tallies: dict[tuple[int, str], Tally] = defaultdict(Tally)
        self._who: tuple[int, str] = (-1, "setup")
        self._lock = threading.Lock()
        self.track_objects = False
        self.shared_etag: str | None = None

    # ----------------------------------------------------------------- the store

    def add(self, path: str, data: bytes, mtime_ns: int = 1_700_000_000_000_000_000) -> None:
        self.objects[path] = _Object(data, mtime_ns)
        self._sorted = None

    def add_many(self, paths: list[str], data: bytes, mtime_ns: int = 1_700_000_000_000_000_000) -> None:
        shared = _Object(data, mtime_ns)
        self.objects.update(dict.fromkeys(paths, shared))
        self.shared_etag = etag_of(data)
        self._sorted = None

    def charge_to(self, rank: int, phase: str) -> None:
        self._who = (rank, phase)

    def count(self, kind: str, nbytes: int = 0, path: str | None = None, keys: int = 0, requests: int = 1) -> None:
        pooled = threading.current_thread().name.startswith(POOL_PREFIXES)
        with self._lock:
            tally = self.tallies[self._who]
            tally.requests[kind] += requests
            tally.pooled += pooled * requests
            tally.bytes += nbytes
            tally.list_keys += keys
            if self.track_objects and path is not None and nbytes:
                tally.objects[path] += nbytes

    def _keys(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        return self._sorted

    # ----------------------------------------------------------------- pyarrow's FileSystemHandler

    def get_type_name(self) -> str:
        return "sim-s3"

    def equals(self, other: Any) -> bool:
        return other is self

    def normalize_path(self, path: str) -> str:
        return path.strip("/")

    def _info(self, path: str) -> pafs.FileInfo:
        path = path.strip("/")
        found = self.objects.get(path)
        if found is not None:
            return pafs.FileInfo(path, pafs.FileType.File, size=len(found.data), mtime_ns=found.mtime_ns)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for path in paths:
            self.count("HEAD")
            info = self._info(path)
            if info.type == pafs.FileType.NotFound:
                self.count("LIST", keys=1)  # is it a folder? (one key under "path/")
                if "/" not in path.strip("/") or self._under(path.strip("/") + "/", 1):
                    info = pafs.FileInfo(path.strip("/"), pafs.FileType.Directory)
            out.append(info)
        return out

    def _under(self, prefix: str, limit: int | None = None) -> list[str]:
        """The keys under ``prefix`` (the first ``limit`` of them), in order."""
        keys = self._keys()
        start = bisect.bisect_left(keys, prefix)
        stop = bisect.bisect_left(keys, prefix + "\U0010ffff")
        return keys[start:stop if limit is None else min(stop, start + limit)]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.strip("/")
        keys = self._under(base + "/")
        for page in range(max(1, -(-len(keys) // LIST_PAGE))):
            self.count("LIST", keys=min(LIST_PAGE, len(keys) - page * LIST_PAGE))
        if not keys and not selector.allow_not_found:
            raise FileNotFoundError(f"{base}: no such folder")
        folders = set()
        out = []
        for key in keys:
            head = key[len(base) + 1:]
            parts = head.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folders.add(f"{base}/{'/'.join(parts[:depth])}")
            found = self.objects[key]
            out.append(pafs.FileInfo(key, pafs.FileType.File, size=len(found.data), mtime_ns=found.mtime_ns))
        out.extend(pafs.FileInfo(f, pafs.FileType.Directory) for f in sorted(folders))
        return out

    def _open(self, path: str, stream: bool) -> pa.PythonFile:
        path = path.strip("/")
        self.count("HEAD")
        found = self.objects.get(path)
        if found is None:
            raise FileNotFoundError(f"Path does not exist '{path}'")
        return pa.PythonFile(_CountingFile(self, path, found.data, stream), mode="r")

    def identity(self, f: Any) -> str | None:
        """The ETag header an opened data file's HEAD carries (pyarrow's ``metadata()`` on S3, which a Python file
        cannot carry, and which pyarrow's wrapper of it does not lead back to its object): every data file of the
        simulated dataset has the same bytes (`add_many`), so the same ETag. None before `add_many`."""
        return None if self.shared_etag is None else f"ETag:{self.shared_etag}"

    def open_input_file(self, path: str) -> pa.PythonFile:
        return self._open(path, stream=False)

    def open_input_stream(self, path: str) -> pa.PythonFile:
        return self._open(path, stream=True)

    # Writing is not part of a start: the simulator stores objects with `add`.
    def _read_only(self, *args: Any) -> Any:
        raise OSError("the simulated store is read-only (objects are added with SimStore.add)")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


def filesystem(store: SimStore) -> pafs.PyFileSystem:
    """The store as a pyarrow filesystem (what ``Storage(filesystem=...)`` takes)."""
    return pafs.PyFileSystem(store)


_ETAGS: dict[int, str] = {}


def etag_of(data: bytes) -> str:
    """S3's ETag of a single-part upload of ``data``: its MD5, quoted (computed once per distinct content)."""
    etag = _ETAGS.get(id(data))
    if etag is None:
        etag = _ETAGS[id(data)] = f'"{hashlib.md5(data).hexdigest()}"'
    return etag


class SimDirect:
    """The store as audioloader's HEAD-less reader sees it (`audioloader.shards.storage.direct`, obstore over S3: one
    GET a ranged read, its response saying the object's ETag and size). `bench_scale.py` plugs it in where
    ``direct.store_for`` would give obstore's for an S3 filesystem, so a start without a manifest is counted as it
    goes on S3 with obstore installed."""

    def __init__(self, store: SimStore) -> None:
        self.store = store

    def read(self, fs_path: str, offset: int, length: int, if_match: str | None = None) -> Any:
        from audioloader.shards.storage.direct import Response

        found = self.store.objects.get(fs_path.strip("/"))
        if found is None:
            raise FileNotFoundError(fs_path)
        data = found.data[offset:offset + length]
        self.store.count("GET", len(data), fs_path)
        return Response(pa.py_buffer(data), f"ETag:{etag_of(found.data)}", len(found.data))
