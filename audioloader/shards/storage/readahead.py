"""ReadAhead: fetch the remote units a reader will read next, concurrently and coalesced, within a byte budget.

A reader knows its future: the splits of a pass and their order are a pure
function of (seed, pass, rank, world size), and so are the record batches / row
groups it reads in them (`audioloader.nodes.read_order.units_ahead` lists them in
the exact order the reader reads them, interleaving, filters and resumed
positions included). `ReadAhead` walks that list ahead of the reader: it groups
consecutive units of one file, coalesces their byte ranges (`units.coalesce`:
one request per run of contiguous bytes, up to `units.MAX_REQUEST_BYTES`; a single
unit longer than `remote.PART_BYTES` goes out as parts, in flight together) and
submits the requests to the dataset's `RemoteFiles` pool, so that several are in
flight while the reader works. When the reader reads a unit, its bytes are
already in memory (or on their way) and pyarrow parses them from there.

What changes is only *when* bytes arrive: the reader reads the same units in the
same order and parses them with the same code, so its rows are bit-identical to
a read without read-ahead (or from local disk).

Memory: the bytes of requests submitted and not yet read by the reader (in
flight or arrived) never exceed ``budget`` bytes, except that one unit larger
than the budget is fetched alone. A unit the list did not foresee (it never
happens in a reader's normal course; counted in ``misses``) is read directly.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from .remote import Parts
from .units import MAX_REQUEST_BYTES, coalesce

#: Default bytes a reader's read-ahead may hold (`audioloader.Storage.readahead_bytes`).
DEFAULT_READAHEAD_BYTES = 64 * 1024 * 1024

Unit = tuple[int, int]  # (file_id, unit)

#: Planned units taken from the plan at once: the footers of their files not yet read (files known from a
#: manifest) are read together, concurrently, before their ranges are planned.
_LOCATE_AHEAD = 64
#: Planned units a fill walks past without fetching (local or unlocated ones) before it stops for now.
_MAX_SKIPPED = 1024


class _Request:
    """One ranged read (in parts when long): its bytes are counted from submission until every unit using them
    has been read."""

    __slots__ = ("future", "length", "offset", "users")

    def __init__(self, offset: int, length: int, future: Parts) -> None:
        self.offset, self.length, self.future, self.users = offset, length, future, 0


class ReadAhead:
    """Fetches the units of ``plan`` ahead of the reader (see the module docstring).

    Args:
        dataset: the `ShardDataset` read (its `RemoteFiles` makes the requests).
        budget: bytes of fetched-but-unread units held at most.
        stats: optional `LoaderStats`: counters ``readahead_units`` (units served from the
            read-ahead), ``readahead_misses``; gauges ``readahead_bytes`` (held now) and
            ``readahead_peak_bytes``.

    Attributes:
        peak_bytes: the most bytes held at once since `start`.
        misses: remote units read directly, since creation.
    """

    def __init__(self, dataset: Any, budget: int = DEFAULT_READAHEAD_BYTES, stats: Any = None) -> None:
        self.dataset, self.budget, self.stats = dataset, int(budget), stats
        self._plan: Iterator[Unit] = iter(())
        self._next: tuple[Unit, list[tuple[int, int]]] | None = None  # a planned unit not yet submitted
        self._ahead: deque[Unit] = deque()  # planned units taken from the plan, not yet peeked at
        self._locating: tuple[list[Unit], Any] | None = None  # the next planned units, their footers being read
        self._window: dict[Unit, deque[list[_Request]]] = {}
        self._held = 0
        self._units = 0  # units fetched (or in flight) and not yet read
        self._max_units: int | None = None
        self.peak_bytes = 0
        self.misses = 0

    def start(self, plan: Iterator[Unit], max_units: int | None = None) -> None:
        """Forget what was fetched (a new position) and fetch ahead along ``plan`` from now on, holding at most
        ``max_units`` units (a pass's: a buffer never holds more than one pass of a rank's rows)."""
        self.cancel()
        self._plan, self._max_units = plan, max_units
        self.peak_bytes = 0
        self._fill()

    def cancel(self) -> None:
        """Drop everything fetched or in flight (requests not started are cancelled)."""
        for queue in self._window.values():
            for requests in queue:
                for request in requests:
                    request.future.cancel()
        self._window.clear()
        self._units = 0
        self._next = None
        self._ahead.clear()
        self._locating = None  # footers being read stay read (the dataset keeps them); the units are dropped
        self._plan = iter(())
        self._held = 0
        self._gauge()

    @property
    def held_bytes(self) -> int:
        """Bytes of requests submitted and not yet read (in flight or arrived)."""
        return self._held

    # ----------------------------------------------------------------- the reader's side

    def read_unit(self, file_id: int, unit: int) -> list[pa.RecordBatch]:
        """The record batches of a unit: from the read-ahead's bytes when it fetched them, else read directly."""
        queue = self._window.get((file_id, unit))
        if not queue:
            if self.dataset.unit_ranges(file_id, unit) is not None:
                self.misses += 1
                if self.stats is not None:
                    self.stats.count("readahead_misses")
            return self.dataset.read_unit(file_id, unit)
        requests = queue.popleft()
        self._units -= 1
        if not queue:
            del self._window[(file_id, unit)]
        try:
            provided = [(request.offset, request.future.result()) for request in requests]
        finally:
            for request in requests:
                request.users -= 1
                if request.users == 0:
                    self._held -= request.length
            self._fill()
            self._gauge()
        if self.stats is not None:
            self.stats.count("readahead_units")
        return self.dataset.read_unit_from(file_id, unit, provided)

    # ----------------------------------------------------------------- fetching ahead

    def _peek(self) -> tuple[Unit, list[tuple[int, int]]] | None:
        """The next planned unit whose bytes are to be fetched (units read locally or unlocated are skipped)."""
        for _ in range(_MAX_SKIPPED):  # an endless plan of unlocated units (ORC) must not hold the reader
            if self._next is not None:
                break
            if not self._ahead:
                batch = self._located_batch()
                if not batch:
                    return None  # the plan's end, or footers still being read while the reader has units
                self._ahead.extend(batch)
            key = self._ahead.popleft()
            ranges = self.dataset.unit_ranges(*key)
            if ranges is not None:
                self._next = (key, ranges)
        return self._next

    def _located_batch(self) -> list[Unit] | None:
        """The next `_LOCATE_AHEAD` planned units, once their files' footers are read (`ShardDataset.locate_files`,
        in the pool, the following batch started at once); None while they are read and the reader has units in
        the window (it is not held), or at the plan's end."""
        if self._locating is None:
            self._locating = self._locate(list(itertools.islice(self._plan, _LOCATE_AHEAD)))
        batch, future = self._locating
        if not batch:
            return None
        if future is not None and not future.done() and self._units > 0:
            return None
        self._locating = None
        if future is not None:
            future.result()  # a changed file's ShardChangedError surfaces here
        self._locating = self._locate(list(itertools.islice(self._plan, _LOCATE_AHEAD)))
        return batch

    def _locate(self, batch: list[Unit]) -> tuple[list[Unit], Any]:
        unlocated = getattr(self.dataset, "unlocated", None)
        files = [] if unlocated is None else unlocated([file_id for file_id, _ in batch])
        if not files:  # every footer read already (a dataset scanned at construction): nothing to wait for
            return batch, None
        return batch, self.dataset.remote.submit(self.dataset.locate_files, files)

    def _fill(self) -> None:
        """Submit the next planned units while the budget allows, consecutive units of a file coalesced (and the
        footers of files known from a manifest read in the background, `_LOCATE_AHEAD` units' files at a time)."""
        while True:
            group: list[tuple[Unit, list[tuple[int, int]]]] = []
            full = False
            while (upcoming := self._peek()) is not None:
                key, ranges = upcoming
                if group and key[0] != group[0][0][0]:
                    break  # another file: submit this group, then go on
                # What the requests would hold, holes between coalesced ranges included.
                grown = sum(n for _, n in coalesce([r for _, rs in group for r in rs] + ranges))
                if group and grown > MAX_REQUEST_BYTES:
                    break
                units = self._units + len(group) + 1
                if (self._held + grown > self.budget and (self._held or group)) or (
                        self._max_units is not None and units > self._max_units):
                    full = True
                    break
                group.append(upcoming)
                self._next = None
            if group:
                self._submit(group)
            if full or not group:
                return

    def _submit(self, group: list[tuple[Unit, list[tuple[int, int]]]]) -> None:
        file_id = group[0][0][0]
        requests = [_Request(offset, length, self.dataset.fetch(file_id, offset, length))
                    for offset, length in coalesce([r for _, ranges in group for r in ranges])]
        for key, ranges in group:
            used = [r for r in requests if any(r.offset <= o and o + n <= r.offset + r.length for o, n in ranges)]
            for request in used:
                request.users += 1
            self._window.setdefault(key, deque()).append(used)
            self._units += 1
        self._held += sum(r.length for r in requests)
        self.peak_bytes = max(self.peak_bytes, self._held)
        self._gauge()

    def _gauge(self) -> None:
        if self.stats is not None:
            self.stats.set_gauge("readahead_bytes", self._held)
            self.stats.set_gauge("readahead_peak_bytes", max(self.stats.gauges.get("readahead_peak_bytes", 0),
                                                             self._held))
