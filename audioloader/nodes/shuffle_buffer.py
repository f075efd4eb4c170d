"""ShuffleBuffer: a seeded, resumable shuffle buffer with a minimum fill."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from .. import checks
from ..dsp.hashing import SALT_SHUFFLE, item_checksum, uniform_int
from ..errors import CheckpointMismatchError
from ..samples import Key, held_bytes, item_key
from ..stats import HeldBytes, LoaderStats
from .held import ROW_ITEMS, ItemFns, RowsHeld

T = TypeVar("T")

#: Rebuilds buffered items from their keys, in the same order (e.g. a random-access
#: read of those rows, then the same decode with the same per-sample seed).
RestoreFn = Callable[[Sequence[Key]], Sequence[Any]]


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


@dataclass(frozen=True)
class BufferLimits:
    """A `ShuffleBuffer`'s limits, checked once, here: ``capacity`` items (>= 1); ``min_size`` items held before
    the first emit (0 to ``capacity``); ``max_bytes`` / ``min_bytes`` the same in bytes (None: by rows only);
    ``one_pass``: never hold two passes (see `ShuffleBuffer`'s rules)."""

    capacity: int
    min_size: int = 0
    max_bytes: int | None = None
    min_bytes: int | None = None
    one_pass: bool = False

    def __post_init__(self) -> None:
        capacity = checks.count("ShuffleBuffer capacity", self.capacity)
        if not checks.is_integer(self.min_size) or not 0 <= self.min_size <= capacity:
            raise checks.bad("ShuffleBuffer min_size", self.min_size, f"must be an integer in [0, capacity={capacity}]")
        checks.count("ShuffleBuffer max_bytes", self.max_bytes, allow_none=True)
        checks.count("ShuffleBuffer min_bytes", self.min_bytes, minimum=0, allow_none=True)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "one_pass", bool(self.one_pass))


