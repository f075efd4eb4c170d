"""How a `ShardDataset` reads rows: a split's record batches, the rows a filter keeps, rows by global index
(random access), one column alone, and a batch's used columns as Python values (`BatchColumns`, `ShardRow`).

The dataset holds a `RowReads`, which reads each unit (record batch, row group or stripe) through the dataset's
`UnitReads`.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..catalog.file_table import AllKept, SplitTable, unit_starts_of
from ..formats.readers import audio_values as _audio_values
from ..sources.splits import Split
from .unit_reads import UnitReader, UnitReads


class ShardRow(NamedTuple):
    """One row read by random access (`ShardDataset.read_rows`).

    Attributes:
        index: global row index.
        file: path or URL of the shard file.
        row: row number in that file.
        audio: encoded audio (``pyarrow.Buffer``, zero-copy where possible), or ``None`` if null.
        label: integer label, or ``None`` (null, or no label column).
        extras: ``{column: python value}`` for the extra columns.
        problem: ``"audio is null"``, ``"label is null"`` or ``None`` (as in `BatchColumns.problems`).
    """

    index: int
    file: str
    row: int
    audio: Any
    label: int | None
    extras: dict[str, Any]
    problem: str | None = None


class BatchColumns(NamedTuple):
    """A record batch's used columns as Python lists (one entry per row).

    Attributes:
        audio: ``pyarrow.Buffer`` (zero-copy view) or ``None`` per row.
        labels: ``int | None`` per row, or ``None`` when there is no label column.
        extras: ``[(name, values)]`` for the extra columns.
        problems: ``None`` when no row has a problem, else ``str | None`` per row.
    """

    audio: list[Any]
    labels: list[int | None] | None
    extras: list[tuple[str, list[Any]]]
    problems: list[str | None] | None


class RowReads:
    """Reads a dataset's rows through its `UnitReads`: a split's record batches, the rows a filter keeps, rows by
    global index, one column alone, and a batch's used columns as Python values. Holds no handle of its own (the
    units' are per thread): thread-safe, picklable.

    Args:
        units: the dataset's `UnitReads` (every unit is read through it).
        files: the dataset's `FileTable`.
        kept: the file rows a filter keeps (int64, ascending), by file; `AllKept` without a filter.
        audio_column, label_column, columns: the columns read (the label's may be None).
    """

    def __init__(self, units: UnitReads, files: Any, kept: Sequence[np.ndarray | None], audio_column: str,
                 label_column: str | None, columns: Sequence[str]):
        self.units, self.files, self._kept = units, files, kept
        self._unit_starts = unit_starts_of(files)
        self.audio_column, self.label_column, self.columns = audio_column, label_column, list(columns)

    def reading(self, units: UnitReads, columns: Sequence[str]) -> RowReads:
        """The same rows read through other ``units`` with other extra ``columns``."""
        return RowReads(units, self.files, self._kept, self.audio_column, self.label_column, columns)

    def locate(self, index: int) -> tuple[int, int]:
        """``(file_id, row in file)`` of a global row index; IndexError when out of range."""
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"a row index must be an int, got {type(index).__name__} {index!r}") from None
        num_rows = self.files.num_rows
        if not 0 <= index < num_rows:
            raise IndexError(f"row index {index!r} is out of range: the source has {num_rows} rows "
                             f"(indices 0..{num_rows - 1}) in {len(self.files)} file(s)")
        file_id = self.files.file_of_row(index)
        return file_id, index - int(self.files.row_offsets[file_id])

    # ----------------------------------------------------------------- the rows a filter keeps

    def counted(self, splits: Sequence[Split]) -> Sequence[Split]:
        """``splits`` (in (file, row) order) with their kept rows counted and those keeping none dropped, renumbered
        (as given without a filter)."""
        if isinstance(self._kept, AllKept):
            return splits
        table = SplitTable.of(splits)
        kept = np.fromiter((self.kept_count(int(f), int(a), int(b))
                            for f, a, b in zip(table.file_ids, table.starts, table.stops, strict=True)),
                           dtype=np.int64, count=len(table))
        return table.with_kept(kept)

    def kept_indices(self) -> np.ndarray:
        """Global indices (int64, ascending) of the rows the filter keeps (every row without one)."""
        if isinstance(self._kept, AllKept):
            return np.arange(self.files.num_rows, dtype=np.int64)
        return np.concatenate([kept + offset for kept, offset in zip(self._kept, self.files.row_offsets.tolist(),
                                                                        strict=False)])

    def read_split(self, split: Split, start_row: int = 0,
                   read_unit: UnitReader | None = None) -> Iterator[pa.RecordBatch]:
        """Record batches holding rows ``[split.start + start_row, split.stop)`` of the split's file.

        Only the used columns; zero-copy for local IPC files and streams (slices of
        the memory map). Batches before ``start_row`` are not read; a Parquet row
        group or ORC stripe is read whole and sliced.
        """
        begin, stop = split.start + start_row, split.stop
        starts = self._unit_starts[split.file_id]
        unit = bisect.bisect_right(starts, begin) - 1
        while begin < stop and unit < len(starts) - 1:
            if starts[unit + 1] > begin:
                yield from _slice_batches((read_unit or self.units.read_unit)(split.file_id, unit), starts[unit], begin,
                                          stop)
                begin = starts[unit + 1]
            unit += 1

    def kept_count(self, file_id: int, start: int, stop: int) -> int:
        """Rows of ``[start, stop)`` of a file that the filter keeps (all of them without a filter)."""
        kept = self._kept[file_id]
        if kept is None:
            return stop - start
        return int(np.searchsorted(kept, stop) - np.searchsorted(kept, start))

    def kept_start(self, file_id: int, start: int, stop: int, skip: int) -> int:
        """The file row where the rows of ``[start, stop)`` that are kept, less the first ``skip``, begin.

        ``[kept_start(...), stop)`` holds exactly the kept rows after the first ``skip`` (``stop`` when none).
        """
        kept = self._kept[file_id]
        if kept is None:
            return min(start + skip, stop)
        first = int(np.searchsorted(kept, start)) + skip
        return int(kept[first]) if first < len(kept) and kept[first] < stop else stop

    def read_kept(self, file_id: int, start: int, stop: int, skip: int = 0,
                  read_unit: UnitReader | None = None) -> Iterator[tuple[pa.RecordBatch, list[int], list[int] | None]]:
        """``(batch, file rows, picks)`` for the kept rows of ``[start, stop)`` after the first ``skip`` of them.

        ``picks``: the positions in ``batch`` of the rows in ``file rows`` (None: every row
        of the batch). Without a filter this is `read_split`; with one, a record batch /
        row group without kept rows is never read, and the filter's columns were read
        at construction, so an unkept row's audio is never touched.
        """
        kept = self._kept[file_id]
        if kept is None:
            pos = start + skip
            for batch in self.read_split(Split(-1, file_id, start, stop), skip, read_unit):
                yield batch, list(range(pos, pos + batch.num_rows)), None
                pos += batch.num_rows
            return
        rows = kept[np.searchsorted(kept, start):np.searchsorted(kept, stop)][skip:]
        starts = self._unit_starts[file_id]
        units = np.searchsorted(starts, rows, side="right") - 1
        for unit in dict.fromkeys(units.tolist()):  # in order, each unit once
            wanted = rows[units == unit]
            pos = starts[unit]
            for batch in (read_unit or self.units.read_unit)(file_id, unit):
                inside = wanted[(wanted >= pos) & (wanted < pos + batch.num_rows)]
                if len(inside):
                    yield batch, inside.tolist(), (inside - pos).tolist()
                pos += batch.num_rows

    def units_of(self, file_id: int, start: int, stop: int, skip: int = 0) -> list[tuple[int, int]]:
        """``(rows before it, unit)`` for each unit `read_kept` reads, in order: the units holding the kept rows of
        ``[start, stop)`` after the first ``skip`` of them, each with how many of those rows come before its first."""
        starts = self._unit_starts[file_id]
        kept = self._kept[file_id]
        if kept is None:
            begin = min(start + skip, stop)
            first = bisect.bisect_right(starts, begin) - 1
            return [(max(starts[u], begin) - begin, u) for u in range(max(first, 0), len(starts) - 1)
                    if starts[u] < stop and starts[u + 1] > begin]
        rows = kept[np.searchsorted(kept, start):np.searchsorted(kept, stop)][skip:]
        units = np.searchsorted(starts, rows, side="right") - 1
        firsts = np.flatnonzero(np.r_[True, units[1:] != units[:-1]]) if len(units) else units
        return [(int(i), int(units[i])) for i in firsts]

    def units_of_rows(self, file_id: int, rows: Sequence[int]) -> list[int]:
        """The units holding file rows ``rows``, in the order `read_rows` reads them (ascending)."""
        return sorted({bisect.bisect_right(self._unit_starts[file_id], r) - 1 for r in rows})

    def columns_of_rows(self, rows: Sequence[ShardRow]) -> BatchColumns:
        """`BatchColumns` of rows read by random access (`read_rows`)."""
        problems = [r.problem for r in rows]
        return BatchColumns([r.audio for r in rows],
                            [r.label for r in rows] if self.label_column is not None else None,
                            [(name, [r.extras[name] for r in rows]) for name in self.columns],
                            problems if any(p is not None for p in problems) else None)

    def columns_of(self, batch: pa.RecordBatch, picks: Sequence[int] | None = None) -> BatchColumns:
        """The used columns of a batch as per-row Python values (one conversion per batch).

        ``picks``: only these rows of the batch, in this order (None: every row).
        """
        # Only the picked rows become Python values (a filter may keep few rows of a batch); the audio
        # stays zero-copy views of the whole column's buffer.
        taken = pa.array(picks, pa.int64()) if picks is not None else None

        def values_of(name: str) -> pa.Array:
            array = batch.column(name)
            return array if taken is None else array.take(taken)

        audio, audio_null = _audio_values(batch.column(self.audio_column), picks)
        labels = label_null = None
        if self.label_column is not None:
            label_array = values_of(self.label_column)
            labels = label_array.to_pylist()
            if label_array.null_count:
                label_null = ~label_array.is_valid().to_numpy(zero_copy_only=False)
        extras = [(name, values_of(name).to_pylist()) for name in self.columns]
        problems = None
        if audio_null is not None or label_null is not None:
            problems = [None] * len(audio)
            if label_null is not None:
                for i in np.flatnonzero(label_null).tolist():
                    problems[i] = "label is null"
            if audio_null is not None:
                for i in np.flatnonzero(audio_null).tolist():
                    problems[i] = "audio is null"
        return BatchColumns(audio, labels, extras, problems)

    def read_rows(self, indices: Sequence[int], read_unit: UnitReader | None = None) -> list[ShardRow]:
        """Random access: one `ShardRow` per index, in the given order (duplicates allowed).

        Each needed record batch / row group is read once; a remote file's are fetched
        concurrently, up to ``RANDOM_ACCESS_BYTES`` at a time. Safe to call from any
        thread (each thread has its own file handles). ``read_unit``: reads units instead
        of this dataset (a read-ahead that fetched them already).
        """
        located = [(self.locate(i), k) for k, i in enumerate(indices)]
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for (file_id, row), k in located:
            unit = bisect.bisect_right(self._unit_starts[file_id], row) - 1
            groups.setdefault((file_id, unit), []).append((row, k))
        out: list[ShardRow | None] = [None] * len(located)
        fetched: dict[tuple[int, int], list[tuple[int, pa.Buffer]]] = {}
        units = sorted(groups)  # file order reuses open handles
        for n, (file_id, unit) in enumerate(units):
            if read_unit is not None:
                batches = read_unit(file_id, unit)
            else:
                if (file_id, unit) not in fetched and self.units.unit_ranges(file_id, unit) is not None:
                    fetched = self.units.fetch_units(self.units.next_units(units, n))  # the next ones at once, bounded
                provided = fetched.pop((file_id, unit), None)
                batches = (self.units.read_unit(file_id, unit) if provided is None
                           else self.units.read_unit_from(file_id, unit, provided))
            # One conversion per record batch for the rows wanted from it, not one per row (issue 37: 110 us a row).
            unit_start, shard_file = self._unit_starts[file_id][unit], self.files[file_id]
            wanted: dict[int, list[tuple[int, int, int]]] = {}  # batch of the unit -> [(row in it, row, out)]
            for row, k in groups[(file_id, unit)]:
                at, b = row - unit_start, 0
                while at >= batches[b].num_rows:
                    at -= batches[b].num_rows
                    b += 1
                wanted.setdefault(b, []).append((at, row, k))
            for b, picks in wanted.items():
                cols = self.columns_of(batches[b], [at for at, _, _ in picks])
                for j, (_, row, k) in enumerate(picks):
                    out[k] = _row_of(cols, j, shard_file, row)
        return out  # type: ignore[return-value]

    def read_column(self, name: str, indices: Sequence[int]) -> list[Any]:
        """The values of column ``name`` at global row ``indices``, in that order, reading that column only
        (e.g. the durations that estimate the bucket edges: no audio is read)."""
        located = [self.locate(i) for i in indices]
        wanted: dict[int, dict[int, list[int]]] = {}
        for k, (file_id, row) in enumerate(located):
            unit = bisect.bisect_right(self._unit_starts[file_id], row) - 1
            wanted.setdefault(file_id, {}).setdefault(unit, []).append(k)
        out: list[Any] = [None] * len(located)
        for file_id, units in sorted(wanted.items()):
            for unit, batches in self.units.read_columns(file_id, [name], sorted(units), f"column {name!r}"):
                values = [v for batch in batches for v in batch.column(name).to_pylist()]
                start = self._unit_starts[file_id][unit]
                for k in units[unit]:
                    out[k] = values[located[k][1] - start]
        return out


def _row_of(cols: BatchColumns, j: int, f: Any, row: int) -> ShardRow:
    """The `ShardRow` of the ``j``-th row of ``cols``, row ``row`` of shard file ``f``."""
    return ShardRow(f.index_offset + row, f.path, row, cols.audio[j],
                    cols.labels[j] if cols.labels is not None else None,
                    {name: values[j] for name, values in cols.extras},
                    cols.problems[j] if cols.problems is not None else None)


def _slice_batches(batches: Sequence[pa.RecordBatch], unit_start: int, begin: int,
                   stop: int) -> Iterator[pa.RecordBatch]:
    """The parts of a unit's batches (unit starts at file row ``unit_start``) in rows ``[begin, stop)``."""
    pos = unit_start
    for batch in batches:
        lo, hi = max(begin, pos), min(stop, pos + batch.num_rows)
        if lo < hi:
            yield batch if hi - lo == batch.num_rows else batch.slice(lo - pos, hi - lo)
        pos += batch.num_rows
