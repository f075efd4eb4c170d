"""Where a unit's bytes are: the byte ranges of a record batch / row group, from the metadata read at construction,
and how ranges are coalesced into requests.

A unit is what a reader reads at once: an IPC record batch (its message: metadata
and body, one contiguous range), a Parquet row group (the column chunks of the
used columns), an IPC stream's record batch message, a run of samples of a tar file or a
plain audio file whole (`tar_format`). ORC stripes are not located
(pyarrow does not expose their offsets): `unit_ranges` gives None and the stripe
is read by pyarrow's ORC reader as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Ranges of one file closer than this are fetched in one request (the bytes between are read and dropped):
#: a request costs a round trip (20-100 ms), 64 KiB cost well under a millisecond of bandwidth.
HOLE_BYTES = 64 * 1024
#: Coalesced requests stop growing at this size, so that a split's bytes arrive as several requests in flight
#: instead of one long one, and the first rows after a start wait for 2 MiB, not a whole file (measured on the
#: speech bench, Parquet at 50 ms: 8 MiB requests gave 0.6x the 0 ms rate).
MAX_REQUEST_BYTES = 2 * 1024 * 1024


def unit_ranges(meta: Any, unit: int, columns: Sequence[str]) -> list[tuple[int, int]] | None:
    """``[(offset, length)]`` of the bytes of unit ``unit`` of a file (`formats.scan.FileMeta`) that a read of
    ``columns`` touches, ascending; None when unknown (ORC).

    IPC: the whole record batch message (every column: its buffers are contiguous, and a
    column left out costs bandwidth only). Parquet: the used columns' chunks (dictionary
    page included).
    """
    if meta.format in ("ipc_file", "tar", "audio_file") and meta.blocks is not None:  # tar: a run of samples
        offset, meta_length, body_length = meta.blocks[unit]
        return [(offset, meta_length + body_length)]
    if meta.format == "ipc_stream" and meta.offsets is not None:
        offsets = meta.offsets
        end = offsets[unit + 1] if unit + 1 < len(offsets) else meta.size
        return [(offsets[unit], end - offsets[unit])]
    if meta.format == "parquet" and meta.parquet_metadata is not None:
        return _parquet_ranges(meta.parquet_metadata, unit, set(columns))
    return None


def _parquet_ranges(metadata: Any, row_group: int, columns: set[str]) -> list[tuple[int, int]]:
    group = metadata.row_group(row_group)
    ranges = []
    for i in range(group.num_columns):
        chunk = group.column(i)
        if chunk.path_in_schema.split(".", 1)[0] not in columns:
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        ranges.append((start, chunk.total_compressed_size))
    return sorted(ranges)


def coalesce(ranges: Sequence[tuple[int, int]], hole: int = HOLE_BYTES,
             limit: int = MAX_REQUEST_BYTES) -> list[tuple[int, int]]:
    """Ascending, overlapping or nearby ``(offset, length)`` ranges merged into requests: two ranges merge when
    the gap between them is at most ``hole`` bytes and the merged request stays within ``limit`` bytes (a
    single range longer than ``limit`` stays one request)."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset - merged[-1][1] <= hole and max(merged[-1][1], offset + length) - merged[-1][0] <= limit:
            merged[-1][1] = max(merged[-1][1], offset + length)
        else:
            merged.append([offset, offset + length])
    return [(start, stop - start) for start, stop in merged]
