"""Elastic resume: the checkpoints of all ``W`` ranks of a run, resumed on ``W'`` ranks.

The rank layout (docs/design.md, "Order"): a pass is a set of splits, and what a rank has consumed
is a set of rows, so the states of all ranks say exactly which rows of the pass
are left; a resume with another world size redistributes those rows, nothing else.

What one old rank has left, read from its state layer by layer (`_left_of`; each node type says what a
state of its own holds, `audioloader.nodes.held`, and `chain.chain_layers` names the types of the chain's
nodes, root first: no chain is built to read the old states):

- its reader's position: the rest of the split it was in, the splits after it
  in its order of that pass, and its whole share of any later pass another rank
  had already started;
- the rows it had read but not delivered: held in its shuffle buffer, in its
  duration bucketer's buckets, or in flight in the decode stage;
- minus the rows the decode stage delivered after its last snapshot of the
  source (their keys are in the `ParallelMap` state, ``emitted``).

Everything left, over all old ranks, is cut into ``W'`` parts of equal rows
(in training, after a seeded shuffle of the pieces; in evaluation in file
order), and new rank ``r'`` reads part ``r'`` first: its reader's *carry*
(the start of its `ReadPlan`, `Plan.started`). Keys keep their pass, so every row keeps its
crop. After the carry, passes go on in the new layout. Deterministic: every new
rank computes the same parts from the same list of states.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchdata.nodes import BaseNode

from .dsp.hashing import SALT_ELASTIC, permutation
from .errors import CheckpointMismatchError
from .nodes._torchdata_compat import rows_held as torchdata_rows_held
from .nodes.arrow_shard_reader import ArrowShardReader
from .nodes.bucket_rules import bucket_limits
from .nodes.bucket_rules import plan as plan_buckets
from .nodes.duration_bucketer import DurationBucketer, row_seconds
from .nodes.held import RowsHeld
from .nodes.read_order import ReaderPosition, ReadPlan, Segment, order_at
from .nodes.shuffle_buffer import ShuffleBuffer
from .samples import BatchEnd, Key
from .shards import ShardDataset
from .stats import LoaderStats

#: Rows per piece that buffered rows are grouped into before the parts are cut (they mix with the splits).
HELD_PIECE_ROWS = 512


@dataclass
class _Left:
    """What one rank's chain holds, from its state: the reader's state and the keys around it."""

    reader_state: dict[str, Any]
    held: list[Key] = field(default_factory=list)  # read from the reader, not passed on
    delivered: list[Key] = field(default_factory=list)  # read after the reader state was taken, and passed on


def _left_of(layers: Sequence[type[BaseNode]], state: dict[str, Any]) -> _Left:
    """`_Left` of a chain whose nodes are of the types ``layers`` (root first, each pulling from the next, down to
    the reader: `chain.chain_layers`), given its root's state: each type says what a state of its own holds
    (`audioloader.nodes.held`), down to the reader, whose state is where it was."""
    if issubclass(layers[0], ArrowShardReader):
        return _Left(dict(state))
    below = _rows_held(layers[0], state)
    left = _left_of(layers[1:], below.source_state)
    if below.emitted is not None:
        # The items it passed on after its snapshot of the source: held below it then, or read after.
        emitted = set(below.emitted)
        held = set(left.held)
        left.held = [key for key in left.held if key not in emitted]
        left.delivered += [key for key in emitted if key not in held]
    left.held += below.held
    return left


def _rows_held(layer: type[BaseNode], state: dict[str, Any]) -> RowsHeld:
    own = getattr(layer, "rows_held", None)
    held = own(state) if own is not None else torchdata_rows_held(layer, state)
    if held is None:
        name = layer.__name__
        raise CheckpointMismatchError(f"cannot resume a chain holding a {name} on another world size: audioloader "
                                      "does not know which rows it holds", {"node": (name, None)})
    return held


@dataclass
class Plan:
    """Where every new rank starts in the rest of the interrupted pass ``last_pass``: its part of the rows left."""

    parts: list[list[Segment]]  # by new rank
    rows_per_rank: list[int]
    last_pass: int

    def state_for(self, plan: ReadPlan) -> dict[str, Any]:
        """The reader state (with its carry) of ``plan``'s rank (a `ReadPlan` of the new layout)."""
        part = self.parts[plan.rank]
        if part:
            return {"pass": self.last_pass, "split_pos": 0, "row": 0, "carry": [s.to_list() for s in part]}
        # nothing left for this rank: at the end of the last pass
        return {"pass": self.last_pass, "split_pos": len(plan.splits_for_pass(self.last_pass)), "row": 0}

    def started(self, plan: ReadPlan) -> ReadPlan:
        """``plan`` (of the new layout) starting at its rank's part (`ReadPlan.starting_at`)."""
        return plan.starting_at(self.state_for(plan))


