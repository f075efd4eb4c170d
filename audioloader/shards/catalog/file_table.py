"""Per-file and per-split metadata as columns: a dataset of a million files holds a few arrays, not a million
objects; a `ShardFile`, `Location`, `FileMeta` or `Split` is made when one is asked for (the file being read).

- `FileTable`: every file's path, format, size, rows per unit and first global row (``Sequence[ShardFile]``).
- `ManifestLocations`, `ManifestMetas`: a manifest's files as ``Sequence[Location]`` / ``Sequence[FileMeta]``,
  read from the manifest's (memory-mapped) columns; the metas remember the footers read since (`located`).
- `SplitTable`: splits as three integer arrays (``Sequence[Split]``), planned for every file at once
  (`plan_splits`: the same splits as `splits.file_splits` file by file).

Measured at 1,000,000 files (docs/benchmarks.md, "Per-rank metadata memory"): about 30 bytes a file and split.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats.scan import FORMATS, FileMeta
from ..sources.splits import Split, file_splits
from ..storage.locations import Location, url_for

#: Files with more units than this have their splits planned one by one (`file_splits`); the others all at once,
#: a unit position at a time (a step per position: cheap for many files of few units, not for a few of many).
_VECTOR_UNITS = 256
#: Files whose cumulative unit starts `FileTable.unit_starts` keeps made (the files being read).
_STARTS_KEPT = 4096


@dataclass(frozen=True)
class ShardFile:
    """One shard file.

    Attributes:
        path: local absolute path or URL.
        format: ``"ipc_file"``, ``"ipc_stream"``, ``"parquet"`` or ``"orc"``.
        size: file size in bytes.
        num_rows: rows in the file.
        batch_rows: rows per record batch (IPC), row group (Parquet) or stripe (ORC), in file order.
        index_offset: global index of this file's row 0.
    """

    path: str
    format: str
    size: int
    num_rows: int
    batch_rows: tuple[int, ...]
    index_offset: int


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` as int32 when they fit (half the bytes), else int64."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0 or (values.min() >= -(2**31) and values.max() < 2**31):
        return values.astype(np.int32)
    return values


def _checked_index(i: Any, n: int) -> int:
    """``i`` as an index into ``n`` items (negative from the end); IndexError outside."""
    i = int(i)
    if not -n <= i < n:
        raise IndexError(f"index {i} out of range for {n} items")
    return i % n if i < 0 else i


class _Rows(Sequence):
    """A read-only ``Sequence`` of objects made on demand from columns by ``_make(i)``; slices are lists."""

    def _make(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._make(j) for j in range(*i.indices(len(self)))]
        return self._make(_checked_index(i, len(self)))

    def __iter__(self) -> Iterator[Any]:
        return (self._make(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self)}>"


class FileTable(_Rows):
    """Every file of a dataset as columns (``Sequence[ShardFile]``: ``table[i]`` is made on demand).

    Args:
        paths: each file's path or URL (a list, or a sequence that makes them, e.g. `ManifestLocations.paths`).
        format_codes: uint8 a file, an index into `formats.scan.FORMATS`.
        sizes: bytes a file (int64).
        unit_offsets: int64, ``len(paths) + 1``: file ``i``'s units are ``unit_values[unit_offsets[i]:
            unit_offsets[i + 1]]``. unit_values: rows a unit (int32/int64).

    Attributes:
        row_offsets: int64, ``len(paths) + 1``: each file's first global row, then the total.
        num_rows: rows of every file.
    """

    def __init__(self, paths: Sequence[str], format_codes: np.ndarray, sizes: np.ndarray, unit_offsets: np.ndarray,
                 unit_values: np.ndarray) -> None:
        self.paths = paths
        self.format_codes = np.asarray(format_codes, dtype=np.uint8)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.unit_offsets = np.asarray(unit_offsets)  # int32 in a manifest: kept as it is
        self.unit_values = np.asarray(unit_values)
        unit_starts = np.zeros(len(self.unit_values) + 1, dtype=np.int64)
        np.cumsum(self.unit_values, out=unit_starts[1:])
        self.row_offsets = unit_starts[self.unit_offsets]
        self.num_rows = int(self.row_offsets[-1])
        self._starts: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._starts_lock = threading.Lock()

    @classmethod
    def of(cls, paths: Sequence[str], metas: Sequence[FileMeta]) -> FileTable:
        """The table of files ``paths`` with their scanned metadata (a list of `FileMeta`)."""
        count = len(metas)
        codes = {name: i for i, name in enumerate(FORMATS)}
        lengths = np.fromiter((len(m.unit_rows) for m in metas), dtype=np.int64, count=count)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((r for m in metas for r in m.unit_rows), dtype=np.int64, count=int(offsets[-1]))
        return cls(paths, np.fromiter((codes[m.format] for m in metas), dtype=np.uint8, count=count),
                   np.fromiter((m.size for m in metas), dtype=np.int64, count=count), offsets, _narrow(values))

    def __len__(self) -> int:
        return len(self.sizes)

    def batch_rows(self, i: int) -> tuple[int, ...]:
        return tuple(self.unit_values[self.unit_offsets[i]:self.unit_offsets[i + 1]].tolist())

    def format(self, i: int) -> str:
        return FORMATS[self.format_codes[i]]

    def _make(self, i: int) -> ShardFile:
        offset = int(self.row_offsets[i])
        return ShardFile(self.paths[i], self.format(i), int(self.sizes[i]), int(self.row_offsets[i + 1]) - offset,
                         self.batch_rows(i), offset)

    def unit_starts(self, i: int) -> tuple[int, ...]:
        """File ``i``'s units' first rows and its row count (``(0, u0, u0 + u1, ..., rows)``): made once for the
        files being read (the last `_STARTS_KEPT`)."""
        starts = self._starts.get(i)
        if starts is None:
            a, b = int(self.unit_offsets[i]), int(self.unit_offsets[i + 1])
            cumulative = np.zeros(b - a + 1, dtype=np.int64)
            np.cumsum(self.unit_values[a:b], out=cumulative[1:])
            starts = tuple(cumulative.tolist())
            with self._starts_lock:
                self._starts[i] = starts
                if len(self._starts) > _STARTS_KEPT:
                    self._starts.popitem(last=False)
        return starts

    def largest_unit_bytes(self, which: np.ndarray) -> int:
        """The largest ``size // units`` of the files where ``which`` (bool a file) is True; 0 where none is."""
        per_unit = self.sizes[which] // np.maximum(1, np.diff(self.unit_offsets)[which])
        return int(per_unit.max()) if per_unit.size else 0

    def file_of_row(self, index: int) -> int:
        """The file holding global row ``index`` (0 <= index < num_rows)."""
        return int(np.searchsorted(self.row_offsets, index, side="right")) - 1

    def nbytes(self) -> int:
        """Bytes of the columns this table holds in process memory: not those that are views of a manifest's map
        (page cache), nor the paths (the locations')."""
        return sum(int(a.nbytes) for a in (self.format_codes, self.sizes, self.unit_offsets, self.unit_values,
                                           self.row_offsets) if a.flags.owndata)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_starts"], state["_starts_lock"] = OrderedDict(), None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._starts_lock = threading.Lock()


