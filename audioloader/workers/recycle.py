"""Reusing large buffers once nothing refers to them, so the main process does not page-fault per sample.

A buffer freshly allocated for a 256 KiB spectrogram (or a 16 MiB batch) costs a
page fault and a zeroed page per 4 KiB the first time it is written: glibc maps
blocks that size afresh or hands trimmed heap back to the kernel between two
batches. Measured on the 2-core VM: copying a chunk's 8 spectrograms out of a
worker's slot into fresh arrays cost 127 us of CPU a sample (61 page faults a
sample), into reused arrays 22 us (none).

`Recycler.empty` hands out a uint8 array of the size asked for; it keeps up to
``max_bytes`` of the arrays it handed out and gives one out again only when its
reference count says that nothing but the recycler holds it: every numpy view,
torch tensor (``torch.from_numpy``) or memoryview made from it holds a reference,
so memory that a sample, a batch, or a user's slice of one still uses is never
written. What is dropped from the recycler is freed by Python as usual.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

#: Arrays looked at per request before a fresh one is allocated (they are in the order they were handed out).
SCAN = 4


def _unused_count() -> int:
    """The reference count `Recycler.empty` sees for an array that only the recycler holds."""
    held: deque[np.ndarray] = deque([np.empty(1, np.uint8)])
    candidate = held[0]
    return sys.getrefcount(candidate)


_UNUSED = _unused_count()


def _unused_listed_count() -> int:
    """The reference count `BatchArenas` sees for a shared arena that only its list holds."""
    listed = [np.empty(1, np.uint8)]
    for arena in listed:
        return sys.getrefcount(arena)
    raise AssertionError


_UNUSED_LISTED = _unused_listed_count()


class Recycler:
    """Hands out uint8 arrays of a given size, reusing one that nothing refers to any more.

    Args:
        max_bytes: the arrays it keeps track of (in use or not) hold at most this many bytes;
            past it the oldest is forgotten (freed by Python once its users drop it).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._arrays: dict[int, deque[np.ndarray]] = {}
        self._bytes = 0

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` bytes, contents undefined (reused, or new)."""
        arrays = self._arrays.get(nbytes)
        if arrays:
            for _ in range(min(SCAN, len(arrays))):
                candidate = arrays[0]
                arrays.rotate(-1)
                if sys.getrefcount(candidate) == _UNUSED:
                    return candidate
        array = np.empty(nbytes, np.uint8)
        if nbytes <= self.max_bytes:
            self._track(nbytes, array)
        return array

    def _track(self, nbytes: int, array: np.ndarray) -> None:
        while self._bytes + nbytes > self.max_bytes:
            size = next(iter(self._arrays))  # the size asked for longest ago
            self._arrays[size].popleft()
            self._bytes -= size
            if not self._arrays[size]:
                del self._arrays[size]
        self._arrays.setdefault(nbytes, deque()).append(array)
        self._bytes += nbytes

    @property
    def tracked_bytes(self) -> int:
        """Bytes of the arrays it keeps track of (in use or free)."""
        return self._bytes

    def clear(self) -> None:
        """Forget every array (those in use stay valid for their users)."""
        self._arrays.clear()
        self._bytes = 0


class BatchArenas:
    """Batch-shaped memory that the workers write features into, so that collating copies nothing.

    The k-th buffer of ``row_bytes`` bytes of the stream since `restart` (the features of
    the k-th sample the stream delivers, when every sample goes to the batcher in order)
    becomes row ``k % batch_size`` of arena ``k // batch_size``, an array of
    ``batch_size`` such rows. `batch_of` then recognises a batch's features as rows
    ``0 .. n-1`` of one arena and returns the arena itself, float32 ``[n, *shape]``,
    where the batcher would otherwise copy them (``torch.stack``); anything else (a
    sample skipped before the batcher, other sizes) only costs that copy.

    Shared (`use_ring`, by a process pool): the arenas are cut from one shared-memory
    file that the worker processes map too, and a chunk sent to a worker comes with the
    rows its samples will most likely take (`reserve`: the next rows after those of the
    chunks in flight); the worker writes each row-size buffer straight there, and the
    consumer takes the row as it is when it is the row due (`take_placed`), else copies
    it to the row due (a row skipped before it: the chunks in flight are then one row
    off, and rows are reserved again once they are all back). Memory is never written
    twice while referred to (an arena is reused once nothing but this object holds it),
    so batches are bit-identical to the stacked ones, whichever way a row came.
    """

    #: Arenas of the shared file at most (a user who holds more batches than this gets copies meanwhile).
    RING_ARENAS = 16

    def __init__(self, batch_size: int, shape: tuple[int, ...], max_bytes: int) -> None:
        self.batch_size = int(batch_size)
        self.shape = tuple(int(n) for n in shape)
        self.row_bytes = 4 * math.prod(self.shape)  # float32
        self.arena_bytes = self.batch_size * self.row_bytes
        self._memory = Recycler(max_bytes)
        ring_arenas = max(2, min(self.RING_ARENAS, int(max_bytes) // max(1, self.arena_bytes)))
        self.ring_bytes = ring_arenas * self.arena_bytes
        self._ring: list[np.ndarray] = []  # the shared arenas, once `use_ring` was called
        self._ring_offsets: dict[int, int] = {}  # id() of each -> where it starts in the shared memory
        # The arenas a batcher may still ask about; weak, so that they do not count as used (see Recycler).
        self._recent: deque[weakref.ref] = deque(maxlen=4)
        self.restart()

    def use_ring(self, memory: Any) -> None:
        """Cut the arenas from ``memory`` (a writable buffer of `ring_bytes`, shared with the workers)."""
        self._ring = [np.frombuffer(memory, np.uint8, self.arena_bytes, i * self.arena_bytes)
                      for i in range(self.ring_bytes // self.arena_bytes)]
        self._ring_offsets = {id(arena): i * self.arena_bytes for i, arena in enumerate(self._ring)}

    def restart(self) -> None:
        """The stream starts again (a reset, nothing in flight): the next row asked for is a batch's first."""
        self._batches: dict[int, np.ndarray] = {}  # batch index -> its arena, from the batch being filled on
        self._received = 0  # rows handed out since the restart: the stream position of the next one
        self._reserved_to = 0  # the position the next reserved row takes
        self._reserving = True  # False while chunks with rows reserved one off are in flight
        self._reserved: dict[Any, tuple[int, int]] = {}  # chunk -> (first position, rows) reserved for it
        self._unplaced: dict[Any, int] = {}  # chunk in flight without reserved rows -> its items

    # -- the consumer's side, in the stream's order ------------------------------------------------

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes``: the row due when it is a row's size, else a recycled array."""
        if nbytes != self.row_bytes or self.row_bytes == 0:
            return self._memory.empty(nbytes)
        position = self._received
        self._received += 1
        if position % self.batch_size == 0:
            self._batches.pop(position // self.batch_size - 1, None)  # handed out: its users hold it now
        return self._row(position)

    def take_placed(self, memory: memoryview, offset: int) -> np.ndarray:
        """The row-size buffer a worker wrote at ``offset`` of the shared arenas (``memory``): that row itself
        when it is the row due, else a copy of it in the row due."""
        position = self._received
        arena = self._arena(position // self.batch_size)
        if self._offset(arena, position) == offset:
            return self.empty(self.row_bytes)
        row = self.empty(self.row_bytes)
        np.copyto(row, np.frombuffer(memory[offset:offset + self.row_bytes], np.uint8))
        return row

    def settle(self, chunk: Any) -> None:
        """Chunk ``chunk``'s results were read (or dropped): its rows are no longer written by a worker."""
        self._unplaced.pop(chunk, None)
        reserved = self._reserved.pop(chunk, None)
        if reserved is not None and self._received != reserved[0] + reserved[1]:
            self._reserving = False  # a row was skipped: the chunks after it hold rows one off

    # -- the submitting side --------------------------------------------------------------------------

    def reserve(self, chunk: Any, items: int) -> list[int | None] | None:
        """Offsets in the shared arenas for the row-size buffers of ``chunk``'s ``items`` (the rows they take when
        no row is skipped before them; None where the row's arena is not shared), or None: no rows reserved."""
        if not self._ring or not items:
            return None
        if not self._reserving and not self._reserved:  # every chunk with rows one off is back
            self._reserving = True
            self._reserved_to = self._received + sum(self._unplaced.values())
        if not self._reserving:
            self._unplaced[chunk] = items
            return None
        start = self._reserved_to
        self._reserved[chunk] = (start, items)
        self._reserved_to = start + items
        return [self._offset(self._arena(p // self.batch_size), p) for p in range(start, start + items)]

    # -- arenas -----------------------------------------------------------------------------------------

    def _row(self, position: int) -> np.ndarray:
        start = (position % self.batch_size) * self.row_bytes
        return self._arena(position // self.batch_size)[start:start + self.row_bytes]

    def _arena(self, batch: int) -> np.ndarray:
        arena = self._batches.get(batch)
        if arena is None:
            arena = self._free_shared()
            if arena is None:
                arena = self._memory.empty(self.arena_bytes)
            self._batches[batch] = arena
            self._recent.append(weakref.ref(arena))
        return arena

    def _free_shared(self) -> np.ndarray | None:
        """A shared arena that nothing refers to (no batch, no row, no reservation), or None."""
        taken = {id(a) for a in self._batches.values()}
        for arena in self._ring:
            if sys.getrefcount(arena) == _UNUSED_LISTED and id(arena) not in taken:
                return arena
        return None

    def _offset(self, arena: np.ndarray, position: int) -> int | None:
        """Where row ``position`` of ``arena`` is in the shared arenas, or None when ``arena`` is not shared."""
        start = self._ring_offsets.get(id(arena))  # the ring holds its arenas: their ids are never reused
        if start is None:
            return None
        return start + (position % self.batch_size) * self.row_bytes

    def batch_of(self, features: list[torch.Tensor]) -> torch.Tensor | None:
        """``features`` as one float32 ``[n, *shape]`` tensor without a copy, when they are rows ``0 .. n-1`` of
        one arena in order; else None."""
        if not features:
            return None
        first = features[0]
        if first.dtype != torch.float32 or tuple(first.shape) != self.shape:
            return None
        base = first.data_ptr()
        arena = next((a for a in (ref() for ref in self._recent) if a is not None and a.ctypes.data == base), None)
        if arena is None or len(features) > self.batch_size:
            return None
        for i, f in enumerate(features):
            if f.data_ptr() != base + i * self.row_bytes or f.dtype != torch.float32 or not f.is_contiguous() \
                    or tuple(f.shape) != self.shape:
                return None
        n = len(features)
        return torch.from_numpy(arena[:n * self.row_bytes].view(np.float32)).view(n, *self.shape)
