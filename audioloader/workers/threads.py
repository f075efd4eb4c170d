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
import traceback
import warnings

import torch

# How long a stopping thread may take before `join_or_report` says which one it is and where it waits.
SLOW_STOP_SECONDS = 10.0

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


def join_or_report(thread: threading.Thread, warn_after: float = SLOW_STOP_SECONDS) -> None:
    """Wait for ``thread`` to end; if it is still running after ``warn_after`` s, warn with its stack, then wait on.

    Stopping the loader waits for its threads without a deadline: giving up would
    leave a thread running into the next pass (a leaked thread, or a reader racing
    with a reset). A thread that does not stop is a bug; the warning names it and
    shows the line it waits on, so the hang can be reported instead of guessed at.
    """
    if not thread.is_alive() or thread is threading.current_thread():
        return
    thread.join(warn_after)
    if not thread.is_alive():
        return
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (no Python frame)\n"
    warnings.warn(f"audioloader: thread {thread.name!r} has not stopped {warn_after:g} s after the loader was told "
                  f"to stop; still waiting for it. Please report this with its stack:\n{stack}",
                  RuntimeWarning, stacklevel=2)
    thread.join()
