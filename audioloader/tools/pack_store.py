"""Where ``audioloader pack`` puts its shards: a local folder, or a prefix in object storage.

A shard is published only once it is complete, so a reader (or a rerun) never finds half of one
under its final name:

- Local OUT: `ShardWriter` writes a hidden temporary file in OUT, fsyncs it and renames it onto
  the shard's name. A pack killed mid-shard leaves only the temporary file, which the rerun deletes.
- Remote OUT (``s3://bucket/prefix``, ``gs://...``): the shard is written to a local staging
  folder (a temporary folder; one shard at a time, so its disk use is one shard; a killed pack's is
  removed by the next remote pack on the machine, `new_staging_folder`), then uploaded
  under its final key in one stream: pyarrow sends a single PUT for a small shard and a multipart
  upload for a large one, and S3 makes a multipart object visible only when the upload completes.
  A process killed mid-upload leaves no object (the parts already sent are kept by S3 until an
  abort; a bucket lifecycle rule "abort incomplete multipart uploads after 1 day" removes them).
  An upload that fails with an exception is deleted again (pyarrow completes a stream that is
  closed on an error), and an upload whose size does not match the local shard is refused.

The journal and ``labels.json`` are small: written whole (a temporary file renamed; one PUT).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs

from audioloader.errors import redacted
from audioloader.shards.sources.pack_folders import PACK_JOURNAL, check_pack_folders
from audioloader.shards.storage.locations import is_url
from audioloader.workers.forks import process_identity

from .remote_files import open_url

__all__ = ["LocalOut", "RemoteOut", "crash_point", "forget_crash_points", "open_out", "require_finished"]

#: Bytes sent to the store per write call when uploading a shard.
UPLOAD_CHUNK = 8 * 2**20
_KILL_VARIABLE = "AUDIOLOADER_PACK_TEST_KILL"
_EVENTS: dict[str, int] = {}


def crash_point(event: str) -> None:
    """Test hook: with ``AUDIOLOADER_PACK_TEST_KILL="EVENT:N"`` the process kills itself (SIGKILL) the N-th time
    EVENT happens: ``row`` (a row written to an open shard), ``upload`` (a part of a shard sent, the upload not
    complete), ``shard`` (a shard published, not yet listed in the journal), ``journal`` (the journal lists it).
    tests/test_pack_resume.py and tests/test_pack_s3.py use it; nothing else sets it."""
    spec = os.environ.get(_KILL_VARIABLE)
    if not spec or not spec.startswith(f"{event}:"):
        return
    _EVENTS[event] = _EVENTS.get(event, 0) + 1
    if _EVENTS[event] == int(spec.split(":", 1)[1]):
        os.kill(os.getpid(), signal.SIGKILL)


def forget_crash_points() -> None:
    """Count the test hook's events from zero (a new pack)."""
    _EVENTS.clear()


class LocalOut:
    """A local output folder."""

    remote = False

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.staging = self.folder
        self.display = str(self.folder)

    def create(self) -> None:
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"OUT {self.display!r} exists and is not a folder")
        self.created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)

    def discard_if_empty(self) -> None:
        """Remove OUT again when this pack created it and it holds nothing (a refused pack leaves no trace)."""
        if getattr(self, "created", False):
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only an empty folder goes

    def names(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir()) if self.folder.is_dir() else []

    def read_text(self, name: str) -> str | None:
        try:
            return (self.folder / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, name: str, text: str) -> None:
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:12]}.tmp"  # unique: parts may write labels.json at once
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.folder / name)
        except BaseException:  # Ctrl-C or a full disk: no temporary left behind (a kill's is removed by the rerun)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / name).unlink()

    def remove_temporaries(self, is_mine: Callable[[str], bool]) -> None:
        """Delete the temporary files a killed writer left behind, of the shards (and journal) ``is_mine(name)``
        (only those: other parts may be writing into the same folder now). ShardWriter and `write_text` name them
        ``.NAME.RANDOM.tmp``."""
        for name in self.names():
            if name.startswith(".") and name.endswith(".tmp") and is_mine(name[1:-4].rsplit(".", 1)[0]):
                self.remove(name)

    def publish(self, shard: Path) -> Path:
        return shard  # ShardWriter has renamed it into place

    def location(self, name: str) -> Path:
        return self.folder / name

    def write_index(self) -> None:
        from audioloader.shards.catalog.manifest_source import write_folder_manifest

        write_folder_manifest(self.folder)

    def close(self) -> None:
        pass


