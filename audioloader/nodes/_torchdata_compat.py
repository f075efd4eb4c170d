"""Where audioloader reaches into torchdata's private attributes: here, for torchdata 0.11 (0.11.0 is what this was
written and tested against).

torchdata.nodes 0.11 has no public way to stop a node's background threads now and wait
for them: its ``ParallelMapper``, ``Prefetcher`` and ``PinMemory`` stop their threads in
``__del__`` (reference counting) and join with a 0.5 s timeout, so a thread still inside
its source's ``next()`` can race with that source's next ``reset()``. The functions below
stop them through the attributes named in each docstring; when torchdata changes those,
this module is what changes. (The other place is `audioloader.loader`, whose ``Loader``
subclasses torchdata's to fix its resume and reads the base class's own fields there.)
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode, PinMemory
from torchdata.nodes import Prefetcher as TorchdataPrefetcher

from ..workers.threads import join_or_report
from .held import RowsHeld, at_snapshot


def stop_single_threaded(node: BaseNode) -> bool:
    """Stop the background thread of a torchdata ``Prefetcher`` or ``PinMemory`` and wait for it; False when
    ``node`` has none (not one of them, or never reset).

    Reads ``node._it`` (a ``_SingleThreadedMapper``), its ``_stop_event`` and ``_thread``.
    """
    it = getattr(node, "_it", None)
    if it is None or not hasattr(it, "_stop_event"):
        return False
    it._stop_event.set()
    thread = getattr(it, "_thread", None)
    if thread is not None:
        join_or_report(thread)
    return True


def forget_single_threaded(node: BaseNode) -> None:
    """Drop a torchdata ``Prefetcher``'s or ``PinMemory``'s stopped thread object before its ``reset`` builds the next.

    torchdata deletes ``node._it`` before it builds the next one; when building fails (the source's
    reset raises: a dead worker, a bad state) the node was left without ``_it`` and every later
    ``shutdown()`` raised AttributeError, which inside ``with`` replaced the real error. Sets ``node._it``.
    """
    node._it = None


def stop_parallel_mapper(mapper: BaseNode) -> bool:
    """Stop a torchdata ``ParallelMapper``'s threads now and wait for them; False when ``mapper`` is none (or
    was never reset).

    Reads ``mapper._it._it`` (``_ParallelMapperImpl`` -> ``_ParallelMapperIter``), its ``_stop`` and
    ``_mp_stop`` events and its ``_read_thread``, ``_sort_thread`` and ``_workers``. Waiting for the reader
    thread closes the race with the next ``reset()`` of the source.
    """
    impl = getattr(mapper, "_it", None)
    it = getattr(impl, "_it", None)
    if it is None or not hasattr(it, "_stop"):
        return False
    it._stop.set()
    it._mp_stop.set()
    for thread in [getattr(it, "_read_thread", None), getattr(it, "_sort_thread", None),
                   *getattr(it, "_workers", [])]:
        if thread is not None:
            join_or_report(thread)
    return True


def stop_threads_of(node: BaseNode) -> bool:
    """Stop the background threads of one of torchdata's threaded nodes; False for any other node."""
    return stop_parallel_mapper(node) or stop_single_threaded(node)


def rows_held(node: BaseNode, state: dict[str, Any]) -> RowsHeld | None:
    """`audioloader.nodes.held.RowsHeld` for torchdata's own ``Prefetcher`` and ``PinMemory`` (their state is
    their thread's: ``{"snapshot", "steps_since_snapshot"}``); None for a node torchdata's threads do not run."""
    if isinstance(node, (PinMemory, TorchdataPrefetcher)):
        return at_snapshot(node, state)
    return None
