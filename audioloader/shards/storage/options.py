"""How shards are read: `Storage` (the option group: this rank's share, splits, filesystem, retries, cache, remote
reads) and `RemoteReads` (read-ahead budget, requests in flight, the metadata index)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ... import checks
from .cache import parse_bytes
from .readahead import DEFAULT_READAHEAD_BYTES
from .remote import DEFAULT_MAX_REQUESTS

INDEX_MODES = ("auto", "off")


@dataclass(frozen=True)
class RemoteReads:
    """How remote shards (``s3://``, ``gs://``, any ``filesystem=``) are read; local files are memory-mapped and
    ignore it. The loader's `audioloader.Storage` carries the same fields. See docs/storage.md ("Read-ahead",
    "The metadata index").

    Attributes:
        readahead_bytes: bytes of upcoming record batches / row groups a reader fetches ahead
            and holds, at most (0: no read-ahead). Size it to bandwidth x latency x a few:
            at 100 MB/s and 50 ms a request, 5 MB are in flight at any time; the 64 MiB
            default also rides out slow requests and covers ``Shuffle(interleave=k)``'s k splits.
        max_requests: requests in flight at once per dataset (construction, read-ahead,
            random access).
        index: ``"auto"``: start from the folder's dataset manifest (``_audioloader_manifest.arrow``,
            written by ``audioloader pack`` / ``audioloader index``) when there is one, else from a 0.3
            metadata index (``_audioloader_index.arrow``) while it matches the listing, else scan the
            files; ``"off"``: ignore both and always scan.
    """

    readahead_bytes: int = DEFAULT_READAHEAD_BYTES
    max_requests: int = DEFAULT_MAX_REQUESTS
    index: str = "auto"

    def __post_init__(self) -> None:
        for name, minimum in (("readahead_bytes", 0), ("max_requests", 1)):
            checks.count(f"Storage.{name}", getattr(self, name), minimum=minimum)
        if self.index not in INDEX_MODES:
            raise ValueError(f"Storage.index={self.index!r}: must be one of {INDEX_MODES}")


DEFAULT_REMOTE_READS = RemoteReads()


def checked_remote_reads(remote_reads: Any) -> RemoteReads:
    """``remote_reads`` as given (None: `DEFAULT_REMOTE_READS`); anything but a `RemoteReads` is a TypeError naming
    the argument."""
    if remote_reads is None:
        return DEFAULT_REMOTE_READS
    if not isinstance(remote_reads, RemoteReads):
        raise TypeError(f"remote_reads must be an audioloader.shards.RemoteReads, got {type(remote_reads).__name__}")
    return remote_reads


@dataclass(frozen=True)
class Storage:
    """Which rows this loader reads and how its shard files are read.

    Attributes:
        rank, world_size: this process's share of the splits (rank ``r`` of ``w`` reads
            every ``w``-th split of a pass); None: from ``torch.distributed`` when a process
            group is initialized, else 0 / 1.
        split_rows: target rows per split, the unit assigned to ranks (a split never
            crosses a record batch, row group or stripe).
        filesystem: a ``pyarrow.fs.FileSystem`` for the source paths (None: from the URL scheme).
        retry: how remote reads are retried and timed out (`Retry`; docs/storage.md).
        readahead_bytes: bytes of upcoming record batches / row groups a reader of remote
            shards fetches ahead and holds at most (0: no read-ahead); size it to bandwidth x
            latency x a few (docs/storage.md, "Read-ahead"). Local shards are memory-mapped.
        max_requests: remote requests in flight at once per source (construction, read-ahead,
            random access).
        index: ``"auto"``: the folder's dataset manifest (``_audioloader_manifest.arrow``) when there
            is one (no listing, no request per file), else a 0.3 metadata index
            (``_audioloader_index.arrow``, or this machine's cached one) while the listing agrees with
            it; ``"off"``: ignore both and read every file's footer (docs/storage.md).
        cache_dir: a folder on a local disk where whole remote shard files are kept after their
            first read, so later passes (and restarts) read them from disk, memory-mapped, instead
            of the network. Shared safely by every rank and process of the machine (one download
            per file). A folder of its own (new or empty: the cache deletes what it evicts). None:
            no cache (docs/storage.md, "A local cache of remote shards").
        cache_limit: bytes the cache may hold (an int, or e.g. ``"200GB"``); the least recently
            used files are evicted past it. At least the largest shard; best the whole dataset
            (then every pass after the first reads nothing remote). None: no limit.
    """

    rank: int | None = None
    world_size: int | None = None
    split_rows: int = 512
    filesystem: Any = None
    retry: Any = None
    cache_dir: str | os.PathLike | None = None
    cache_limit: int | str | None = None
    readahead_bytes: int = DEFAULT_REMOTE_READS.readahead_bytes
    max_requests: int = DEFAULT_REMOTE_READS.max_requests
    index: str = DEFAULT_REMOTE_READS.index

    def __post_init__(self) -> None:
        checks.field_count(self, "split_rows")
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not os.fspath(self.cache_dir):
                raise checks.field_error(self, "cache_dir", "must be a folder path (str or Path) or None")
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_limit is not None:
            if self.cache_dir is None:
                raise ValueError(f"Storage(cache_limit={self.cache_limit!r}) without cache_dir: give the cache a "
                                 "folder, Storage(cache_dir='/local/disk/audioloader-cache', cache_limit=...)")
            object.__setattr__(self, "cache_limit", parse_bytes(self.cache_limit, "Storage.cache_limit"))
        self.remote_reads()  # checks readahead_bytes, max_requests, index

    def remote_reads(self) -> RemoteReads:
        """The settings the shard readers take (`audioloader.shards.RemoteReads`)."""
        return RemoteReads(self.readahead_bytes, self.max_requests, self.index)

    def dataset_fields(self, owner: str, *given: Any) -> tuple[Any, ...]:
        """What a `ShardDataset` takes from this group: ``(split_rows, filesystem, retry, cache_dir, cache_limit,
        remote_reads)``. ``given``: the same fields, in that order, as ``owner`` (``"ShardDataset"``,
        ``"ArrowShardReader"``) got them one by one; beside ``storage=`` each must be left at its default
        (`ValueError` naming it)."""
        for name, value in zip(DATASET_DEFAULTS, given, strict=True):
            if value != DATASET_DEFAULTS[name]:
                where = ("readahead_bytes=..., max_requests=..., index=..." if name == "remote_reads" else
                         f"{name}={value!r}")
                raise ValueError(f"{owner}(storage=..., {name}=...): give it once, in the group: "
                                 f"storage=Storage({where}, ...)")
        return (self.split_rows, self.filesystem, self.retry, self.cache_dir, self.cache_limit, self.remote_reads())



def reader_share(storage: Storage | None, rank: int | None, world_size: int | None, *,
                 has_files: bool = False) -> tuple[Any, Any]:
    """A reader's ``(rank, world_size)``: the group's when ``storage`` is given (the keywords then left at 0, 1).
    Beside a `ShardDataset` (``has_files``: it has its files) the group may give only the share."""
    if storage is None:
        return rank, world_size
    if has_files and dataclasses.replace(storage, rank=None, world_size=None) != Storage():
        raise ValueError("storage= with a ShardDataset gives only this rank's share (Storage(rank=..., "
                         "world_size=...)): the dataset already has its files (build it with the storage)")
    if (rank, world_size) != (0, 1):
        raise ValueError("ArrowShardReader.of(storage=..., rank=/world_size=...): give this rank's share once, in the "
                         "group: Storage(rank=..., world_size=...)")
    return storage.rank, storage.world_size


#: The keywords a `ShardDataset` takes one by one as well as in `Storage`, with their defaults.
DATASET_DEFAULTS: dict[str, Any] = {"split_rows": 512, "filesystem": None, "retry": None, "cache_dir": None,
                                    "cache_limit": None, "remote_reads": None}
