"""Where shards live: a source (folder, glob, file, URL, list, Iceberg table) resolved to sorted shard locations."""

from __future__ import annotations

import fnmatch
import functools
import glob
import json
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ...errors import ShardReadError, redacted
from ..storage.locations import Location, TableFile, filesystem_for, has_scheme, local_path, mtime_ns, url_for
from ..storage.retry import DEFAULT_RETRY, Retry, with_retries
from .pack_folders import PACK_JOURNAL, check_pack_folders

SHARD_EXTENSIONS = (".arrow", ".ipc", ".feather", ".parquet", ".pq", ".orc", ".tar", ".tar.gz", ".tgz")
ACCEPTED = ("Arrow IPC file (.arrow/.feather v2), Arrow IPC stream (Hugging Face save_to_disk), Parquet, ORC or "
            "WebDataset tar (.tar); a folder without any of them: its audio files, one a row")

#: Member / file extensions read as audio (lower case, without the dot).
AUDIO_EXTENSIONS = ("flac", "wav", "mp3", "ogg", "opus", "oga", "m4a", "mp4", "aac", "webm", "mka", "wma", "aiff",
                    "aif", "sph", "au")

GLOB_CHARS = "*?["
#: A folder's metadata index (see `audioloader.shards.catalog.index`); its leading underscore keeps it out of listings.
INDEX_NAME = "_audioloader_index.arrow"


class SourceNotFoundError(ShardReadError, FileNotFoundError):
    """Nothing matches the shard source (a missing path, an empty glob, a folder without shards)."""


def is_audio_name(name: str) -> bool:
    """Whether a file name has an audio extension (`AUDIO_EXTENSIONS`)."""
    base = name.rsplit("/", 1)[-1]
    return "." in base and base.rsplit(".", 1)[1].lower() in AUDIO_EXTENSIONS


def _has_shard_extension(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    # Hidden and underscore files are bookkeeping (.crc, _SUCCESS, _metadata), as in pyarrow.dataset.
    return not base.startswith((".", "_")) and base.lower().endswith(SHARD_EXTENSIONS)


def _shards_or_audio(names: list[Any], name_of: Callable[[Any], str] = str) -> list[Any]:
    """Of a folder's files, the shards; where there is none, the plain audio files (one a row: `tar_format`)."""
    shards = [n for n in names if _has_shard_extension(name_of(n))]
    if shards:
        return shards
    return [n for n in names if is_audio_name(name_of(n)) and not name_of(n).rsplit("/", 1)[-1].startswith((".", "_"))]


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
    if any(c in item for c in GLOB_CHARS):
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
        journals: dict[str, dict[str, Callable[[], str]]] = {}
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            found.extend(os.path.join(root, n) for n in names)
            for name in filter(PACK_JOURNAL.match, names):
                journals.setdefault(os.path.relpath(root, path), {})[name] = functools.partial(
                    _read_local_text, os.path.join(root, name))
        check_pack_folders(path, journals)
        return _shards_or_audio(found), f"folder {path!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if os.path.isfile(path):
        return [path], f"file {path!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder ({path})")


def _hidden_below(folder: str, base: str) -> bool:
    """A folder under ``base`` inside a hidden or bookkeeping folder (``.x``, ``_x``): a local walk skips those."""
    return any(part.startswith((".", "_")) for part in folder[len(base):].split("/") if part)


def _glob_match(path: str, pattern: str) -> bool:
    """Glob matching as for local paths: ``*`` stays within one folder unless the pattern has ``**``."""
    if "**" not in pattern and path.count("/") != pattern.count("/"):
        return False
    return fnmatch.fnmatchcase(path, pattern)


def _listed(info: pafs.FileInfo) -> tuple[str, int | None, int | None]:
    return info.path, mtime_ns(info), info.size if info.size is not None and info.size >= 0 else None


