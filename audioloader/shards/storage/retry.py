"""Retries of remote reads: transient faults (HTTP 5xx, a reset connection, a timeout) are tried again.

Every read of a remote shard (listing, footer scan, a record batch or row group)
goes through `with_retries`: a failed attempt is retried after a capped
exponential backoff with jitter, and after the last attempt a `ShardReadError`
names the object, the attempts and the last error. A refused request (credentials,
permissions: `is_access_refused`) is never retried: it raises `AccessDeniedError`
at once, saying what to check. A read is all or nothing (a
whole record batch / row group, or a whole footer scan), so a retry can neither
lose nor duplicate a row. Local files are never retried: their errors are not
transient.

The jitter comes from a private ``random.Random`` seeded by the OS: it only
spreads the retries of many ranks apart in time, and never touches the data's
randomness (which is a pure function of the seed and the keys).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from ... import checks
from ...errors import AccessDeniedError, ShardReadError, redacted
from .throttle import store_rate

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
            ``[delay / 2, delay]`` (jitter, so many ranks do not retry in step); after a throttled
            request from ``[0, delay]`` (full jitter: many ranks refused at once spread out most).
        timeout: seconds a request may stall (no byte received) before it counts as
            failed. Applied to the S3 filesystems audioloader builds from ``s3://``
            URLs; a ``filesystem=`` you pass keeps its own settings.
    """

    attempts: int = 5
    initial_delay: float = 0.2
    max_delay: float = 10.0
    timeout: float = 30.0

    def __post_init__(self) -> None:
        checks.field_count(self, "attempts")
        for name in ("initial_delay", "max_delay", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Retry.{name}={value!r}: must be a number of seconds >= 0")
        if self.timeout == 0:
            raise ValueError("Retry.timeout=0: must be > 0 seconds")

    def delay(self, failures: int, full_jitter: bool = False) -> float:
        """Seconds to wait after ``failures`` failed attempts (1, 2, ...), jitter included (``full_jitter``: drawn
        from ``[0, cap]`` instead of ``[cap / 2, cap]``)."""
        cap = min(self.max_delay, self.initial_delay * 2 ** (failures - 1))
        with _JITTER_LOCK:
            draw = _JITTER.random()
        return cap * draw if full_jitter else cap * (0.5 + 0.5 * draw)


DEFAULT_RETRY = Retry()


def checked_retry(retry: Any) -> Retry:
    """``retry`` as given (None: `DEFAULT_RETRY`); anything but a `Retry` is a TypeError naming the argument."""
    if retry is None:
        return DEFAULT_RETRY
    if not isinstance(retry, Retry):
        raise TypeError(f"retry must be an audioloader.Retry, got {type(retry).__name__}")
    return retry


# Error codes of a refused request, as S3 (and S3-compatible stores) send them, as pyarrow's S3 filesystem writes
# them (the AWS SDK's enum names), as GCS (google-cloud-cpp) and Azure write them. None of them passes by waiting.
_REFUSED_CODES = re.compile(r"\b(?:" + "|".join((
    "AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "RequestExpired", "InvalidClientTokenId",
    "MissingAuthenticationToken", "UnrecognizedClientException", "RequestTimeTooSkewed",
    "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "INVALID_CLIENT_TOKEN_ID",
    "MISSING_AUTHENTICATION_TOKEN", "REQUEST_EXPIRED", "UNRECOGNIZED_CLIENT", "INVALID_SIGNATURE",
    "INCOMPLETE_SIGNATURE", "REQUEST_TIME_TOO_SKEWED",
    "PERMISSION_DENIED", "UNAUTHENTICATED",
    "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
    "InsufficientAccountPermissions")) + r")\b")
# An HTTP status in the text: "HTTP status 403" (pyarrow, for a code the SDK does not know), "HTTP response
# code: 403", "status code 401", "403, message='Forbidden'" (aiohttp, under fsspec's http).
_REFUSED_STATUS = re.compile(r"(?:\b(?:HTTP|status|response code)\D{0,12}\b40[13]\b|\b40[13], message=)", re.IGNORECASE)
_EXPIRED_TOKEN = re.compile(r"\btoken (?:has|is) expired\b", re.IGNORECASE)  # S3's ExpiredToken, as message only


def is_access_refused(error: BaseException) -> bool:
    """Whether the storage refused a request: credentials, permissions, or a region / endpoint that is not theirs.

    By type (``PermissionError``: s3fs, gcsfs, local files; a ``code`` or ``status`` attribute of 401 / 403:
    HTTP clients) or by the error codes and statuses the storage clients write into their messages.
    """
    if isinstance(error, PermissionError) or _http_status(error) in (401, 403):
        return True
    text = str(error)
    return bool(_REFUSED_CODES.search(text) or _REFUSED_STATUS.search(text) or _EXPIRED_TOKEN.search(text))


# How the stores and clients say "too fast": S3's SlowDown (pyarrow: SLOW_DOWN; a HEAD has no body, so only its
# status), HTTP 429 / 503 in pyarrow's, aiohttp's and requests' words, AWS's and GCS's throttling codes, Azure's.
_THROTTLED = re.compile(r"\b(?:SlowDown|SLOW_DOWN|TooManyRequests|Too Many Requests|Throttling|ThrottlingException|"
                        r"THROTTLING|RequestLimitExceeded|REQUEST_LIMIT_EXCEEDED|rateLimitExceeded|"
                        r"Please reduce your request rate|ServerBusy)\b"
                        r"|(?:\b(?:HTTP|status|response code)\D{0,12}\b(?:429|503)\b|\b(?:429|503), message=)",
                        re.IGNORECASE)


def _http_status(error: BaseException) -> Any:
    """The HTTP status an error carries as an attribute, or None: aiohttp's ``status`` first (reading its
    deprecated ``code`` warns), then requests' ``status_code`` and urllib's ``code``."""
    for attribute in ("status", "status_code", "code"):
        status = getattr(error, attribute, None)
        if status is not None:
            return status
    return None


def _says_throttled(error: BaseException) -> bool:
    return _http_status(error) in (429, 503) or bool(_THROTTLED.search(str(error)))


def throttling(error: BaseException) -> BaseException | None:
    """The error in ``error``'s chain (itself, its causes) that says the store refused a request for being asked
    too fast, or None. fsspec's http filesystem raises ``FileNotFoundError(url)`` from aiohttp's ``429 Too Many
    Requests``: the status is kept there, in the cause."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _says_throttled(error):
            return error
        error = error.__cause__ or error.__context__
    return None


def is_throttled(error: BaseException) -> bool:
    """Whether the store refused a request for being asked too fast (S3's ``503 SlowDown``, HTTP ``429``, a
    throttling code; in the error or its causes): worth trying again, later, and worth slowing every request to
    that store down."""
    return throttling(error) is not None


def retry_after(error: BaseException) -> float | None:
    """Seconds a throttled HTTP response asked to wait (its ``Retry-After`` header, in seconds), or None."""
    cause = throttling(error)
    headers = getattr(cause, "headers", None)
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return None if value is None else max(0.0, float(value))
    except (AttributeError, TypeError, ValueError):  # an HTTP date, or headers of another shape: not used
        return None


def is_transient(error: BaseException) -> bool:
    """Whether a failed remote read may succeed when tried again.

    Missing objects, refused access (`is_access_refused`) and our own checks (`ShardReadError`:
    a shard that changed) are final; other I/O errors (HTTP 5xx, resets,
    timeouts) and short reads that break parsing are worth another try.
    """
    if is_throttled(error) and not isinstance(error, ShardReadError):
        return True  # also a "missing" file or a client error whose cause is a 429 / 503 (fsspec's http)
    if isinstance(error, (ShardReadError, FileNotFoundError)) or is_access_refused(error):
        return False
    text = str(error)
    if "NoSuchKey" in text or "NoSuchBucket" in text or "NO_SUCH_KEY" in text or "NO_SUCH_BUCKET" in text:
        return False
    return isinstance(error, (OSError, EOFError, pa.ArrowInvalid))


def refused(error: BaseException, what: str) -> AccessDeniedError:
    """The `AccessDeniedError` for ``error``, a refused read of ``what``: what to check, no secrets shown."""
    said = redacted(str(error).strip().rstrip("."))
    return AccessDeniedError(
        f"access to {redacted(what)} was refused by the storage: {said}. This is not retried. Check the "
        "credentials the storage client finds (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, "
        "AWS_PROFILE and ~/.aws/credentials, or the instance's / pod's role; a session token may have expired), that "
        "the bucket policy or the role allows reading the objects (s3:GetObject) and listing the prefix "
        "(s3:ListBucket), and the region and endpoint (AWS_DEFAULT_REGION, AWS_ENDPOINT_URL, or ?region= / "
        "?endpoint_override= on the URL): a request sent to another region or server is refused too")


def with_retries(read: Callable[[], T], *, what: str, retry: Retry, on_failure: Callable[[], Any] | None = None,
                 sleep: Callable[[float], Any] = time.sleep, store: str | None = None,
                 on_throttle: Callable[[bool, float], Any] | None = None) -> T:
    """``read()``, tried up to ``retry.attempts`` times while it fails with a transient error.

    ``on_failure()`` runs after each failed attempt (e.g. to drop a file handle
    whose connection broke). ``what`` names the object in the final error.
    ``store``: the object's URL (or path in its filesystem): each attempt first waits for its slot in the
    process's rate for that store (`audioloader.shards.throttle.store_rate`), and tells it whether the store
    throttled it. ``on_throttle(refused, seconds)`` is called for each throttled attempt (``refused=True``, with
    the backoff waited after it) and each wait for a slot (``refused=False``).
    """
    rate = store_rate(store) if store is not None else None
    start = time.monotonic()
    attempts = throttled = 0
    while True:
        epoch, waited = rate.acquire() if rate is not None else (0, 0.0)
        if waited and on_throttle is not None:
            on_throttle(False, waited)
        try:
            result = read()
        except Exception as error:
            if not isinstance(error, ShardReadError) and is_access_refused(error):
                raise refused(error, what) from error
            if not is_transient(error):
                raise
            attempts += 1
            slow_down = is_throttled(error)
            if slow_down:
                throttled += 1
                if rate is not None:
                    rate.refused(epoch)
            if on_failure is not None:
                on_failure()
            if attempts == retry.attempts:
                said = (f" ({throttled} of them refused for going too fast: the store accepts fewer requests than "
                        "this job sends; fewer ranks or Storage(max_requests=...) send fewer)" if throttled else "")
                raise ShardReadError(
                    f"cannot read {redacted(what)}: {attempts} attempt{'s' if attempts > 1 else ''} failed over "
                    f"{time.monotonic() - start:.1f} s{said}; last error: {_last_error(error)}. Check the "
                    "storage endpoint and the network; Retry(attempts=..., timeout=...) sets how hard to try"
                ) from error
            wait = retry.delay(attempts, full_jitter=slow_down)
            asked = retry_after(error) if slow_down else None
            if asked is not None:  # the store said how long: at least that, within the retry's cap
                wait = max(wait, min(asked, retry.max_delay))
            if slow_down and on_throttle is not None:
                on_throttle(True, wait)
            sleep(wait)
        else:
            if rate is not None:
                rate.succeeded()
            return result


def _last_error(error: BaseException) -> str:
    """What the last attempt's error said, with the throttling status its client put in a cause (fsspec's http:
    ``FileNotFoundError(url)`` from a 429), no secrets."""
    cause = throttling(error)
    said = str(error).strip()
    if cause is not None and cause is not error:
        said = f"{said} ({type(cause).__name__}: {str(cause).strip()})"
    return redacted(said)


class FSSpecHandler(pafs.FSSpecHandler):
    """pyarrow's handler of an fsspec filesystem, except that a path fsspec calls missing because the store
    throttled the request (fsspec's http raises ``FileNotFoundError`` from a ``429 Too Many Requests``) raises,
    to be retried, instead of being reported missing."""

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            try:
                info = self.fs.info(path)
            except FileNotFoundError as error:
                if is_throttled(error):
                    raise
                infos.append(pafs.FileInfo(path, pafs.FileType.NotFound))
            else:
                infos.append(self._create_file_info(path, info))
        return infos

    def open_input_file(self, path: str) -> pa.PythonFile:
        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def open_input_stream(self, path: str) -> pa.PythonFile:
        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def _check_file(self, path: str) -> None:
        """pyarrow asks ``fs.isfile``, which says False for any error (a 429 too): ask for the info instead."""
        if self.fs.info(path).get("type") != "file":
            raise FileNotFoundError(path)