class _StartsOf(_Rows):
    """``starts[i]`` = `FileTable.unit_starts` (i): what the row reads index by file."""

    def __init__(self, files: FileTable) -> None:
        self._files = files

    def __len__(self) -> int:
        return len(self._files)

    def _make(self, i: int) -> tuple[int, ...]:
        return self._files.unit_starts(i)


class AllKept(dict):
    """``kept[file_id]``: None for every file (no filter: all rows kept), without a list as long as the files."""

    def __missing__(self, file_id: int) -> None:
        return None


def unit_starts_of(files: FileTable) -> Sequence[tuple[int, ...]]:
    return _StartsOf(files)


# ----------------------------------------------------------------------------- a manifest's files


class ManifestLocations(_Rows):
    """A manifest's files as `Location` s on one filesystem (``Sequence[Location]``, made on demand).

    Args:
        manifest: the `manifest.Manifest`. fs: the filesystem (None: local files). folder: the manifest's folder
            (a filesystem path). scheme: the URL scheme shown in paths (None: paths stay the filesystem's).
    """

    def __init__(self, manifest: Any, fs: Any, folder: str, scheme: str | None) -> None:
        self.manifest, self.fs, self.folder, self.scheme = manifest, fs, folder, scheme
        self.paths = _Paths(self)

    def __len__(self) -> int:
        return self.manifest.num_files

    def fs_path(self, i: int) -> str:
        return f"{self.folder}/{self.manifest.name(i)}"

    def path(self, i: int) -> str:
        fs_path = self.fs_path(i)
        return url_for(self.scheme, fs_path) if self.scheme else fs_path

    def _make(self, i: int) -> Location:
        fs_path = self.fs_path(i)
        if self.fs is None:
            return Location(fs_path, None, fs_path)
        return Location(url_for(self.scheme, fs_path) if self.scheme else fs_path, self.fs, fs_path,
                         self.manifest.mtime_ns(i), size=int(self.manifest.sizes[i]))


