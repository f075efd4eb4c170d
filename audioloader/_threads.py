"""Keeping torch's thread settings and torchdata's threads under control.

torchdata 0.11's ParallelMapper thread workers call ``torch.set_num_threads(1)``
(``_apply_udf``). In torch that call also changes the process-wide default that
every thread created later starts with, so a user's own threads (or their
DataLoader workers, or a PinMemory thread) would silently run single-threaded.
We want the opposite: decode workers at one intra-op thread each (two decode
threads on two cores must not fight over four OpenMP threads) and the user's
setting untouched. torch initialises a thread's intra-op count lazily from the
process default on its first op, so each worker pins itself to 1 first and then
the default is put back from a short-lived thread (a thread's own count is set
at its first op and not changed by a later default).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

_PIN_LOCK = threading.Lock()
_PINNED = threading.local()


def _set_default_from_other_thread(num_threads: int) -> None:
    # torch.set_num_threads also sets the *calling* thread's count; doing it in a
    # throwaway thread changes only the process default.
    helper = threading.Thread(target=torch.set_num_threads, args=(num_threads,), name="audioloader-threads")
    helper.start()
    helper.join()


def pin_worker_to_one_thread(user_default: int) -> None:
    """Call at the start of work in a decode thread: 1 intra-op thread here, default restored."""
    if getattr(_PINNED, "done", False):
        return
    with _PIN_LOCK:
        torch.set_num_threads(1)
        torch.get_num_threads()  # forces this thread's lazy init at 1
        _set_default_from_other_thread(user_default)
    _PINNED.done = True


def restore_default_threads(user_default: int) -> None:
    """Put torch's process-wide default back if a torchdata worker changed it."""
    if sys.is_finalizing():
        return  # no new threads can start now, and nothing will use the default any more
    probe: list[int] = []
    checker = threading.Thread(target=lambda: probe.append(torch.get_num_threads()))
    checker.start()
    checker.join()
    if probe and probe[0] != user_default:
        _set_default_from_other_thread(user_default)


def shutdown_mapper(mapper: Any) -> None:
    """Stop a torchdata ParallelMapper's threads now and wait for its reader thread.

    torchdata 0.11 leaves this to ``__del__`` (reference counting) and joins with
    a 0.5 s timeout; a reader thread still inside ``next()`` of the source would
    then race with the next ``reset()`` of that source (sharp edge: the reset
    race). Waiting for the reader thread to finish closes the race.
    """
    impl = getattr(mapper, "_it", None)  # ParallelMapper -> _ParallelMapperImpl
    it = getattr(impl, "_it", None)  # -> _ParallelMapperIter / _InlineMapperIter
    if it is None or not hasattr(it, "_stop"):
        return
    it._stop.set()
    it._mp_stop.set()
    for thread in [getattr(it, "_read_thread", None), getattr(it, "_sort_thread", None),
                   *getattr(it, "_workers", [])]:
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()
