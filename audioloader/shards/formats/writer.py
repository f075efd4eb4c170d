"""Writing one shard atomically: ``ShardWriter``.

A shard is an Arrow IPC *file* (the default: memory-mappable, so the reader gets
zero-copy ``audio`` buffers) or a Parquet file, with the columns

- ``audio``: ``binary``, the encoded audio bytes (WAV, FLAC, Ogg, MP3, ...),
- ``label``: ``int64`` class id (left out for unlabeled data),
- any extra columns the caller declares (e.g. ``path: string``, ``duration: float64``).

Label names are stored in the schema metadata under the key ``b"audioloader"``
as JSON ``{"labels": [names in id order] | null, "version": 1}``, plus any
further entries the caller gives (``audioloader pack`` adds ``"segments": "cut"``
when each row is a segment cut from a longer recording); the reader exposes the
names as ``ShardDataset.label_names``.

Atomicity: rows go to a temporary sibling file (same folder, so ``os.replace``
is a rename on one filesystem), which is fsynced and then renamed onto the
target. A reader therefore never sees a half-written shard, and an exception
inside the ``with`` block leaves neither the shard nor the temporary file.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from ... import checks

__all__ = ["FORMATS", "METADATA_KEY", "METADATA_VERSION", "ShardWriter", "shard_doc", "shard_metadata"]

FORMATS = ("ipc_file", "parquet")
METADATA_KEY = b"audioloader"
METADATA_VERSION = 1
_RESERVED = ("audio", "label")


def shard_metadata(label_names: list[str] | None, extra: Mapping[str, Any] | None = None) -> dict[bytes, bytes]:
    """The schema metadata audioloader writes: ``{b"audioloader": JSON bytes}``.

    Args:
        label_names: class names in id order (``label_names[i]`` is the name of id ``i``), or ``None``.
        extra: further JSON-able entries of the document (not ``labels`` or ``version``).
    """
    doc = {"labels": None if label_names is None else list(label_names), "version": METADATA_VERSION}
    doc.update({k: v for k, v in (extra or {}).items() if k not in doc})
    return {METADATA_KEY: json.dumps(doc, ensure_ascii=False).encode("utf-8")}


def shard_doc(schema: pa.Schema) -> dict[str, Any]:
    """The ``audioloader`` metadata document of a schema (see `shard_metadata`); ``{}`` when absent or foreign."""
    try:
        doc = json.loads((schema.metadata or {})[METADATA_KEY])
    except (KeyError, ValueError, TypeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _check_label_names(label_names: Any) -> list[str] | None:
    if label_names is None:
        return None
    if isinstance(label_names, (str, bytes)) or not hasattr(label_names, "__iter__"):
        raise ValueError(f"label_names={label_names!r}: must be a list of class names in id order, or None")
    names = list(label_names)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise ValueError(f"label_names[{i}]={name!r}: class names must be str")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"label_names: duplicate class names {dupes}; each id needs its own name")
    return names


def _check_extra_columns(extra_columns: Any) -> dict[str, pa.DataType]:
    if extra_columns is None:
        return {}
    if not isinstance(extra_columns, Mapping):
        raise ValueError(f"extra_columns={extra_columns!r}: must be a mapping {{name: pyarrow type}}, "
                         'e.g. {"path": pa.string()}')
    out: dict[str, pa.DataType] = {}
    for name, dtype in extra_columns.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"extra_columns: column name {name!r} must be a non-empty str")
        if name in _RESERVED:
            raise ValueError(f"extra_columns: {name!r} is reserved for the audio/label columns; rename it")
        if not isinstance(dtype, pa.DataType):
            raise ValueError(f"extra_columns[{name!r}]={dtype!r}: must be a pyarrow DataType, "
                             "e.g. pa.string()")
        out[name] = dtype
    return out


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable. Not every platform/filesystem allows
    # opening a directory for fsync; the shard is still complete without it.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ShardWriter:
    """Write one shard file atomically; use as a context manager.

    Example::

        with ShardWriter("out/shard-00000.arrow", label_names=["cat", "dog"],
                         extra_columns={"path": pa.string()}) as w:
            w.write(audio=wav_bytes, label=1, path="dog/a.wav")

    Args:
        path: the shard to create (str or ``Path``); an existing file is replaced
            only when the writer closes successfully. Its folder must exist.
        format: ``"ipc_file"`` (Arrow IPC file format, default) or ``"parquet"``.
        label_names: class names in id order, stored in the schema metadata; when
            given, every label must be in ``range(len(label_names))``.
        labeled: ``True`` (default) writes an ``int64`` ``label`` column;
            ``False`` writes unlabeled shards (no ``label`` column).
        extra_columns: ``{name: pyarrow.DataType}`` of further columns, in order;
            each ``write()`` may give a value for each (missing ones are null).
        rows_per_batch: rows per Arrow record batch / Parquet row group (the
            reader's unit of I/O and the smallest split). Default 64.
        max_batch_bytes: a batch is also cut once its audio reaches this many
            bytes (default 64 MiB), so long recordings do not make huge batches.
        metadata: further entries of the ``audioloader`` schema metadata (JSON-able values).

    Attributes:
        path: the target ``Path``; ``num_rows``: rows written so far;
        schema: the ``pyarrow.Schema`` written (with metadata).

    Raises:
        ValueError: for a bad argument (the message names it), or a bad row in
            ``write()``.
    """

    def __init__(self, path: str | os.PathLike[str], format: str = "ipc_file", *,
                 label_names: list[str] | None = None, labeled: bool = True,
                 extra_columns: Mapping[str, pa.DataType] | None = None,
                 rows_per_batch: int = 64, max_batch_bytes: int = 64 * 2**20,
                 metadata: Mapping[str, Any] | None = None) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"path={path!r}: must be a file path (str or os.PathLike)")
        if format not in FORMATS:
            raise ValueError(f"format={format!r}: must be one of {', '.join(FORMATS)}")
        if not isinstance(labeled, bool):
            raise ValueError(f"labeled={labeled!r}: must be True or False")
        self.path = Path(path)
        self.format = format
        self.label_names = _check_label_names(label_names)
        if self.label_names is not None and not labeled:
            raise ValueError("label_names given with labeled=False: unlabeled shards have no label ids "
                             "to name; drop label_names or use labeled=True")
        self.labeled = labeled
        self.extra_columns = _check_extra_columns(extra_columns)
        self.rows_per_batch = checks.positive_integer("rows_per_batch", rows_per_batch)
        self.max_batch_bytes = checks.positive_integer("max_batch_bytes", max_batch_bytes)
        if not self.path.parent.is_dir():
            raise ValueError(f"path={str(self.path)!r}: folder {str(self.path.parent)!r} does not exist")
        if self.path.is_dir():
            raise ValueError(f"path={str(self.path)!r} is a folder; give a file name "
                             "such as shard-00000.arrow")

        fields = [pa.field("audio", pa.binary())]
        if labeled:
            fields.append(pa.field("label", pa.int64()))
        fields += [pa.field(name, dtype) for name, dtype in self.extra_columns.items()]
        self.schema = pa.schema(fields, metadata=shard_metadata(self.label_names, metadata))

        self.num_rows = 0
        self._columns: dict[str, list[Any]] = {f.name: [] for f in self.schema}
        self._buffered_bytes = 0
        self._tmp: Path | None = None
        self._sink: Any = None
        self._writer: Any = None
        self._state = "new"  # new -> open -> closed | aborted

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> ShardWriter:
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the temporary file and start writing (``__enter__`` calls this)."""
        if self._state != "new":
            raise RuntimeError(f"ShardWriter({str(self.path)!r}) was already opened; use a new writer")
        # Hidden, unique sibling: same filesystem as the target (atomic rename),
        # and never picked up by a reader globbing "*.arrow".
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            self._sink = pa.OSFile(str(self._tmp), "wb")
            if self.format == "ipc_file":
                self._writer = pa.ipc.new_file(self._sink, self.schema)
            else:
                self._writer = self._parquet_writer()
        except BaseException:
            self._state = "open"
            self.abort()
            raise
        self._state = "open"

    def _parquet_writer(self) -> Any:
        import pyarrow.parquet as pq

        others = [f.name for f in self.schema if f.name != "audio"]
        # Audio is already compressed: compressing it again, building a dictionary
        # of it, or keeping min/max statistics of it only costs time and space.
        compression = {name: "snappy" for name in others}
        compression["audio"] = "none"
        return pq.ParquetWriter(self._sink, self.schema, compression=compression,
                                use_dictionary=others or False, write_statistics=others or False)

    def write(self, audio: bytes | bytearray | memoryview | pa.Buffer, label: int | None = None,
              **extras: Any) -> None:
        """Append one row.

        Args:
            audio: the encoded audio bytes (bytes-like or ``pyarrow.Buffer``).
            label: class id (``int >= 0``; ``< len(label_names)`` when names are known),
                or ``None`` (stored as null; the loader reports such a row as bad).
                Must be ``None`` for an unlabeled writer.
            **extras: values of the declared extra columns; missing ones are null.
        """
        if self._state != "open":
            raise RuntimeError(f"ShardWriter({str(self.path)!r}) is not open; "
                               "use it as `with ShardWriter(...) as w:`")
        data = self._check_audio(audio)
        label = self._check_label(label)
        unknown = sorted(set(extras) - set(self.extra_columns))
        if unknown:
            declared = ", ".join(self.extra_columns) or "none"
            raise ValueError(f"write(): unknown column(s) {unknown}; declared extra_columns: {declared}")
        self._columns["audio"].append(data)
        if self.labeled:
            self._columns["label"].append(label)
        for name in self.extra_columns:
            self._columns[name].append(extras.get(name))
        self._buffered_bytes += len(data)
        self.num_rows += 1
        if len(self._columns["audio"]) >= self.rows_per_batch or self._buffered_bytes >= self.max_batch_bytes:
            self._flush()

    def _check_audio(self, audio: Any) -> bytes:
        if isinstance(audio, bytes):
            return audio
        if isinstance(audio, (bytearray, memoryview, pa.Buffer)):
            return bytes(audio)
        raise ValueError(f"write(): audio must be the encoded bytes (bytes-like), got {type(audio).__name__} "
                         f"(row {self.num_rows} of {self.path.name})")

    def _check_label(self, label: Any) -> int | None:
        where = f"row {self.num_rows} of {self.path.name}"
        if not self.labeled:
            if label is not None:
                raise ValueError(f"write(): label={label!r} given to an unlabeled writer (labeled=False), "
                                 f"{where}")
            return None
        if label is None:
            return None
        # numpy integers are fine; bools, floats and strings are caller bugs.
        if isinstance(label, bool) or not isinstance(label, numbers.Integral):
            raise ValueError(f"write(): label={label!r} must be an int class id or None, {where}")
        label = int(label)
        if label < 0:
            raise ValueError(f"write(): label={label!r} must be >= 0, {where}")
        if self.label_names is not None and label >= len(self.label_names):
            raise ValueError(f"write(): label={label!r} is out of range: label_names has "
                             f"{len(self.label_names)} classes, {where}")
        return label

    def _flush(self) -> None:
        if not self._columns["audio"]:
            return
        batch = pa.RecordBatch.from_arrays(
            [pa.array(self._columns[f.name], type=f.type) for f in self.schema], schema=self.schema)
        if self.format == "ipc_file":
            self._writer.write_batch(batch)
        else:
            # One call, one row group: the buffer *is* the row group.
            self._writer.write_batch(batch, row_group_size=batch.num_rows)
        for values in self._columns.values():
            values.clear()
        self._buffered_bytes = 0

    def close(self) -> Path:
        """Flush, fsync and move the shard into place; returns its path. Idempotent."""
        if self._state == "closed":
            return self.path
        if self._state != "open":
            raise RuntimeError(f"ShardWriter({str(self.path)!r}) is {self._state}; nothing to close")
        try:
            self._flush()
            self._writer.close()
            self._writer = None
            self._sink.close()
            self._sink = None
            _fsync_file(self._tmp)
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        _fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Discard everything written: no shard appears and the temporary file is removed."""
        if self._state in ("closed", "aborted"):
            return
        self._state = "aborted"
        # Close quietly: the writer may be in a broken state after the error
        # that brought us here, and that original error is what the caller needs.
        for handle in (self._writer, self._sink):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._writer = self._sink = None
        for values in self._columns.values():
            values.clear()
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)

    def __repr__(self) -> str:
        return (f"ShardWriter({str(self.path)!r}, format={self.format!r}, rows={self.num_rows}, "
                f"state={self._state!r})")
