"""ShuffleBuffer: a seeded, resumable shuffle buffer with a minimum fill."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from ..dsp.hashing import SALT_SHUFFLE, item_checksum, uniform_int
from ..errors import CheckpointMismatchError
from ..samples import Key
from ..stats import LoaderStats

T = TypeVar("T")

#: Rebuilds buffered items from their keys, in the same order (e.g. a random-access
#: read of those rows, then the same decode with the same per-sample seed).
RestoreFn = Callable[[Sequence[Key]], Sequence[Any]]


def _item_key(item: Any) -> Key:
    return item.key


def verify_checksums(items: Sequence[Any], expected: Sequence[int] | None, checksum_fn: Callable[[Any], int],
                     what: str) -> None:
    """`CheckpointMismatchError` naming the file and row of each item whose checksum differs from the checkpoint's.

    ``expected`` None (a checkpoint from before checksums) checks nothing.
    """
    if expected is None:
        return
    changed = [(item, want, got) for item, want in zip(items, expected, strict=True)
               if (got := checksum_fn(item)) != want]
    if not changed:
        return
    lines = [f"  {getattr(item, 'file', '?')} row {getattr(item, 'row', '?')} (index {item.key.index}): "
             f"checksum {want:#010x} in the checkpoint, {got:#010x} now" for item, want, got in changed[:5]]
    raise CheckpointMismatchError(
        f"resuming: {len(changed)} of the {len(items)} rows held in the {what} read back different audio than "
        "when the checkpoint was taken; their shards changed:\n" + "\n".join(lines)
        + "\nResume on the data the checkpoint was taken on, or start a new run on the new data",
        {"rows": ([want for _, want, _ in changed], [got for _, _, got in changed])})


class ShuffleBuffer(BaseNode[T], Generic[T]):
    """Holds up to ``capacity`` items and emits them in a seeded random order.

    Works over anything with a ``.key`` (``RawSample`` or ``Sample``); pass
    ``key_fn`` for other items.

    Rules (none depends on timing, so the output order is a pure function of the
    seed, the rank and the source's order):

    * Nothing is emitted until ``min_size`` items are held, or the source is
      exhausted (then it drains).
    * Each emit pulls one item to replace it, plus one more while below
      ``capacity``, so the buffer grows by one per emit up to ``capacity``
      (WebDataset's rule).
    * The ``draws``-th pick is ``uniform_int(n, seed, SALT_SHUFFLE, rank, draws)``,
      removed by swapping with the last item (O(1)).

    State holds the keys of the held items (two lists of ints: about 7 bytes an
    item once pickled; a third, ``sources``, only while items of a mix's other
    sources are held), the draw counter and the source's state, never the items
    themselves, when a ``restore`` callable is given: ``reset(state)`` rebuilds
    the items through ``restore(keys)``. Without ``restore``, the state holds the
    items (fine only for small items). ``get_state()`` is cheap: a ParallelMapper
    above this node calls it after every item.

    Shuffle quality: each emitted item's displacement, ``|emitted position -
    arrival position|`` counted in items through this buffer, goes to ``stats``
    (`LoaderStats.record_displacement`); items restored from a checkpoint have
    no arrival position and are not counted.

    Args:
        source: upstream node.
        capacity: most items held (>= 1).
        min_size: items held before the first emit; 0 = emit at once; <= capacity.
        seed: shuffle seed; combined with ``rank`` so ranks shuffle independently.
        rank: this process's rank (only seeds the picks).
        restore: see above.
        key_fn: item -> ``Key``; default ``item.key``.
        checksum_fn: item -> 32-bit int identifying its content; default `item_checksum`.
        stats: optional `LoaderStats`; the fill level goes to gauge ``shuffle_buffer_fill``.
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode, capacity: int, min_size: int = 0, *, seed: int = 0, rank: int = 0,
                 restore: RestoreFn | None = None, key_fn: Callable[[Any], Key] = _item_key,
                 checksum_fn: Callable[[Any], int] = item_checksum, stats: LoaderStats | None = None) -> None:
        super().__init__()
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ShuffleBuffer capacity={capacity!r} must be an integer >= 1")
        if isinstance(min_size, bool) or not isinstance(min_size, int) or not 0 <= min_size <= capacity:
            raise ValueError(f"ShuffleBuffer min_size={min_size!r} must be an integer in [0, capacity={capacity}]")
        self.source = source
        self.capacity = capacity
        self.min_size = min_size
        self.seed = seed
        self.rank = rank
        self.restore = restore
        self.key_fn = key_fn
        self.checksum_fn = checksum_fn
        self.stats = stats
        self._clear()

    def _clear(self) -> None:
        self._items: list[Any] = []
        # Keys kept beside the items in plain lists: get_state() copies them (a
        # pointer copy, ~50 us for both at 10000 items; numpy tolist() took ~210 us, and
        # a ParallelMapper above calls get_state() after every item).
        self._indices: list[int] = []
        self._passes: list[int] = []
        self._sources: list[int] = []
        self._other_sources = 0  # held items whose source is not 0: the state lists sources only then
        self._arrivals: list[int] = []  # position of each held item in the arrival order (-1: restored)
        self._pulled = self._emitted = 0  # items in and out since the last reset: the displacement's clock
        self._checksums: list[int] = []
        self._draws = 0
        self._exhausted = False
        self._primed = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._clear()
        if initial_state is None:
            self.source.reset(None)
            return
        items = self._restore_items(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY])
        for item in items:
            self._append(item, arrival=-1)
        self._draws = initial_state["draws"]
        self._exhausted = initial_state["exhausted"]
        self._primed = initial_state["primed"]

    def _restore_items(self, state: dict[str, Any]) -> list[Any]:
        if "items" in state:
            return list(state["items"])
        if self.restore is None:
            raise ValueError("this ShuffleBuffer state holds keys only; build the buffer with the same "
                             "restore= callable as the one that saved it")
        sources = state.get("sources") or [0] * len(state["indices"])
        keys = [Key(i, p, s) for i, p, s in zip(state["indices"], state["passes"], sources, strict=True)]
        items = list(self.restore(keys))
        got = [self.key_fn(item) for item in items]
        if got != keys:
            raise RuntimeError("ShuffleBuffer restore returned items whose keys differ from the checkpoint's; "
                               "the data changed since the checkpoint was taken")
        verify_checksums(items, state.get("checksums"), self.checksum_fn, "shuffle buffer")
        return items

    def _append(self, item: Any, arrival: int) -> None:
        index, pass_index, *source = self.key_fn(item)  # a Key, or a plain (index, pass) tuple
        source = int(source[0]) if source else 0
        self._indices.append(int(index))
        self._passes.append(int(pass_index))
        self._sources.append(source)
        self._other_sources += source != 0
        self._arrivals.append(arrival)
        if self.restore is not None:
            self._checksums.append(self.checksum_fn(item))
        self._items.append(item)

    def _pull(self) -> None:
        try:
            item = next(self.source)
        except StopIteration:
            self._exhausted = True
            return
        self._append(item, self._pulled)
        self._pulled += 1

    def next(self) -> T:
        if not self._primed:
            while len(self._items) < self.min_size and not self._exhausted:
                self._pull()
            self._primed = True
        # One pull replaces the item about to leave; a second grows the buffer.
        for _ in range(2):
            if len(self._items) < self.capacity and not self._exhausted:
                self._pull()
        n = len(self._items)
        if self.stats is not None:
            self.stats.set_gauge("shuffle_buffer_fill", n)
        if n == 0:
            raise StopIteration
        pick = uniform_int(n, self.seed, SALT_SHUFFLE, self.rank, self._draws)
        self._draws += 1
        arrival = self._arrivals[pick]
        if self.stats is not None and arrival >= 0:
            self.stats.record_displacement(abs(self._emitted - arrival))
        self._emitted += 1
        return self._swap_remove(pick)

    def _swap_remove(self, pick: int) -> Any:
        item = self._items[pick]
        self._other_sources -= self._sources[pick] != 0
        for column in (self._items, self._indices, self._passes, self._sources, self._arrivals):
            column[pick] = column[-1]
            column.pop()
        if self._checksums:
            self._checksums[pick] = self._checksums[-1]
            self._checksums.pop()
        return item

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            self.SOURCE_KEY: self.source.state_dict(),
            "draws": self._draws,
            "exhausted": self._exhausted,
            "primed": self._primed,
        }
        if self.restore is not None:
            # Lists of ints, not bytes or arrays: `torch.load(weights_only=True)` accepts them.
            state["indices"] = list(self._indices)
            state["passes"] = list(self._passes)
            if self._other_sources:
                state["sources"] = list(self._sources)
            state["checksums"] = list(self._checksums)
        else:
            state["items"] = list(self._items)
        return state

    def __len__(self) -> int:
        """Items held now."""
        return len(self._items)
