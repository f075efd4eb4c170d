"""Files ``audioloader pack`` reads from, and writes to, object storage (``s3://``, ``gs://``, ...).

A URL is opened with pyarrow's filesystem for its scheme (S3, GCS, HDFS; its options in the
query string, e.g. ``?endpoint_override=host:port&scheme=http``), else fsspec's. One
filesystem is made per bucket and options, and shared by the pack's threads (pyarrow's are
thread-safe). Messages and stored paths show a URL without its query string and user-info
(`audioloader.errors.redacted`).
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from audioloader.errors import redacted
from audioloader.shards.sources import local_path

__all__ = ["RemoteFile", "fetch", "is_url", "local_path", "open_url"]

_FILESYSTEMS: dict[str, Any] = {}
_LOCK = threading.Lock()


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL of a remote store: the dataset's rule (`audioloader.shards.sources.local_path`;
    ``file://`` URLs and Windows drive letters are local, and a ``file://`` URL stands for its path)."""
    return local_path(text) is None


def open_url(url: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` of a URL; the filesystem is shared per bucket and options."""
    parts = urllib.parse.urlsplit(url)
    key = f"{parts.scheme}://{parts.netloc}?{parts.query}"
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs = _filesystem(url)
        with _LOCK:
            fs = _FILESYSTEMS.setdefault(key, fs)
    return fs, f"{parts.netloc}{parts.path}".rstrip("/") if parts.scheme in ("s3", "gs", "gcs") else \
        _filesystem_path(url)


def _filesystem(url: str) -> Any:
    try:
        return pafs.FileSystem.from_uri(url)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as arrow_error:
        try:
            import fsspec
        except ImportError:
            raise ValueError(f"cannot open {redacted(url)!r}: pyarrow has no filesystem for this scheme "
                             f"({arrow_error}); install fsspec and the scheme's package (e.g. s3fs, gcsfs)") from None
        fs, _ = fsspec.core.url_to_fs(url)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _filesystem_path(url: str) -> str:
    try:
        return pafs.FileSystem.from_uri(url)[1]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        import fsspec

        return fsspec.core.url_to_fs(url)[1]


class RemoteFile:
    """An audio file (or a folder: a base for relative paths) at a URL.

    ``str()`` is the URL without query string or user-info (for messages); ``url`` keeps them.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def join(self, relative: str) -> RemoteFile:
        """The file ``relative`` (a ``/``-separated path) under this folder, with the same URL options."""
        parts = urllib.parse.urlsplit(self.url)
        path = f"{parts.path.rstrip('/')}/{relative.lstrip('/')}"
        return RemoteFile(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")))

    @property
    def parent(self) -> RemoteFile:
        """The folder holding this file (same URL options)."""
        parts = urllib.parse.urlsplit(self.url)
        folder = parts.path.rstrip("/").rsplit("/", 1)[0]
        return RemoteFile(urllib.parse.urlunsplit((parts.scheme, parts.netloc, folder, parts.query, "")))

    @property
    def name(self) -> str:
        return urllib.parse.urlsplit(self.url).path.rstrip("/").rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return redacted(self.url)

    def __repr__(self) -> str:
        return f"RemoteFile({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteFile) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)


def fetch(file: RemoteFile) -> bytes:
    """The whole object, in one request (pyarrow's client retries transient errors).

    Raises:
        FileNotFoundError: no such object. OSError: it cannot be read.
    """
    fs, path = open_url(file.url)
    with fs.open_input_stream(path) as stream:
        return stream.read()
