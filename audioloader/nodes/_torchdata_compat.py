"""Where audioloader reaches into torchdata's private attributes: here, for torchdata 0.11 (0.11.0 is what this was
written and tested against).

torchdata.nodes 0.11 has no public way to stop a node's background threads now and wait
for them: its ``ParallelMapper``, ``Prefetcher`` and ``PinMemory`` stop their threads in
``__del__`` (reference counting) and join with a 0.5 s timeout, so a thread still inside
its source's ``next()`` can race with that source's next ``reset()``. The functions below
stop them through the attributes named in each docstring; when torchdata changes those,
this module is what changes.

torchdata's ``Loader`` 0.11 also drops a loaded state after a ``state_dict()`` call and counts a resumed
look-ahead item twice: `FixedLoader` and `FixedLoaderIterator` fix both through their base classes' fields
(`audioloader.loader.Loader` builds on them).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode, PinMemory
from torchdata.nodes import Loader as TorchdataLoader
from torchdata.nodes import Prefetcher as TorchdataPrefetcher
from torchdata.nodes.loader import LoaderIterator as TorchdataLoaderIterator

from ..workers.threads import join_or_report
from .held import RowsHeld, at_snapshot

T = TypeVar("T")


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


def rows_held(node_type: type[BaseNode], state: dict[str, Any]) -> RowsHeld | None:
    """`audioloader.nodes.held.RowsHeld` for torchdata's own ``Prefetcher`` and ``PinMemory`` (their state is
    their thread's: ``{"snapshot", "steps_since_snapshot"}``); None for a node torchdata's threads do not run."""
    if issubclass(node_type, (PinMemory, TorchdataPrefetcher)):
        return at_snapshot(state)
    return None


class FixedLoaderIterator(TorchdataLoaderIterator[T]):
    """torchdata's ``LoaderIterator`` that counts a look-ahead item once and does not point back at its loader.

    Reads and sets ``_cached_item`` and ``_cached_state_dict`` (the look-ahead item and the state before it).
    """

    def __init__(self, loader: TorchdataLoader[T]) -> None:
        super().__init__(loader)
        self.loader = None  # break the Loader <-> iterator reference cycle

    def has_next(self) -> bool:
        # Upstream calls next(self) here, which counts the look-ahead item once
        # and then again when it is returned (upstream #1453).
        if self._cached_item is None:
            try:
                self._cached_state_dict = self.state_dict()
                self._cached_item = next(self.root)
            except StopIteration:
                pass
        return self._cached_item is not None


class FixedLoader(TorchdataLoader[T], Generic[T]):
    """torchdata's ``Loader`` whose loaded state is applied on the next ``iter()`` even after a ``state_dict()``
    call (upstream PR #1548), iterated by ``iterator_type`` (a `FixedLoaderIterator`).

    Reads and sets ``_it`` (the iterator), ``_iter_for_state_dict`` (an ``iter()`` already done for a
    ``state_dict()`` call) and ``_next_iter_state_dict`` (the state to load at the next ``iter()``).
    """

    iterator_type: type[FixedLoaderIterator] = FixedLoaderIterator

    def __iter__(self):
        if self._it is None:
            self._it = self.iterator_type(self)
        return super().__iter__()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Apply ``state_dict`` on the next ``iter()``, even after an earlier ``state_dict()`` call."""
        self._iter_for_state_dict = False
        super().load_state_dict(state_dict)

    def start_fresh(self) -> None:
        """The next ``iter()`` resets the chain with no state (forgetting a loaded one, and a reset already
        done for an earlier ``state_dict()`` call)."""
        self._iter_for_state_dict = False
        self._next_iter_state_dict = None

    @property
    def positioned(self) -> bool:
        """True once iteration started or a state was loaded: `state_dict()` then says where the next item is."""
        return self._it is not None or self._next_iter_state_dict is not None

    def state_dict(self) -> dict[str, Any]:
        if self._next_iter_state_dict is not None:
            # A loaded but not yet applied state is where the next item comes from: report it
            # rather than the last iterator's position (or, before any, a fresh epoch's threads).
            return self._next_iter_state_dict
        return super().state_dict()
