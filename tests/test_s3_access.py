"""Refused access on a real S3 server (moto enforcing IAM, on loopback): raised at once, saying what to check."""

from __future__ import annotations

import urllib.parse

import pytest

import audioloader as al
from tests.helpers import SMALL, upload_shards
from tests.s3_server import S3Server

PATIENT = al.Retry(attempts=5, initial_delay=0.01, max_delay=0.05, timeout=2.0)


@pytest.fixture(scope="module")
def s3(s3_servers, tmp_path_factory):
    """A server that enforces IAM (`conftest.s3_servers`), holding 12 rows of IPC shards at ``private/ipc``."""
    server = s3_servers(enforce_auth=True)
    # not always "ipc0": conftest's ipc_shards may have taken it
    upload_shards(server, tmp_path_factory.mktemp("ipc"), "private/ipc", [6, 6], batch_rows=3, seconds=0.2)
    return server


def url_with_keys(s3: S3Server, key: str, secret: str) -> str:
    """The shards' URL through the proxy, with the keys in its user-info (pyarrow reads them from there)."""
    user_info = f"{urllib.parse.quote(key, safe='')}:{urllib.parse.quote(secret, safe='')}@"
    return s3.url("private/ipc").replace("s3://", "s3://" + user_info)


def loader(url: str) -> al.AudioLoader:
    return al.AudioLoader(url, batch_size=4, train=False, features=SMALL, workers=al.Workers(num_workers=0),
                          storage=al.Storage(split_rows=3, retry=PATIENT))


def test_the_servers_own_keys_read_the_shards(s3):
    with loader(url_with_keys(s3, s3.access_key, s3.secret_key)) as reader:
        assert sum(int(b["valid"].sum()) for b in reader) == 12


@pytest.mark.parametrize("who", ["unknown key", "wrong secret", "user without a policy"])
def test_refused_credentials_fail_after_one_request_naming_the_source_not_the_keys(s3, who):
    if who == "unknown key":
        key, secret = "AKIAUNKNOWN000000000", "not-a-secret"
    elif who == "wrong secret":
        key, secret = s3.access_key, "wrong/secret+key"
    else:
        key, secret = s3.add_user(f"nobody-{id(who)}", allowed=False)
    s3.proxy.clear()
    with pytest.raises(al.AccessDeniedError) as info:
        loader(url_with_keys(s3, key, secret))
    assert len(s3.proxy.requests) == 1, s3.proxy.requests  # refused: not retried
    message = str(info.value)
    assert ("'s3://private/ipc' was refused by the storage" in message  # its listing, or its manifest's read
            or "manifest s3://private/ipc/_audioloader_manifest.arrow was refused by the storage" in message), message
    assert "ACCESS_DENIED" in message or "INVALID_ACCESS_KEY_ID" in message or "SIGNATURE_DOES_NOT_MATCH" in message
    assert "credentials" in message and "bucket policy" in message and "region and endpoint" in message
    assert key not in message and secret not in message and s3.proxy.endpoint not in message
