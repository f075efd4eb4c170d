"""Where a file lives, and the one rule for URLs: which text is a local path and which a store's URL (a ``file://``
URL is its local path), and the filesystem a store's URL opens on (pyarrow's own first, else fsspec). The dataset
and the tools (``audioloader pack``: `audioloader.tools.remote_files`) both ask here."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import redacted
from .retry import DEFAULT_RETRY, FSSpecHandler, Retry

__all__ = ["Location", "TableFile", "filesystem_for", "has_scheme", "is_url", "local_path", "mtime_ns", "url_for"]


@dataclass(frozen=True)
class TableFile:
    """What a table's metadata says about one of its data files.

    Attributes:
        format: ``"parquet"`` or ``"orc"``.
        size: bytes.
        rows: rows (the file must have exactly these: checked when it is scanned).
        guarantee: a ``pyarrow.compute.Expression`` that every row of the file satisfies
            (its partition values and column bounds), or None when not asked for.
    """

    format: str
    size: int
    rows: int
    guarantee: Any = None


@dataclass(frozen=True)
class Location:
    """Where a file lives: ``fs is None`` means a local path we can memory-map.

    ``mtime_ns``, ``size``: the modification time and size a remote listing reported (None: not
    listed; local files are stat'ed when scanned). ``listed``: a table's metadata about the file (Iceberg).
    """

    path: str  # shown to users: local absolute path or URL
    fs: Any
    fs_path: str
    mtime_ns: int | None = None
    listed: TableFile | None = None
    size: int | None = None
    #: A tar of a set described by a manifest beside it: its rows (`audioloader.shards.sources.tarred_sets.JoinedRows`).
    joined: Any = field(default=None, compare=False, hash=False)


def has_scheme(text: str) -> bool:
    """Whether ``text`` is written as a URL (``scheme://...``, ``file://`` included); a Windows drive letter is no
    scheme."""
    scheme = urllib.parse.urlparse(text).scheme
    return len(scheme) > 1 and "://" in text  # len > 1 keeps Windows drive letters local


def local_path(text: str) -> str | None:
    """The local path ``text`` names: ``text`` itself when it is no URL (a path, a glob; a Windows drive letter is
    no scheme), the unquoted path of a ``file://`` URL; None for a URL of a store (``s3://``, any fsspec scheme).

    The one rule for what is local, used by the dataset and by the tools (`audioloader.tools.remote_files`)."""
    if not has_scheme(text):
        return text
    parsed = urllib.parse.urlparse(text)
    return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else None


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL of a remote store (`local_path`'s rule: ``file://`` URLs and Windows drive letters
    are local, and a ``file://`` URL stands for its path)."""
    return local_path(text) is None


def _tuned_s3(fs: pafs.S3FileSystem, retry: Retry) -> pafs.S3FileSystem:
    """The same S3 filesystem with ``retry.timeout`` and no retries of its own (`with_retries` does them,
    so attempts are counted once and the final error can say how many there were)."""
    options = fs.__reduce__()[1][0]  # the constructor's arguments, as pyarrow pickles them
    if not options.get("proxy_options", {}).get("scheme"):
        options["proxy_options"] = None
    options.update(request_timeout=retry.timeout, connect_timeout=retry.timeout,
                   retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    return pafs.S3FileSystem(**options)


def filesystem_for(url: str, retry: Retry | None = DEFAULT_RETRY) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` for a URL: pyarrow's own first, else fsspec.

    ``retry``: the policy the caller's `with_retries` applies; an S3 filesystem is then given its timeout and makes
    no retries of its own. None: the filesystem keeps its own retries and timeouts (for a caller that does not
    retry its requests, such as ``audioloader pack``).
    """
    try:
        fs, path = pafs.FileSystem.from_uri(url)
        return (_tuned_s3(fs, retry) if retry is not None and isinstance(fs, pafs.S3FileSystem) else fs), path
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as arrow_error:
        if "Unrecognized filesystem type" not in str(arrow_error):
            raise ValueError(_refused_url_message(url, arrow_error)) from None
        try:
            import fsspec  # optional: covers hf://, memory://, az://, http(s)://, ...
        except ImportError:
            raise ValueError(f"cannot open {redacted(url)!r}: pyarrow has no filesystem for this scheme "
                             f"({arrow_error}); install fsspec and the scheme's package "
                             "(e.g. s3fs, gcsfs), or pass storage=al.Storage(filesystem=...)") from None
        try:
            fs, path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as fsspec_error:
            raise ValueError(f"cannot open {redacted(url)!r}: no filesystem for this scheme in pyarrow "
                             f"({arrow_error}) or fsspec ({fsspec_error}); install the scheme's "
                             "fsspec package or pass storage=al.Storage(filesystem=...)") from None
        return pafs.PyFileSystem(FSSpecHandler(fs)), path  # a throttled request raises (retried), never 'missing'


def _refused_url_message(url: str, arrow_error: Exception) -> str:
    """pyarrow has a filesystem for the URL's scheme but refused the URL itself (an option it does not take in a
    URL, such as ``session_token``): the cause first, then where such options go."""
    scheme = url.split("://", 1)[0]
    return (f"cannot open {redacted(url)!r}: pyarrow's {scheme}:// filesystem refused the URL: "
            f"{redacted(str(arrow_error))}. Options pyarrow does not read from a URL (a session token, ...) go in "
            f"a filesystem you build: storage=al.Storage(filesystem=pyarrow.fs.S3FileSystem(access_key=..., "
            f"secret_key=..., session_token=...)) (or GcsFileSystem(...)), with the path without the option; "
            f"or in the environment (AWS_SESSION_TOKEN, ...)")


def url_for(scheme: str, fs_path: str) -> str:
    """The URL of ``fs_path`` on a filesystem of ``scheme`` (a path that is already a URL stays as it is)."""
    return fs_path if "://" in fs_path else f"{scheme}://{fs_path.lstrip('/')}"


def mtime_ns(info: pafs.FileInfo) -> int | None:
    """The modification time a listing reports, in ns; None where it reports none (or 0)."""
    return info.mtime_ns if info.mtime_ns is not None and info.mtime_ns > 0 else None