class RemoteOut:
    """A prefix in object storage; shards are staged in a local temporary folder and uploaded when complete."""

    remote = True

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") if "?" not in url else url
        self.fs, path = open_url(url)
        self.root = path.rstrip("/")
        self.display = redacted(url).rstrip("/")
        self.staging = new_staging_folder()

    def create(self) -> None:
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise ValueError(f"OUT {self.display!r} is an object, not a prefix (folder)")

    def names(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return sorted(info.base_name for info in infos if info.type == pafs.FileType.File)

    def read_text(self, name: str) -> str | None:
        try:
            with self.fs.open_input_stream(f"{self.root}/{name}") as stream:
                return stream.read().decode("utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, name: str, text: str) -> None:
        with self.fs.open_output_stream(f"{self.root}/{name}") as out:  # one PUT: the object appears whole
            out.write(text.encode("utf-8"))

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(f"{self.root}/{name}")

    def remove_temporaries(self, is_mine: Callable[[str], bool]) -> None:
        pass  # temporaries are in this run's own staging folder

    def discard_if_empty(self) -> None:
        pass  # a prefix is no object: nothing was created

    def publish(self, shard: Path) -> str:
        """Upload a finished local shard under its final key, then delete the local copy."""
        key = f"{self.root}/{shard.name}"
        size = shard.stat().st_size
        try:
            with self.fs.open_output_stream(key) as out, open(shard, "rb") as handle:
                while chunk := handle.read(UPLOAD_CHUNK):
                    out.write(chunk)
                    crash_point("upload")
            uploaded = self.fs.get_file_info(key).size
            if uploaded != size:
                raise OSError(f"{self.location(shard.name)}: uploaded {uploaded} bytes of {size}")
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(key)
            raise
        shard.unlink()
        return self.location(shard.name)

    def location(self, name: str) -> str:
        return f"{self.display}/{name}"

    def write_index(self) -> None:
        from audioloader.shards.catalog.manifest_source import write_folder_manifest

        write_folder_manifest(self.url)

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


#: A remote pack's staging folders: ``<temp>/audioloader-pack-<pid>-<random>``.
STAGING_PREFIX = "audioloader-pack-"


def new_staging_folder() -> Path:
    """A new local staging folder for this process's remote pack, after removing those of packs that were killed
    (their process is gone). A SIGKILL (the out-of-memory killer, a preempted job) runs no clean-up, and each
    such pack left up to a shard's size of disk in the temp folder for good."""
    for old in Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}*-*"):
        pid = old.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and process_identity(int(pid)) is None:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))


def open_out(out: str | os.PathLike[str]) -> LocalOut | RemoteOut:
    """The store of ``out``: a URL is a remote prefix, anything else a local folder."""
    text = os.fspath(out)
    return RemoteOut(text) if is_url(text) else LocalOut(text)


def require_finished(out: str | os.PathLike[str]) -> None:
    """Refuse to index a folder a split pack is still writing: every part's journal must say it is done.

    Raises:
        PackFolderError: naming the parts that have not finished (a folder without pack journals passes).
    """
    store = open_out(out)
    try:
        journals = {name: functools.partial(lambda n: store.read_text(n) or "{}", name) for name in store.names()
                    if PACK_JOURNAL.match(name)}
        check_pack_folders(store.display, {".": journals} if journals else {})
    finally:
        store.close()
