"""Always-on loader counters: cheap enough for the hot path (a lock and a few adds)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from typing import Any

from .samples import BadRow

#: How many bad-row records `LoaderStats` keeps for the report (the count is exact regardless).
MAX_REPORTED_BAD_ROWS = 1000


class LoaderStats:
    """Thread-safe counters shared by the nodes of one chain.

    ``counters``: named integers (``samples``, ``batches``, ``rows_read`` ...).
    ``seconds``: wall seconds spent per stage (``read``, ``decode``, ``resample``,
    ``mel``, ``wait``), summed over threads, so they can exceed elapsed time.
    ``bad_rows``: the most recent `MAX_REPORTED_BAD_ROWS` reports of rows that could
    not be decoded; ``skipped_rows``: of rows the length policy left out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.gauges: dict[str, Any] = {}
        self.bad_rows: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)
        self.skipped_rows: deque[dict[str, Any]] = deque(maxlen=MAX_REPORTED_BAD_ROWS)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def add_seconds(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] += seconds

    def set_gauge(self, name: str, value: Any) -> None:
        self.gauges[name] = value

    @contextmanager
    def timed(self, stage: str):
        """``with stats.timed("decode"): ...`` adds the block's wall time to ``stage``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_seconds(stage, time.perf_counter() - start)

    def record_bad_row(self, bad: BadRow) -> None:
        with self._lock:
            self.counters["bad_rows"] += 1
            self.bad_rows.append(bad.report())

    def record_skipped_row(self, skipped: BadRow) -> None:
        """A row the length policy left out (not an error): counted and reported apart from bad rows."""
        with self._lock:
            self.counters["skipped_rows"] += 1
            self.skipped_rows.append(skipped.report())

    def drain(self) -> dict[str, Any]:
        """Counters and seconds gathered since the last drain, and start again from zero.

        A worker process's stats are drained after each chunk and `merge` d into the
        consumer's.
        """
        with self._lock:
            delta = {"counters": dict(self.counters), "seconds": dict(self.seconds)}
            self.counters.clear()
            self.seconds.clear()
        return delta

    def merge(self, delta: dict[str, Any]) -> None:
        """Add a `drain` result from another process."""
        with self._lock:
            for name, n in delta.get("counters", {}).items():
                self.counters[name] += n
            for stage, seconds in delta.get("seconds", {}).items():
                self.seconds[stage] += seconds

    def __reduce__(self):
        # Sent to a worker process as part of a job: there it starts empty (see `drain`).
        return (LoaderStats, ())

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy: ``{"counters", "seconds", "gauges", "bad_rows", "skipped_rows"}``."""
        with self._lock:
            return {
                "counters": dict(self.counters),
                "seconds": dict(self.seconds),
                "gauges": dict(self.gauges),
                "bad_rows": list(self.bad_rows),
                "skipped_rows": list(self.skipped_rows),
            }
