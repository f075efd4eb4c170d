"""Files ``audioloader pack`` reads from, and writes to, object storage (``s3://``, ``gs://``, ...).

A URL is opened as the dataset opens one (`audioloader.shards.storage.locations.filesystem_for`: pyarrow's
filesystem for its scheme (S3, GCS, HDFS; its options in the query string, e.g.
``?endpoint_override=host:port&scheme=http``), else fsspec's), keeping the filesystem's own retries; what is a
store's URL and what a local path (a ``file://`` URL is its path) is decided there too
(`audioloader.shards.storage.locations.is_url`). One filesystem is made per bucket and options, and shared by the
pack's threads (pyarrow's are thread-safe). Messages and stored paths show a URL without its query string and
user-info (`audioloader.errors.redacted`).
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

from audioloader.errors import redacted
from audioloader.shards.storage.locations import filesystem_for

__all__ = ["RemoteFile", "fetch", "open_url"]

_FILESYSTEMS: dict[str, Any] = {}
_LOCK = threading.Lock()
#: Schemes whose path in the filesystem is the URL's bucket and path as written: after the bucket's first URL no
#: other is parsed by pyarrow (which refuses a space in a file name).
_PATHS_AS_WRITTEN = ("s3", "gs", "gcs")


def open_url(url: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` of a URL; the filesystem is shared per bucket and options."""
    parts = urllib.parse.urlsplit(url)
    key = f"{parts.scheme}://{parts.netloc}?{parts.query}"
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
    if fs is None or parts.scheme not in _PATHS_AS_WRITTEN:
        opened, path = filesystem_for(url, retry=None)  # pack does not retry its requests: the store's client does
        with _LOCK:
            fs = _FILESYSTEMS.setdefault(key, opened)
    if parts.scheme in _PATHS_AS_WRITTEN:
        path = f"{parts.netloc}{parts.path}".rstrip("/")
    return fs, path


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
