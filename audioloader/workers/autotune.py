"""How many worker processes get work, decided while the loader runs (``Workers(num_workers="auto")``).

After tf.data's AUTOTUNE, in its simplest form: a hill climb on what the consumer
sees. Every `WINDOW_SECONDS` of the stream the `Autotuner` is told how many items
the consumer took and how long it waited for workers:

- it **adds** a worker when the consumer waited more than `WAIT_TO_ADD` of the window
  (the workers are the bottleneck) and fewer than ``maximum`` work; one window
  later (the chunks in flight were handed out under the old count) it compares the
  next `JUDGE_WINDOWS` windows' items/s with the rate before: less than `MIN_GAIN` better (the cores
  are busy: with this process's own training loop, or other processes) and the worker
  is retired again, and no worker is added for `HOLD_SECONDS`;
- it **retires** a worker after `IDLE_WINDOWS` windows in a row where the consumer
  did not wait (less than `IDLE_WAIT`): fewer workers leave cores to the training
  loop and hold less memory; if the consumer then waits, or the rate drops by
  `MIN_GAIN`, the worker comes back and none is retired for `HOLD_SECONDS`.

Which worker computes which item never changes an item (every result is a pure
function of the item), so none of this changes a batch or a checkpoint. It is pure
bookkeeping: the caller measures, and applies the counts it returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Seconds of stream between two decisions.
WINDOW_SECONDS = 1.0
#: Add a worker when the consumer waited more than this fraction of a window.
WAIT_TO_ADD = 0.05
#: A change must not cost (or, for an added worker, must gain) more than this fraction of items/s.
MIN_GAIN = 0.05
#: A window in which the consumer waited less than this fraction is idle ...
IDLE_WAIT = 0.01
#: ... and after this many idle windows in a row a worker is retired.
IDLE_WINDOWS = 5
#: Windows a change is judged on (after one that settles it): rates on a shared machine vary by 10% a window.
JUDGE_WINDOWS = 2
#: Seconds a count that was tried and undone is not tried again.
HOLD_SECONDS = 30.0
#: Decisions kept for `stats()` (the latest).
MAX_DECISIONS = 64


@dataclass(frozen=True)
class Decision:
    """One change of the worker count: ``seconds`` since the stream started, ``from_count -> to_count``, why."""

    seconds: float
    from_count: int
    to_count: int
    reason: str

    def as_tuple(self) -> tuple[float, int, int, str]:
        return (round(self.seconds, 3), self.from_count, self.to_count, self.reason)


def initial_guess(maximum: int) -> int:
    """Workers to start with: the cores the machine leaves free (its cores less the 1-minute load average), at
    least 1 and at most ``maximum``."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform: start from the cores
        load = 0.0
    free = (os.cpu_count() or 1) - load
    return max(1, min(maximum, round(free)))


class Autotuner:
    """Decides the number of working workers, between 1 and ``maximum``, from the consumer's waits.

    Args:
        maximum: the workers there are.
        initial: the count to start from (`initial_guess`).
    """

    def __init__(self, maximum: int, initial: int) -> None:
        if maximum < 1:
            raise ValueError(f"maximum={maximum}: an autotuned pool needs at least one worker")
        self.maximum = maximum
        self.count = max(1, min(maximum, initial))
        self.decisions: list[Decision] = []
        self._start: float | None = None
        self._window_start = 0.0
        self._items = 0
        self._waited = 0.0
        self._idle = 0
        self._trial: tuple[str, float, int] | None = None  # ("add" | "retire", items/s before, count before)
        self._settling = False
        self._judged: list[tuple[float, float]] = []  # (items/s, wait) of the windows since a trial settled
        self._no_more_until = 0.0  # no add before this time (an add that did not pay)
        self._no_fewer_until = 0.0  # no retire before this time (a retire that cost)

    def start(self, now: float) -> None:
        """The stream starts (again) at ``now`` (seconds, a monotonic clock)."""
        if self._start is None:
            self._start = now
        self._window_start, self._items, self._waited = now, 0, 0.0
        self._trial, self._settling, self._idle, self._judged = None, False, 0, []

    def record(self, items: int, waited: float) -> None:
        """The consumer took ``items`` items and waited ``waited`` seconds for them."""
        self._items += items
        self._waited += waited

    def tick(self, now: float) -> int | None:
        """The new count when a window ended at ``now`` and it changes, else None."""
        if self._start is None:
            self.start(now)
        elapsed = now - self._window_start
        if elapsed < WINDOW_SECONDS:
            return None
        rate, wait = self._items / elapsed, self._waited / elapsed
        self._window_start, self._items, self._waited = now, 0, 0.0
        return self._decide(now, rate, wait, elapsed)

    def _decide(self, now: float, rate: float, wait: float, elapsed: float) -> int | None:
        if self._trial is not None:
            if self._settling:  # this window's chunks were handed out under the old count
                self._settling = False
                return None
            self._judged.append((rate, wait))
            if len(self._judged) < JUDGE_WINDOWS:
                return None
            rates, waits = zip(*self._judged, strict=True)
            self._judged = []
            return self._judge(now, sum(rates) / len(rates), sum(waits) / len(waits))
        if wait > WAIT_TO_ADD and self.count < self.maximum and now >= self._no_more_until:
            return self._change(now, self.count + 1, "add", rate,
                                f"the consumer waited {wait:.0%} of {elapsed:.1f} s at {rate:.0f} items/s")
        self._idle = self._idle + 1 if wait < IDLE_WAIT else 0
        if self._idle >= IDLE_WINDOWS and self.count > 1 and now >= self._no_fewer_until:
            return self._change(now, self.count - 1, "retire", rate,
                                f"the consumer did not wait in {self._idle} windows ({rate:.0f} items/s)")
        return None

    def _judge(self, now: float, rate: float, wait: float) -> int | None:
        kind, before, count_before = self._trial
        self._trial = None
        if kind == "add" and rate < before * (1 + MIN_GAIN):
            self._no_more_until = now + HOLD_SECONDS
            return self._change(now, count_before, None, rate,
                                f"{self.count} workers gave {rate:.0f} items/s against {before:.0f} with "
                                f"{count_before}: less than {MIN_GAIN:.0%} more")
        if kind == "retire" and (wait > WAIT_TO_ADD or rate < before * (1 - MIN_GAIN)):
            self._no_fewer_until = now + HOLD_SECONDS
            return self._change(now, count_before, None, rate,
                                f"with {self.count} the consumer waited {wait:.0%} and got {rate:.0f} items/s "
                                f"against {before:.0f}")
        return None

    def _change(self, now: float, count: int, trial: str | None, rate: float, reason: str) -> int:
        """Go to ``count`` for ``reason``; a ``trial`` ("add" / "retire") is judged after the next window."""
        since = now - self._start if self._start is not None else 0.0
        self.decisions.append(Decision(since, self.count, count, reason))
        del self.decisions[:-MAX_DECISIONS]
        if trial is not None:
            self._trial, self._settling = (trial, rate, self.count), True
        self.count = count
        self._idle = 0
        return count

    def report(self) -> dict[str, object]:
        """``{"count", "maximum", "autotune": [(seconds, from, to, reason), ...]}`` for `stats()`."""
        return {"count": self.count, "maximum": self.maximum,
                "autotune": [d.as_tuple() for d in self.decisions]}
