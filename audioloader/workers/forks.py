"""A process forked from the consumer forgets the consumer's worker processes.

multiprocessing records every process it starts in ``multiprocessing.process._children``
and, at interpreter exit, terminates the daemonic ones (``multiprocessing.util._exit_function``).
A child made with ``os.fork()`` inherits that record: when it exits normally (``sys.exit(0)``
in an evaluation helper, a logging daemon, a fork server of another library), it sent SIGTERM
to the parent's decode workers, and the parent's next batch failed with ``WorkerError``. The
workers are not the child's: a hook run in every forked child takes them out of its record.
The child's copy of a pool already knows it is not the owner (`ProcessPool.shutdown` checks the
pid) and never touches the workers.
"""

from __future__ import annotations

import multiprocessing.process
import os
import weakref
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