class _Paths(_Rows):
    """The paths of `ManifestLocations`, made on demand."""

    def __init__(self, locations: ManifestLocations) -> None:
        self._locations = locations

    def __len__(self) -> int:
        return len(self._locations)

    def _make(self, i: int) -> str:
        return self._locations.path(i)

    def __iter__(self) -> Iterator[str]:  # every path at once: a million in 0.4 s, not one call each
        locations = self._locations
        fs_paths = [f"{locations.folder}/{name}" for name in locations.manifest.names()]
        return iter([url_for(locations.scheme, p) for p in fs_paths] if locations.scheme else fs_paths)


class ManifestMetas(_Rows):
    """A manifest's files as `FileMeta` s (``Sequence[FileMeta]``, made on demand: ``located`` False), and the
    footers read since (``metas[i] = meta`` keeps one: the dataset's `located`)."""

    def __init__(self, manifest: Any) -> None:
        self.manifest = manifest
        self._located: dict[int, FileMeta] = {}

    def __len__(self) -> int:
        return self.manifest.num_files

    def _make(self, i: int) -> FileMeta:
        meta = self._located.get(i)
        return meta if meta is not None else self.manifest.meta(i)

    def __setitem__(self, i: int, meta: FileMeta) -> None:
        self._located[int(i)] = meta

    def located_metas(self) -> list[FileMeta]:
        """The metas of the files whose footers were read."""
        return list(self._located.values())

    def column(self, name: str) -> list[Any]:
        """Every file's ``digest``, ``mtime_ns`` or ``etag`` (as its `FileMeta` would say), without the metas."""
        values = self.manifest.values(name)
        for i, meta in list(self._located.items()):
            values[i] = getattr(meta, name)
        return values

    def table(self, paths: Sequence[str]) -> FileTable:
        """The `FileTable` of the manifest's files, from its columns (no per-file object)."""
        m = self.manifest
        codes = np.asarray([FORMATS.index(name) for name in m.format_names], dtype=np.uint8)[m.format_codes]
        return FileTable(paths, codes, m.sizes, m.unit_offsets, m.unit_values)

    def distinct_schemas(self) -> list[tuple[int, Any]]:
        """``(first file, schema)`` of each distinct schema, in order of first file."""
        return self.manifest.distinct_schemas()


def file_table_of(locations: Sequence[Location], metas: Sequence[FileMeta]) -> FileTable:
    """The files' `FileTable`: from a manifest's columns (`ManifestMetas`), else from the scanned metadata."""
    paths = getattr(locations, "paths", None)
    if isinstance(metas, ManifestMetas):
        return metas.table(paths)
    return FileTable.of(paths if paths is not None else [loc.path for loc in locations], metas)


def remote_mask(locations: Sequence[Location]) -> np.ndarray:
    """Whether each file is remote (bool a file), without making a manifest's locations."""
    fs = getattr(locations, "fs", 0)  # one filesystem for all: a manifest's files
    if fs != 0:
        return np.full(len(locations), fs is not None)
    return np.fromiter((loc.fs is not None for loc in locations), dtype=bool, count=len(locations))


# ----------------------------------------------------------------------------- splits


class SplitTable(_Rows):
    """Splits as columns (``Sequence[Split]``: ``table[i]`` is ``Split(i, file_ids[i], starts[i], stops[i],
    kept[i])``), in (file, row) order.

    Args:
        file_ids, starts, stops: int arrays a split. kept: rows a filter keeps a split (int64), or None: all.
    """

    def __init__(self, file_ids: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                 kept: np.ndarray | None = None) -> None:
        self.file_ids, self.starts, self.stops = _narrow(file_ids), _narrow(starts), _narrow(stops)
        self.kept = None if kept is None else np.asarray(kept, dtype=np.int64)

    @classmethod
    def of(cls, splits: Sequence[Split]) -> SplitTable:
        """The table of ``splits`` (in (file, row) order; renumbered by position)."""
        if isinstance(splits, SplitTable):
            return splits
        count = len(splits)
        kept = (np.fromiter((s.num_rows for s in splits), dtype=np.int64, count=count)
                if any(s.kept is not None for s in splits) else None)
        return cls(np.fromiter((s.file_id for s in splits), dtype=np.int64, count=count),
                   np.fromiter((s.start for s in splits), dtype=np.int64, count=count),
                   np.fromiter((s.stop for s in splits), dtype=np.int64, count=count), kept)

    def __len__(self) -> int:
        return len(self.file_ids)

    def _make(self, i: int) -> Split:
        return Split(i, int(self.file_ids[i]), int(self.starts[i]), int(self.stops[i]),
                     None if self.kept is None else int(self.kept[i]))

    def take(self, indices: np.ndarray) -> list[Split]:
        """The splits at ``indices`` (an int array), made at once (faster than one by one)."""
        indices = np.asarray(indices, dtype=np.int64)
        kept = [None] * len(indices) if self.kept is None else self.kept[indices].tolist()
        return [Split(i, f, a, b, k) for i, f, a, b, k in zip(
            indices.tolist(), self.file_ids[indices].tolist(), self.starts[indices].tolist(),
            self.stops[indices].tolist(), kept, strict=True)]

    def num_rows(self) -> np.ndarray:
        """Rows read from each split (int64): the kept ones under a filter."""
        return (self.stops.astype(np.int64) - self.starts) if self.kept is None else self.kept

    def with_kept(self, kept: np.ndarray) -> SplitTable:
        """These splits with their kept rows counted (``kept``, int64 a split); those keeping none dropped."""
        keep = np.asarray(kept, dtype=np.int64) > 0
        return SplitTable(self.file_ids[keep], self.starts[keep], self.stops[keep], np.asarray(kept)[keep])

    def nbytes(self) -> int:
        return int(self.file_ids.nbytes + self.starts.nbytes + self.stops.nbytes
                   + (0 if self.kept is None else self.kept.nbytes))


