"""The read order of an `ArrowShardReader`: the `Segment` s it reads, where it stands in them (`ReaderPosition`),
how it goes on from there (`Walk`), and the units (record batches / row groups / stripes) it reads from a position
on, in the order it reads them: what its read-ahead fetches (`audioloader.shards.storage.readahead`).

`Walk` is the one implementation of the course: the reader reads its rows along one, and `units_ahead` walks a
copy of its position ahead of it, one unit per point where the reader opens one (a lane opens a unit when it needs
the unit's first row). The units are thus a pure function of the reader's arguments and position (pass, split,
row, carry, lanes, turn).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from .. import checks
from ..dsp.hashing import SALT_INTERLEAVE, SALT_SPLIT_ORDER, permutation
from ..shards import ShardDataset, Split, subdivide
from ..shards.sources.splits import resolve_rank, rows_of, take

logger = logging.getLogger(__name__)

Unit = tuple[int, int]  # (file_id, unit)

#: Rows read per random-access read of a ``take`` segment.
TAKE_CHUNK = 256


class Segment(NamedTuple):
    """Rows of one file that a reader reads in order, with keys of pass ``pass_index``.

    ``[start, stop)`` of ``files[file_id]`` (under a filter, only its kept rows),
    or, with ``take``, only those file rows (ascending): rows a rank of an earlier
    world size had read but not delivered when its checkpoint was taken.
    """

    pass_index: int
    file_id: int
    start: int
    stop: int
    take: tuple[int, ...] | None = None

    def to_list(self) -> list[int]:
        """Plain ints for a state: ``[pass, file_id, start, stop, *take]`` (take: after a -1 marker)."""
        return [self.pass_index, self.file_id, self.start, self.stop, *(() if self.take is None else (-1, *self.take))]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> Segment:
        head = [int(v) for v in values[:4]]
        take = tuple(int(v) for v in values[5:]) if len(values) > 4 else None
        return cls(*head, take)


@dataclass(frozen=True)
class ReaderPosition:
    """Where a reader stands in its read order (`ArrowShardReader.position`; a state read back:
    `ArrowShardReader.position_of`).

    ``carry``: the segments read before the next pass (an elastic resume; empty otherwise): while there are some,
    they are the order. ``lanes`` (interleaved): per lane, its split's position in the order (-1: empty) and the
    rows it yielded; ``()`` when not interleaving or not started. ``turn``: the round robin's position in the lane
    order.
    """

    pass_index: int
    split_pos: int
    row: int
    carry: tuple[Segment, ...] = ()
    lanes: tuple[tuple[int, int], ...] = ()
    turn: int = 0


class OrderedReader(Protocol):
    """What the read order needs of a reader (`ArrowShardReader` is one): its dataset, modes and splits."""

    dataset: Any
    seed: int
    interleave: int
    infinite: bool

    def segments_for_pass(self, pass_index: int) -> list[Segment]: ...

    def segment_rows(self, segment: Segment) -> int: ...


def order_at(reader: OrderedReader, pass_index: int, carry: Sequence[Segment]) -> Sequence[Segment]:
    """The segments ``reader`` reads in pass ``pass_index``: the ``carry`` while there is one, else the pass's."""
    return carry if carry else reader.segments_for_pass(pass_index)


def lane_order(reader: OrderedReader, pass_index: int) -> list[int]:
    """The order in which an interleaving reader's lanes take turns in pass ``pass_index``."""
    return permutation(reader.interleave, reader.seed, SALT_INTERLEAVE, pass_index).tolist()


class Lane(Protocol):
    """A lane of an interleaving walk: a split of the order, read ``rows`` rows long, ``row`` of them yielded."""

    pos: int  # the split's position in the order
    row: int
    rows: int


L = TypeVar("L", bound=Lane)