class _Pieces:
    """The rows left over all old ranks, as `Segment` s, with the arithmetic to cut them."""

    def __init__(self, reader: ArrowShardReader) -> None:
        self.reader = reader
        self.dataset = reader.dataset
        self.segments: list[Segment] = []

    def add_rest_of(self, old: ArrowShardReader, at: ReaderPosition, last_pass: int) -> None:
        """What ``old`` (a reader of the old layout) has left from position ``at`` up to the end of ``last_pass``."""
        order = order_at(old, at.pass_index, at.carry)
        for pos, row in at.lanes:  # an interleaving reader: the rest of each split its lanes were reading
            if pos >= 0:
                self.segments.append(self.skip(order[pos], row))
        if at.split_pos < len(order):
            self.segments.append(self.skip(order[at.split_pos], at.row))
            self.segments += order[at.split_pos + 1:]
        for later in range(at.pass_index + 1, last_pass + 1):
            self.segments += old.segments_for_pass(later)

    def add_held(self, keys: Sequence[Key]) -> None:
        rows: dict[tuple[int, int], list[int]] = defaultdict(list)
        for key in keys:
            file_id, row = self.dataset.locate(key.index)
            rows[(key.pass_index, file_id)].append(row)
        for (pass_index, file_id), taken in sorted(rows.items()):
            taken.sort()
            for start in range(0, len(taken), HELD_PIECE_ROWS):
                part = tuple(taken[start:start + HELD_PIECE_ROWS])
                self.segments.append(Segment(pass_index, file_id, part[0], part[-1] + 1, part))

    def remove(self, keys: Sequence[Key]) -> None:
        """Cut delivered rows out of the segments (few: at most a decode chunk per old rank)."""
        for key in keys:
            file_id, row = self.dataset.locate(key.index)
            for i, s in enumerate(self.segments):
                if s.pass_index != key.pass_index or s.file_id != file_id or not s.start <= row < s.stop:
                    continue
                if s.take is not None:
                    if row in s.take:
                        self.segments[i] = s._replace(take=tuple(r for r in s.take if r != row))
                        break
                    continue
                self.segments[i:i + 1] = [s._replace(stop=row), s._replace(start=row + 1)]
                break
            else:  # a delivered row the states do not place: resuming would deliver it again
                raise CheckpointMismatchError(
                    f"row {key.index} of pass {key.pass_index} was delivered after a snapshot but is not in what "
                    "the states say is left; the states are not of one consistent checkpoint",
                    {"delivered": ([key.index, key.pass_index], None)})
        self.segments = [s for s in self.segments if self.reader.segment_rows(s)]

    def skip(self, segment: Segment, rows: int) -> Segment:
        """The segment less its first ``rows`` rows."""
        if segment.take is not None:
            return segment._replace(take=segment.take[rows:])
        return segment._replace(start=self.dataset.kept_start(segment.file_id, segment.start, segment.stop, rows))

    def head(self, segment: Segment, rows: int) -> Segment:
        """The first ``rows`` rows of the segment."""
        if segment.take is not None:
            return segment._replace(take=segment.take[:rows])
        return segment._replace(stop=self.dataset.kept_start(segment.file_id, segment.start, segment.stop, rows))

    def cut(self, parts: int) -> list[list[Segment]]:
        """The segments, in order, cut into ``parts`` runs of equal rows (to one row)."""
        counts = [self.reader.segment_rows(s) for s in self.segments]
        total = sum(counts)
        bounds = [total * (j + 1) // parts for j in range(parts)]
        out: list[list[Segment]] = [[] for _ in range(parts)]
        done, j = 0, 0
        for segment, n in zip(self.segments, counts, strict=True):
            while n:
                room = bounds[j] - done
                if room == 0:
                    j += 1
                    continue
                take = min(n, room)
                out[j].append(segment if take == n else self.head(segment, take))
                segment, n, done = (segment if take == n else self.skip(segment, take)), n - take, done + take
        return out


def plan(layers: Sequence[type[BaseNode]], dataset: ShardDataset, read_plan: ReadPlan,
         states: Sequence[dict[str, Any]]) -> Plan:
    """Every new rank's start after a resume of ``states`` (the chain states of old ranks 0..W-1, in rank order).

    ``layers``: the types of the old ranks' chain nodes, root first, down to the reader (the chain this loader's
    settings make: `chain.chain_layers`); ``dataset`` and ``read_plan``: the source's and this rank's plan in the
    new layout. Readers of both layouts place the old positions and cut the parts; none reads a row.
    """
    reader = ArrowShardReader(dataset, plan=read_plan)
    old_world = len(states)
    lefts = [_left_of(layers, state) for state in states]
    olds = [reader.for_rank(r, old_world) for r in range(old_world)]
    positions = [old.position_of(left.reader_state) for old, left in zip(olds, lefts, strict=True)]
    # The last pass anything was read from: a snapshot of a reader can be behind the rows read after it.
    last_pass = max([position.pass_index for position in positions]
                    + [key.pass_index for left in lefts for key in (*left.held, *left.delivered)])
    pieces = _Pieces(reader)
    for old, position in zip(olds, positions, strict=True):
        pieces.add_rest_of(old, position, last_pass)
    pieces.remove([key for left in lefts for key in left.delivered])
    for left in lefts:
        pieces.add_held(left.held)
    pieces.segments.sort(key=lambda s: (s.pass_index, s.file_id, s.start, s.take or ()))
    if reader.shuffle:  # training: the pieces in a seeded order, so a rank's share is spread over the data
        order = permutation(len(pieces.segments), reader.seed, SALT_ELASTIC, last_pass, old_world, reader.world_size)
        pieces.segments = [pieces.segments[i] for i in order.tolist()]
    parts = pieces.cut(reader.world_size)
    return Plan(parts, [sum(reader.segment_rows(s) for s in part) for part in parts], last_pass)


def resumed(settings: Any, sources: Any, start: Plan) -> Any:
    """``settings`` (`chain.settle`'s) of a chain that starts at ``start``: its reader's plan starting at this rank's
    part (`Plan.started`) and, in evaluation, its batcher's first pass the batches every new rank yields in the rest
    of the pass (`count_batches`); every node of it is built so, and none is changed afterwards."""
    layout = settings.batch_layout
    if settings.num_batches is not None:
        layout = dataclasses.replace(layout, first_pass_batches=count_batches(settings, sources, start))
    return dataclasses.replace(settings, reads=(start.started(settings.reads[0]),), batch_layout=layout)


def count_batches(settings: Any, sources: Any, start: Plan | None = None) -> int:
    """Batches every rank yields in a pass (equal on all, see `Batcher`'s ``num_batches``) or, after an elastic
    resume from ``start``, in the rest of it: from ``settings.reads`` (`chain.settle`'s) or ``start``'s parts and,
    with bucketing, ``settings.buckets`` (a training pass of ranks in step: `steps_in_step`)."""
    s = settings
    if s.batching is not None:
        return steps_in_step(s, sources, start) if s.train else planned_batches(s, sources, start)
    if start is not None:
        rows = start.rows_per_rank
    else:
        rows = [sum(counts) for counts in zip(*(plan.rows_per_rank() for plan in s.reads), strict=True)]
    return min(rows) // s.batch_size if s.drop_last else math.ceil(max(rows) / s.batch_size)


def steps_in_step(settings: Any, sources: Any, start: Plan | None = None) -> int:
    """A training pass of ranks in step (``Bucketing(sync_buckets=True)``, ``infinite=False``): the most batches a
    rank's bucketer makes of its rows, each rank's reader, shuffle buffer and bucketer built as `chain.build_chain`
    builds them (from the pass's start or, after an elastic resume, ``start``'s carry) and run on the raw rows (no
    decoding). Every rank yields that many (those that run out, one-entry batches whose ``valid`` is False), so a
    pass ends on the same step everywhere: a DDP collective never waits for a rank that has stopped."""
    s, fetch, counts = settings, sources.fetch(), []
    seconds = functools.partial(row_seconds, duration_column=s.duration_column, segments=sources.segments)
    for rank in range(s.storage.world_size):
        rows = _rank_rows(s, sources, rank, start)
        stats = LoaderStats()  # the buffer and the bucketer share its byte budget, as in the chain
        buffer = ShuffleBuffer(rows, limits=s.buffer_limits, seed=s.seed, rank=rank, restore=fetch, stats=stats)
        bucketer = DurationBucketer(buffer, limits=s.bucket_limits, drop_last=s.drop_last, restore=fetch,
                                    stats=stats, duration_fn=seconds)
        bucketer.reset(None)
        counts.append(sum(isinstance(item, BatchEnd) for item in bucketer))
    return max(counts)


def planned_batches(settings: Any, sources: Any, start: Plan | None = None) -> int:
    """Eval with bucketing: the most batches a rank's rows make, each rank's read in its reader's order
    (interleaved too) into ``settings.buckets``, from the pass's start or, after an elastic resume (``start``),
    from its carry."""
    s, counts = settings, []
    for rank in range(s.storage.world_size):
        rows = _rank_rows(s, sources, rank, start)
        limits = bucket_limits(s, None, False)
        rows = list(rows) if limits.token_column is not None else rows
        tokens = [float(r.extras.get(limits.token_column) or 0) for r in rows] if limits.token_column else None
        counts.append(len(plan_buckets((s.seconds_of(r, sources.segments) for r in rows), drop_last=s.drop_last,
                                       limits=limits, tokens=tokens)))
    return max(counts)


def _rank_rows(settings: Any, sources: Any, rank: int, start: Plan | None) -> ArrowShardReader:
    """A reader of rank ``rank``'s rows of a pass (read once), built as `chain.build_chain` builds it, from the
    pass's start or, after an elastic resume, ``start``'s carry."""
    plan = settings.reads[0].for_rank(rank)
    return ArrowShardReader(sources.datasets[0], plan=plan if start is None else start.started(plan))
