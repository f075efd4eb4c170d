"""Readers: per-file handles reading one record batch / row group / stripe, and zero-copy audio values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..storage.remote import SparseFile
from .scan import orc_module


class _Handle:
    """A reader of one file's units. ``sparse``: a remote file's `SparseFile` (where the read-ahead puts a
    unit's fetched bytes before the unit is read), None for a local one."""

    sparse: SparseFile | None = None
    #: ``(address, bytes)`` of the memory map a local IPC file is read through (`UnitReads.release_mapped_pages`).
    mapped_range: tuple[int, int] | None = None


class IpcFileHandle(_Handle):
    """Random access to one IPC file's record batches, projected to the used columns.

    ``f``: a memory map (``local``) or a remote file (a `SparseFile` holding the footer).
    """

    def __init__(self, f: Any, schema: pa.Schema, columns: Sequence[str], local: bool):
        self._file, self._columns = f, list(columns)
        if local:
            # On a memory map every read is a zero-copy view; included_fields would copy.
            self._reader = pa.ipc.open_file(f)
        else:
            # Remotely, read only the used columns' buffers.
            included = sorted(schema.get_field_index(c) for c in columns)
            self._reader = pa.ipc.open_file(f, options=pa.ipc.IpcReadOptions(included_fields=included))

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return [self._reader.get_batch(i).select(self._columns)]

    def close(self) -> None:
        self._file.close()


class IpcStreamHandle(_Handle):
    """Random access to one IPC stream's record batches via the message offsets found at construction."""

    def __init__(self, f: Any, schema: pa.Schema, offsets: Sequence[int], columns: Sequence[str]):
        self._file, self._schema, self._offsets, self._columns = f, schema, offsets, list(columns)

    def unit(self, i: int) -> list[pa.RecordBatch]:
        self._file.seek(self._offsets[i])
        message = pa.ipc.read_message(self._file)
        return [pa.ipc.read_record_batch(message, self._schema).select(self._columns)]

    def close(self) -> None:
        self._file.close()


class ParquetHandle(_Handle):
    """One Parquet file: a unit is a row group, read whole (Parquet cannot seek inside one)."""

    def __init__(self, f: Any, columns: Sequence[str], metadata: Any = None):
        self._file = f
        self._parquet = pq.ParquetFile(f, metadata=metadata)  # the footer parsed at construction: not read again
        self._columns = list(columns)

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return self._parquet.read_row_group(i, columns=self._columns).to_batches()

    def close(self) -> None:
        self._file.close()


class OrcHandle(_Handle):
    """One ORC file: a unit is a stripe, read whole (pyarrow reads ORC by stripe, like Parquet by row group)."""

    def __init__(self, f: Any, columns: Sequence[str]):
        self._file = f
        self._orc = orc_module().ORCFile(self._file)  # reads the file tail (a remote one's from memory)
        self._columns = list(columns)

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return [self._orc.read_stripe(i, columns=self._columns).select(self._columns)]

    def close(self) -> None:
        self._file.close()


class ConformedHandle(_Handle):
    """A handle whose batches are read into a target schema: a file of a source whose schemas evolved."""

    def __init__(self, handle: Any, schema: pa.Schema):
        self._handle, self._schema = handle, schema
        self.sparse, self.mapped_range = handle.sparse, handle.mapped_range

    def unit(self, i: int) -> list[pa.RecordBatch]:
        return [conform(batch, self._schema) for batch in self._handle.unit(i)]

    def close(self) -> None:
        self._handle.close()


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns: cast to its types (binary -> large_binary shares the values'
    buffer), a column the batch lacks as nulls."""
    arrays = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, field.type))
        else:
            column = batch.column(index)
            arrays.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def audio_values(column: pa.Array, picks: Sequence[int] | None = None) -> tuple[list[Any], np.ndarray | None]:
    """Per-row zero-copy ``pyarrow.Buffer`` views (``None`` for nulls), and the null mask or None.

    For a struct column (Hugging Face Audio) the ``bytes`` field is used; a row is
    null when the struct or its bytes are null. ``picks``: only these rows, in this
    order (None: every row).
    """
    valid = None
    if pa.types.is_struct(column.type):
        if column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False)
        column = column.field("bytes")
    if column.null_count:
        child_valid = column.is_valid().to_numpy(zero_copy_only=False)
        valid = child_valid if valid is None else valid & child_valid
    n = len(column)
    rows = range(n) if picks is None else picks
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        _, offsets_buf, data = column.buffers()
        dtype = np.int32 if pa.types.is_binary(column.type) else np.int64
        offsets = np.frombuffer(offsets_buf, dtype=dtype)[column.offset:column.offset + n + 1].tolist()
        if data is None:
            data = pa.py_buffer(b"")
        values = [data.slice(offsets[i], offsets[i + 1] - offsets[i]) for i in rows]
    else:  # binary_view and other layouts: per-scalar (still zero-copy)
        values = [column[i].as_buffer() if column[i].is_valid else None for i in rows]
    if valid is not None:
        if picks is not None:
            valid = valid[np.asarray(picks, dtype=np.int64)]
        values = [v if ok else None for v, ok in zip(values, valid.tolist(), strict=True)]
    return values, None if valid is None else ~valid
