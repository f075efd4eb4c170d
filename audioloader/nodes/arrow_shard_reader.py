"""ArrowShardReader: the source node, rows of Arrow/Parquet/ORC shards as `RawSample`s.

Work is assigned in splits (runs of record batches / row groups / stripes of one file):

- ``shuffle=True`` (training): pass ``p`` orders all splits by a permutation
  seeded by ``(seed, p)``, identical on every rank; rank ``r`` of ``w`` reads
  ``order[r::w]``. Within a split rows come in file order (the shuffle buffer
  downstream mixes them).
- ``shuffle=False`` (evaluation): splits are spread over ranks to balance rows
  (longest-processing-time first); each rank reads its splits in file order,
  the same every pass, so every row is read exactly once across ranks.

With ``interleave=k`` the reader reads ``k`` splits of its order at once, one
row from each in turn (round robin, the lanes in an order seeded per pass), so
that consecutive rows come from one split only in a pass's last rows: a small
shuffle buffer then mixes much better.

State is ``{"pass", "split_pos", "row"}`` (interleaved: plus each lane's split and
row, and the round robin's turn): resuming seeks straight to those rows.
After a resume with another world size (`audioloader.elastic`) a rank first reads
its share of what the old ranks left of their pass(es), the ``carry`` (its plan's
``start``): a list of `Segment` s kept in the state while it lasts, then goes on with the next pass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from .. import checks
from ..dsp.hashing import audio_checksum
from ..errors import CheckpointMismatchError
from ..samples import Key, RawSample
from ..shards import Retry, ShardDataset, Split
from ..shards.formats.scan import FORMATS
from ..shards.storage.options import RemoteReads, Storage, reader_share
from ..shards.storage.readahead import ReadAhead
from ..stats import LoaderStats
from .read_order import (
    TAKE_CHUNK,
    ReaderPosition,
    ReadPlan,
    Segment,
    Walk,
    order_at,
    plan_arguments,
    segment_units,
    units_ahead,
)
from .rows import fetch_rows, owned_audio


class _Block:
    """One read of a segment (a record batch's rows, or a chunk of a ``take``) as per-row Python values."""

    __slots__ = ("audio", "checksums", "extras", "file_rows", "index_offset", "key_pass", "labels", "mapped",
                 "owned", "path", "problems")

    def __init__(self, file_rows: list[int], cols: Any, owned: bool, file: Any, key_pass: int,
                 mapped: tuple[int, int | None] | None = None) -> None:
        self.file_rows, self.path, self.index_offset, self.key_pass = file_rows, file.path, file.index_offset, key_pass
        self.audio, self.labels, self.extras, self.problems = cols
        # Not a memory map: a row leaves as its own copy (`owned_audio`), made as it leaves, so a lane holds its unit
        # once (the read holds the unit until the lane moves on) and what left holds only itself.
        self.owned, self.mapped = owned, mapped  # a memory map's file as known (`RawSample.mapped`)
        # Now, right after the read checked the file: a row's bytes are not touched again until it is decoded.
        self.checksums = [audio_checksum(audio) for audio in cols.audio]

    def __len__(self) -> int:
        return len(self.file_rows)

    def sample(self, i: int) -> RawSample:
        labels, problems, row = self.labels, self.problems, self.file_rows[i]
        audio, self.audio[i] = self.audio[i], None  # the block does not keep a row alive once it left
        if self.owned:
            audio = owned_audio(audio)
        return RawSample(
            Key(self.index_offset + row, self.key_pass),
            audio,
            labels[i] if labels is not None else None,
            {name: values[i] for name, values in self.extras},
            self.path,
            row,
            problems[i] if problems is not None else None,
            self.checksums[i],
            self.mapped,
        )


class _Lane:
    """A segment an interleaving reader reads: its position in the read order, its rows, the rows yielded."""

    __slots__ = ("block", "blocks", "i", "pos", "row", "rows", "segment")

    def __init__(self, pos: int, segment: Segment, row: int, rows: int) -> None:
        self.pos, self.segment, self.row, self.rows = pos, segment, row, rows
        self.blocks: Iterator[_Block] | None = None  # opened at the first row (next() may run in another thread)
        self.block: _Block | None = None
        self.i = 0


def _read_ahead(dataset: ShardDataset, stats: LoaderStats | None) -> ReadAhead | None:
    """The read-ahead of a dataset's remote files (`audioloader.shards.storage.readahead`), or None: no remote file, a
    budget of 0, or a cache (files it keeps are read from their local copies)."""
    budget = dataset.remote_reads.readahead_bytes
    read_ahead = dataset.remote_files() & (dataset.files.format_codes != FORMATS.index("orc"))
    remote = dataset.cache is None and bool(read_ahead.any())
    return ReadAhead(dataset, budget, stats) if remote and budget else None


class ArrowShardReader(BaseNode[RawSample]):
    """Yields one `RawSample` per row of the shards (this rank's share), audio still encoded.

    Args:
        dataset: the `ShardDataset` it reads.
        plan: the share and the order as one value made beforehand (`ReadPlan.of(dataset, seed=..., rank=...,
            world_size=..., shuffle=..., infinite=..., interleave=...)`, which checks them and says what each means;
            `AudioLoader` settles its readers' plans before any node is built). The reader only reads it.
        stats: optional `LoaderStats`: seconds under ``read`` (record batch reads and
            column conversion, per batch) and the ``rows_read`` counter; for remote files
            ``remote_requests`` and ``remote_bytes`` (after construction) and the read-ahead's
            figures (`ReadAhead`); ``throttled_requests`` (refused by the store for going too fast, construction
            included) and ``seconds["throttle_wait"]`` (waited because of them: backoffs and the store's rate).

    With remote files and ``dataset.remote_reads.readahead_bytes > 0`` the reader fetches its upcoming record
    batches / row groups ahead (`audioloader.shards.storage.readahead`), in the order it reads them.
    `of` takes the fields one by one (a source or a dataset, and the plan's fields) and builds both groups.

    Yields ``RawSample(key=Key(index, pass), audio=pyarrow.Buffer | None,
    label=int | None, extras={name: value}, file, row, problem)``; a row with
    null audio or a null label comes through with ``problem`` set, never raised.

    ``get_state()`` is ``{"pass": int, "split_pos": int, "row": int}``: the pass,
    the position in this rank's split order of that pass, and the rows of that
    split already yielded. Interleaved, ``split_pos`` is the next split no lane has
    taken yet (``row`` is 0), ``"lanes"`` holds each lane's ``[position, rows
    yielded]`` (``[-1, 0]``: empty) and ``"turn"`` the round robin's position in the lane order.
    """

    PASS_KEY, SPLIT_POS_KEY, ROW_KEY, CARRY_KEY = "pass", "split_pos", "row", "carry"
    LANES_KEY, TURN_KEY = "lanes", "turn"

    def __init__(self, dataset: ShardDataset, plan: ReadPlan | None = None, *, stats: LoaderStats | None = None,
                 **fields: Any) -> None:
        if fields or plan is None or not isinstance(dataset, ShardDataset):
            raise checks.node_fields("ArrowShardReader", "a ShardDataset and its ReadPlan (ReadPlan.of(dataset, ...))",
                                     fields)
        if not isinstance(plan, ReadPlan):
            raise TypeError(f"plan must be a ReadPlan (ReadPlan.of(dataset, ...)), got {type(plan).__name__}")
        super().__init__()
        self.stats = stats
        self.dataset = dataset
        self.plan = plan
        self._start = self.plan.start  # the plan's start (an elastic resume's), taken by the first reset(None)
        if self._start is not None:
            self.position_of(self._start)  # checked now: a start that does not fit fails here, not at reset
        if stats is not None:
            self._report_to(stats)
        self._readahead = _read_ahead(self.dataset, stats)
        self._pass_units: int | None = None
        self._ahead_from_here = True  # the read-ahead starts over at the next row (a new position)
        self._started = False
        self._walk_from(ReaderPosition(0, 0, 0))

    seed = property(lambda self: self.plan.seed)
    rank = property(lambda self: self.plan.rank)
    world_size = property(lambda self: self.plan.world_size)
    shuffle = property(lambda self: self.plan.shuffle)
    infinite = property(lambda self: self.plan.infinite)
    interleave = property(lambda self: self.plan.interleave)
    splits = property(lambda self: self.plan.splits)

    # ----------------------------------------------------------------- construction

    @classmethod
    def of(cls, source_or_dataset: Any, *, audio_column: str = "audio", label_column: str | None = "label",
           columns: Sequence[str] = (), seed: int = 0, rank: int | None = 0, world_size: int | None = 1,
           shuffle: bool = True, infinite: bool = False, split_rows: int = 512, filesystem: Any = None,
           stats: LoaderStats | None = None, retry: Retry | None = None, filter: Any = None,
           interleave: int = 1, cache_dir: str | None = None, cache_limit: int | None = None,
           remote_reads: RemoteReads | None = None, storage: Storage | None = None) -> ArrowShardReader:
        """A reader built from its fields one by one: the `ShardDataset` (``source_or_dataset`` itself, or one
        opened from a source) and its `ReadPlan`.

        Args:
            source_or_dataset: a `ShardDataset`, or a source for one (folder, glob, file,
                URL or a list of them; see `ShardDataset`).
            storage: how the files are read and this rank's share, as one group (`Storage`; its rank and world
                size then replace ``rank``/``world_size``). With a `ShardDataset` it gives only the share.
            audio_column, label_column, columns, split_rows, filesystem, retry, filter, cache_dir, cache_limit,
                remote_reads: passed to `ShardDataset` (when a dataset is given they must match it or be left at
                their defaults).
            seed: seeds the split order of each pass (``shuffle=True``).
            rank, world_size: this process's share; ``None`` takes them from torch.distributed.
            shuffle: ``True`` for training order (seeded split permutation per pass),
                ``False`` for a balanced, fixed evaluation order.
            infinite: loop over passes 0, 1, 2, ... without stopping.
            interleave: splits read at once (1: one after the other). With ``k > 1`` the
                reader has ``k`` lanes, each reading one split of this rank's order at a
                time; rows come one per lane, round robin, the lanes of pass ``p`` in the
                order ``permutation(k, seed, SALT_INTERLEAVE, p)``; a lane whose split is
                done takes the next split of the order when its turn comes (an empty lane
                with nothing left to take is skipped). A pure function of the seed and the
                order: the same rows in another order, so every row is still read once per
                pass. Memory: a record batch / row group / stripe per lane.
            stats: as the constructor's.
        """
        rank, world_size = reader_share(checks.instance("storage", storage, Storage), rank, world_size,
                                        has_files=isinstance(source_or_dataset, ShardDataset))
        plan_arguments(seed, rank, world_size, interleave)  # before the dataset opens its files: fail at once
        dataset = cls._dataset(source_or_dataset, audio_column, label_column, columns, split_rows, filesystem,
                               retry, filter, (cache_dir, cache_limit), remote_reads, storage)
        plan = ReadPlan.of(dataset, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle, infinite=infinite,
                           interleave=interleave)
        return cls(dataset, plan, stats=stats)

    def _report_to(self, stats: LoaderStats) -> None:
        """Count the dataset's cache, requests and throttling (construction's too) and its metadata in ``stats``."""
        dataset = self.dataset
        if dataset.cache is not None:
            dataset.cache.report_to(stats)
        if dataset.remote.on_read is None:
            dataset.remote.on_read = stats.count_request
            # Throttling during construction (footer scans) counts too: what the dataset saw so far, then each.
            stats.count("throttled_requests", dataset.remote.throttled)
            stats.add_seconds("throttle_wait", dataset.remote.throttle_seconds)
            dataset.remote.on_throttle = stats.count_throttle
        for name, value in dataset.metadata_memory().items():  # metadata_bytes, manifest_mapped_bytes
            stats.set_gauge(name, value)

    @staticmethod
    def _dataset(source: Any, audio_column: str, label_column: str | None, columns: Sequence[str],
                 split_rows: int, filesystem: Any, retry: Retry | None, filter: Any,
                 cache: tuple[str | None, int | None] = (None, None),
                 remote_reads: RemoteReads | None = None, storage: Storage | None = None) -> ShardDataset:
        if not isinstance(source, ShardDataset):
            if storage is not None:  # the group's fields, each left out here
                split_rows, filesystem, retry, *cache, remote_reads = storage.dataset_fields(
                    "ArrowShardReader", split_rows, filesystem, retry, *cache, remote_reads)
            return ShardDataset(source, audio_column=audio_column, label_column=label_column, columns=columns,
                                split_rows=split_rows, filesystem=filesystem, retry=retry, filter=filter,
                                cache_dir=cache[0], cache_limit=cache[1], remote_reads=remote_reads)
        given = {"audio_column": (audio_column, "audio", source.audio_column),
                 "label_column": (label_column, "label", source.label_column),
                 "columns": (list(columns), [], list(source.columns)),
                 "split_rows": (split_rows, 512, source.split_rows)}
        for name, (value, default, actual) in given.items():
            if value != default and value != actual:
                raise ValueError(f"{name}={value!r} differs from the ShardDataset's {actual!r}; "
                                 f"leave {name} out when passing a ShardDataset, or build the dataset with it")
        if (filesystem is not None or retry is not None or filter is not None or cache != (None, None)
                or remote_reads is not None):
            raise ValueError("filesystem=, retry=, filter=, cache_dir= and remote_reads= are for sources; a "
                             "ShardDataset already "
                             "has its files (pass them to the ShardDataset)")
        return source

    # ----------------------------------------------------------------- assignment

    def splits_for_pass(self, pass_index: int) -> list[Split]:
        """This rank's splits for pass ``pass_index``, in read order (`ReadPlan.splits_for_pass`)."""
        return self.plan.splits_for_pass(pass_index)

    def assignment(self) -> list[list[Split]]:
        """Every rank's splits of pass 0, in read order (``shuffle=False``: of every pass)."""
        return self.plan.assignment()

    def rows_per_rank(self) -> list[int]:
        """Rows each rank reads in one pass (exact for ``shuffle=False``; pass 0 for ``shuffle=True``)."""
        return self.plan.rows_per_rank()

    def segments_for_pass(self, pass_index: int) -> list[Segment]:
        """This rank's read order of pass ``pass_index`` as `Segment` s (its splits; see `splits_for_pass`)."""
        return [Segment(int(pass_index), s.file_id, s.start, s.stop) for s in self.splits_for_pass(pass_index)]

    def segment_rows(self, segment: Segment) -> int:
        """Rows a segment yields (its kept rows, under a filter)."""
        if segment.take is not None:
            return len(segment.take)
        return self.dataset.kept_count(segment.file_id, segment.start, segment.stop)

    # ----------------------------------------------------------------- torchdata contract

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._ahead_from_here = True
        if initial_state is None and self._start is not None:  # the plan's start (`ReadPlan.start`), once
            initial_state, self._start = self._start, None
        elif initial_state is None:
            # As torchdata's SamplerWrapper: a new pass only if this one was started,
            # so the Loader's end-of-epoch path (reset(state), StopIteration, reset(None)) advances.
            pass_index = self._walk.pass_index
            if self._started:
                pass_index = pass_index + 1 if self.shuffle else 0
            self._started = False
            self._walk_from(ReaderPosition(pass_index, 0, 0))
            return
        position = self.position_of(initial_state)
        self._started = False
        self._walk_from(position)

    def for_rank(self, rank: int, world_size: int) -> ArrowShardReader:
        """A reader of the same dataset, seed and modes for rank ``rank`` of ``world_size`` (an elastic resume reads
        the old ranks' states with readers of the old layout)."""
        plan = ReadPlan.of(self.dataset, seed=self.seed, rank=rank, world_size=world_size, shuffle=self.shuffle,
                           infinite=self.infinite, interleave=self.interleave)
        return ArrowShardReader(self.dataset, plan=plan)

    def position_of(self, state: dict[str, Any]) -> ReaderPosition:
        """Where ``state`` puts this reader in its read order, checked against its splits
        (`CheckpointMismatchError` naming what does not fit)."""
        try:
            values = [int(state[k]) for k in (self.PASS_KEY, self.SPLIT_POS_KEY, self.ROW_KEY)]
            carry = tuple(Segment.from_list(segment) for segment in state.get(self.CARRY_KEY, ()))
            lanes = tuple((int(pos), int(row)) for pos, row in state.get(self.LANES_KEY, ()))
            turn = int(state.get(self.TURN_KEY, 0))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointMismatchError(f"ArrowShardReader state {state!r} lacks a valid {error}; expected "
                                          "{'pass': int, 'split_pos': int, 'row': int}") from None
        pass_index, split_pos, row = values
        order = order_at(self, pass_index, carry)
        fits = pass_index >= 0 and 0 <= split_pos <= len(order) and (
            row == 0 if split_pos == len(order) else 0 <= row <= self.segment_rows(order[split_pos]))
        fits = fits and all(0 <= s.file_id < len(self.dataset.files) and 0 <= s.start <= s.stop
                            <= self.dataset.files[s.file_id].num_rows for s in carry)
        fits = fits and self._lanes_fit(lanes, turn, order, split_pos, row)
        if not fits:
            raise CheckpointMismatchError(
                f"ArrowShardReader state {state!r} does not fit this reader (rank {self.rank} has "
                f"{len(order)} splits in pass {pass_index}, interleave={self.interleave}); was it saved with other "
                "files, split_rows, seed, world_size or interleave?", {"reader_state": (dict(state), None)})
        return ReaderPosition(pass_index, split_pos, row, carry, lanes, turn)

    def _lanes_fit(self, lanes: Sequence[tuple[int, int]], turn: int, order: Sequence[Segment],
                   split_pos: int, row: int) -> bool:
        """Whether interleaving lanes (``[]``: none started) fit this reader and an order of ``split_pos`` taken."""
        if self.interleave == 1:
            return not lanes
        def lane_fits(pos: int, r: int) -> bool:  # empty, or a split taken before split_pos, partly read
            return (pos, r) == (-1, 0) or (0 <= pos < split_pos and 0 <= r < self.segment_rows(order[pos]))

        taken = [pos for pos, _ in lanes if pos >= 0]
        return (row == 0 and 0 <= turn < self.interleave
                and len(lanes) in (0, self.interleave) and len(set(taken)) == len(taken)
                and all(lane_fits(pos, r) for pos, r in lanes))

    def _walk_from(self, position: ReaderPosition) -> None:
        """Read on from ``position``."""
        self._walk: Walk[_Lane] = Walk(self, position, _Lane)
        self._blocks = None  # opened lazily in next(), which may run in another thread
        self._block: _Block | None = None
        self._i = self._n = 0

    def position(self) -> ReaderPosition:
        """Where this reader stands in its read order now (what `get_state` holds, as a value)."""
        return self._walk.position()

    def get_state(self) -> dict[str, Any]:
        position = self.position()
        state = {self.PASS_KEY: position.pass_index, self.SPLIT_POS_KEY: position.split_pos,
                 self.ROW_KEY: position.row}
        if position.carry:
            state[self.CARRY_KEY] = [segment.to_list() for segment in position.carry]
        if self.interleave > 1:
            state[self.LANES_KEY] = [list(lane) for lane in position.lanes]
            state[self.TURN_KEY] = position.turn
        return state

    def next(self) -> RawSample:
        self._started = True
        if self._ahead_from_here:
            self._ahead_from_here = False
            if self._readahead is not None:  # fetch from this position on, in the order the rows will be read
                self._readahead.start(units_ahead(self, self.position()), self._units_per_pass())
        if self.interleave > 1:
            return self._next_interleaved()
        i = self._i
        if i >= self._n:
            self._read_next_block()
            i = 0
        self._i = i + 1
        self._walk.row += 1
        return self._block.sample(i)

    # ----------------------------------------------------------------- reading

    def _units_per_pass(self) -> int:
        """Units this rank reads in one pass (counted once): the most its read-ahead holds."""
        if self._pass_units is None:
            self._pass_units = max(1, sum(len(segment_units(self, segment, 0))
                                          for segment in self.segments_for_pass(0)))
        return self._pass_units

    def _end_of_order(self) -> None:
        """Go on with the next pass (``infinite``), or StopIteration."""
        if not self._walk.next_pass():
            raise StopIteration
        self._blocks = None

    def _read_next_block(self) -> None:
        """Load the next non-empty block of rows of this rank's read order; StopIteration at the end."""
        walk = self._walk
        while True:
            if self._blocks is None:
                if walk.split_pos >= len(walk.order):
                    self._end_of_order()
                    continue
                self._blocks = self._blocks_of(walk.order[walk.split_pos], walk.row)
            block = self._pull(self._blocks)
            if block is not None:
                self._block, self._i, self._n = block, 0, len(block)
                return
            self._blocks = None
            walk.next_split()

    def _next_interleaved(self) -> RawSample:
        """The next row of the lane whose turn it is (`Walk.lane_with_turn`)."""
        while True:
            turn = self._walk.lane_with_turn()
            if turn is None:  # nothing left in this pass
                self._end_of_order()
                continue
            lane_id, lane = turn
            sample = self._next_of_lane(lane)
            if lane.row == lane.rows:
                self._walk.lanes[lane_id] = None
            return sample

    def _next_of_lane(self, lane: _Lane) -> RawSample:
        """The next row of ``lane``; its segment's blocks are read as it needs them."""
        if lane.block is None or lane.i == len(lane.block):
            if lane.blocks is None:
                lane.blocks = self._blocks_of(lane.segment, lane.row)
            lane.block, lane.i = self._pull(lane.blocks), 0
            if lane.block is None:
                raise RuntimeError(f"{lane.segment} ended after {lane.row} of its {lane.rows} rows")
        sample = lane.block.sample(lane.i)
        lane.i += 1
        lane.row += 1
        return sample

    def _pull(self, blocks: Iterator[_Block]) -> _Block | None:
        """The next block of ``blocks`` (None at its end), timed under ``read`` and counted in ``rows_read``."""
        if self.stats is None:
            return next(blocks, None)
        start = time.perf_counter()
        try:
            block = next(blocks, None)
        finally:
            self.stats.add_seconds("read", time.perf_counter() - start)
        if block is not None:
            self.stats.count("rows_read", len(block))
        return block

    def _blocks_of(self, segment: Segment, skip: int) -> Iterator[_Block]:
        """`_Block` s of a segment's rows after the first ``skip`` of them (reads without a row left out)."""
        dataset = self.dataset
        file = dataset.files[segment.file_id]
        mapped = dataset.mapped_state(segment.file_id)
        owned = mapped is None
        read_unit = self._readahead.read_unit if self._readahead is not None else None
        if segment.take is not None:
            rows = segment.take[skip:]
            for start in range(0, len(rows), TAKE_CHUNK):
                part = rows[start:start + TAKE_CHUNK]
                cols = dataset.columns_of_rows(dataset.read_rows([file.index_offset + r for r in part], read_unit))
                yield _Block(list(part), cols, owned, file, segment.pass_index, mapped)
            return
        for batch, file_rows, picks in dataset.read_kept(segment.file_id, segment.start, segment.stop, skip,
                                                         read_unit):
            if file_rows:
                block = _Block(file_rows, dataset.columns_of(batch, picks), owned, file, segment.pass_index, mapped)
                if not owned:  # its checksums read the ends of its rows; decode workers read the rest themselves
                    dataset.release_mapped_pages(segment.file_id)
                yield block

    # ----------------------------------------------------------------- random access

    def fetch(self, keys: Sequence[Key]) -> list[RawSample]:
        """The rows of ``keys`` as `RawSample`s, in the same order (for restoring a shuffle buffer).

        Thread-safe: may run in another thread while ``next()`` runs (each thread has its own file handles).
        """
        return fetch_rows(self.dataset, keys)

    @property
    def fetcher(self) -> functools.partial:
        """`fetch` as a picklable function that does not hold this node (for worker processes)."""
        return functools.partial(fetch_rows, self.dataset)

    def __repr__(self) -> str:
        mode = "shuffle" if self.shuffle else "eval"
        return (f"ArrowShardReader({self.dataset!r}, rank={self.rank}/{self.world_size}, {mode}, "
                f"seed={self.seed}, infinite={self.infinite})")
