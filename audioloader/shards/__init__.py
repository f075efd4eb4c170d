"""Shard discovery, format detection, metadata, splits, schema checks and reads (see `dataset`)."""

from .dataset import (
    ACCEPTED,
    FORMATS,
    SHARD_EXTENSIONS,
    BatchColumns,
    ShardDataset,
    ShardFile,
    ShardRow,
    SourceNotFoundError,
    Split,
    resolve_source,
    subdivide,
)

__all__ = [
    "ACCEPTED",
    "FORMATS",
    "SHARD_EXTENSIONS",
    "BatchColumns",
    "ShardDataset",
    "ShardFile",
    "ShardRow",
    "SourceNotFoundError",
    "Split",
    "resolve_source",
    "subdivide",
]
