"""Predicate pushdown: a ``pyarrow.compute`` expression over non-audio columns decides which rows are read.

``filter=pc.field("duration") < 10.0`` (any boolean `pyarrow.compute.Expression`
over columns other than the audio) is applied at construction, before any audio
is read:

1. **Parquet row groups are pruned by their statistics**: pyarrow's dataset layer
   (``ParquetFileFragment.subset``) drops the row groups whose min/max (and null
   counts) show that no row can match. They are never read.
2. In the remaining record batches / row groups only the filter's own columns
   are read (a projected read: remotely, ranged reads of those columns only) and
   the expression is evaluated on them; the rows it keeps are recorded per file.

Before both, for a table source (`IcebergTable`), **data files are pruned by
their metadata** (`files_that_may_match`): each file's partition values and
column bounds make an expression all its rows satisfy, and pyarrow's dataset
layer drops the files whose expression rules the filter out. They are never
opened.

Reading then touches only the kept rows' audio (a record batch or row group
without a kept row is never read). Rows keep their global index, so keys,
crops, resume and exactly-once evaluation work as without a filter. This module
depends only on Arrow: `filter_columns`, `kept_positions` and
`files_that_may_match` work on any Arrow data.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

_ROW = "__audioloader_row"


def filter_columns(expression: Any, schema: pa.Schema, audio_column: str) -> list[str]:
    """The columns ``expression`` reads (in schema order); a clear error for anything but a boolean
    expression over existing non-audio columns."""
    if not isinstance(expression, pc.Expression):
        raise TypeError(f"filter must be a pyarrow.compute.Expression (e.g. pc.field('duration') < 10.0), "
                        f"got {type(expression).__name__}")
    names = [name for name in schema.names if name != audio_column]
    available = ", ".join(repr(n) for n in names)
    error = _error(expression, schema, names)
    if error is not None:
        text = str(error)
        if f"FieldRef.Name({audio_column})" in text:
            raise ValueError(f"filter={expression} reads the audio column {audio_column!r}; a filter decides which "
                             f"rows to read before their audio is touched, so it may use only the other columns: "
                             f"{available}")
        missing = re.search(r"FieldRef\.Name\((.*?)\)", text)
        if missing:
            raise ValueError(f"filter={expression} names a column the shards do not have ({missing.group(1)!r}); "
                             f"available: {available}")
        raise TypeError(f"filter={expression}: {text}. It must be a boolean expression, e.g. "
                        "(pc.field('duration') < 10.0) & (pc.field('split') == 'train')")
    for name in list(names):  # the smallest set of columns it still evaluates on: the ones it reads
        fewer = [n for n in names if n != name]
        if _error(expression, schema, fewer) is None:
            names = fewer
    return names


def _error(expression: pc.Expression, schema: pa.Schema, names: list[str]) -> Exception | None:
    """Why ``expression`` does not evaluate on a table of these columns, or None."""
    try:
        pa.schema([schema.field(n) for n in names]).empty_table().filter(expression)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        return error
    return None


def kept_positions(batches: list[pa.RecordBatch], expression: pc.Expression) -> np.ndarray:
    """Positions (int64, ascending) of the rows of ``batches`` (one unit, in order) that ``expression`` keeps."""
    table = pa.Table.from_batches(batches) if batches else None
    if table is None or table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    table = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table.filter(expression).column(_ROW).to_numpy()


def parquet_row_groups_that_may_match(metadata: Any, expression: pc.Expression, schema: pa.Schema) -> list[int]:
    """Row groups of a Parquet file whose statistics do not rule out a match (pyarrow prunes them).

    ``metadata``: the file's parsed footer (`pyarrow.parquet.FileMetaData`, read once at the scan); pruning
    needs nothing else, so the file is not opened again. ``schema``: the source's unified schema (a column
    the file lacks is null there, a narrower type widened).
    """
    footer = pa.BufferOutputStream()
    metadata.write_metadata_file(footer)
    fragment = pads.ParquetFileFormat().make_fragment(pa.BufferReader(footer.getvalue()))
    return [group.id for group in fragment.subset(expression, schema=schema).row_groups]


def files_that_may_match(guarantees: list[pc.Expression], schema: pa.Schema,
                         expression: pc.Expression) -> set[int] | None:
    """Positions of the files whose guarantee (an expression every row of the file satisfies) does not rule
    ``expression`` out, decided by pyarrow's dataset layer (its partition pruning); no file is opened.

    ``schema``: what the guarantees and the expression are bound to. None when the expression
    does not bind to it (the caller's own checks then report why).
    """
    paths = [f"/{i}" for i in range(len(guarantees))]  # never opened: placeholders that carry the position
    dataset = pads.FileSystemDataset.from_paths(paths, schema=schema, format=pads.ParquetFileFormat(),
                                                filesystem=pafs.LocalFileSystem(), partitions=guarantees)
    try:
        return {int(fragment.path[1:]) for fragment in dataset.get_fragments(filter=expression)}
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
