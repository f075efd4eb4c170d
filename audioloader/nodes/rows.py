"""Rows read back by key, as `RawSample` s: what a shuffle buffer or a bucketer restores on resume, and what a decode
worker reads itself when it is sent keys instead of rows (`fetch_rows`; `fetch_mixed` for the sources of a mix).

Both are plain functions of a dataset, picklable with `functools.partial`, so the front
and the nodes share them without either importing the other's module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dsp.hashing import audio_checksum
from ..samples import Key, RawSample
from ..shards import ShardDataset


def fetch_rows(dataset: ShardDataset, keys: Sequence[Key]) -> list[RawSample]:
    """The rows of ``keys`` as `RawSample`s, in the same order (random access, each record batch read once)."""
    keys = [k if isinstance(k, Key) else Key(*k) for k in keys]
    # The rows read before (a worker's previous chunk, decoded by now) need their pages no more: a worker
    # process would otherwise keep every row it ever read mapped (`ShardDataset.release_mapped_pages`).
    dataset.release_mapped_pages()
    rows = dataset.read_rows([k.index for k in keys])
    out = []
    for key, row in zip(keys, rows, strict=True):
        mapped = dataset.mapped_state(dataset.locate(key.index)[0])
        audio = row.audio if mapped is not None else owned_audio(row.audio)
        out.append(RawSample(key, audio, row.label, row.extras, row.file, row.row, row.problem,
                             audio_checksum(audio), mapped))
    return out


def owned_audio(audio: Any) -> Any:
    """A row's audio as its own bytes, for every file that is not memory-mapped (Parquet, ORC, remote: the
    unit is in process memory either way), so that a row held in a shuffle buffer or a bucketer does not keep
    its whole record batch / row group alive (measured on S3: 3x the rows' memory) and counts what it holds.

    A numpy ``uint8`` array, not ``bytes``: pickled it leaves the pickle out of band, so a row sent to a decode
    process travels through shared memory (`audioloader.workers.wire`) instead of inside a pickle through the
    socket (``bytes`` and ``bytearray`` always travel in band)."""
    return None if audio is None else np.frombuffer(audio, dtype=np.uint8).copy()


def fetch_mixed(datasets: Sequence[ShardDataset], keys: Sequence[Key]) -> list[RawSample]:
    """The rows of ``keys`` (of any sources of a mix) as `RawSample` s, in the same order.

    ``datasets[s]`` is source ``s``'s dataset; each source's rows are read in one
    random-access call. Picklable with `functools.partial` (worker processes read
    rows themselves).
    """
    keys = [k if isinstance(k, Key) else Key(*k) for k in keys]
    out: list[RawSample | None] = [None] * len(keys)
    by_source: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        by_source.setdefault(key.source, []).append(position)
    for source, positions in by_source.items():
        if not 0 <= source < len(datasets):
            raise IndexError(f"key {keys[positions[0]]} names source {source}; this mix has {len(datasets)}")
        for position, row in zip(positions, fetch_rows(datasets[source], [keys[p] for p in positions]), strict=True):
            out[position] = row
    return out  # type: ignore[return-value]
