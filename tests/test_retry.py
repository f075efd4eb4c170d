"""Retry: capped exponential backoff with jitter, final errors naming the object and the attempts."""

from __future__ import annotations

import pytest

import audioloader as al
from audioloader.shards.retry import with_retries


def flaky(failures: int, error: Exception):
    calls = []

    def read():
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "data"

    return read, calls


def test_transient_faults_are_retried_with_capped_exponential_backoff():
    read, calls = flaky(5, OSError("AWS Error SLOW_DOWN (HTTP status 503)"))
    waits = []
    retry = al.Retry(attempts=6, initial_delay=0.1, max_delay=0.3)
    assert with_retries(read, what="x", retry=retry, sleep=waits.append) == "data"
    assert len(calls) == 6 and len(waits) == 5
    caps = [0.1, 0.2, 0.3, 0.3, 0.3]
    assert all(cap / 2 <= wait <= cap for wait, cap in zip(waits, caps, strict=True))
    assert len(set(waits)) > 1  # jittered


def test_the_last_failure_names_the_object_and_the_attempts():
    read, calls = flaky(10, ConnectionResetError("Connection reset by peer"))
    dropped = []
    with pytest.raises(al.ShardReadError) as info:
        with_retries(read, what="batch/row group 2 of shard s3://b/p.arrow", retry=al.Retry(attempts=3),
                     on_failure=lambda: dropped.append(1), sleep=lambda s: None)
    assert len(calls) == 3 and len(dropped) == 3
    assert "batch/row group 2 of shard s3://b/p.arrow: 3 attempts failed" in str(info.value)
    assert "Connection reset by peer" in str(info.value)


@pytest.mark.parametrize("error", [FileNotFoundError("gone"), PermissionError("no"),
                                   OSError("AWS Error ACCESS_DENIED: AccessDenied"),
                                   al.ShardReadError("shard x changed while it was being read")])
def test_final_errors_are_not_retried(error):
    read, calls = flaky(10, error)
    with pytest.raises(type(error)):
        with_retries(read, what="x", retry=al.Retry(attempts=5), sleep=lambda s: None)
    assert len(calls) == 1


def test_retry_arguments_are_checked():
    with pytest.raises(ValueError, match="attempts"):
        al.Retry(attempts=0)
    with pytest.raises(ValueError, match="timeout"):
        al.Retry(timeout=0)
    with pytest.raises(TypeError, match="Retry"):
        al.AudioLoader("unused", retry=3)
