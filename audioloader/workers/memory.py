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


def _load_libc_functions() -> tuple:
    """glibc's ``(malloc_trim, mallopt)``, each None where absent (not Linux, not glibc).

    Looked up once, at import: `find_library` runs ``ldconfig`` in a subprocess, which a worker process
    (forked, or started by a fork server that imported this module) must not pay for at its start.
    """
    if not sys.platform.startswith("linux"):
        return None, None
    name = ctypes.util.find_library("c")
    if name is None:
        return None, None
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None, None
    return getattr(library, "malloc_trim", None), getattr(library, "mallopt", None)


_MALLOC_TRIM, _MALLOPT = _load_libc_functions()

#: glibc's ``mallopt`` parameters (malloc.h) and the values `keep_heap_pages` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations up to this size come from the heap, not a fresh ``mmap`` (glibc's ceiling: 32 MiB on 64 bits).
HEAP_ALLOCATION_MAX = 32 << 20
#: Free memory at the top of the heap kept for the next sample instead of given back at each ``free``.
HEAP_TOP_KEEP = 256 << 20


def keep_heap_pages() -> bool:
    """In a decode worker process: reuse the heap's pages from one sample to the next; False where not glibc.

    glibc serves a large allocation (a decoded window: 0.9 MB, the resampled clip, soundfile's
    buffers) with a fresh ``mmap`` until a freed one raises its threshold, and gives the heap's top
    back to the kernel whenever more than twice that is free; either way the next sample's
    temporaries land on new pages, each a fault and a zeroed page. Measured on the standard 10 s
    FLAC rows: 457 page faults and 7.2 ms of CPU per 5 s crop decoded and resampled to 32 kHz,
    against 0 faults and 5.8 ms with fixed thresholds (4.8 against 6.5 ms to 16 kHz;
    benchmarks/pipeline/bench_worker_cost.py has the loader's figures). A worker process holds no
    long-lived results (they leave through shared memory), so what the heap keeps is one
    sample's temporaries, and `after_decode` still trims it every `TRIM_EVERY` decodes.
    Not for the consumer's process: there decode threads interleave temporaries with samples
    held for minutes (see the module docstring).
    """
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, HEAP_ALLOCATION_MAX)) and bool(_MALLOPT(_M_TRIM_THRESHOLD, HEAP_TOP_KEEP))
_DECODES = itertools.count(1)  # next() on itertools.count is atomic under the GIL


def after_decode() -> None:
    """Count one decode; every `TRIM_EVERY`-th call trims the heap (a few ms, the GIL released)."""
    if _MALLOC_TRIM is None or TRIM_EVERY <= 0:
        return
    if next(_DECODES) % TRIM_EVERY == 0:
        _MALLOC_TRIM(0)
