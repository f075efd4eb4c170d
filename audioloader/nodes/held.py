"""What a node's state says about the rows under it: the protocol that lets `audioloader.elastic` walk a chain.

An elastic resume (a run's checkpoints resumed on another number of ranks) must know
which rows every old rank had read and not yet delivered. Each node type answers for a
state of its own with the classmethod ``rows_held(state) -> RowsHeld``: the state of the
node it pulls from, as recorded in its own, the keys of the rows it holds (read, not
passed on), and, for a stage that records its source's state only now and then, the keys
it passed on since. It needs no node: an elastic resume reads the old ranks' states
before any chain exists (`audioloader.chain.chain_layers` gives the node types of a
chain, root first, as `build_chain` wires them). `audioloader.elastic` goes down the
layers to the `ArrowShardReader` (whose state is a position in its read order) and adds
up the keys; it never needs to know another node's state's keys. torchdata's own nodes
answer through `audioloader.nodes._torchdata_compat.rows_held`.

A node whose state holds no rows and nests its source's state under a key says so
with `nested`; one that passes its source's state through unchanged with `passed_through`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dsp.hashing import item_checksum
from ..errors import CheckpointMismatchError
from ..samples import Key, held_bytes, item_key


@dataclass
class RowsHeld:
    """What one node's state says about the rows under it.

    Attributes:
        source_state: the state of the node it pulls from, as this node's state recorded it (its snapshot).
        held: keys of the rows it read from its source (after ``source_state`` was taken) and has not passed on.
        emitted: keys of the rows it passed on after ``source_state`` was taken (None: it records its
            source's state with every item, so none).
    """

    source_state: dict[str, Any] | None
    held: list[Key] = field(default_factory=list)
    emitted: list[Key] | None = None


@dataclass(frozen=True)
class ItemFns:
    """How a node that holds items (`ShuffleBuffer`, `DurationBucketer`) reads them, as one group: ``key``
    (item -> its `Key`, what a keys-only state records), ``checksum`` (item -> a 32-bit int identifying its
    content, checked when the items are read back on resume) and ``size`` (item -> the bytes it keeps alive,
    counted against the byte budgets). The defaults fit `RawSample` and `Sample`."""

    key: Callable[[Any], Key] = item_key
    checksum: Callable[[Any], int] = item_checksum
    size: Callable[[Any], int] = held_bytes


#: The item functions of rows and samples (`ItemFns`' defaults).
ROW_ITEMS = ItemFns()


def nested(state: dict[str, Any], key: str) -> RowsHeld:
    """A node that holds no rows and keeps its source's state under ``key`` of its own."""
    return RowsHeld(state[key])


def passed_through(state: dict[str, Any]) -> RowsHeld:
    """A node that holds no rows and whose state is its source's (a batch-level transform)."""
    return RowsHeld(state)


def at_snapshot(state: dict[str, Any]) -> RowsHeld:
    """A node that runs its source in a background thread and records ``{"snapshot", "steps_since_snapshot"}``
    (torchdata's ``Prefetcher`` and ``PinMemory``): only a state taken at a snapshot says what it holds."""
    if int(state.get("steps_since_snapshot", 0)):
        raise CheckpointMismatchError("the prefetcher's state is not at a snapshot; cannot redistribute it",
                                      {"prefetcher": (state.get("steps_since_snapshot"), 0)})
    return RowsHeld(state["snapshot"])


def as_keys(pairs: Iterable[Sequence[int]]) -> list[Key]:
    """``[[index, pass], ...]`` (as states store keys) as `Key` s."""
    return [Key(int(pair[0]), int(pair[1])) for pair in pairs]
