"""Shard discovery, format detection, metadata, splits, schema checks and reads.

A *source* (directory, glob, file, URL, or a list of them; or an `IcebergTable`:
its snapshot's data files) resolves to a sorted list of shard files. Each file
is Arrow IPC file format, Arrow IPC stream format (what Hugging Face
``save_to_disk`` writes), Parquet or ORC, detected from its content, not its
name. Construction reads only footers and message headers, never audio, and
checks the schema of the used columns in every file.

Rows are addressed by a global ``index``: the file's offset in the sorted file
list plus the row number in that file. A `Split` is a run of consecutive rows of
one file, aligned to record batches (IPC), row groups (Parquet) or stripes
(ORC); it is the unit that passes and ranks are made of.

Local files are memory-mapped, so reading IPC data is zero-copy: audio values
come out as ``pyarrow.Buffer`` views of the mapping. Remote files (``s3://``,
``gs://``, ... through ``pyarrow.fs`` or fsspec) are read with ranged reads of
one record batch, row group or stripe at a time, retried on transient faults (`Retry`).
"""

from .dataset import ShardDataset, ShardFile
from .formats import FORMATS
from .retry import Retry
from .row_reads import BatchColumns, ShardRow
from .sources import ACCEPTED, SHARD_EXTENSIONS, IcebergTable, SourceNotFoundError, TableSnapshot, resolve_source
from .splits import Split, subdivide
from .storage import RemoteReads

__all__ = [
    "ACCEPTED",
    "FORMATS",
    "SHARD_EXTENSIONS",
    "BatchColumns",
    "IcebergTable",
    "RemoteReads",
    "Retry",
    "ShardDataset",
    "ShardFile",
    "ShardRow",
    "SourceNotFoundError",
    "Split",
    "TableSnapshot",
    "resolve_source",
    "subdivide",
]
