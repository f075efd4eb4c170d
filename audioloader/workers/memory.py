"""Giving freed heap memory back to the OS (glibc), so RSS follows what is really held.

Decode threads allocate large short-lived buffers (decoded PCM, resampled audio,
STFT: 1-2 MB each) next to long-lived results (a 256 KB spectrogram waiting in
the shuffle buffer). glibc's dynamic mmap threshold rises to the size of the
temporaries once the first are freed, so both end up interleaved on the
per-thread heaps, and the holes between live spectrograms are never returned:
the benchmark measured ~6.5x the buffer's payload in anonymous memory.
``malloc_trim(0)`` (glibc >= 2.8) returns the free pages inside the heaps. It is
called every `TRIM_EVERY` decodes, from the decode threads, so it also runs
while a buffer fills or is restored. Elsewhere (musl, macOS) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import sys

#: Decodes between two trims; env ``AUDIOLOADER_MALLOC_TRIM_EVERY`` overrides, 0 disables.
TRIM_EVERY = int(os.environ.get("AUDIOLOADER_MALLOC_TRIM_EVERY", "256"))


def _load_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # absent from non-glibc C libraries
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()
_DECODES = itertools.count(1)  # next() on itertools.count is atomic under the GIL


def after_decode() -> None:
    """Count one decode; every `TRIM_EVERY`-th call trims the heap (a few ms, the GIL released)."""
    if _MALLOC_TRIM is None or TRIM_EVERY <= 0:
        return
    if next(_DECODES) % TRIM_EVERY == 0:
        _MALLOC_TRIM(0)
