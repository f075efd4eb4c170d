"""Retry: capped exponential backoff with jitter, final errors naming the object and the attempts."""

from __future__ import annotations

import pytest

import audioloader as al
from audioloader.shards.storage.retry import is_access_refused, is_transient, with_retries


def flaky(failures: int, error: Exception):
    calls = []

    def read():
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "data"

    return read, calls


def test_transient_faults_are_retried_with_capped_exponential_backoff():
    read, calls = flaky(5, OSError("AWS Error INTERNAL_FAILURE (HTTP status 500)"))  # throttling: test_throttle.py
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
        al.AudioLoader("unused", storage=al.Storage(retry=3))


# What storage clients write when a request is refused: pyarrow's S3 filesystem (the AWS SDK's enum names, or
# UNKNOWN with the HTTP status for a code the SDK does not know), botocore, GCS (google-cloud-cpp), HTTP clients.
REFUSED = [
    "When reading information for key 'a.arrow' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject operation: "
    "No response body.",
    "When listing objects under key '' in bucket 'b': AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 "
    "operation: The AWS Access Key Id you provided does not exist in our records.",
    "AWS Error SIGNATURE_DOES_NOT_MATCH during ListObjectsV2 operation: The request signature we calculated does not "
    "match the signature you provided.",
    "AWS Error UNKNOWN (HTTP status 400) during GetObject operation: The provided token has expired.",
    "AWS Error UNKNOWN (HTTP status 403) during GetObject operation: ",
    "AWS Error REQUEST_TIME_TOO_SKEWED during GetObject operation: The difference between the request time and the "
    "current time is too large.",
    "An error occurred (ExpiredToken) when calling the GetObject operation: The provided token has expired.",
    "An error occurred (AccessDenied) when calling the ListObjectsV2 operation: Access Denied",
    "google::cloud::Status(PERMISSION_DENIED: Permanent error, with a last message of caller does not have "
    "storage.objects.get access)",
    "google::cloud::Status(UNAUTHENTICATED: Permanent error in ReadObject)",
    "Server failed to authenticate the request. ErrorCode:AuthenticationFailed",
    "HTTP response code: 403",
    "401, message='Unauthorized', url='https://example.com/data/a.arrow'",
]
TRANSIENT = [
    "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.",
    "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached",
    "AWS Error UNKNOWN (HTTP status 500) during GetObject operation: We encountered an internal error.",
    "When reading key 'forbidden/AccessDeniedReport.arrow': AWS Error UNKNOWN (HTTP status 503) during GetObject",
    "Connection reset by peer",
]


@pytest.mark.parametrize("text", REFUSED)
def test_refused_access_is_recognised_in_every_clients_words(text):
    assert is_access_refused(OSError(text)) and not is_transient(OSError(text))


@pytest.mark.parametrize("text", TRANSIENT)
def test_transient_faults_are_not_taken_for_refusals(text):
    assert not is_access_refused(OSError(text)) and is_transient(OSError(text))


class HttpError(OSError):
    def __init__(self, code: int) -> None:
        super().__init__("the server answered")
        self.code = code


@pytest.mark.parametrize(("error", "refused"), [(PermissionError("no"), True), (HttpError(403), True),
                                                (HttpError(401), True), (HttpError(503), False)])
def test_refusals_by_type_and_status_attribute(error, refused):
    assert is_access_refused(error) is refused


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_aiohttp_statuses_are_read_without_its_deprecated_code_attribute():
    aiohttp = pytest.importorskip("aiohttp")  # fsspec's http filesystem raises its ClientResponseError
    url = aiohttp.client.URL("https://data.example/speech/part-00001.arrow")
    multidict = pytest.importorskip("multidict")  # aiohttp's own dependency
    request = aiohttp.RequestInfo(url, "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()), url)
    refused = aiohttp.ClientResponseError(request, (), status=403, message="Forbidden")
    slow = aiohttp.ClientResponseError(request, (), status=429, message="Too Many Requests")
    assert is_access_refused(refused) and not is_transient(refused)
    assert not is_access_refused(slow) and is_transient(slow)


@pytest.mark.parametrize("text", REFUSED[:3])
def test_a_refused_read_is_tried_once_and_says_what_to_check_without_secrets(text):
    read, calls = flaky(10, OSError(text))
    url = "s3://AKIAEXAMPLE:wJalrSECRET@my-bucket/speech/part-00003.arrow?endpoint_override=h:9&session_token=SESSIONSECRET"
    with pytest.raises(al.AccessDeniedError) as info:
        with_retries(read, what=f"batch/row group 2 of shard {url}", retry=al.Retry(attempts=5), sleep=lambda s: None)
    assert len(calls) == 1
    message = str(info.value)
    assert "batch/row group 2 of shard s3://my-bucket/speech/part-00003.arrow was refused" in message
    assert text.split(" during ")[0].split(": ")[-1] in message  # the storage's own words
    assert "not retried" in message and "credentials" in message and "bucket policy" in message
    assert "region and endpoint" in message
    assert not any(secret in message for secret in ("AKIAEXAMPLE", "wJalrSECRET", "SESSIONSECRET", "h:9"))
    assert isinstance(info.value, al.ShardReadError) and isinstance(info.value, PermissionError)


def test_urls_are_shown_without_user_info_or_query():
    from audioloader.errors import redacted

    assert redacted("s3://key:secret@bucket/a/b.arrow?secret_key=x&region=y") == "s3://bucket/a/b.arrow"
    assert redacted("cannot read 'gs://b/x.parquet?token=t#f' now") == "cannot read 'gs://b/x.parquet' now"
    assert redacted("s3://bucket/a@b.arrow") == "s3://bucket/a@b.arrow"  # an @ in a key is no user-info
    assert redacted("/data/a?b.arrow") == "/data/a?b.arrow"  # local paths are left alone
