"""Retries of remote reads: transient faults (HTTP 5xx, a reset connection, a timeout) are tried again.

Every read of a remote shard (listing, footer scan, a record batch or row group)
goes through `with_retries`: a failed attempt is retried after a capped
exponential backoff with jitter, and after the last attempt a `ShardReadError`
names the object, the attempts and the last error. A read is all or nothing (a
whole record batch / row group, or a whole footer scan), so a retry can neither
lose nor duplicate a row. Local files are never retried: their errors are not
transient.

The jitter comes from a private ``random.Random`` seeded by the OS: it only
spreads the retries of many ranks apart in time, and never touches the data's
randomness (which is a pure function of the seed and the keys).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from ..errors import ShardReadError

T = TypeVar("T")

_JITTER = random.Random()  # independent of the user's and the data's randomness
_JITTER_LOCK = threading.Lock()


@dataclass(frozen=True)
class Retry:
    """How remote reads are retried.

    Attributes:
        attempts: tries per read, the first included (>= 1).
        initial_delay: seconds before the second try; doubles each time ...
        max_delay: ... up to this cap. Each wait is drawn uniformly from
            ``[delay / 2, delay]`` (jitter, so many ranks do not retry in step).
        timeout: seconds a request may stall (no byte received) before it counts as
            failed. Applied to the S3 filesystems audioloader builds from ``s3://``
            URLs; a ``filesystem=`` you pass keeps its own settings.
    """

    attempts: int = 5
    initial_delay: float = 0.2
    max_delay: float = 10.0
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts={self.attempts!r}: must be an integer >= 1")
        for name in ("initial_delay", "max_delay", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Retry.{name}={value!r}: must be a number of seconds >= 0")
        if self.timeout == 0:
            raise ValueError("Retry.timeout=0: must be > 0 seconds")

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed attempts (1, 2, ...), jitter included."""
        cap = min(self.max_delay, self.initial_delay * 2 ** (failures - 1))
        with _JITTER_LOCK:
            return cap * (0.5 + 0.5 * _JITTER.random())


DEFAULT_RETRY = Retry()


def is_transient(error: BaseException) -> bool:
    """Whether a failed remote read may succeed when tried again.

    Missing objects, refused permissions and our own checks (`ShardReadError`:
    a shard that changed) are final; other I/O errors (HTTP 5xx, resets,
    timeouts) and short reads that break parsing are worth another try.
    """
    if isinstance(error, (ShardReadError, FileNotFoundError, PermissionError)):
        return False
    text = str(error)
    if "AccessDenied" in text or "HTTP response code: 403" in text or "NoSuchKey" in text or "NoSuchBucket" in text:
        return False
    return isinstance(error, (OSError, EOFError, pa.ArrowInvalid))


def with_retries(read: Callable[[], T], *, what: str, retry: Retry, on_failure: Callable[[], Any] | None = None,
                 sleep: Callable[[float], Any] = time.sleep) -> T:
    """``read()``, tried up to ``retry.attempts`` times while it fails with a transient error.

    ``on_failure()`` runs after each failed attempt (e.g. to drop a file handle
    whose connection broke). ``what`` names the object in the final error.
    """
    start = time.monotonic()
    attempts = 0
    while True:
        try:
            return read()
        except Exception as error:
            if not is_transient(error):
                raise
            attempts += 1
            if on_failure is not None:
                on_failure()
            if attempts == retry.attempts:
                raise ShardReadError(
                    f"cannot read {what}: {attempts} attempt{'s' if attempts > 1 else ''} failed over "
                    f"{time.monotonic() - start:.1f} s; last error: {str(error).strip()}. Check the storage "
                    "endpoint and the network; Retry(attempts=..., timeout=...) sets how hard to try") from error
            sleep(retry.delay(attempts))
