"""Forks of the consumer: a forked process forgets the consumer's workers, and Ctrl-C survives a worker's fork.

multiprocessing records every process it starts in ``multiprocessing.process._children``
and, at interpreter exit, terminates the daemonic ones (``multiprocessing.util._exit_function``).
A child made with ``os.fork()`` inherits that record: when it exits normally (``sys.exit(0)``
in an evaluation helper, a logging daemon, a fork server of another library), it sent SIGTERM
to the parent's decode workers, and the parent's next batch failed with ``WorkerError``. The
workers are not the child's: a hook run in every forked child takes them out of its record.
The child's copy of a pool already knows it is not the owner (`ProcessPool.shutdown` checks the
pid) and never touches the workers.

A Ctrl-C that lands while a worker process starts is held over the start (`interrupt_held`): a
``KeyboardInterrupt`` raised inside an at-fork hook is dropped by Python. `process_identity` tells whether a
process (the consumer, a killed pack) still runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from typing import Any

#: Worker processes started in this process (weakly: a stopped pool's workers drop out by themselves).
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()


def forget_in_forked_children(process: Any) -> None:
    """Keep the started ``process`` (a ``multiprocessing`` process) out of the exit hooks of forked children."""
    _STARTED.add(process)


def _forget_inherited() -> None:
    """In a freshly forked child: the parent's workers are not this process's children."""
    children = getattr(multiprocessing.process, "_children", None)  # CPython 3.8-3.13
    if children is not None:
        children.difference_update(list(_STARTED))
    _STARTED.clear()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_forget_inherited)


@contextlib.contextmanager
def interrupt_held() -> Iterator[list[int]]:
    """Hold back a Ctrl-C that arrives while a worker process starts; yields a list that is non-empty afterwards
    if one did (the caller raises ``KeyboardInterrupt`` where it can stop the process it started).

    A fork runs Python's at-fork hooks (logging's lock release, `_forget_inherited` here); a
    ``KeyboardInterrupt`` raised inside one is printed as "Exception ignored" and lost, and an infinite loader
    then runs on as if Ctrl-C had not been pressed (1 in 60 interrupts at random times in the first 1.5 s,
    measured); one raised inside ``Process.start()`` after the fork leaves a started process in no list.
    Python's default handler is replaced for the start by one that only records the signal; a handler of the
    program's own is left alone, as is any thread but the main one (signal handlers run only there)."""
    held: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield held
        return
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def process_identity(pid: int) -> Any:
    """Something that stays the same while process ``pid`` runs, or None once it has exited (a worker watches
    its consumer with it; a remote pack finds the staging folders of killed packs).

    On Linux its start time (so a reused pid is not taken for it) unless it is a
    zombie; elsewhere whether a signal can be sent to it.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except FileNotFoundError:
        return None
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return True
