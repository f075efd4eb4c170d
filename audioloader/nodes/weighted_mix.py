"""WeightedMix: several source nodes interleaved at weights, each draw a pure function of its counter."""

from __future__ import annotations

import bisect
import contextlib
import itertools
from collections.abc import Mapping
from typing import Any

from torchdata.nodes import BaseNode

from ..dsp.hashing import SALT_MIX, uniform
from ..errors import CheckpointMismatchError
from ..samples import Key
from ..stats import LoaderStats

#: What an exhausted source does, the node's three behaviours (`audioloader.mix.stop_criterion` reads a user's choice,
#: torchdata's names included, as one of them).
STOPS = ("cycle", "first_exhausted", "all_exhausted")


def start_next_pass(node: BaseNode) -> None:
    """Make ``node`` start its next pass (a new split order, new keys).

    torchdata's rule, which `ArrowShardReader` follows: ``reset(None)`` starts the
    next pass only if the node was started (pulled) since its last reset. A node
    restored from a checkpoint and not pulled since would start its old pass
    again, so it is pulled once first (the item is dropped: its pass is over).
    """
    with contextlib.suppress(StopIteration):
        next(node)
    node.reset(None)


class WeightedMix(BaseNode):
    """Interleaves ``sources`` at ``weights``; each item's key gets its source's position (``Key.source``).

    Draw ``d`` of epoch ``e`` takes the source whose share of the cumulative
    weights (over the sources still active) holds ``uniform(seed, SALT_MIX, rank, e, d)``:
    a counter-based hash, like the shuffle buffer's picks, so the interleaving
    is a pure function of the seed, the rank and the draw number, and a
    checkpoint needs only the counter. Over ``n`` draws a source of weight ``w``
    gives ``n w`` items, with a standard deviation of ``sqrt(n w (1 - w))``.

    Sources are nodes that end at the end of a pass (``ArrowShardReader(infinite=False)``);
    ``stop`` says what an exhausted source does (see `audioloader.Mix`):
    ``"cycle"`` starts its next pass (on the same draw), ``"all_exhausted"`` drops
    it until the epoch ends, ``"first_exhausted"`` ends the epoch. With
    ``infinite``, an ended epoch is followed by the next, every source at its
    next pass; without, ``next()`` raises ``StopIteration``.

    Why not torchdata's ``MultiNodeWeightedSampler``: its resume is exact too,
    but its draws come from ``torch.multinomial`` over a sequential generator
    whose state (a 5 KB tensor) would sit in every checkpoint and whose stream
    may change with the torch version; it cannot tell the items which source
    they came from; and its epoch reset restarts a restored, not yet pulled
    source at its old pass (see `start_next_pass`).

    Args:
        sources: ``{name: node}``; a source's position in this mapping is its id.
        weights: ``{name: weight}``, positive (normalised here).
        stop: ``"cycle"``, ``"first_exhausted"`` or ``"all_exhausted"`` (`STOPS`; torchdata's names through
            `audioloader.mix.stop_criterion`).
        infinite: start a new epoch after one ends (meaningless with ``"cycle"``, which never ends).
        seed, rank: seed the draws (ranks draw independently).
        stats: optional `LoaderStats`: per source ``rows_read`` and ``passes``.

    State: ``{"sources": {name: state}, "exhausted": {name: bool}, "epoch": e, "draws": d}``.
    """

    SOURCES_KEY, EXHAUSTED_KEY, EPOCH_KEY, DRAWS_KEY = "sources", "exhausted", "epoch", "draws"

    def __init__(self, sources: Mapping[str, BaseNode], weights: Mapping[str, float], *, stop: str = "cycle",
                 infinite: bool = False, seed: int = 0, rank: int = 0, stats: LoaderStats | None = None) -> None:
        super().__init__()
        if not sources or set(sources) != set(weights):
            raise ValueError(f"WeightedMix needs one weight per source: sources {list(sources)}, "
                             f"weights {list(weights)}")
        for name, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"WeightedMix weight of {name!r} is {weight!r}: weights must be positive numbers")
        self.names = list(sources)
        self.nodes = [sources[name] for name in self.names]
        total = float(sum(weights.values()))
        self.weights = [weights[name] / total for name in self.names]
        if stop not in STOPS:
            raise ValueError(f"stop={stop!r}: must be one of {STOPS}; audioloader.mix.stop_criterion reads "
                             "torchdata's StopCriteria names as one of them")
        self.stop = stop
        self.infinite = bool(infinite)
        self.seed, self.rank = int(seed), int(rank)
        self.stats = stats
        self._epoch = 0
        self._draws = 0
        self._exhausted = [False] * len(self.nodes)
        self._started = False

    # ------------------------------------------------------------------ torchdata contract

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            self._restore(initial_state)
        else:
            if self._started:  # as torchdata's samplers: a new epoch only if this one was started
                self._start_epoch(self._epoch + 1)
            else:
                self._draws, self._exhausted = 0, [False] * len(self.nodes)
                for s, node in enumerate(self.nodes):
                    node.reset(None)
                    self._count(s, "passes")
        self._started = False

    def _restore(self, state: dict[str, Any]) -> None:
        try:
            sources, exhausted = state[self.SOURCES_KEY], state[self.EXHAUSTED_KEY]
            epoch, draws = int(state[self.EPOCH_KEY]), int(state[self.DRAWS_KEY])
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointMismatchError(f"WeightedMix state lacks a valid {error}; expected "
                                          "{'sources', 'exhausted', 'epoch', 'draws'}") from None
        if list(sources) != self.names:
            raise CheckpointMismatchError(f"this checkpoint mixes the sources {list(sources)}, this mix "
                                          f"{self.names}; build the mix with the checkpoint's sources",
                                          {"sources": (list(sources), self.names)})
        self._epoch, self._draws = epoch, draws
        self._exhausted = [bool(exhausted[name]) for name in self.names]
        for name, node in zip(self.names, self.nodes, strict=True):
            node.reset(sources[name])

    def next(self) -> Any:
        self._started = True
        while True:
            if self._epoch_over():
                if not self.infinite:
                    raise StopIteration
                self._start_epoch(self._epoch + 1)
            s = self._draw()
            self._draws += 1
            try:
                item = next(self.nodes[s])
            except StopIteration:
                if self.stop != "cycle":
                    self._exhausted[s] = True
                    continue
                item = self._restart(s)
            self._count(s, "rows_read")
            if s:
                key = item.key
                item.key = Key(key.index, key.pass_index, s)
            return item

    def get_state(self) -> dict[str, Any]:
        return {
            self.SOURCES_KEY: {name: node.state_dict() for name, node in zip(self.names, self.nodes, strict=True)},
            self.EXHAUSTED_KEY: dict(zip(self.names, self._exhausted, strict=True)),
            self.EPOCH_KEY: self._epoch,
            self.DRAWS_KEY: self._draws,
        }

    # ------------------------------------------------------------------ the mix

    def _draw(self) -> int:
        """The source of the current draw, among those not exhausted, by weight."""
        active = [s for s, done in enumerate(self._exhausted) if not done]
        cumulative = list(itertools.accumulate(self.weights[s] for s in active))
        u = uniform(self.seed, SALT_MIX, self.rank, self._epoch, self._draws) * cumulative[-1]
        return active[min(bisect.bisect_right(cumulative, u), len(active) - 1)]

    def _epoch_over(self) -> bool:
        if self.stop == "first_exhausted":
            return any(self._exhausted)
        return all(self._exhausted)  # never for "cycle": nothing is marked exhausted

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._draws, self._exhausted = epoch, 0, [False] * len(self.nodes)
        for s, node in enumerate(self.nodes):
            start_next_pass(node)
            self._count(s, "passes")

    def _restart(self, s: int) -> Any:
        """Source ``s`` ran out: start its next pass and return its first item."""
        self.nodes[s].reset(None)  # it was just pulled, so this starts the next pass
        self._count(s, "passes")
        try:
            return next(self.nodes[s])
        except StopIteration:
            raise ValueError(f"source {self.names[s]!r} has no rows for rank {self.rank}: a mix cannot cycle "
                             "an empty source; give it rows or leave it out") from None

    def _count(self, s: int, name: str) -> None:
        if self.stats is not None:
            self.stats.count_source(s, name)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={w:.3g}" for n, w in zip(self.names, self.weights, strict=True))
        return f"WeightedMix({parts}, stop={self.stop!r}, infinite={self.infinite})"
