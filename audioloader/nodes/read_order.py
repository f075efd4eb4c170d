"""The read order of an `ArrowShardReader`: the `Segment` s it reads, where it stands in them (`ReaderPosition`),
and the units (record batches / row groups / stripes) it reads from a position on, in the order it reads them:
what its read-ahead fetches (`audioloader.shards.readahead`).

The units are a pure function of the reader's arguments and position (pass, split, row, carry,
lanes, turn): the same walk `ArrowShardReader.next` makes, one unit per point
where the reader opens one (a lane opens a unit when it needs the unit's first row).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..dsp.hashing import SALT_INTERLEAVE, permutation

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


def order_at(reader: OrderedReader, position: ReaderPosition) -> Sequence[Segment]:
    """The segments ``reader`` reads at ``position``: its carry while it has one, else its pass's."""
    return position.carry if position.carry else reader.segments_for_pass(position.pass_index)


def lane_order(reader: OrderedReader, pass_index: int) -> list[int]:
    """The order in which an interleaving reader's lanes take turns in pass ``pass_index``."""
    return permutation(reader.interleave, reader.seed, SALT_INTERLEAVE, pass_index).tolist()


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
    if reader.interleave > 1:
        yield from _interleaved(reader, position)
        return
    pass_index, order = position.pass_index, order_at(reader, position)
    split_pos, row = position.split_pos, position.row
    while True:
        for pos in range(split_pos, len(order)):
            for _, unit in segment_units(reader, order[pos], row if pos == split_pos else 0):
                yield unit
        if not reader.infinite or not order:
            return
        pass_index, split_pos, row = pass_index + 1, 0, 0
        order = reader.segments_for_pass(pass_index)


class _LaneWalk:
    """A lane in the walk: its segment's rows yielded so far, and the units still to open with the row each opens at."""

    __slots__ = ("row", "rows", "units")

    def __init__(self, reader: OrderedReader, segment: Segment, row: int, rows: int) -> None:
        self.row, self.rows = row, rows
        self.units = [(before + row, unit) for before, unit in segment_units(reader, segment, row)]
        self.units.reverse()  # popped from the end

    def next_event(self) -> int:
        """Rows this lane can yield before a turn of it must be walked one by one: the turn that opens its next
        unit, or the turn that yields its last row (after which the lane is empty)."""
        return min(self.units[-1][0] if self.units else self.rows, self.rows - 1) - self.row


def _interleaved(reader: OrderedReader, position: ReaderPosition) -> Iterator[Unit]:
    """`units_ahead` for ``interleave > 1``: the round robin of `ArrowShardReader.next`, simulated."""
    k = reader.interleave
    pass_index, order = position.pass_index, order_at(reader, position)
    split_pos, turn = position.split_pos, position.turn
    lanes: list[_LaneWalk | None] = [None] * k
    for lane_id, (pos, row) in enumerate(position.lanes):
        if pos >= 0:
            lanes[lane_id] = _LaneWalk(reader, order[pos], row, reader.segment_rows(order[pos]))
    turns = lane_order(reader, pass_index)
    while True:
        if all(lane is not None for lane in lanes):  # a full round: skip the rounds in which nothing opens
            rounds = min(lane.next_event() for lane in lanes)  # type: ignore[union-attr]
            if rounds > 0:
                for lane in lanes:
                    lane.row += rounds  # type: ignore[union-attr]
                continue
        lane_id = turns[turn]
        turn = (turn + 1) % k
        lane = lanes[lane_id]
        if lane is None:
            while split_pos < len(order) and lane is None:
                rows = reader.segment_rows(order[split_pos])
                if rows:
                    lane = _LaneWalk(reader, order[split_pos], 0, rows)
                split_pos += 1
            if lane is None:
                if not any(lanes):
                    if not reader.infinite or not order:
                        return
                    pass_index, split_pos, turn = pass_index + 1, 0, 0
                    order = reader.segments_for_pass(pass_index)
                    turns = lane_order(reader, pass_index)
                continue
            lanes[lane_id] = lane
        while lane.units and lane.units[-1][0] == lane.row:
            yield lane.units.pop()[1]
        lane.row += 1
        if lane.row == lane.rows:
            lanes[lane_id] = None
