"""Splits: runs of consecutive rows of one file, built from batches / row groups, and their subdivision; the rank
and world size that a pass's splits are shared over (`resolve_rank`)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ... import checks


@dataclass(frozen=True)
class Split:
    """Rows ``[start, stop)`` of ``files[file_id]``; ``split_id`` is its position in (file, row) order.

    ``kept``: under a filter, how many of those rows it keeps (`ShardDataset.counted`); None: all.
    """

    split_id: int
    file_id: int
    start: int
    stop: int
    kept: int | None = None

    @property
    def num_rows(self) -> int:
        """Rows read from the split: the kept ones under a filter."""
        return self.stop - self.start if self.kept is None else self.kept


def file_splits(file_id: int, unit_rows: Sequence[int], split_rows: int, divide_units: bool) -> list[Split]:
    """Splits of one file: consecutive units merged up to ``split_rows`` rows.

    With ``divide_units`` (IPC, where slicing a batch is zero-copy) a unit with
    more than ``2 * split_rows`` rows is cut into near-equal row ranges.
    """
    ranges: list[tuple[int, int]] = []
    acc_start = acc_rows = pos = 0
    for rows in unit_rows:
        if rows == 0:
            continue
        if divide_units and rows > 2 * split_rows:
            if acc_rows:
                ranges.append((acc_start, pos))
                acc_rows = 0
            pieces = -(-rows // split_rows)
            ranges.extend((pos + rows * k // pieces, pos + rows * (k + 1) // pieces) for k in range(pieces))
        else:
            if acc_rows and acc_rows + rows > split_rows:
                ranges.append((acc_start, pos))
                acc_rows = 0
            if acc_rows == 0:
                acc_start = pos
            acc_rows += rows
        pos += rows
    if acc_rows:
        ranges.append((acc_start, pos))
    return [Split(-1, file_id, a, b) for a, b in ranges]


def _numbered(splits: Sequence[Split]) -> list[Split]:
    ordered = sorted(splits, key=lambda s: (s.file_id, s.start))
    return [Split(i, s.file_id, s.start, s.stop, s.kept) for i, s in enumerate(ordered)]


def subdivide(splits: Sequence[Split], count: int) -> Sequence[Split]:
    """At least ``count`` splits (when there are that many rows): halve the largest until there are.

    Deterministic: the largest split (ties: lowest ``split_id``) is cut in half
    each step; the result is renumbered in (file, row) order. Used so every rank
    has data when ``world_size`` exceeds the natural number of splits. ``splits`` themselves when there are
    enough (a dataset's `file_table.SplitTable`, not a million objects).
    """
    if len(splits) >= count:
        return splits
    heap = [(-s.num_rows, s.split_id, s) for s in splits]
    heapq.heapify(heap)
    serial = len(splits)
    while len(heap) < count and heap and -heap[0][0] > 1 and heap[0][2].stop - heap[0][2].start > 1:
        _, _, s = heapq.heappop(heap)
        middle = s.start + (s.stop - s.start) // 2  # halves of a filtered split are counted again by the caller
        for part in (Split(-1, s.file_id, s.start, middle), Split(-1, s.file_id, middle, s.stop)):
            heapq.heappush(heap, (-part.num_rows, serial, part))
            serial += 1
    return _numbered([s for _, _, s in heap])


def take(splits: Sequence[Split], indices: np.ndarray) -> list[Split]:
    """``[splits[i] for i in indices]``, made at once where ``splits`` are columns (`file_table.SplitTable`)."""
    taker = getattr(splits, "take", None)
    return taker(indices) if taker is not None else [splits[i] for i in np.asarray(indices).tolist()]


def rows_of(splits: Sequence[Split]) -> np.ndarray:
    """Rows read from each split (int64 a split; the kept ones under a filter)."""
    rows = getattr(splits, "num_rows", None)
    if callable(rows):
        return rows().astype(np.int64)
    return np.fromiter((s.num_rows for s in splits), dtype=np.int64, count=len(splits))


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return ``(rank, world_size)``: the rank whose share of the splits is read, and how many ranks share them.

    ``None`` values come from torch.distributed's initialized default process group, else 0 / 1.
    Raises ``ValueError`` for a negative rank, a world size below 1, or
    ``rank >= world_size``.
    """
    import torch.distributed as dist  # here: the shards layer is read without torch (tools, workers)

    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    rank, world_size = checks.integer("rank", rank), checks.integer("world_size", world_size)
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size}); "
                         "pass rank and world_size together, or neither under torch.distributed")
    return rank, world_size
