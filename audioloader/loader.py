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

`Stream` puts DataLoader-like iterators in front of a `Loader` (what `AudioLoader`
hands out): ``iter()`` any number of times, the newest iterator wins, an unused
one holds nothing, and a prefetching consumer can say which items it trained on
(`Stream.mark_trained`) so that the state matches them.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from .nodes._torchdata_compat import FixedLoader, FixedLoaderIterator, stop_threads_of
from .nodes.catch_failures import raise_failure

T = TypeVar("T")


class _LoaderIterator(FixedLoaderIterator[T]):
    """Raises a `Failure` item (an exception a `CatchFailures` node carried up) in the caller's thread."""

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


class Loader(FixedLoader[T], Generic[T]):
    """``torchdata.nodes.Loader`` with exact resume (`FixedLoader`), clean shutdown and original exceptions."""

    iterator_type = _LoaderIterator

    def __init__(self, root: BaseNode[T], restart_on_stop_iteration: bool = True) -> None:
        super().__init__(root, restart_on_stop_iteration)
        _LIVE_LOADERS.add(self)

    def shutdown(self) -> None:
        """Stop every background thread of the chain (idempotent).

        ``state_dict()`` afterwards still describes where iteration stopped; a
        new ``iter()`` starts the threads again.
        """
        stop_threads(self.root)

    def __enter__(self) -> Loader[T]:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        shutdown_keeping_error(self.shutdown, error)


def shutdown_keeping_error(shutdown: Callable[[], None], error: BaseException | None) -> None:
    """``shutdown()`` on leaving a ``with`` block; while ``error`` is on its way out, a failure to shut
    down is added to it as a note instead of replacing it (the original error is the one to see)."""
    if error is None:
        shutdown()
        return
    try:
        shutdown()
    except Exception as failure:
        if hasattr(error, "add_note"):  # Python 3.11+; before, the failure is dropped and the error goes on
            error.add_note(f"(shutting the loader down afterwards failed too: {type(failure).__name__}: {failure})")


def iter_nodes(root: BaseNode):
    """Yield ``root`` and every node under it (following ``source`` attributes: every node of torchdata's and ours)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for name in ("source", "root"):
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

    Nodes with their own ``shutdown()`` are told twice: once on the way up, and again once every thread
    has ended, because a thread may have been resetting a node below it (starting its worker processes)
    when that node was told to stop; what that reset started is stopped by the second call.
    """
    nodes = list(iter_nodes(root))
    own_shutdowns = []
    for node in reversed(nodes):
        own = getattr(node, "shutdown", None)
        if callable(own):
            own()
            own_shutdowns.append(own)
            continue
        stop_threads_of(node)
    for own in own_shutdowns:
        own()


# ------------------------------------------------------------------------------ DataLoader-like iterators

#: States kept after the last items handed out, for `Stream.mark_trained`. A prefetching consumer is a
#: batch or two ahead (Lightning's fetcher: one); the states are the chain's own small dicts, not copies.
TRAIL_LENGTH = 16

_SUPERSEDED = ("this iterator of the loader was superseded: iter(loader) was called again (a newer for-loop or "
               "iter()) and the newer iterator now owns the loader's one stream of batches. Use the newest "
               "iterator; for two independent streams, build two loaders")
_BUSY = ("this loader is being iterated in another thread right now (a next() is in progress there); two threads "
         "would split one stream of batches between them. Iterate it in one thread; for a second, independent "
         "stream build a second loader")


class StreamIterator(Generic[T]):
    """An iterator of a `Stream`: ``next()`` asks ``take(self)`` (the stream's, or its owner's wrapper)."""

    def __init__(self, stream: Stream[T], take: Callable[[StreamIterator[T]], T]) -> None:
        self.stream = stream
        self.generation = stream.generation
        self.started = False  # its first next() has started (or continued) the chain
        self.closed = False
        self._take = take  # a bound method of the owner keeps the owner alive while this is iterated

    def __iter__(self) -> StreamIterator[T]:
        return self

    def __next__(self) -> T:
        if self.closed:
            raise StopIteration
        return self._take(self)

    def close(self) -> None:
        """End this iterator (``next()`` raises ``StopIteration``); the loader's position stays where it is."""
        self.closed = True


