"""`Storage`: how remote shards are kept (a local cache of whole files); local shards ignore it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Storage:
    """How remote shards (``s3://``, ``gs://``, any ``filesystem=``) are kept; local files are read in place.

    Attributes:
        cache_dir: a folder on a local disk where whole remote shard files are kept after their first
            read, so later passes (and restarts) read them from disk, memory-mapped, instead of the
            network. Shared safely by every rank and process of the machine (one download per file).
            It must be a folder of its own (new or empty: the cache deletes what it evicts). None: no cache.
        cache_limit: bytes the cache may hold (an int, or e.g. ``"200GB"``); least recently used files
            are evicted past it. At least the largest shard; best the whole dataset (then every pass
            after the first reads nothing remote). None: no limit.

    See docs/storage.md ("A local cache") for sizing it and sharing it between ranks.
    """

    cache_dir: str | os.PathLike | None = None
    cache_limit: int | str | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not os.fspath(self.cache_dir):
                raise TypeError(f"Storage.cache_dir={self.cache_dir!r}: must be a folder path (str or Path) or None")
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_limit is not None:
            if self.cache_dir is None:
                raise ValueError(f"Storage(cache_limit={self.cache_limit!r}) without cache_dir: give the cache a "
                                 "folder, Storage(cache_dir='/local/disk/audioloader-cache', cache_limit=...)")
            object.__setattr__(self, "cache_limit", parse_bytes(self.cache_limit, "Storage.cache_limit"))


DEFAULT_STORAGE = Storage()


def check_storage(storage: Any) -> Storage:
    """``storage``, or the default `Storage` for None; a TypeError naming the argument for anything else."""
    if storage is None:
        return DEFAULT_STORAGE
    if not isinstance(storage, Storage):
        raise TypeError(f"storage must be an audioloader.Storage, got {type(storage).__name__}")
    return storage
