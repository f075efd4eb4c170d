"""Where shards live: a source (folder, glob, file, URL, list) resolved to sorted shard locations."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import ShardReadError
from .retry import DEFAULT_RETRY, Retry, with_retries

SHARD_EXTENSIONS = (".arrow", ".ipc", ".feather", ".parquet", ".pq", ".orc")
ACCEPTED = "Arrow IPC file (.arrow/.feather v2), Arrow IPC stream (Hugging Face save_to_disk), Parquet or ORC"

_GLOB_CHARS = "*?["


class SourceNotFoundError(ShardReadError, FileNotFoundError):
    """Nothing matches the shard source (a missing path, an empty glob, a folder without shards)."""


@dataclass(frozen=True)
class _Location:
    """Where a file lives: ``fs is None`` means a local path we can memory-map.

    ``mtime_ns``: the modification time a remote listing reported (None: not listed; local
    files are stat'ed when scanned).
    """

    path: str  # shown to users: local absolute path or URL
    fs: Any
    fs_path: str
    mtime_ns: int | None = None


def _is_url(text: str) -> bool:
    scheme = urllib.parse.urlparse(text).scheme
    return len(scheme) > 1 and "://" in text  # len > 1 keeps Windows drive letters local


def _tuned_s3(fs: pafs.S3FileSystem, retry: Retry) -> pafs.S3FileSystem:
    """The same S3 filesystem with ``retry.timeout`` and no retries of its own (`with_retries` does them,
    so attempts are counted once and the final error can say how many there were)."""
    options = fs.__reduce__()[1][0]  # the constructor's arguments, as pyarrow pickles them
    if not options.get("proxy_options", {}).get("scheme"):
        options["proxy_options"] = None
    options.update(request_timeout=retry.timeout, connect_timeout=retry.timeout,
                   retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    return pafs.S3FileSystem(**options)


def _filesystem_for(url: str, retry: Retry = DEFAULT_RETRY) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` for a URL: pyarrow's own first, else fsspec."""
    try:
        fs, path = pafs.FileSystem.from_uri(url)
        return (_tuned_s3(fs, retry) if isinstance(fs, pafs.S3FileSystem) else fs), path
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as arrow_error:
        try:
            import fsspec  # optional: covers hf://, memory://, az://, http(s)://, ...
        except ImportError:
            raise ValueError(f"cannot open {url!r}: pyarrow has no filesystem for this scheme "
                             f"({arrow_error}); install fsspec and the scheme's package "
                             "(e.g. s3fs, gcsfs), or pass filesystem=") from None
        try:
            fs, path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as fsspec_error:
            raise ValueError(f"cannot open {url!r}: no filesystem for this scheme in pyarrow "
                             f"({arrow_error}) or fsspec ({fsspec_error}); install the scheme's "
                             "fsspec package or pass filesystem=") from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _url_for(scheme: str, fs_path: str) -> str:
    return fs_path if "://" in fs_path else f"{scheme}://{fs_path.lstrip('/')}"


def _has_shard_extension(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    # Hidden and underscore files are bookkeeping (.crc, _SUCCESS, _metadata), as in pyarrow.dataset.
    return not base.startswith((".", "_")) and base.lower().endswith(SHARD_EXTENSIONS)


def _hf_state_files(read_text, folder: str) -> list[str] | None:
    """Data files listed in a Hugging Face ``save_to_disk`` ``state.json``, or None.

    Such a folder may also hold ``cache-*.arrow`` files written by ``Dataset.map``;
    ``state.json`` says which files are the dataset.
    """
    try:
        state = json.loads(read_text(folder.rstrip("/") + "/state.json"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    if not names or not all(isinstance(n, str) and "/" not in n for n in names):
        return None
    return [folder.rstrip("/") + "/" + n for n in names]


def _read_local_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _expand_local(item: str) -> tuple[list[str], str]:
    """Local files for one source entry, and a description of what was searched."""
    path = os.path.abspath(os.path.expanduser(item))
    if any(c in item for c in _GLOB_CHARS):
        matches = sorted(glob.glob(path, recursive=True))
        files: list[str] = []
        for match in matches:
            files.extend(_expand_local(match)[0] if os.path.isdir(match) else [match])
        return files, f"glob {path!r} ({len(matches)} matches)"
    if os.path.isdir(path):
        listed = _hf_state_files(_read_local_text, path)
        if listed is not None:
            return listed, f"Hugging Face dataset folder {path!r} (state.json)"
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            found.extend(os.path.join(root, n) for n in names if _has_shard_extension(n))
        return found, f"folder {path!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if os.path.isfile(path):
        return [path], f"file {path!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder ({path})")


def _glob_match(path: str, pattern: str) -> bool:
    """Glob matching as for local paths: ``*`` stays within one folder unless the pattern has ``**``."""
    if "**" not in pattern and path.count("/") != pattern.count("/"):
        return False
    return fnmatch.fnmatchcase(path, pattern)


def _mtime_ns(info: pafs.FileInfo) -> int | None:
    return info.mtime_ns if info.mtime_ns is not None and info.mtime_ns > 0 else None


def _expand_remote(item: str, fs: Any, fs_path: str, retry: Retry) -> tuple[list[tuple[str, int | None]], str]:
    """Files (as ``(fs path, mtime_ns)``) for one entry on a pyarrow filesystem."""
    def listing(selector: Any) -> list[pafs.FileInfo]:
        return with_retries(lambda: fs.get_file_info(selector), what=f"the listing of {item!r}", retry=retry)

    if any(c in fs_path for c in _GLOB_CHARS):
        parts = fs_path.split("/")
        fixed = next(i for i, p in enumerate(parts) if any(c in p for c in _GLOB_CHARS))
        base = "/".join(parts[:fixed])
        infos = listing(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [(i.path, _mtime_ns(i)) for i in infos
                 if i.type == pafs.FileType.File and _glob_match(i.path, fs_path)]
        return files, f"glob {item!r} ({len(files)} matches)"
    info = listing(fs_path)
    if info.type == pafs.FileType.Directory:
        def read_text(p: str) -> str:
            with fs.open_input_stream(p) as f:
                return f.read().decode("utf-8")
        listed = _hf_state_files(read_text, fs_path)
        if listed is not None:
            return [(p, None) for p in listed], f"Hugging Face dataset folder {item!r} (state.json)"
        infos = listing(pafs.FileSelector(fs_path, recursive=True))
        files = [(i.path, _mtime_ns(i)) for i in infos
                 if i.type == pafs.FileType.File and _has_shard_extension(i.path)]
        return files, f"folder {item!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if info.type == pafs.FileType.File:
        return [(fs_path, _mtime_ns(info))], f"file {item!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder")


def _expand(item: Any, filesystem: Any, retry: Retry) -> tuple[list[_Location], str]:
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if not isinstance(item, str):
        raise TypeError(f"a shard source must be a path, URL, glob or a list of them; got {type(item).__name__}")
    if filesystem is not None and not isinstance(filesystem, pafs.LocalFileSystem):
        parsed = urllib.parse.urlparse(item)
        fs_path = parsed.netloc + parsed.path if _is_url(item) else item
        files, searched = _expand_remote(item, filesystem, fs_path, retry)
        return [_Location(p, filesystem, p, mtime) for p, mtime in files], searched
    if item.startswith("file://"):
        item = urllib.parse.unquote(urllib.parse.urlparse(item).path)
    if filesystem is not None or not _is_url(item):
        files, searched = _expand_local(item)
        return [_Location(p, None, p) for p in files], searched
    fs, fs_path = _filesystem_for(item, retry)
    if isinstance(fs, pafs.LocalFileSystem):
        files, searched = _expand_local(fs_path)
        return [_Location(p, None, p) for p in files], searched
    scheme = urllib.parse.urlparse(item).scheme
    files, searched = _expand_remote(item, fs, fs_path, retry)
    return [_Location(_url_for(scheme, p), fs, p, mtime) for p, mtime in files], searched


def resolve_source(source: Any, filesystem: Any = None, retry: Retry = DEFAULT_RETRY) -> list[_Location]:
    """Sorted, de-duplicated shard locations for a source (see `ShardDataset`)."""
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ValueError("the shard source is an empty list; pass a folder, glob, file or URL")
    found: dict[str, _Location] = {}
    searched = []
    for item in items:
        locations, what = _expand(item, filesystem, retry)
        searched.append(what)
        for loc in locations:
            found.setdefault(loc.path, loc)
    if not found:
        raise SourceNotFoundError(
            "no shard files match the source; searched " + "; ".join(searched)
            + f". Shards are {ACCEPTED} files; in folders only names ending in "
            + ", ".join(SHARD_EXTENSIONS) + " are taken (name a file directly to use another name)")
    return [found[p] for p in sorted(found)]