class Walk(Generic[L]):
    """A reader's course through its read order from a position on: the pass, its order (the carry first), the
    next split and the rows of it yielded and, interleaved, the lanes and whose turn it is.

    ``make_lane(pos, segment, row, rows)`` makes a lane on the split at ``pos`` of the order, ``row`` of its
    ``rows`` rows yielded: what a lane does with its rows is the walker's (the reader reads them, `units_ahead`
    lists the units it opens); where the walk goes is this class's alone.
    """

    def __init__(self, reader: OrderedReader, position: ReaderPosition,
                 make_lane: Callable[[int, Segment, int, int], L]) -> None:
        self.reader, self.make_lane = reader, make_lane
        self.pass_index, self.carry = position.pass_index, position.carry
        self.split_pos, self.row, self.turn = position.split_pos, position.row, position.turn
        self._order: Sequence[Segment] | None = None  # computed when first read (a reader built is not yet read)
        self._turns: list[int] | None = None
        self.lanes: list[L | None] = [None] * reader.interleave
        for lane_id, (pos, row) in enumerate(position.lanes):
            if pos >= 0:
                segment = self.order[pos]
                self.lanes[lane_id] = make_lane(pos, segment, row, reader.segment_rows(segment))

    @property
    def order(self) -> Sequence[Segment]:
        """The segments of this pass (`order_at`)."""
        if self._order is None:
            self._order = order_at(self.reader, self.pass_index, self.carry)
        return self._order

    def position(self) -> ReaderPosition:
        """Where the walk stands now."""
        lanes = () if self.reader.interleave == 1 else tuple(
            (-1, 0) if lane is None else (lane.pos, lane.row) for lane in self.lanes)
        return ReaderPosition(self.pass_index, self.split_pos, self.row, self.carry, lanes, self.turn)

    def next_split(self) -> None:
        """On to the start of the next split of the order (not interleaving: one split after the other)."""
        self.split_pos += 1
        self.row = 0

    def next_pass(self) -> bool:
        """On to the start of the next pass if the reader is ``infinite``; False (staying at the end of this one)
        if it is not, or if its order is empty."""
        if not self.reader.infinite or not self.order:
            return False
        self.pass_index += 1
        self.carry = ()
        self.split_pos = self.row = self.turn = 0
        self._order = self._turns = None
        self.lanes = [None] * len(self.lanes)
        return True

    def lane_with_turn(self) -> tuple[int, L] | None:
        """``(lane_id, lane)`` whose turn it is, the round robin a step on (interleaving). An empty lane first takes
        the next split of the order with rows; one with none left to take is passed over. None when no lane has
        rows left in this pass."""
        turns = self._turns
        if turns is None:
            turns = self._turns = lane_order(self.reader, self.pass_index)
        while True:
            lane_id = turns[self.turn]
            self.turn = (self.turn + 1) % len(turns)
            lane = self.lanes[lane_id]
            if lane is None:
                lane = self.lanes[lane_id] = self._open_lane()
                if lane is None:
                    if not any(self.lanes):
                        return None
                    # On to the next lane with rows (at the end of a pass most turns are of empty lanes).
                    while self.lanes[turns[self.turn]] is None:
                        self.turn = (self.turn + 1) % len(turns)
                    continue
            return lane_id, lane

    def _open_lane(self) -> L | None:
        """A lane on the next split of the order that has rows (None when none is left)."""
        order = self.order
        while self.split_pos < len(order):
            pos = self.split_pos
            self.split_pos += 1
            rows = self.reader.segment_rows(order[pos])
            if rows:
                return self.make_lane(pos, order[pos], 0, rows)
        return None


def segment_units(reader: OrderedReader, segment: Segment, skip: int) -> list[tuple[int, Unit]]:
    """``(rows of the segment read before it, unit)`` for each unit read for ``segment``'s rows after ``skip``."""
    dataset = reader.dataset
    if segment.take is not None:  # read by random access, in chunks of rows (see ArrowShardReader's blocks)
        rows = segment.take[skip:]
        return [(start, (segment.file_id, unit)) for start in range(0, len(rows), TAKE_CHUNK)
                for unit in dataset.units_of_rows(segment.file_id, rows[start:start + TAKE_CHUNK])]
    return [(before, (segment.file_id, unit))
            for before, unit in dataset.units_of(segment.file_id, segment.start, segment.stop, skip)]


def units_ahead(reader: OrderedReader, position: ReaderPosition) -> Iterator[Unit]:
    """The units ``reader`` reads from ``position`` on, in order (generated lazily; endless when the
    reader is ``infinite``)."""
    walk = Walk(reader, position, functools.partial(_LaneUnits, reader))
    if reader.interleave > 1:
        yield from _interleaved(walk)
        return
    while True:
        if walk.split_pos >= len(walk.order):
            if not walk.next_pass():
                return
            continue
        for _, unit in segment_units(reader, walk.order[walk.split_pos], walk.row):
            yield unit
        walk.next_split()


class _LaneUnits:
    """A lane of `units_ahead`'s walk: its rows yielded so far, and the units still to open with the row each opens
    at."""

    __slots__ = ("pos", "row", "rows", "units")

    def __init__(self, reader: OrderedReader, pos: int, segment: Segment, row: int, rows: int) -> None:
        self.pos, self.row, self.rows = pos, row, rows
        self.units = [(before + row, unit) for before, unit in segment_units(reader, segment, row)]
        self.units.reverse()  # popped from the end

    def next_event(self) -> int:
        """Rows this lane can yield before a turn of it must be walked one by one: the turn that opens its next
        unit, or the turn that yields its last row (after which the lane is empty)."""
        return min(self.units[-1][0] if self.units else self.rows, self.rows - 1) - self.row


