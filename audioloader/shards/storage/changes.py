"""Local shards that change under a reader: checks before a memory-mapped file's bytes are touched."""

from __future__ import annotations

import os

from ...errors import ShardReadError


def check_local(path: str, size: int, mtime_ns: int | None) -> None:
    """`ShardReadError` naming ``path`` and what changed, when its size or modification time differ."""
    try:
        now = os.stat(path)
    except OSError as error:
        raise ShardReadError(f"shard {path} cannot be read any more ({error}); it was removed or replaced "
                             "after the loader was built") from error
    changes = []
    if now.st_size != size:
        changes.append(f"size {size} -> {now.st_size} bytes")
    if mtime_ns is not None and now.st_mtime_ns != mtime_ns:
        changes.append(f"modification time {mtime_ns} -> {now.st_mtime_ns} ns")
    if changes:
        raise ShardReadError(f"shard {path} changed while it was being read ({', '.join(changes)}). A shard must not "
                             "be rewritten or truncated while a loader reads it (a memory-mapped read of a "
                             "truncated file would crash the process); build the loader again to read the new content")