def _expand_remote(item: str, fs: Any, fs_path: str, retry: Retry,
                   indexes: list | None = None) -> tuple[list[tuple[str, int | None, int | None]], str]:
    """Files (as ``(fs path, mtime_ns, size)``) for one entry on a pyarrow filesystem; metadata indexes the
    listing shows are appended to ``indexes`` (as the same tuples)."""
    item = redacted(item)  # as shown in messages: no credentials

    def note_indexes(infos: list[pafs.FileInfo]) -> None:
        if indexes is not None:
            indexes.extend(_listed(i) for i in infos if i.type == pafs.FileType.File
                           and i.path.rsplit("/", 1)[-1] == INDEX_NAME)

    def listing(selector: Any) -> list[pafs.FileInfo]:
        # Paced by the store's learnt rate like every other request: a LIST throttled by S3 slows the others too.
        return with_retries(lambda: fs.get_file_info(selector), what=f"the listing of {item!r}", retry=retry,
                            store=item)

    if any(c in fs_path for c in GLOB_CHARS):
        parts = fs_path.split("/")
        fixed = next(i for i, p in enumerate(parts) if any(c in p for c in GLOB_CHARS))
        base = "/".join(parts[:fixed])
        infos = listing(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        note_indexes(infos)
        files = [_listed(i) for i in infos if i.type == pafs.FileType.File and _glob_match(i.path, fs_path)]
        return files, f"glob {item!r} ({len(files)} matches)"
    def read_text(p: str) -> str:
        with fs.open_input_stream(p) as f:
            return f.read().decode("utf-8")

    def check_packs(infos: list[pafs.FileInfo]) -> None:  # a GET a journal, only where the listing shows some
        journals: dict[str, dict[str, Callable[[], str]]] = {}
        base = fs_path.rstrip("/")
        for i in infos:
            folder, _, name = i.path.rpartition("/")
            if i.type == pafs.FileType.File and PACK_JOURNAL.match(name) and not _hidden_below(folder, base):
                journals.setdefault(folder[len(base) + 1:] or ".", {})[name] = functools.partial(read_text, i.path)
        check_pack_folders(item, journals)

    folder = None if fs_path.lower().endswith(SHARD_EXTENSIONS) else _list_folder(listing, fs_path)
    if folder:  # one LIST call, not the folder check (a HEAD and a LIST) and a look for state.json (a HEAD) first
        if any(i.type == pafs.FileType.File and i.path == f"{fs_path.rstrip('/')}/state.json" for i in folder):
            listed = _hf_state_files(read_text, fs_path)
            if listed is not None:
                return [(p, None, None) for p in listed], f"Hugging Face dataset folder {item!r} (state.json)"
        note_indexes(folder)
        check_packs(folder)
        files = [_listed(i) for i in _shards_or_audio([i for i in folder if i.type == pafs.FileType.File],
                                                      lambda i: i.path)]
        return files, f"folder {item!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    info = listing(fs_path)  # a file, an empty folder, or nothing: asked as before
    if info.type == pafs.FileType.Directory:
        listed = _hf_state_files(read_text, fs_path)
        if listed is not None:
            return [(p, None, None) for p in listed], f"Hugging Face dataset folder {item!r} (state.json)"
        infos = listing(pafs.FileSelector(fs_path, recursive=True))
        note_indexes(infos)
        check_packs(infos)
        files = [_listed(i) for i in _shards_or_audio([i for i in infos if i.type == pafs.FileType.File],
                                                      lambda i: i.path)]
        return files, f"folder {item!r} and its subfolders for *{'/*'.join(SHARD_EXTENSIONS)}"
    if info.type == pafs.FileType.File:
        return [_listed(info)], f"file {item!r}"
    raise SourceNotFoundError(f"shard source {item!r}: no such file or folder")


def _list_folder(listing: Callable[[Any], Any], fs_path: str) -> list[pafs.FileInfo]:
    """Everything under ``fs_path`` as a folder, listed recursively; empty where it is a file, an empty folder or
    nothing, or where the store refuses to list it (the caller then asks what ``fs_path`` is, as pyarrow would)."""
    try:
        return listing(pafs.FileSelector(fs_path, recursive=True, allow_not_found=True))
    except OSError:  # e.g. NotADirectoryError (fsspec), no permission to list: the caller's look says what it is
        return []


def _expand(item: Any, filesystem: Any, retry: Retry, indexes: list[Location]) -> tuple[list[Location], str]:
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if isinstance(item, IcebergTable):
        raise TypeError(f"{item} is a whole source: pass it alone (source=IcebergTable(...)), or mix it with other "
                        "sources in an audioloader.Mix")
    resolve = getattr(item, "resolve_locations", None)  # a set of tars described by a manifest (`tarred_sets`)
    if resolve is not None:
        return resolve(filesystem, retry), str(item)
    if not isinstance(item, str):
        raise TypeError(f"a shard source must be a path, URL, glob or a list of them; got {type(item).__name__}")
    if filesystem is not None and not isinstance(filesystem, pafs.LocalFileSystem):
        parsed = urllib.parse.urlparse(item)
        fs_path = parsed.netloc + parsed.path if has_scheme(item) else item
        found: list = []
        files, searched = _expand_remote(item, filesystem, fs_path, retry, found)
        indexes.extend(Location(p, filesystem, p, mtime, size=size) for p, mtime, size in found)
        return [Location(p, filesystem, p, mtime, size=size) for p, mtime, size in files], searched
    item = local_path(item) or item  # a file:// URL is its local path
    if filesystem is not None or not has_scheme(item):
        files, searched = _expand_local(item)
        return [Location(p, None, p) for p in files], searched
    fs, fs_path = filesystem_for(item, retry)
    if isinstance(fs, pafs.LocalFileSystem):
        files, searched = _expand_local(fs_path)
        return [Location(p, None, p) for p in files], searched
    scheme = urllib.parse.urlparse(item).scheme
    found = []
    files, searched = _expand_remote(item, fs, fs_path, retry, found)
    indexes.extend(Location(url_for(scheme, p), fs, p, mtime, size=size) for p, mtime, size in found)
    return [Location(url_for(scheme, p), fs, p, mtime, size=size) for p, mtime, size in files], searched


def resolve_source(source: Any, filesystem: Any = None, retry: Retry = DEFAULT_RETRY,
                   indexes: list[Location] | None = None) -> list[Location]:
    """Sorted, de-duplicated shard locations for a source (see `ShardDataset`); the metadata indexes that remote
    listings showed are appended to ``indexes``."""
    indexes = [] if indexes is None else indexes
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    if not items:
        raise ValueError("the shard source is an empty list; pass a folder, glob, file or URL")
    found: dict[str, Location] = {}
    searched = []
    for item in items:
        locations, what = _expand(item, filesystem, retry, indexes)
        searched.append(what)
        for loc in locations:
            found.setdefault(loc.path, loc)
    if not found:
        raise SourceNotFoundError(
            "no shard files match the source; searched " + "; ".join(searched)
            + f". Shards are {ACCEPTED} files; in folders only names ending in "
            + ", ".join(SHARD_EXTENSIONS) + " are taken (name a file directly to use another name)")
    return [found[p] for p in sorted(found)]


# ----------------------------------------------------------------------------- Iceberg tables


@dataclass(frozen=True)
class IcebergTable:
    """An Apache Iceberg table as a source: the data files of one snapshot, read like shard files.

    ``source=al.IcebergTable("audio.clips", catalog={"type": "sql", "uri": "sqlite:///wh/catalog.db",
    "warehouse": "file:///wh"})``. Needs ``pyiceberg`` (imported only when such a source
    is used). Plain data, so a loader built on it pickles; the table is opened
    where the loader is built.

    Attributes:
        table: the table's identifier, ``"namespace.name"``.
        catalog: pyiceberg catalog properties (``pyiceberg.catalog.load_catalog(catalog_name,
            **catalog)``: ``type``, ``uri``, ``warehouse``, credentials ...); empty: pyiceberg's
            configuration (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*`` variables) for ``catalog_name``.
        snapshot_id: the snapshot to read; None: the table's current snapshot when the loader is built.
        catalog_name: the catalog's name in pyiceberg's configuration.

    Rows are the snapshot's data files' rows (Parquet and ORC), files sorted by path;
    a row's index is its file's offset among *all* the snapshot's data files plus
    its row, so a ``filter=`` that prunes files (by their partition values and
    column bounds) shifts no other row. The snapshot id is in the checkpoint's
    fingerprint: a resume against another snapshot is refused, naming both.
    Tables with delete files (row-level deletes) are refused: compact them first.
    """

    table: str
    catalog: Mapping[str, Any] = field(default_factory=dict)
    snapshot_id: int | None = None
    catalog_name: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or "." not in self.table:
            raise ValueError(f"IcebergTable(table={self.table!r}): name a table as 'namespace.table'")
        if not isinstance(self.catalog, Mapping):
            raise TypeError(f"IcebergTable(catalog=...) takes the catalog's properties as a dict, got "
                            f"{type(self.catalog).__name__}")
        if self.snapshot_id is not None and (isinstance(self.snapshot_id, bool) or not isinstance(self.snapshot_id,
                                                                                                   int)):
            raise TypeError(f"IcebergTable(snapshot_id={self.snapshot_id!r}) must be an int or None")

    def __str__(self) -> str:
        return f"Iceberg table {self.table!r}"


@dataclass(frozen=True)
class TableSnapshot:
    """The snapshot of a table a source reads.

    Attributes:
        table: the table's identifier.
        snapshot_id: the snapshot read.
        schema: the snapshot's schema as Arrow (what file guarantees are bound to).
    """

    table: str
    snapshot_id: int
    schema: pa.Schema


_ICEBERG_FORMATS = {"PARQUET": "parquet", "ORC": "orc"}


def _iceberg_table(source: IcebergTable) -> Any:
    """The pyiceberg ``Table`` of ``source`` (imports pyiceberg; a clear error naming it when it is missing)."""
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError
    except ImportError as error:
        raise ImportError(f"{source} needs the pyiceberg package ({error}): pip install 'pyiceberg[sql-sqlite]' "
                          "(or the extra of your catalog, e.g. pyiceberg[glue], pyiceberg[hive])") from None
    catalog = load_catalog(source.catalog_name, **dict(source.catalog))
    try:
        return catalog.load_table(source.table)
    except NoSuchTableError as error:
        raise SourceNotFoundError(f"{source} not found in catalog {source.catalog_name!r} ({error}); check the "
                                  "namespace and name, and the catalog's uri / warehouse") from None


def resolve_iceberg(source: IcebergTable, filesystem: Any = None, retry: Retry = DEFAULT_RETRY,
                    guarantees: bool = False) -> tuple[TableSnapshot, list[Location]]:
    """The snapshot ``source`` reads and its data files as locations sorted by path, each ``listed``.

    ``guarantees``: also build each file's `TableFile.guarantee` (for pruning by a filter).
    """
    table = _iceberg_table(source)
    snapshot = table.current_snapshot() if source.snapshot_id is None else table.snapshot_by_id(source.snapshot_id)
    if snapshot is None:
        known = [s.snapshot_id for s in table.snapshots()]
        raise SourceNotFoundError(f"{source} has no snapshot {source.snapshot_id}; its snapshots are {known}"
                                  if source.snapshot_id is not None else f"{source} has no snapshot (no data yet)")
    schema = table.schemas().get(snapshot.schema_id, table.schema())
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow_schema = schema_to_pyarrow(schema)
    filesystems: dict[tuple[str, str], Any] = {}
    locations = []
    for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
        data = task.file
        if task.delete_files:
            raise ValueError(f"{source}, snapshot {snapshot.snapshot_id}: data file {data.file_path} has "
                             f"{len(task.delete_files)} delete file(s) (row-level deletes), which audioloader does "
                             "not apply; compact the table (rewrite its data files) or read a snapshot without them")
        fmt = _ICEBERG_FORMATS.get(data.file_format.name)
        if fmt is None:
            raise ValueError(f"{source}: data file {data.file_path} is {data.file_format.name}; audioloader reads "
                             "Parquet and ORC data files")
        guarantee = _guarantee(table, schema, arrow_schema, data) if guarantees else None
        listed = TableFile(fmt, int(data.file_size_in_bytes), int(data.record_count), guarantee)
        locations.append(_data_file(data.file_path, filesystem, retry, filesystems, listed))
    if not locations:
        raise ValueError(f"{source}, snapshot {snapshot.snapshot_id}, has no data files; append rows to it or "
                         "read another snapshot")
    return TableSnapshot(source.table, snapshot.snapshot_id, arrow_schema), sorted(locations, key=lambda x: x.path)


def _data_file(url: str, filesystem: Any, retry: Retry, filesystems: dict, listed: TableFile) -> Location:
    """A data file's location: local, on ``filesystem``, or on its URL's filesystem (one per scheme and bucket)."""
    parsed = urllib.parse.urlparse(url)
    if filesystem is not None and not isinstance(filesystem, pafs.LocalFileSystem):
        path = parsed.netloc + parsed.path if has_scheme(url) else url
        return Location(path, filesystem, path, listed=listed)
    if not has_scheme(url) or parsed.scheme == "file":
        path = urllib.parse.unquote(parsed.path) if has_scheme(url) else url
        return Location(path, None, path, listed=listed)
    key = (parsed.scheme, parsed.netloc)
    if key not in filesystems:
        filesystems[key] = filesystem_for(url, retry)[0]
    fs = filesystems[key]
    if isinstance(fs, pafs.LocalFileSystem):
        return Location(parsed.path, None, parsed.path, listed=listed)
    if isinstance(fs, pafs.PyFileSystem):  # an fsspec filesystem: its own form of paths
        return Location(url, fs, filesystem_for(url, retry)[1], listed=listed)
    return Location(url, fs, parsed.netloc + parsed.path, listed=listed)


def _guarantee(table: Any, schema: Any, arrow_schema: pa.Schema, data: Any) -> Any:
    """An expression every row of data file ``data`` satisfies, from its metadata (``pc.scalar(True)``: nothing known).

    Identity partition values give ``column == value`` (or ``is_null``); a column's
    lower/upper bounds give ``lo <= column <= hi`` where the file says the column has
    no nulls (and, for floating point, no NaN: bounds leave NaN out); a column that is
    all nulls gives ``is_null``. Other partition transforms add nothing the bounds do
    not. Binary columns (the audio) are left out: a filter cannot read them.
    """
    from pyiceberg.conversions import from_bytes
    from pyiceberg.transforms import IdentityTransform

    terms = []
    top = {f.field_id: f for f in schema.fields}

    def scalar(name: str, value: Any) -> Any:
        return pa.scalar(value, type=arrow_schema.field(name).type)

    spec = table.specs()[data.spec_id]
    for position, part in enumerate(spec.fields):
        column = top.get(part.source_id)
        if column is None or not isinstance(part.transform, IdentityTransform):
            continue
        value = data.partition[position]
        terms.append(pc.field(column.name).is_null() if value is None
                     else pc.field(column.name) == scalar(column.name, value))
    nulls, values, nans = data.null_value_counts or {}, data.value_counts or {}, data.nan_value_counts or {}
    for field_id, column in top.items():
        arrow_type = arrow_schema.field(column.name).type
        if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
            continue
        if field_id in values and nulls.get(field_id) == values[field_id] and values[field_id] > 0:
            terms.append(pc.field(column.name).is_null())
            continue
        low, high = (data.lower_bounds or {}).get(field_id), (data.upper_bounds or {}).get(field_id)
        if low is None or high is None or nulls.get(field_id) != 0:
            continue
        if pa.types.is_floating(arrow_type) and nans.get(field_id) != 0:
            continue  # pyiceberg 0.12 records no NaN counts: a NaN row would lie outside the bounds
        try:
            low, high = scalar(column.name, from_bytes(column.field_type, low)), \
                scalar(column.name, from_bytes(column.field_type, high))
        except (pa.ArrowException, TypeError, ValueError):
            continue
        terms.append((pc.field(column.name) >= low) & (pc.field(column.name) <= high))
    guarantee = pc.scalar(True)
    for term in terms:
        guarantee = guarantee & term
    return guarantee
