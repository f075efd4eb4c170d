"""Moving Python objects between processes through reusable shared memory.

A message is a pickle (protocol 5) whose large buffers travel *out of band*:
numpy arrays, torch tensors and ``pyarrow.Buffer`` values (decoded audio,
spectrograms, encoded audio bytes) are copied once into a `SharedSlot`, a
shared-memory file mapped in both processes, and only the small pickle and a
table of ``(offset, length)`` pairs cross the socket.

Why slots are reused rather than made per message: on Linux a fresh shared
mapping costs a page fault and a zeroed page per 4 KiB on both sides; measured
here, about 200 us per 256 KiB spectrogram against 7 us for a mapping that is
reused (pages stay resident). Why not pickle the bytes through the socket:
1.2 ms of the main process's CPU per 1.4 MB FLAC clip.

The reader copies what it loads out of the slot (`loads`), so the slot can be
rewritten by the next message while the objects live on for as long as their
user keeps them (a shuffle buffer may hold a sample for minutes).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import tempfile
from typing import Any

import numpy as np
import torch

from .recycle import BatchArenas, Recycler

#: Buffers smaller than this stay inside the pickle (a table entry costs more than the copy).
INLINE_BYTES = 4096

#: Where a buffer of a message is (its table entry's first field): the chunk's slot, or a batch's row in the
#: shared arenas.
IN_SLOT, IN_RING = 0, 1

#: Slots grow in steps of this many bytes (fewer remaps when sizes vary a little).
_GROWTH_STEP = 1 << 20


def _tensor_from_array(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class _Pickler(pickle.Pickler):
    """Pickles torch tensors through numpy, so their data can leave the pickle out of band."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided:
            return _tensor_from_array, (obj.detach().contiguous().numpy(),)
        return NotImplemented


class SharedSlot:
    """A growable shared-memory file (Linux ``memfd``; a temporary file elsewhere) and its mapping.

    Both processes map the same file. The side that writes a message grows the
    file when the message does not fit; the other side remaps when a message
    says the slot is larger than its mapping.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = 0
        self._map: mmap.mmap | None = None
        self._remap(size)

    @classmethod
    def create(cls, size: int) -> SharedSlot:
        """A new slot of ``size`` bytes (its pages are allocated when first written)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("audioloader-slot", os.MFD_CLOEXEC)
        else:  # macOS and other POSIX systems without memfd
            with tempfile.TemporaryFile(prefix="audioloader-slot-") as handle:
                fd = os.dup(handle.fileno())
        os.ftruncate(fd, size)
        return cls(fd, size)

    def _remap(self, size: int) -> None:
        # The old mapping is dropped, not closed: buffers exported from it (arrays
        # still being read) keep it alive until they go; the file is the same.
        self._map = mmap.mmap(self.fd, size) if size else None
        self.size = size

    def ensure(self, size: int) -> None:
        """Writer side: make the slot at least ``size`` bytes."""
        if size > self.size:
            new = -(-size // _GROWTH_STEP) * _GROWTH_STEP
            os.ftruncate(self.fd, new)
            self._remap(new)

    def follow(self, size: int) -> None:
        """Reader side: map the ``size`` bytes the writer says the slot now has."""
        if size > self.size:
            self._remap(size)

    def view(self, offset: int, length: int) -> memoryview:
        return memoryview(self._map)[offset:offset + length]

    def close(self) -> None:
        self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def dumps(obj: Any, slot: SharedSlot, places: list[int | None] | None = None, ring: SharedSlot | None = None,
          row_bytes: int = 0) -> tuple[bytes, list[tuple[int, int, int]], int]:
    """Pickle ``obj``; its large buffers go into ``slot``.

    ``places``: the j-th buffer of ``row_bytes`` bytes goes to offset ``places[j]`` of ``ring`` instead (where
    that is not None): a batch's row, reserved by the consumer (`audioloader.workers.recycle.BatchArenas`).
    Returns ``(pickle bytes, [(IN_SLOT or IN_RING, offset, length)] of the out-of-band buffers, slot size)``;
    the slot size tells the reader to remap if the slot grew.
    """
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < INLINE_BYTES:
            return True  # serialise in band
        buffers.append(buffer)
        return False

    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=out_of_band).dump(obj)
    table, offset, rows = [], 0, 0
    for buffer in buffers:
        nbytes = buffer.raw().nbytes
        if places is not None and nbytes == row_bytes:
            place = places[rows] if rows < len(places) else None
            rows += 1
            if place is not None:
                table.append((IN_RING, place, nbytes))
                continue
        table.append((IN_SLOT, offset, nbytes))
        offset += nbytes
    slot.ensure(offset)
    for buffer, (where, start, length) in zip(buffers, table, strict=True):
        source = np.frombuffer(buffer.raw(), dtype=np.uint8)
        target = (slot if where == IN_SLOT else ring).view(start, length)
        np.copyto(np.frombuffer(target, dtype=np.uint8), source)  # releases the GIL
    return stream.getvalue(), table, slot.size


def loads(data: bytes, table: list[tuple[int, int, int]], slot: SharedSlot, slot_size: int, *, copy: bool,
          into: Recycler | BatchArenas | None = None, ring: SharedSlot | None = None) -> Any:
    """Unpickle a `dumps` message.

    ``copy=True`` gives objects private copies of their buffers (the slot may be
    rewritten at once), in arrays from ``into`` when given (reused ones: no page
    faults); ``copy=False`` gives views of the slot, valid until the slot's next message.
    Buffers a worker wrote into ``ring`` (rows reserved by ``into``, a `BatchArenas`) are
    taken from there by ``into.take_placed`` (no copy when the row is the one due).
    """
    slot.follow(slot_size)
    buffers = []
    for where, offset, length in table:
        if where == IN_RING:
            buffers.append(into.take_placed(ring.view(0, ring.size), offset))
            continue
        view = np.frombuffer(slot.view(offset, length), dtype=np.uint8)
        if not copy:
            buffers.append(view)
        elif into is None:
            buffers.append(view.copy())
        else:
            private = into.empty(length)
            np.copyto(private, view)  # releases the GIL
            buffers.append(private)
    return pickle.loads(data, buffers=buffers)