def _interleaved(walk: Walk[_LaneUnits]) -> Iterator[Unit]:
    """`units_ahead` for ``interleave > 1``: the reader's round robin, walked a lane's row at a time, and whole
    rounds at once while no lane opens a unit."""
    lanes = walk.lanes
    while True:
        if all(lane is not None for lane in lanes):  # a full round: skip the rounds in which nothing opens
            rounds = min(lane.next_event() for lane in lanes)  # type: ignore[union-attr]
            if rounds > 0:
                for lane in lanes:
                    lane.row += rounds  # type: ignore[union-attr]
                continue
        turn = walk.lane_with_turn()
        if turn is None:
            if not walk.next_pass():
                return
            lanes = walk.lanes
            continue
        lane_id, lane = turn
        while lane.units and lane.units[-1][0] == lane.row:
            yield lane.units.pop()[1]
        lane.row += 1
        if lane.row == lane.rows:
            lanes[lane_id] = None


# Eval mode warns when the busiest rank reads more than this times the rows of the least busy one.
IMBALANCE_WARNING_RATIO = 1.2


def plan_arguments(seed: Any, rank: Any, world_size: Any, interleave: Any) -> tuple[int, int, int, int]:
    """``(seed, rank, world_size, interleave)`` checked (`ValueError`/`TypeError` naming the argument); a rank and
    world size of None from torch.distributed (`resolve_rank`)."""
    seed = checks.integer("seed", seed)
    interleave = _checked_interleave(interleave)
    rank, world_size = resolve_rank(rank, world_size)
    return seed, rank, world_size, interleave


def _checked_interleave(interleave: Any) -> int:
    if not checks.is_integer(interleave) or interleave < 1:
        raise ValueError(f"interleave={interleave!r} must be an int >= 1 (the splits read at once; 1: one by one)")
    return int(interleave)


#: Splits assigned per step of `Balance.of`'s loop (bounds the Python objects alive at once).
_BALANCE_CHUNK = 1 << 16


@dataclass(frozen=True, eq=False)
class Balance:
    """Splits spread over ranks by rows, longest first (`of`): the evaluation assignment, as arrays.

    ``grouped``: split positions (int64) ordered by rank, then ``split_id``; rank ``r``'s are
    ``grouped[bounds[r]:bounds[r + 1]]``; ``rows``: the rows each rank reads. At 1,000,000 splits it holds 8 MB
    and takes about a second, where a list of `Split` objects per rank held 190 MB.
    """

    grouped: np.ndarray
    bounds: np.ndarray
    rows: tuple[int, ...]

    @classmethod
    def of(cls, splits: Sequence[Split], world_size: int) -> Balance:
        """Longest-processing-time assignment: splits are taken by rows descending (ties: lowest ``split_id``)
        and each goes to the rank with the fewest rows so far (ties: lowest rank)."""
        rows, ids = rows_of(splits), _split_ids(splits)
        owner = np.empty(len(rows), dtype=np.int64)
        loads = [(0, rank) for rank in range(world_size)]  # a heap of (rows so far, rank)
        order = np.lexsort((ids, -rows))
        for start in range(0, len(order), _BALANCE_CHUNK):  # Python ints a chunk at a time, not a million at once
            part = order[start:start + _BALANCE_CHUNK]
            for position, count in zip(part.tolist(), rows[part].tolist(), strict=True):
                load, rank = loads[0]
                owner[position] = rank
                heapq.heapreplace(loads, (load + count, rank))
        grouped = np.lexsort((ids, owner))
        bounds = np.searchsorted(owner[grouped], np.arange(world_size + 1))
        totals = [0] * world_size
        for load, rank in loads:
            totals[rank] = load
        return cls(grouped, bounds, tuple(totals))

    def of_rank(self, rank: int) -> np.ndarray:
        """Positions of rank ``rank``'s splits, in ``split_id`` order (int64)."""
        return self.grouped[self.bounds[rank]:self.bounds[rank + 1]]


def balance_splits(splits: Sequence[Split], world_size: int) -> list[list[Split]]:
    """Every rank's splits by `Balance` (longest-processing-time), each rank's list in (file, row) order."""
    balance = Balance.of(splits, world_size)
    return [take(splits, balance.of_rank(rank)) for rank in range(world_size)]


def _split_ids(splits: Sequence[Split]) -> np.ndarray:
    """Each split's ``split_id`` (int64): its position in a `file_table.SplitTable`."""
    if hasattr(splits, "num_rows") and callable(splits.num_rows):  # a SplitTable: numbered by position
        return np.arange(len(splits), dtype=np.int64)
    return np.fromiter((s.split_id for s in splits), dtype=np.int64, count=len(splits))


