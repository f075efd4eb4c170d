"""A folder source read through its dataset manifest (`audioloader.shards.manifest`): no LIST, no request per
file; fetched once per machine in a multi-process job.

`open_manifest` is what `ShardDataset` calls for a source that names one folder (a path
or URL without glob characters, or the manifest file itself):

- a local folder with ``_audioloader_manifest.arrow`` in it: the manifest, memory-mapped (no other file is
  opened at construction).
- a remote folder, in a process that is alone on its machine: one read of the manifest
  (pyarrow's HEAD and GET); when there is none, None (the caller lists and scans as before).
- a remote folder, in a job with several processes on the machine (`job_key`): the
  first process to take the lock of the machine cache's ``shared/manifest-<key>.arrow``
  (`machine_cache.shared_file`) reads the store's manifest, or, when the store has none,
  lists the folder and scans its files (``build``), and publishes the result atomically;
  the others wait for it and map the same file: 0 requests of their own.

Rows, splits and batches do not depend on the path taken: a manifest holds what a scan reads.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import redacted
from ..formats.scan import FileMeta, scan_all
from ..sources.resolve import GLOB_CHARS, SHARD_EXTENSIONS, resolve_source
from ..storage.identity import object_identity
from ..storage.locations import Location, filesystem_for, has_scheme, url_for
from ..storage.machine_cache import identity_path, shared_file
from ..storage.retry import Retry, with_retries
from .file_table import ManifestLocations, ManifestMetas
from .manifest import MANIFEST_NAME, Manifest, manifest_table, write_manifest

#: ``build() -> (locations, metas)``: the folder listed and its files scanned (what construction does without one).
Build = Callable[[], tuple[list[Location], list[FileMeta]]]


@dataclass
class FromManifest:
    """A folder source as its manifest gives it.

    Attributes:
        manifest: the `Manifest` (memory-mapped where it is a file on this machine).
        locations: every file's `Location`, sorted, as `resolve.resolve_source` gives them (`ManifestLocations`:
            made on demand from the manifest's columns).
        metas: every file's `FileMeta`: the manifest's (`ManifestMetas`, made on demand; footers not read:
            ``located`` False), or, in the process that listed and scanned the folder, what it scanned (lists).
        origin: ``"local"`` (beside local shards), ``"store"`` (read from the store by this process),
            ``"machine"`` (published by another process of the machine), ``"listing"`` (this process listed
            and scanned the folder and published the result for the machine).
    """

    manifest: Manifest
    locations: Sequence[Location]
    metas: Sequence[FileMeta]
    origin: str


def job_key() -> str | None:
    """What the processes of one job on one machine share, or None for a process that is alone.

    ``$AUDIOLOADER_JOB_ID`` when set; else, under torchrun (``TORCHELASTIC_RUN_ID``) or Slurm
    (``SLURM_JOB_ID``), that id and the parent process (the launcher of the machine's ranks:
    torchrun's agent, ``slurmstepd``), so that two jobs, or two runs of one, never share a listing.
    """
    explicit = os.environ.get("AUDIOLOADER_JOB_ID")
    if explicit:
        return explicit
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(name)
        if value:
            step = os.environ.get("SLURM_STEP_ID", "") if name == "SLURM_JOB_ID" else ""
            return f"{name}={value}.{step}:{os.getppid()}"
    return None


def open_manifest(source: Any, filesystem: Any, retry: Retry, build: Build | None = None) -> FromManifest | None:
    """The folder ``source`` through its manifest (see the module docstring), or None where it has none and no
    machine-wide listing is made (the caller then lists and scans).

    Raises:
        ShardReadError: a manifest of another version or not a manifest (names ``audioloader index``).
    """
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        return None
    if any(c in (urllib.parse.urlparse(source).path if has_scheme(source) else source) for c in GLOB_CHARS):
        return None  # a glob
    if filesystem is not None and not isinstance(filesystem, pafs.LocalFileSystem):
        parsed = urllib.parse.urlparse(source)
        fs_path = (parsed.netloc + parsed.path) if has_scheme(source) else source
        return _remote(source, filesystem, fs_path.rstrip("/"), None, retry, build)
    if source.startswith("file://"):
        source = urllib.parse.unquote(urllib.parse.urlparse(source).path)
    if filesystem is not None or not has_scheme(source):
        return _local(source)
    fs, fs_path = filesystem_for(source, retry)
    if isinstance(fs, pafs.LocalFileSystem):
        return _local(fs_path)
    return _remote(source, fs, fs_path.rstrip("/"), urllib.parse.urlparse(source).scheme, retry, build)


def _local(path: str) -> FromManifest | None:
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.basename(path) == MANIFEST_NAME:
        folder, manifest_path = os.path.dirname(path), path
    else:
        folder, manifest_path = path, os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(manifest_path):
        return None
    manifest = Manifest(manifest_path, manifest_path)
    return FromManifest(manifest, ManifestLocations(manifest, None, folder, None), ManifestMetas(manifest), "local")


def _remote(source: str, fs: Any, fs_path: str, scheme: str | None, retry: Retry,
            build: Build | None) -> FromManifest | None:
    """A remote folder (or manifest) through its manifest; ``scheme`` None: paths stay the filesystem's."""
    if fs_path.rsplit("/", 1)[-1] == MANIFEST_NAME:
        folder, manifest_path = fs_path.rsplit("/", 1)[0], fs_path
    elif fs_path.lower().endswith(SHARD_EXTENSIONS):
        return None  # a shard file
    else:
        folder, manifest_path = fs_path, f"{fs_path}/{MANIFEST_NAME}"
    where = redacted(url_for(scheme, manifest_path) if scheme else manifest_path)
    job = job_key()
    if job is None:  # alone on the machine: nothing to share
        data = _read_manifest(fs, manifest_path, where, retry)
        if data is None:
            return None
        manifest = Manifest(data, where)
        return FromManifest(manifest, ManifestLocations(manifest, fs, folder, scheme), ManifestMetas(manifest), "store")

    def produce(temporary: str) -> Any:
        data, identity = _read_identified(fs, manifest_path, where, retry)
        if data is not None:
            Manifest(data, where)  # refused before it is published when it is not one this version reads
            with open(temporary, "wb") as out:
                out.write(data)
            if identity is not None:  # what a later start checks the copy against (`still_valid`)
                Path(f"{temporary}.identity").write_text(identity, encoding="utf-8")
            return "store"
        if build is None or manifest_path == fs_path:
            return None
        locations, metas = build()
        names = [loc.fs_path[len(folder) + 1:] for loc in locations]
        if not all(loc.fs_path.startswith(f"{folder}/") for loc in locations):
            return None  # e.g. a Hugging Face state.json naming files elsewhere: not a folder's manifest
        write_manifest(manifest_table(names, metas, mtimes=True), temporary)
        return locations, metas

    key = hashlib.blake2b(f"{job}\0{source}\0{type(fs).__name__}".encode(), digest_size=16).hexdigest()
    def still_valid(published: Path) -> bool:  # one HEAD: the store's manifest is still the one published
        try:
            recorded = identity_path(published).read_text(encoding="utf-8")
        except OSError:
            return False  # built from a listing (or the store reports no identity): made again
        return _identity_of(fs, manifest_path, where, retry) == recorded

    path, produced = shared_file(f"manifest-{key}.arrow", produce, what=f"the manifest of {redacted(source)}",
                                 still_valid=still_valid)
    if path is None:
        return None
    manifest = Manifest(str(path), where)
    if isinstance(produced, tuple):  # this process listed and scanned: it keeps what it scanned
        return FromManifest(manifest, produced[0], produced[1], "listing")
    return FromManifest(manifest, ManifestLocations(manifest, fs, folder, scheme), ManifestMetas(manifest),
                        "store" if produced == "store" else "machine")


def _read_manifest(fs: Any, path: str, where: str, retry: Retry) -> pa.Buffer | None:
    """The bytes of the manifest at ``path`` (pyarrow: a HEAD and a GET), or None when there is none."""
    return _read_identified(fs, path, where, retry)[0]


def _read_identified(fs: Any, path: str, where: str, retry: Retry) -> tuple[pa.Buffer | None, str | None]:
    """``(bytes, identity)`` of the manifest at ``path`` (`identity.object_identity`: its ETag or version, from
    the same request), or ``(None, None)`` when there is none."""
    def read() -> tuple[pa.Buffer | None, str | None]:
        try:
            with fs.open_input_stream(path) as f:
                return f.read_buffer(), object_identity(f)
        except FileNotFoundError:
            return None, None

    return with_retries(read, what=f"the manifest {where}", retry=retry)


def _identity_of(fs: Any, path: str, where: str, retry: Retry) -> str | None:
    """The store's manifest's identity now (pyarrow's open: a HEAD, no byte read), None when there is none."""
    def head() -> str | None:
        try:
            with fs.open_input_file(path) as f:
                return object_identity(f)
        except FileNotFoundError:
            return None

    return with_retries(head, what=f"the manifest {where}", retry=retry)


def write_folder_manifest(source: Any, filesystem: Any = None) -> str:
    """Scan every shard of a folder (local or remote, e.g. ``s3://bucket/data``), write its manifest
    (``_audioloader_manifest.arrow``) into it and return the manifest's path or URL.

    A remote folder's manifest records each object's ETag (what pyarrow's open returns); a local one (``audioloader
    pack``, before an upload) has none: its files are checked by size and footer when first read. Write it again
    after adding, removing or rewriting shards: construction takes the files from it and lists nothing.
    """
    text = os.fspath(source)
    locations = resolve_source(text, filesystem, retry := Retry())
    metas = scan_all(locations, retry)
    folder = os.path.commonprefix([loc.fs_path.rsplit("/", 1)[0] + "/" for loc in locations])  # noqa: RUF071
    folder = folder[:folder.rfind("/")]
    names = [loc.fs_path[len(folder) + 1:] for loc in locations]
    fs = locations[0].fs
    if fs is None and filesystem is None and has_scheme(text) and not text.startswith("file://"):
        fs = filesystem_for(text)[0]
    if fs is None:
        folder = folder if os.path.isabs(folder) else os.path.abspath(folder)
    write_manifest(manifest_table(names, metas), f"{folder}/{MANIFEST_NAME}", fs)
    shown = os.path.commonprefix([loc.path.rsplit("/", 1)[0] + "/" for loc in locations])  # noqa: RUF071
    return f"{shown[:shown.rfind('/')]}/{MANIFEST_NAME}"
