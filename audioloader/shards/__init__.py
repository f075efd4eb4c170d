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

The names below are imported on first use (PEP 562 ``__getattr__``, as in
``audioloader``): ``audioloader pack --help`` needs `index` and `writer`, not
pyarrow.dataset and the reading machinery (about 0.3 s of CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

#: Where each name is defined (relative module paths); keep the TYPE_CHECKING block below in step.
_LAZY_NAMES: dict[str, str] = {
    "ACCEPTED": ".sources",
    "AudioFiles": ".tarred_sets",
    "BatchColumns": ".row_reads",
    "FORMATS": ".formats",
    "IcebergTable": ".sources",
    "LhotseShar": ".tarred_sets",
    "NemoTarred": ".tarred_sets",
    "RemoteReads": ".storage",
    "Retry": ".retry",
    "SHARD_EXTENSIONS": ".sources",
    "ShardDataset": ".dataset",
    "ShardFile": ".file_table",
    "ShardRow": ".row_reads",
    "PackFolderError": ".pack_folders",
    "SourceNotFoundError": ".sources",
    "Split": ".splits",
    "TableSnapshot": ".sources",
    "resolve_source": ".sources",
    "subdivide": ".splits",
}

if TYPE_CHECKING:
    from .dataset import ShardDataset
    from .file_table import ShardFile
    from .formats import FORMATS
    from .pack_folders import PackFolderError
    from .retry import Retry
    from .row_reads import BatchColumns, ShardRow
    from .sources import (
        ACCEPTED,
        SHARD_EXTENSIONS,
        IcebergTable,
        SourceNotFoundError,
        TableSnapshot,
        resolve_source,
    )
    from .splits import Split, subdivide
    from .storage import RemoteReads
    from .tarred_sets import AudioFiles, LhotseShar, NemoTarred

__all__ = [
    "ACCEPTED",
    "FORMATS",
    "SHARD_EXTENSIONS",
    "AudioFiles",
    "BatchColumns",
    "IcebergTable",
    "LhotseShar",
    "NemoTarred",
    "PackFolderError",
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


__getattr__, __dir__ = lazy_attributes(__name__, __path__, _LAZY_NAMES)
