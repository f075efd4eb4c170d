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
    """Copies results out of the workers' slots straight into batch-shaped memory, so collating copies nothing.

    The k-th buffer of ``row_bytes`` bytes asked for since `restart` (the features of
    the k-th sample the stream delivers, when every sample goes to the batcher in order)
    becomes row ``k % batch_size`` of arena ``k // batch_size``, an array of
    ``batch_size`` such rows. `batch_of` then recognises a batch's features as rows
    ``0 .. n-1`` of one arena and returns the arena itself, float32 ``[n, *shape]``,
    where the batcher would otherwise copy them (``torch.stack``); anything else (a
    sample skipped before the batcher, other sizes) only costs that copy. Arenas
    come from a `Recycler` (memory of a batch nothing refers to any more); other
    buffers too. Memory is private to the consumer and never written twice while
    referred to, so batches are bit-identical to the stacked ones.
    """

    def __init__(self, batch_size: int, shape: tuple[int, ...], max_bytes: int) -> None:
        self.batch_size = int(batch_size)
        self.shape = tuple(int(n) for n in shape)
        self.row_bytes = 4 * math.prod(self.shape)  # float32
        self._memory = Recycler(max_bytes)
        self._arena: np.ndarray | None = None
        self._row = 0
        # The arenas a batcher may still ask about; weak, so that they do not count as used (see Recycler).
        self._recent: deque[weakref.ref] = deque(maxlen=4)

    def restart(self) -> None:
        """The stream starts again (a reset): the next row asked for is a batch's first."""
        self._arena, self._row = None, 0

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes``: the next arena row when it is a row's size, else a recycled array."""
        if nbytes != self.row_bytes or self.row_bytes == 0:
            return self._memory.empty(nbytes)
        if self._arena is None or self._row == self.batch_size:
            self._arena = self._memory.empty(self.batch_size * self.row_bytes)
            self._recent.append(weakref.ref(self._arena))
            self._row = 0
        start = self._row * self.row_bytes
        self._row += 1
        return self._arena[start:start + self.row_bytes]

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
