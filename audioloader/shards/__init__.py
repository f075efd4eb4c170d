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

The package is five layers, each a sub-package importing only those below it (``tests/test_layering.py``),
lowest first: ``storage/`` (bytes, local or remote), ``sources/`` (what a source names, splits), ``formats/``
(what is in a file), ``catalog/`` (the manifest, the index, the file table) and ``dataset/`` (`ShardDataset`).

The names below are imported on first use (PEP 562 ``__getattr__``, as in
``audioloader``): ``audioloader pack --help`` needs `index` and `writer`, not
pyarrow.dataset and the reading machinery (about 0.3 s of CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

#: Where each name is defined (relative module paths); keep the TYPE_CHECKING block below in step.
_LAZY_NAMES: dict[str, str] = {
    "ACCEPTED": ".sources.resolve",
    "AudioFiles": ".sources.tarred_sets",
    "BatchColumns": ".dataset.row_reads",
    "FORMATS": ".formats.scan",
    "IcebergTable": ".sources.resolve",
    "LhotseShar": ".sources.tarred_sets",
    "NemoTarred": ".sources.tarred_sets",
    "RemoteReads": ".storage.options",
    "Retry": ".storage.retry",
    "SHARD_EXTENSIONS": ".sources.resolve",
    "ShardDataset": ".dataset.shard_dataset",
    "ShardFile": ".catalog.file_table",
    "ShardRow": ".dataset.row_reads",
    "PackFolderError": ".sources.pack_folders",
    "SourceNotFoundError": ".sources.resolve",
    "Split": ".sources.splits",
    "TableSnapshot": ".sources.resolve",
    "resolve_source": ".sources.resolve",
    "subdivide": ".sources.splits",
}

if TYPE_CHECKING:
    from .catalog.file_table import ShardFile
    from .dataset.row_reads import BatchColumns, ShardRow
    from .dataset.shard_dataset import ShardDataset
    from .formats.scan import FORMATS
    from .sources.pack_folders import PackFolderError
    from .sources.resolve import (
        ACCEPTED,
        SHARD_EXTENSIONS,
        IcebergTable,
        SourceNotFoundError,
        TableSnapshot,
        resolve_source,
    )
    from .sources.splits import Split, subdivide
    from .sources.tarred_sets import AudioFiles, LhotseShar, NemoTarred
    from .storage.options import RemoteReads
    from .storage.retry import Retry

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
