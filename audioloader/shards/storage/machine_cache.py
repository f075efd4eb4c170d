"""This machine's cache folder: the one root under which audioloader keeps what it can make again.

``cache_root()`` is ``$AUDIOLOADER_CACHE`` when set, else ``$XDG_CACHE_HOME/audioloader``
(the XDG base directory rule), else ``~/.cache/audioloader``. Under it:

- ``index/``: cached metadata indexes of remote folders (`audioloader.shards.catalog.index`);
- ``shared/``: files one process of the machine fetches or makes for all (`shared_file`): dataset manifests
  of remote folders and manifests built from a listing (`audioloader.shards.manifest_source`);
- ``demo-v1/``, ``demo-v1-quick/``: the demo's synthetic dataset (``audioloader demo``);
- ``bench/``: the benchmark datasets (``audioloader bench``; several hundred MB).

Everything there can be deleted at any time (``rm -rf ~/.cache/audioloader``): it is made again on
demand. The environment is read on every call, so a test or a job can point it elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ShardReadError

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows: no sharing, every process makes its own copy
    fcntl = None

__all__ = ["SharedFileTimeout", "cache_root", "identity_path", "shared_file"]


def cache_root() -> Path:
    """The machine cache folder (not created here): see the module docstring for the order of precedence."""
    explicit = os.environ.get("AUDIOLOADER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    # XDG: an empty or relative XDG_CACHE_HOME is invalid and must be ignored.
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "audioloader"


# ----------------------------------------------------------------------------- files shared by a machine's processes

#: Seconds a file published into ``shared/`` is reused without asking the store again: the ranks of one job start
#: within seconds of each other, so one fetch (or listing) serves them all; a start later than this fetches again.
SHARED_FRESH_SECONDS = 300.0
#: Seconds a process waits for the process of its machine that fetches a shared file (``$AUDIOLOADER_SHARED_TIMEOUT``
#: overrides it): a listing of a million files takes minutes.
SHARED_TIMEOUT_SECONDS = 1800.0
#: Seconds between two tries of a busy lock while waiting (a waiter costs a system call each).
_POLL_SECONDS = 0.02


class SharedFileTimeout(ShardReadError, TimeoutError):
    """A process waited too long for another process of its machine to publish a shared file (manifest, listing)."""


def shared_file(name: str, produce: Callable[[str], Any], *, what: str, fresh_seconds: float = SHARED_FRESH_SECONDS,
                timeout: float | None = None, still_valid: Callable[[Path], bool] | None = None
                ) -> tuple[Path | None, Any]:
    """``(path, produced)``: the file ``shared/<name>`` of the machine cache, made once for the machine's processes.

    The first process to take the file's lock (``flock``, so a dead holder releases it) is the
    machine's leader for it: unless a fresh copy is there (published less than ``fresh_seconds``
    ago), it calls ``produce(temporary path)``, which writes the file, and renames it into place
    (atomic: a reader never sees a torn file). The others wait for the lock, then map the
    published copy: no request of their own. ``produced`` is what ``produce`` returned, in the
    process that called it; None elsewhere. ``path`` is None where ``produce`` wrote nothing. Where the
    cache folder cannot be written (a read-only home), the file is made in a private temporary folder.

    ``still_valid(path)``: asked by the leader, under the lock, when the published copy is older than
    ``fresh_seconds``: True keeps it (its age starts again; e.g. one HEAD finds the store's object is still
    the one the copy was made from), False makes it again. Without it an old copy is made again. ``produce``
    may write what the file was made from into ``<temporary>.identity``: it is published beside the file as
    ``<path>.identity`` (`identity_path`), for ``still_valid`` to read.

    Raises:
        SharedFileTimeout: the lock was held longer than ``timeout`` seconds (default
            `SHARED_TIMEOUT_SECONDS` or ``$AUDIOLOADER_SHARED_TIMEOUT``); the message names the file,
            the process holding it and what to check.
    """
    path = cache_root() / "shared" / name
    if fcntl is None:
        private = Path(tempfile.mkdtemp(prefix="audioloader-shared-")) / name
        return private, produce(str(private))
    if _fresh(path, fresh_seconds):
        return path, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # nowhere to share it: this process alone
        private = Path(tempfile.mkdtemp(prefix="audioloader-shared-")) / name
        return private, produce(str(private))
    try:
        _lock(fd, path, what, timeout)
        if _fresh(path, fresh_seconds):  # published by the leader while this process waited
            return path, None
        if still_valid is not None and path.exists() and still_valid(path):  # old, but still what the store has
            os.utime(path)
            return path, None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)  # named to waiters that time out
        temporary = f"{path}.{os.getpid()}-{secrets.token_hex(4)}.part"
        try:
            produced = produce(temporary)
            if not os.path.exists(temporary):  # nothing to publish: each process makes its own
                return None, produced
            os.replace(temporary, path)
            if os.path.exists(f"{temporary}.identity"):
                os.replace(f"{temporary}.identity", identity_path(path))
            else:  # none recorded for this copy: an old one must not vouch for it
                with contextlib.suppress(OSError):
                    os.unlink(identity_path(path))
        finally:
            for leftover in (temporary, f"{temporary}.identity"):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        return path, produced
    finally:
        os.close(fd)  # releases the lock


def identity_path(path: Path | str) -> Path:
    """Where the identity of what the shared file ``path`` was made from is kept (see `shared_file`)."""
    return Path(f"{path}.identity")


def _fresh(path: Path, fresh_seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < fresh_seconds
    except OSError:
        return False


def _lock(fd: int, path: Path, what: str, timeout: float | None) -> None:
    """Take the exclusive lock of ``fd``, waiting at most ``timeout`` seconds (see `shared_file`)."""
    if timeout is None:
        timeout = float(os.environ.get("AUDIOLOADER_SHARED_TIMEOUT") or SHARED_TIMEOUT_SECONDS)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_SECONDS)
    try:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
    except OSError:
        holder = "unknown"
    raise SharedFileTimeout(
        f"waited {timeout:.0f} s for {what}, which another process of this machine ({holder}) is making into "
        f"{path} (lock {path}.lock); check that process (is it alive, does it reach the store, is it listing a very "
        "large prefix?), raise $AUDIOLOADER_SHARED_TIMEOUT, or delete the lock file if no audioloader runs")