def plan_splits(files: FileTable, split_rows: int) -> SplitTable:
    """Every file's splits (`splits.file_splits`: units merged up to ``split_rows`` rows; IPC units over twice
    that cut into near-equal ranges), in (file, row) order, computed for all files at once.

    A file of at most ``split_rows`` rows is one split (the common case, no loop); the others are planned a unit
    position at a time across files (`_planned_by_unit`), or one by one where a file has very many units.
    """
    rows = np.diff(files.row_offsets)
    whole = (rows > 0) & (rows <= split_rows)
    if whole.sum() == (rows > 0).sum():
        ids = np.flatnonzero(whole)
        return SplitTable(ids, np.zeros(len(ids), dtype=np.int32), rows[ids])
    parts = [(np.flatnonzero(whole), np.zeros(int(whole.sum()), dtype=np.int64), rows[whole])]
    counts = np.diff(files.unit_offsets)
    divide = np.isin(files.format_codes, [FORMATS.index("ipc_file"), FORMATS.index("ipc_stream")])
    rest = np.flatnonzero(rows > split_rows)
    for f in rest[counts[rest] > _VECTOR_UNITS].tolist():  # files of many units: one by one
        found = file_splits(f, files.batch_rows(f), split_rows, bool(divide[f]))
        parts.append((np.full(len(found), f, dtype=np.int64), np.array([s.start for s in found], dtype=np.int64),
                      np.array([s.stop for s in found], dtype=np.int64)))
    parts.extend(_planned_by_unit(files, rest[counts[rest] <= _VECTOR_UNITS], divide, split_rows))
    file_ids, starts, stops = (np.concatenate([p[k] for p in parts]) for k in range(3))
    order = np.lexsort((starts, file_ids))
    return SplitTable(file_ids[order], starts[order], stops[order])


def _planned_by_unit(files: FileTable, few: np.ndarray, divide: np.ndarray, split_rows: int
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`file_splits` of the files ``few`` (ids), all at once: the k-th unit of every file that has one, for k =
    0, 1, ...; returns ``(file ids, starts, stops)`` parts, unordered."""
    counts = np.diff(files.unit_offsets)[few]
    order = np.argsort(-counts, kind="stable")  # files with a unit k are a prefix, for every k
    few, counts = few[order], counts[order]
    acc_start = np.zeros(len(few), dtype=np.int64)
    acc_rows = np.zeros(len(few), dtype=np.int64)
    pos = np.zeros(len(few), dtype=np.int64)
    parts = []
    for k in range(int(counts[0]) if len(few) else 0):
        n = int(np.searchsorted(-counts, -k, side="left"))  # files with more than k units
        ids = few[:n]
        rows = files.unit_values[files.unit_offsets[ids] + k].astype(np.int64)
        a_start, a_rows, p = acc_start[:n], acc_rows[:n], pos[:n]  # views: updated in place
        cut = divide[ids] & (rows > 2 * split_rows)
        merge = ~cut & (rows > 0)
        close = (cut | (merge & (a_rows + rows > split_rows))) & (a_rows > 0)  # the run so far ends before it
        parts.append((ids[close], a_start[close], p[close].copy()))
        a_rows[close] = 0
        if cut.any():
            pieces = -(-rows[cut] // split_rows)
            j = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
            r, base, each = np.repeat(rows[cut], pieces), np.repeat(p[cut], pieces), np.repeat(pieces, pieces)
            parts.append((np.repeat(ids[cut], pieces), base + r * j // each, base + r * (j + 1) // each))
        opening = merge & (a_rows == 0)
        a_start[opening] = p[opening]
        a_rows[merge] += rows[merge]
        p += rows
    last = acc_rows > 0
    parts.append((few[last], acc_start[last], pos[last]))
    return parts
