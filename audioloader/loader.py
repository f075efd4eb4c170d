"""Loader: torchdata's ``Loader`` with its 0.11 resume and lifecycle bugs fixed.

Use it in place of ``torchdata.nodes.Loader`` when composing audioloader's nodes
by hand. What it changes (see shared research notes, torchdata 0.11):

* ``load_state_dict`` after a ``state_dict()`` call is no longer ignored
  (upstream PR #1548): the pending state always wins on the next ``iter()``.
* ``num_yielded`` is right after a resume (upstream #1453: the look-ahead item
  was counted twice).
* The iterator does not point back at the loader, so dropping a loader frees
  it by reference counting (no ``gc.collect()`` needed to stop its threads).
* ``shutdown()`` stops every background thread of the chain; the loader is a
  context manager.
* A ``Failure`` item (an exception carried up by `CatchFailures`) is raised in
  the caller's thread with its original type and traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode
from torchdata.nodes import Loader as _TorchdataLoader
from torchdata.nodes.loader import LoaderIterator as _TorchdataLoaderIterator

from .nodes._torchdata_compat import stop_threads_of
from .nodes.catch_failures import raise_failure

T = TypeVar("T")


class _LoaderIterator(_TorchdataLoaderIterator[T]):
    def __init__(self, loader: Loader[T]) -> None:
        super().__init__(loader)
        self.loader = None  # break the Loader <-> iterator reference cycle

    def has_next(self) -> bool:
        # Upstream calls next(self) here, which counts the look-ahead item once
        # and then again when it is returned.
        if self._cached_item is None:
            try:
                self._cached_state_dict = self.state_dict()
                self._cached_item = next(self.root)
            except StopIteration:
                pass
        return self._cached_item is not None

    def next(self) -> T:
        return raise_failure(super().next())


#: Loaders alive now; their threads are stopped at interpreter exit (see `_stop_all_at_exit`).
_LIVE_LOADERS: weakref.WeakSet[Loader] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    # A loader still referenced at exit (e.g. by the traceback of a KeyboardInterrupt
    # caught in the training loop) has daemon threads inside torch or libsndfile;
    # if they still run when the interpreter tears down, C++ code aborts the
    # process ("terminate called without an active exception"). atexit handlers
    # run while threads can still be joined.
    for loader in list(_LIVE_LOADERS):
        with contextlib.suppress(Exception):
            loader.shutdown()


class Loader(_TorchdataLoader[T], Generic[T]):
    """``torchdata.nodes.Loader`` with exact resume, clean shutdown and original exceptions."""

    def __init__(self, root: BaseNode[T], restart_on_stop_iteration: bool = True) -> None:
        super().__init__(root, restart_on_stop_iteration)
        _LIVE_LOADERS.add(self)

    def __iter__(self):
        if self._it is None:
            self._it = _LoaderIterator(self)
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
        if self._next_iter_state_dict is not None and self._it is None:
            # A loaded but not yet applied state: report it rather than starting
            # the chain (torchdata would start a fresh epoch's threads here).
            return self._next_iter_state_dict
        return super().state_dict()

    def shutdown(self) -> None:
        """Stop every background thread of the chain (idempotent).

        ``state_dict()`` afterwards still describes where iteration stopped; a
        new ``iter()`` starts the threads again.
        """
        stop_threads(self.root)

    def __enter__(self) -> Loader[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def iter_nodes(root: BaseNode):
    """Yield ``root`` and every node under it (following ``source``/``_source`` attributes)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for name in ("source", "_source", "root"):
            child = getattr(node, name, None)
            if isinstance(child, BaseNode):
                stack.append(child)


def stop_threads(root: BaseNode) -> None:
    """Stop the background threads of every node in the chain under ``root``.

    Knows torchdata's ``ParallelMapper``/``Prefetcher``/``PinMemory`` (0.11
    internals: `audioloader.nodes._torchdata_compat`) and calls ``shutdown()`` on any node that has one. Stops the
    deepest node first: a thread above it that is waiting for items (a shuffle
    buffer filling up, say) then sees the end of its source at once instead of
    finishing the fill before it can notice the stop.
    """
    for node in reversed(list(iter_nodes(root))):
        own = getattr(node, "shutdown", None)
        if callable(own):
            own()
            continue
        stop_threads_of(node)