class ShuffleBuffer(BaseNode[T], Generic[T]):
    """Holds up to ``capacity`` items (and ``max_bytes`` bytes) and emits them in a seeded random order.

    Works over anything with a ``.key`` (``RawSample`` or ``Sample``); pass
    ``items=ItemFns(key=...)`` for other items.

    Rules (none depends on timing, so the output order is a pure function of the
    seed, the rank and the source's order; item sizes are a function of the items):

    * The buffer takes an item from the source only while it has room: fewer than
      ``capacity`` items, and fewer than ``max_bytes`` bytes held (the items'
      ``items.size``, plus whatever the other holders of ``stats.memory`` hold, e.g. a
      `DurationBucketer` after it). So it holds at most ``max_bytes`` plus one item.
    * Nothing is emitted until ``min_size`` items or ``min_bytes`` bytes are held
      (whichever comes first), or the buffer has no room, or the source is exhausted
      (then it drains): the first item waits for a bounded amount of data.
    * Each emit pulls one item to replace it, plus one more while there is room,
      so the buffer grows by one per emit up to its limits (WebDataset's rule).
    * The ``draws``-th pick is ``uniform_int(n, seed, SALT_SHUFFLE, rank, draws)``,
      removed by swapping with the last item (O(1)).
    * ``one_pass``: the buffer never holds two passes. The first item of a later
      pass (``key.pass_index`` above the held items') is set aside; the buffer
      empties, then starts the new pass with it (and fills to its minimum again).
      A pass is delivered whole before the next begins, so a corpus smaller than
      the buffer is shuffled like a permutation per pass and no row repeats within
      one; ``stats()["memory"]["shuffle_buffer"]["one_pass_caps"]`` counts the
      passes that ended before the buffer was full.

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
        limits: ``capacity``, ``min_size``, ``max_bytes``, ``min_bytes`` and ``one_pass`` as one checked group
            (`BufferLimits`; `AudioLoader` settles its own before the chain is built): see the rules.
        seed: shuffle seed; combined with ``rank`` so ranks shuffle independently.
        rank: this process's rank (only seeds the picks).
        restore: see above.
        stats: optional `LoaderStats`; the fill level goes to gauge ``shuffle_buffer_fill``, what is held
            to ``stats.memory`` (holder ``"shuffle_buffer"``; the nodes given one `LoaderStats` share it, and
            ``max_bytes`` bounds their total).
        items: how the items are read (`ItemFns`): ``key`` (default ``item.key``), ``checksum`` (default
            `item_checksum`) and ``size``, the bytes an item keeps alive (default `held_bytes`: a raw row's own
            audio copy, a decoded sample's features, plus its Python objects).

    `of` takes the limits one by one (``capacity``, ``min_size``, ...) and the item functions as ``key_fn``,
    ``checksum_fn`` and ``size_fn``.
    """

    SOURCE_KEY = "source"
    HOLDER = "shuffle_buffer"

    def __init__(self, source: BaseNode, limits: BufferLimits | None = None, *, seed: int = 0, rank: int = 0,
                 restore: RestoreFn | None = None, stats: LoaderStats | None = None, items: ItemFns = ROW_ITEMS,
                 **fields: Any) -> None:
        if fields or not isinstance(limits, BufferLimits):
            raise checks.node_fields("ShuffleBuffer", "its limits as one BufferLimits(capacity, min_size, ...)",
                                     fields)
        super().__init__()
        self.source = source
        self.limits = limits
        self.capacity, self.min_size, self.one_pass = limits.capacity, limits.min_size, limits.one_pass
        self.max_bytes, self.min_bytes = limits.max_bytes, limits.min_bytes
        self.items = items
        self.size_fn, self.key_fn, self.checksum_fn = items.size, items.key, items.checksum
        self.seed = seed
        self.rank = rank
        self.restore = restore
        self.stats = stats
        held = stats.memory if stats is not None else HeldBytes()
        self._holding = held.holding(self.HOLDER)
        # The limits in the report (``stats()["memory"]["shuffle_buffer"]``), fixed for the node's life.
        self._holding.owner.limit = self.max_bytes
        self._holding.info.update(limited_by=None, one_pass_caps=0, max_rows=self.capacity, max_bytes=self.max_bytes,
                                  min_rows=self.min_size, min_bytes=self.min_bytes, one_pass=self.one_pass)
        self._clear()

    @classmethod
    def of(cls, source: BaseNode, capacity: int, min_size: int = 0, *, seed: int = 0, rank: int = 0,
           restore: RestoreFn | None = None, key_fn: Callable[[Any], Key] = item_key,
           checksum_fn: Callable[[Any], int] = item_checksum, stats: LoaderStats | None = None,
           max_bytes: int | None = None, min_bytes: int | None = None,
           size_fn: Callable[[Any], int] = held_bytes, one_pass: bool = False) -> ShuffleBuffer:
        """A buffer built from its settings one by one: ``capacity`` to ``one_pass`` make its `BufferLimits`,
        ``key_fn``, ``checksum_fn`` and ``size_fn`` its `ItemFns`; the rest as the constructor's."""
        limits = BufferLimits(capacity, min_size, max_bytes, min_bytes, one_pass)
        return cls(source, limits, seed=seed, rank=rank, restore=restore, stats=stats,
                   items=ItemFns(key_fn, checksum_fn, size_fn))

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
        self._sizes: list[int] = []  # bytes each held item counts (size_fn, taken once)
        self._pulled = self._emitted = 0  # items in and out since the last reset: the displacement's clock
        self._checksums: list[int] = []
        self._draws = 0
        self._exhausted = False
        self._primed = False
        self._pass = -1  # one_pass: the pass of the items held (-1: none yet)
        self._fenced: tuple[Any, int] | None = None  # one_pass: the first item of the next pass, and its arrival
        self._full = False  # one_pass: the buffer ran out of room in this pass (else a whole pass fit in it)
        self._holding.clear()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._clear()
        if initial_state is None:
            self.source.reset(None)
            return
        items, fenced = self._restore_items(initial_state)
        self.source.reset(initial_state[self.SOURCE_KEY])
        for item in items:
            self._append(item, arrival=-1)
        if fenced is not None:
            self._fenced = (fenced, -1)
            self._holding.add(self.size_fn(fenced))
        self._draws = initial_state["draws"]
        self._exhausted = initial_state["exhausted"]
        self._primed = initial_state["primed"]
        # A state from before one_pass: the pass of the newest items held.
        self._pass = int(initial_state.get("pass", max(self._passes, default=-1)))
        self._full = bool(initial_state.get("full", False))

    def _restore_items(self, state: dict[str, Any]) -> tuple[list[Any], Any]:
        """The held items and the item set aside for the next pass (or None), read back or from the state."""
        if "items" in state:
            return list(state["items"]), state.get("fenced_item")
        if self.restore is None:
            raise ValueError("this ShuffleBuffer state holds keys only; build the buffer with the same "
                             "restore= callable as the one that saved it")
        keys = self.keys_of(state)
        fenced = state.get("fenced")
        checksums = state.get("checksums")
        if checksums is not None and fenced is not None:
            checksums = [*checksums, fenced[3]]
        items = list(self.restore(keys))
        got = [self.key_fn(item) for item in items]
        if got != keys:
            raise RuntimeError("ShuffleBuffer restore returned items whose keys differ from the checkpoint's; "
                               "the data changed since the checkpoint was taken")
        verify_checksums(items, checksums, self.checksum_fn, "shuffle buffer")
        return (items[:-1], items[-1]) if fenced is not None else (items, None)

    @staticmethod
    def keys_of(state: dict[str, Any]) -> list[Key]:
        """The keys of the rows a keys-only state holds: the held ones, then the one set aside (if any)."""
        sources = state.get("sources") or [0] * len(state["indices"])
        keys = [Key(i, p, s) for i, p, s in zip(state["indices"], state["passes"], sources, strict=True)]
        fenced = state.get("fenced")
        if fenced is not None:
            keys.append(Key(*fenced[:3]))
        return keys

    def _append(self, item: Any, arrival: int) -> None:
        index, pass_index, *source = self.key_fn(item)  # a Key, or a plain (index, pass) tuple
        source = int(source[0]) if source else 0
        self._indices.append(int(index))
        self._passes.append(int(pass_index))
        self._sources.append(source)
        self._other_sources += source != 0
        self._arrivals.append(arrival)
        size = int(self.size_fn(item))
        self._sizes.append(size)
        self._holding.add(size)
        if self.restore is not None:
            self._checksums.append(self.checksum_fn(item))
        self._items.append(item)

    # ------------------------------------------------------------------ filling

    def _room(self) -> bool:
        """Whether the buffer may take another item now (and, when not, what stopped it, for the report)."""
        if self._exhausted or self._fenced is not None:
            return False
        if len(self._items) >= self.capacity:
            return self._limited("rows")
        if self.max_bytes is not None and self._holding.owner.total >= self.max_bytes:
            return self._limited("bytes")
        return True

    def _limited(self, by: str) -> bool:
        self._full = True
        self._holding.info["limited_by"] = by
        return False

    def _filled(self) -> bool:
        """The first fill is done: ``min_size`` items or ``min_bytes`` bytes held."""
        return len(self._items) >= self.min_size or (
            self.min_bytes is not None and self._holding.bytes >= self.min_bytes)

    def _pull(self) -> None:
        try:
            item = next(self.source)
        except StopIteration:
            self._exhausted = True
            return
        arrival = self._pulled
        self._pulled += 1
        if self.one_pass:
            pass_index = int(self.key_fn(item)[1])
            if pass_index > self._pass:
                if self._items:  # the pass ended: set the item aside until the buffer is empty
                    self._fenced = (item, arrival)
                    self._holding.add(int(self.size_fn(item)))
                    self._on_pass_end()
                    return
                self._pass = pass_index
        self._append(item, arrival)

    def _on_pass_end(self) -> None:
        if not self._full:  # the whole pass fit: the buffer held one pass of rows, no more
            self._holding.info["limited_by"] = "pass"
            self._holding.info["one_pass_caps"] += 1

    def _open_next_pass(self) -> None:
        """The buffer is empty: the item set aside starts the next pass (with a first fill of its own)."""
        item, arrival = self._fenced
        self._fenced = None
        self._holding.add(-int(self.size_fn(item)))
        self._pass = int(self.key_fn(item)[1])
        self._full = False
        self._primed = False
        self._append(item, arrival)

    def next(self) -> T:
        while True:
            if not self._primed:
                while not self._filled() and self._room():
                    self._pull()
                self._primed = True
            # One pull replaces the item about to leave; a second grows the buffer.
            for _ in range(2):
                if self._room():
                    self._pull()
            if self._items or self._fenced is None:
                break
            self._open_next_pass()
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
        self._holding.add(-self._sizes[pick], -1)
        for column in (self._items, self._indices, self._passes, self._sources, self._arrivals, self._sizes):
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
        if self.one_pass:
            state["pass"] = self._pass
            state["full"] = self._full
        fenced = self._fenced[0] if self._fenced is not None else None
        if self.restore is not None:
            # Lists of ints, not bytes or arrays: `torch.load(weights_only=True)` accepts them.
            state["indices"] = list(self._indices)
            state["passes"] = list(self._passes)
            if self._other_sources:
                state["sources"] = list(self._sources)
            state["checksums"] = list(self._checksums)
            if fenced is not None:
                key = Key(*self.key_fn(fenced))
                state["fenced"] = [int(key.index), int(key.pass_index), int(key.source), self.checksum_fn(fenced)]
        else:
            state["items"] = list(self._items)
            if fenced is not None:
                state["fenced_item"] = fenced
        return state

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """The rows it holds, and the one set aside for the next pass (one_pass); see `audioloader.nodes.held`.
        A state with the items themselves (a buffer without ``restore``) names them by the rows' and samples' key
        (`ROW_ITEMS`): the items `AudioLoader`'s chain holds, whose buffers always restore (keys-only states)."""
        if "items" in state:
            fenced = [state["fenced_item"]] if state.get("fenced_item") is not None else []
            keys = [ROW_ITEMS.key(item) for item in (*state["items"], *fenced)]
        else:
            keys = cls.keys_of(state)
        return RowsHeld(state[cls.SOURCE_KEY], [Key(k.index, k.pass_index) for k in keys])

    def __len__(self) -> int:
        """Items held now."""
        return len(self._items)

    @property
    def held_bytes(self) -> int:
        """Bytes the held items count (``size_fn``), the item set aside for the next pass included."""
        return self._holding.bytes