class Stream(Generic[T]):
    """The one stream of items of a `Loader`, handed out through iterators that behave like a DataLoader's.

    ``iterator()`` may be called any number of times; the new `StreamIterator` supersedes the
    earlier ones, which raise ``RuntimeError`` if used again. An iterator starts the chain at its
    first ``next()``, so one never used (a framework probing ``iter(loader)``) holds nothing, and
    dropping one releases nothing because it holds nothing (no lock outlives a call). Where a new
    iterator starts:

    * after `load_state_dict` / `start_fresh`, and the first time: as the `Loader` says (the loaded
      state, or the start of a pass). The live iterator, too: its next item is the one after the loaded
      state (a state is never ignored; an iterator that has ended stays ended);
    * ``continues=True`` (an infinite loader): at `state_dict()`, i.e. right after the last item
      handed out, or after the last one marked trained once `mark_trained` is in use. The running
      chain goes on untouched where it can; after `stop()`, an error, or items handed out but not
      trained, it restarts from that state (exactly; a shuffle buffer is rebuilt);
    * ``continues=False`` (one pass per iteration): the next pass, as torch's DataLoader starts
      the next epoch.

    ``repeats=True`` (an infinite loader whose chain ends with each pass: evaluation): when a pass ends, the
    same ``next()`` starts the next one and goes on, so the iterator never ends (unless a pass is empty).

    One ``next()`` at a time: another thread's ``next()`` during one raises ``RuntimeError``.

    A consumer that prefetches (Lightning's fetcher takes batch k+1 before training on batch k)
    tells the stream which items it has trained on with `mark_trained`; from its first call,
    `state_dict()` is the state after the last item marked trained, so a checkpoint taken while
    items are prefetched resumes with the first untrained one.
    """

    def __init__(self, loader: Loader[T], continues: bool, repeats: bool = False) -> None:
        self.loader = loader
        self.continues = continues
        self.repeats = repeats
        self.generation = 0  # of the newest iterator
        self._it: Any = None  # the Loader's iterator, once started
        self._busy = threading.Lock()  # held for the length of one next() call, never longer
        self._fresh = True  # the next start is a plain iter(loader): the first one, or after a load
        self._running = False  # the chain is started and can go on (no stop, error or end since)
        self._handed = 0  # items handed out since the chain (re)started
        self._trained = 0  # of those, marked trained
        self._marking = False  # mark_trained() is in use: state_dict() reports the trained position
        self._trail: deque[tuple[int, dict[str, Any]]] = deque(maxlen=TRAIL_LENGTH)  # (handed, state after)
        # A one-pass stream restarted (next pass) while batches of the old pass were handed out but not yet
        # marked trained (a consumer cycling it, taking a batch ahead): the first marks go to those, and
        # until then the position is in the old pass.
        self._old_untrained = 0
        self._old_state: dict[str, Any] | None = None

    # ------------------------------------------------------------------ iterators

    def iterator(self, take: Callable[[StreamIterator[T]], T] | None = None) -> StreamIterator[T]:
        """A new iterator, superseding the earlier ones; ``take`` wraps `next` (default: `next` itself)."""
        self.generation += 1
        return StreamIterator(self, take or self.next)

    def next(self, iterator: StreamIterator[T]) -> T:
        """The next item for ``iterator``; raises ``RuntimeError`` if it was superseded or another thread is in."""
        if iterator.generation != self.generation:
            raise RuntimeError(_SUPERSEDED)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(_BUSY)
        try:
            if not iterator.started or self._fresh:  # fresh: a state was loaded, which a live iterator goes on from
                self._start()
                iterator.started = True
            try:
                try:
                    item = next(self._it)
                except StopIteration:
                    if not self.repeats or not self._running:  # not running: ended by an error, not a pass
                        raise
                    self._next_pass()  # an endless stream of passes: the next one (an empty pass ends it)
                    item = next(self._it)
            except StopIteration:
                iterator.closed, self._running = True, False  # ended; a new iterator starts a new pass
                raise
            except BaseException:
                self._running = False  # the Loader's iterator ends after an error; a new iterator restarts
                raise
            self._handed += 1
            self._trail.append((self._handed, self.loader.state_dict()))
            return item
        finally:
            self._busy.release()

    def _start(self) -> None:
        """Start the chain for a new iterator, or go on with the running one (see the class docstring)."""
        if self.continues and not self._fresh:
            if self._running and not self._lagging():
                return  # the chain is exactly where the state says: go on
            self.loader.load_state_dict(self.state_dict())
        self._next_pass(keep_untrained=not self._fresh and not self.continues)
        self._fresh = False

    def _next_pass(self, keep_untrained: bool = True) -> None:
        """Start the chain: its next pass, or where a loaded state says. ``keep_untrained``: the batches of the
        pass before, handed out and not yet marked trained, keep the position there until they are marked."""
        if keep_untrained and self._lagging():
            self._old_state = self.state_dict()
            self._old_untrained += self._handed - self._trained
        self._it = iter(self.loader)
        self._running = True
        self._handed = self._trained = 0
        self._trail.clear()
        self._trail.append((0, self.loader.state_dict()))

    def _lagging(self) -> bool:
        return self._marking and self._trained < self._handed

    @property
    def marking(self) -> bool:
        """`mark_trained` is in use: `state_dict` reports the position after the last item marked trained."""
        return self._marking

    # ------------------------------------------------------------------ position

    def mark_trained(self, items: int = 1) -> None:
        """The oldest ``items`` items handed out and not yet marked have been trained on."""
        if items < 1:
            raise ValueError(f"mark_trained({items}): the number of batches trained on must be 1 or more")
        untrained = self._old_untrained + self._handed - self._trained
        if items > untrained:
            raise ValueError(f"mark_trained({items}): only {untrained} batch(es) were handed out since the "
                             "loader (re)started and not marked trained yet; call it once per batch trained on, "
                             "after the batch came out of the loader")
        old = min(items, self._old_untrained)
        self._old_untrained -= old
        if not self._old_untrained:
            self._old_state = None
        self._trained += items - old
        self._marking = True

    def state_dict(self, ahead: int = 0) -> dict[str, Any]:
        """The `Loader`'s state after the last item handed out, or after the last one marked trained.

        ``ahead``: items the consumer taking this state holds untrained (a prefetching framework's, see
        `batches_ahead_of_framework`); the state is then the one before them. Marks, once in use, win.
        """
        if self._old_state is not None:
            return self._old_state
        trained = self._trained if self._marking else max(0, self._handed - ahead)
        if trained >= self._handed:
            return self.loader.state_dict()
        for handed, state in self._trail:
            if handed == trained:
                return state
        raise RuntimeError(
            f"the loader's state after the last batch marked trained is no longer kept: {self._handed - trained} "
            f"batches were handed out after it, and the states after the last {TRAIL_LENGTH} only are kept. Call "
            "mark_trained() after each batch trained on (a consumer that prefetches is a batch or two ahead)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iterator starts at ``state``."""
        self.loader.load_state_dict(state)
        self._forget_position()

    def start_fresh(self) -> None:
        """The next iterator starts the chain anew with no state (see `Loader.start_fresh`)."""
        self.loader.start_fresh()
        self._forget_position()

    def stop(self) -> None:
        """The chain was stopped (`Loader.shutdown`): a new iterator restarts it (from the state if it continues)."""
        self._running = False

    def _forget_position(self) -> None:
        self._fresh, self._running = True, False
        self._handed = self._trained = self._old_untrained = 0
        self._old_state = None
        self._trail.clear()


# ------------------------------------------------------------------------------ consumers that take items ahead

#: Where PyTorch Lightning takes the training loaders' states for a checkpoint (``_FitLoop.on_save_checkpoint``,
#: Lightning 2.x), and the fetchers it iterates them with (checked with Lightning 2.6).
_LIGHTNING_MODULES = ("lightning.pytorch.", "pytorch_lightning.")
_LIGHTNING_SAVE = "on_save_checkpoint"
_PREFETCHING_FETCHER = "_PrefetchDataFetcher"
_SELF_FETCHING_FETCHER = "_DataLoaderIterDataFetcher"  # training_step(dataloader_iter): nothing taken ahead


def batches_ahead_of_framework(depth: int = 8) -> int | None:
    """Items a training framework holds untrained while it takes a loader's state: 0 outside one.

    Called from a loader's ``state_dict()``; looks at the callers. Inside PyTorch Lightning's checkpoint
    save (``_FitLoop.on_save_checkpoint``), Lightning's fetcher (``_PrefetchDataFetcher``) has taken batch
    k+1 from the loader before the model trained on batch k, whenever the loader has no length (an
    infinite training loader): the batches it holds (``fetcher.batches``, one per loader in the default
    ``max_size_cycle`` mode) were handed out and not trained on. Returns their number; 0 for a fetcher
    that takes nothing ahead; None where Lightning takes the state but how far ahead it is cannot be
    read (no fetcher running, as in a save after ``fit()`` returned; another fetcher;
    ``CombinedLoader(mode="max_size")``): the caller warns then.
    """
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return 0
        if (frame.f_code.co_name == _LIGHTNING_SAVE
                and frame.f_globals.get("__name__", "").startswith(_LIGHTNING_MODULES)):
            return _lightning_fetcher_ahead(frame.f_locals.get("self"))
        frame = frame.f_back
    return 0


def _lightning_fetcher_ahead(fit_loop: Any) -> int | None:
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    kinds = {cls.__name__ for cls in type(fetcher).__mro__}
    if _SELF_FETCHING_FETCHER in kinds:
        return 0
    combined = getattr(fetcher, "_combined_loader", None)
    held = getattr(fetcher, "batches", None)
    # Modes in which every training loader gives a batch to every step (a held step holds one batch of each).
    if _PREFETCHING_FETCHER not in kinds or not isinstance(held, list) or getattr(combined, "_mode", None) not in (
            "max_size_cycle", "min_size"):
        return None
    return len(held)
