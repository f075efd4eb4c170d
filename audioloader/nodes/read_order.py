"""The units (record batches / row groups / stripes) an `ArrowShardReader` reads from its position on, in the
order it reads them: what its read-ahead fetches (`audioloader.shards.readahead`).

A pure function of the reader's arguments and position (pass, split, row, carry,
lanes, turn): the same walk `ArrowShardReader.next` makes, one unit per point
where the reader opens one (a lane opens a unit when it needs the unit's first row).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..dsp.hashing import SALT_INTERLEAVE, permutation

if TYPE_CHECKING:
    from .arrow_shard_reader import ArrowShardReader, Segment

Unit = tuple[int, int]  # (file_id, unit)


def segment_units(reader: ArrowShardReader, segment: Segment, skip: int) -> list[tuple[int, Unit]]:
    """``(rows of the segment read before it, unit)`` for each unit read for ``segment``'s rows after ``skip``."""
    dataset = reader.dataset
    if segment.take is not None:  # read by random access, in chunks of rows (see ArrowShardReader._blocks_of)
        from .arrow_shard_reader import _TAKE_CHUNK

        rows = segment.take[skip:]
        return [(start, (segment.file_id, unit)) for start in range(0, len(rows), _TAKE_CHUNK)
                for unit in dataset.units_of_rows(segment.file_id, rows[start:start + _TAKE_CHUNK])]
    return [(before, (segment.file_id, unit))
            for before, unit in dataset.units_of(segment.file_id, segment.start, segment.stop, skip)]


def units_ahead(reader: ArrowShardReader) -> Iterator[Unit]:
    """The units ``reader`` reads from its current position on, in order (generated lazily; endless when the
    reader is ``infinite``)."""
    if reader.interleave > 1:
        yield from _interleaved(reader)
        return
    pass_index, order = reader._pass, reader._current_order()
    split_pos, row = reader._split_pos, reader._row
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

    def __init__(self, reader: ArrowShardReader, segment: Segment, row: int, rows: int) -> None:
        self.row, self.rows = row, rows
        self.units = [(before + row, unit) for before, unit in segment_units(reader, segment, row)]
        self.units.reverse()  # popped from the end

    def next_event(self) -> int:
        """Rows this lane can yield before a turn of it must be walked one by one: the turn that opens its next
        unit, or the turn that yields its last row (after which the lane is empty)."""
        return min(self.units[-1][0] if self.units else self.rows, self.rows - 1) - self.row


def _interleaved(reader: ArrowShardReader) -> Iterator[Unit]:
    """`units_ahead` for ``interleave > 1``: the round robin of `ArrowShardReader._next_interleaved`, simulated."""
    k = reader.interleave
    pass_index, order = reader._pass, reader._current_order()
    split_pos, turn = reader._split_pos, reader._turn
    lanes: list[_LaneWalk | None] = [None if lane is None else _LaneWalk(reader, lane.segment, lane.row, lane.rows)
                                     for lane in reader._lanes]
    lane_order = permutation(k, reader.seed, SALT_INTERLEAVE, pass_index).tolist()
    while True:
        if all(lane is not None for lane in lanes):  # a full round: skip the rounds in which nothing opens
            rounds = min(lane.next_event() for lane in lanes)  # type: ignore[union-attr]
            if rounds > 0:
                for lane in lanes:
                    lane.row += rounds  # type: ignore[union-attr]
                continue
        lane_id = lane_order[turn]
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
                    lane_order = permutation(k, reader.seed, SALT_INTERLEAVE, pass_index).tolist()
                continue
            lanes[lane_id] = lane
        while lane.units and lane.units[-1][0] == lane.row:
            yield lane.units.pop()[1]
        lane.row += 1
        if lane.row == lane.rows:
            lanes[lane_id] = None