@dataclass(frozen=True, eq=False)
class ReadPlan:
    """Which splits of a dataset rank ``rank`` of ``world_size`` reads, pass by pass: made before its reader (`of`).

    A reader built with a plan only reads it (a chain's settings, plans included, are final before any node exists:
    `audioloader.chain.settle`). ``splits``: the dataset's splits, subdivided so every rank has one when rows allow
    (a `file_table.SplitTable` where there are enough already: columns, not a million objects);
    ``balance``: with ``shuffle=False``, every rank's splits (`Balance`), the same every pass; ``start``: a reader
    state its first fresh pass starts at instead of the start of pass 0 (an elastic resume's carry: `starting_at`).
    """

    seed: int
    rank: int
    world_size: int
    shuffle: bool
    infinite: bool
    interleave: int
    splits: Sequence[Split]
    balance: Balance | None
    start: dict[str, Any] | None = None

    @classmethod
    def of(cls, dataset: ShardDataset, *, seed: int = 0, rank: int | None = 0, world_size: int | None = 1,
           shuffle: bool = True, infinite: bool = False, interleave: int = 1) -> ReadPlan:
        """The plan of ``dataset`` for these arguments (`ArrowShardReader`'s, which says what each means); errors
        name the argument (``world_size`` above the rows in training, a bad ``interleave``, ``rank``...)."""
        seed, rank, world_size, interleave = plan_arguments(seed, rank, world_size, interleave)
        splits = _splits_for_world(dataset, world_size, bool(shuffle))
        balance = None if shuffle else Balance.of(splits, world_size)
        plan = cls(int(seed), rank, world_size, bool(shuffle), bool(infinite), interleave, splits, balance)
        if balance is not None:
            _warn_if_unbalanced(plan.rows_per_rank())
        return plan

    def for_rank(self, rank: int) -> ReadPlan:
        """The plan of another rank of the same world size, read once (the batches a rank will make are planned
        by reading its rows: `audioloader.elastic.planned_batches`)."""
        return dataclasses.replace(self, rank=rank, infinite=False, start=None)

    def starting_at(self, state: dict[str, Any]) -> ReadPlan:
        """This plan, its reader's first fresh pass starting at the reader state ``state`` (`audioloader.elastic`)."""
        return dataclasses.replace(self, start=dict(state))

    def splits_for_pass(self, pass_index: int) -> list[Split]:
        """This rank's splits for pass ``pass_index``, in read order."""
        if self.balance is not None:
            return take(self.splits, self.balance.of_rank(self.rank))
        order = permutation(len(self.splits), self.seed, SALT_SPLIT_ORDER, int(pass_index))
        return take(self.splits, order[self.rank::self.world_size])

    def assignment(self) -> list[list[Split]]:
        """Every rank's splits of pass 0, in read order (``shuffle=False``: of every pass)."""
        if self.balance is not None:
            return [take(self.splits, self.balance.of_rank(rank)) for rank in range(self.world_size)]
        order = permutation(len(self.splits), self.seed, SALT_SPLIT_ORDER, 0)
        return [take(self.splits, order[r::self.world_size]) for r in range(self.world_size)]

    def rows_per_rank(self) -> list[int]:
        """Rows each rank reads in one pass (exact for ``shuffle=False``; pass 0 for ``shuffle=True``)."""
        if self.balance is not None:
            return list(self.balance.rows)
        order = permutation(len(self.splits), self.seed, SALT_SPLIT_ORDER, 0)
        rows = rows_of(self.splits)[order]
        return [int(rows[r::self.world_size].sum()) for r in range(self.world_size)]


def _splits_for_world(dataset: ShardDataset, world_size: int, shuffle: bool) -> Sequence[Split]:
    """The dataset's splits, subdivided so every rank gets at least one when rows allow."""
    w, rows = world_size, dataset.num_kept_rows
    if rows < w and shuffle:
        raise ValueError(f"world_size={w} but the source has only {rows} rows (kept by the filter, if any), so "
                         "some ranks would have no data in training (shuffle=True); use fewer ranks or more "
                         "data (evaluation, shuffle=False, allows idle ranks)")
    splits = dataset.counted(subdivide(dataset.splits, w))
    for _ in range(64):  # under a filter a half may keep no row and be dropped: halve again
        if len(splits) >= min(w, rows):
            break
        splits = dataset.counted(subdivide(splits, w))
    return splits


def _warn_if_unbalanced(loads: list[int]) -> None:
    busiest, idlest = int(np.argmax(loads)), int(np.argmin(loads))
    if loads[busiest] > IMBALANCE_WARNING_RATIO * loads[idlest]:
        logger.warning("evaluation rows are unbalanced across ranks: rank %d reads %d rows, rank %d reads %d "
                       "(rows per rank: %s). Smaller split_rows, or shards with more record batches / row "
                       "groups, balance better", busiest, loads[busiest], idlest, loads[idlest], loads)
