"""The request rate a store accepts, learned from its refusals: one AIMD rate limiter per store, per process.

A store that is asked too fast refuses requests (S3: ``503 SlowDown``, about 5,500
GET/HEAD a second per prefix while it scales; HTTP stores: ``429 Too Many
Requests``). Trying again at once, or on a fixed backoff, from every thread of
every rank, keeps the store overloaded. Instead each process keeps, per store,
the rate it may send at (`StoreRate`):

- until the first refusal there is no limit (nothing is waited, nothing is measured
  but a count of recent requests);
- a refusal halves the rate (multiplicative decrease): from the rate actually sent
  in the last second, or from the current limit, whichever is lower. Refusals of
  requests sent before the last decrease do not halve it again (they were sent at
  the old rate, and say nothing new), so 24 requests refused at once halve it once;
- each success raises it by `INCREASE` requests a second (additive increase), so the
  rate creeps back up at about 1/8 of itself a second while the store accepts it;
- every request to the store waits for its slot (a token bucket of that rate, with
  a burst of `BURST_SECONDS` of it), and a retried request waits for its slot too,
  after its own backoff (`audioloader.shards.retry`): never a tight loop.

All threads of a process share a store's limiter (`store_rate`), so the pace is the
process's, however many requests it has in flight. Processes (ranks) learn their
own rates from the refusals they get; as for TCP, AIMD makes many of them converge
on a fair share of what the store accepts.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

#: Requests a second a limited rate never goes below (a store that refuses everything is still asked, slowly).
FLOOR = 0.5
#: Requests a second added to the rate per successful request.
INCREASE = 0.125
#: Requests a limited store may get at once after an idle time: this many seconds of its rate (at least 1).
BURST_SECONDS = 0.1
#: The window over which the rate actually sent is measured (seconds).
WINDOW = 1.0


class StoreRate:
    """The rate one store accepts, as this process has learned it (see the module docstring). Thread-safe.

    Attributes:
        name: the store (`store_of`).
        rate: requests a second allowed, or None (no refusal seen yet: no limit).
        throttled: refusals seen (since creation); decreases: how many of them halved the rate.
        waited: seconds requests spent waiting for their slot (all threads together).
    """

    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        self.name = name
        self.rate: float | None = None
        self.throttled = self.decreases = 0
        self.waited = 0.0
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._sent: deque[float] = deque()  # when each request of the last WINDOW seconds was sent
        self._next_slot = 0.0  # the token bucket, as the time its next request may go (GCRA)
        self._epoch = 0  # decreases so far: a request remembers the epoch it was sent in

    def acquire(self) -> tuple[int, float]:
        """Wait for this request's slot; returns ``(epoch, seconds waited)`` (the epoch goes back to `refused`)."""
        with self._lock:
            now = self._clock()
            self._sent.append(now)
            while self._sent and self._sent[0] < now - WINDOW:
                self._sent.popleft()
            if self.rate is None:
                return self._epoch, 0.0
            interval = 1.0 / self.rate
            slot = max(self._next_slot, now - (max(1.0, self.rate * BURST_SECONDS) - 1.0) * interval)
            self._next_slot = slot + interval
            wait = max(0.0, slot - now)
            self.waited += wait
            epoch = self._epoch
        if wait > 0:
            self._sleep(wait)
        return epoch, wait

    def refused(self, epoch: int) -> None:
        """A request sent in ``epoch`` was refused (throttled): halve the rate, once per epoch."""
        with self._lock:
            self.throttled += 1
            if epoch != self._epoch:
                return  # sent before the last decrease: already answered
            sent = len(self._sent) / WINDOW
            current = sent if self.rate is None else min(self.rate, max(sent, FLOOR))
            self.rate = max(FLOOR, current / 2)
            self._epoch += 1
            self.decreases += 1
            self._next_slot = max(self._next_slot, self._clock() + 1.0 / self.rate)

    def succeeded(self) -> None:
        """A request was served: the rate may grow (additive increase)."""
        if self.rate is not None:  # unlocked read: a lost increase costs nothing
            with self._lock:
                if self.rate is not None:
                    self.rate += INCREASE

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"store": self.name, "rate": self.rate, "throttled": self.throttled,
                    "decreases": self.decreases, "waited_s": round(self.waited, 3)}


def store_of(path: str) -> str:
    """The store an object's URL or path belongs to: ``scheme://bucket`` (``s3://b/k`` -> ``s3://b``), or for a
    path inside a filesystem, its first component (``bucket/key`` -> ``bucket``). User-info and query left out."""
    parsed = urllib.parse.urlsplit(path)
    if parsed.scheme and parsed.netloc:
        return f"{parsed.scheme}://{parsed.hostname or ''}{'' if parsed.port is None else f':{parsed.port}'}"
    return path.lstrip("/").split("/", 1)[0]


_RATES: dict[str, StoreRate] = {}
_RATES_LOCK = threading.Lock()


def store_rate(path: str) -> StoreRate:
    """This process's `StoreRate` of the store ``path`` lies in (made at the first call)."""
    name = store_of(path)
    with _RATES_LOCK:
        rate = _RATES.get(name)
        if rate is None:
            rate = _RATES[name] = StoreRate(name)
        return rate


def forget_rates() -> None:
    """Start over: every store unlimited again. A forked child does (the parent's locks may be held by threads that
    did not fork, and its rates are its own to learn)."""
    global _RATES_LOCK
    _RATES.clear()
    _RATES_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_rates)
