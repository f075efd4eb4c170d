"""What a remote shard's identity check refuses: changed bytes, not the same bytes uploaded another way; and a URL
whose options pyarrow refuses is named as such (moto's S3 server on loopback, tests/s3_server.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

import audioloader as al
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.storage.identity import ETagCheck, etag_part_sizes, md5_etag
from tests.helpers import SMALL, flip_audio_bytes, make_shards, take
from tests.s3_server import S3Server

PREFIX = "identity/shards"
FILE = "part-00001.arrow"


def client(s3: S3Server):
    boto3 = pytest.importorskip("boto3")  # moto's own dependency: uploads the way other S3 clients do
    return boto3.client("s3", endpoint_url=f"http://{s3.direct_endpoint}", region_name="us-east-1",
                        aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)


def put(s3: S3Server, key: str, data: bytes, how: str) -> str:
    """Upload ``data`` to ``key`` in one PUT or as a multipart upload of one part; returns the new ETag."""
    c = client(s3)
    if how == "single":
        return c.put_object(Bucket="identity", Key=key, Body=data)["ETag"]
    upload = c.create_multipart_upload(Bucket="identity", Key=key)["UploadId"]
    part = c.upload_part(Bucket="identity", Key=key, UploadId=upload, PartNumber=1, Body=data)
    return c.complete_multipart_upload(Bucket="identity", Key=key, UploadId=upload,
                                       MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})["ETag"]


def loader(s3: S3Server) -> al.AudioLoader:
    return al.AudioLoader(s3.url(PREFIX), batch_size=4, seed=2, features=SMALL, workers=al.Workers(num_workers=0),
                          shuffle=al.Shuffle(buffer_size=8, min_size=4), storage=al.Storage(split_rows=4))


@pytest.mark.parametrize(("first", "again"), [("multipart", "single"), ("single", "multipart")])
def test_the_same_bytes_uploaded_another_way_resume_and_changed_bytes_are_refused(s3, tmp_path, first, again):
    # A new ETag (a single PUT's MD5 against a multipart upload's MD5 of part MD5s) for the same bytes was refused
    # as "rewritten in place": the loader now reads the file and checks its bytes against the checkpoint's ETag.
    make_shards(tmp_path, [12, 12], "ipc_file", batch_rows=4, seconds=0.3)
    client(s3).create_bucket(Bucket="identity")
    keys = {path.name: f"shards/{path.name}" for path in sorted(tmp_path.iterdir())}
    for name, key in keys.items():
        put(s3, key, (tmp_path / name).read_bytes(), first)
    with loader(s3) as whole:
        expected = take(whole, 6)
    with loader(s3) as before:
        head = take(before, 2)
        state = before.state_dict()
    data = (tmp_path / FILE).read_bytes()
    old = [e for e in state["fingerprint"]["file_identity"]["etags"] if e is not None]
    assert put(s3, keys[FILE], data, again) not in " ".join(old)  # another ETag, the same bytes
    with loader(s3) as resumed:
        resumed.load_state_dict(state)
        rest = take(resumed, 4)
    assert [b["index"].tolist() for b in head + rest] == [b["index"].tolist() for b in expected]
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0xFF  # in the middle of the audio: same size, same footer
    put(s3, keys[FILE], bytes(changed), again)
    with loader(s3) as refused, pytest.raises(al.CheckpointMismatchError, match=f"{FILE}: rewritten in place"):
        refused.load_state_dict(state)


def test_an_etag_check_finds_the_part_size_of_a_multipart_upload():
    data = os.urandom(17 * 1024 * 1024 + 12345)  # 3 parts of 8 MiB (the AWS CLI's and boto3's part size)
    part = 8 * 1024 * 1024
    digests = [hashlib.md5(data[i:i + part]).digest() for i in range(0, len(data), part)]
    etag = f'ETag:"{hashlib.md5(b"".join(digests)).hexdigest()}-3"'
    assert md5_etag(etag)[1] == 3 and part in etag_part_sizes(len(data), 3)
    for content, same in ((data, True), (data[:-1] + b"x", False)):
        check = ETagCheck(etag, len(content))
        for i in range(0, len(content), 1_000_003):  # fed in pieces that do not line up with the parts
            check.update(content[i:i + 1_000_003])
        assert check.matches() is same
    single = ETagCheck(f'ETag:"{hashlib.md5(data).hexdigest()}"', len(data))
    single.update(data)
    assert single.matches()
    assert md5_etag("x-amz-version-id:3HL4kqtJlcpXroDTDmJ") is None  # a version id names an upload, not bytes


@pytest.mark.parametrize("url", ["s3://bucket/speech?session_token=SECRETTOKEN&region=us-east-1",
                                 "gs://bucket/speech?token=SECRETTOKEN"])
def test_an_option_pyarrow_does_not_take_in_a_url_is_named_first_not_a_missing_package(url):
    # It said "no filesystem for this scheme ... install s3fs", the real cause in parentheses.
    with pytest.raises(ValueError) as info:
        al.AudioLoader(url, features=SMALL)
    message = str(info.value)
    scheme = url.split(":")[0]
    assert message.startswith(f"cannot open '{scheme}://bucket/speech': pyarrow's {scheme}:// filesystem refused the "
                              "URL: Unexpected query parameter"), message
    assert "session_token=..." in message and "install" not in message and "SECRETTOKEN" not in message


# ----------------------------------------------------------------------------- a changed object, whatever the path

def replacement(folder, change: str) -> bytes:
    """The new content of `FILE` (written into a manifest as 12 rows): 64 bytes of audio flipped (same size and
    footer: only the ETag tells), or the file written again with more or fewer rows."""
    if change == "same size":
        flip_audio_bytes(folder / FILE, row=3)
        return (folder / FILE).read_bytes()
    other = folder.parent / f"other-{change}"
    make_shards(other, [12, 16 if change == "larger" else 8], "ipc_file", batch_rows=4, seconds=0.3)
    return (other / FILE).read_bytes()


@pytest.mark.parametrize("cached", [False, True], ids=["no cache", "cache"])
@pytest.mark.parametrize("change", ["same size", "larger", "smaller"])
def test_an_object_replaced_after_its_manifest_is_a_shard_changed_error_at_once(s3, tmp_path, change, cached):
    # It was ShardChangedError in 2 of these 6 cases: with a cache, ShardReadError "changed after the loader was
    # built"; without, a smaller object was a "short read" retried 5 times over 3 s before a ShardReadError.
    prefix = f"identity/changed-{change.replace(' ', '-')}-{int(cached)}"
    make_shards(tmp_path / "local", [12, 12], "ipc_file", batch_rows=4, seconds=0.3)
    s3.upload(tmp_path / "local", prefix)
    write_folder_manifest(s3.url(prefix, direct=True))
    data = replacement(tmp_path / "local", change)
    with s3.filesystem().open_output_stream(f"{prefix}/{FILE}") as out:
        out.write(data)
    s3.proxy.clear()
    storage = al.Storage(split_rows=4, cache_dir=tmp_path / "cache" if cached else None,
                         retry=al.Retry(attempts=5, initial_delay=0.5, max_delay=1.0, timeout=5.0))
    with al.AudioLoader(s3.url(prefix), batch_size=4, features=SMALL, train=False, storage=storage,
                        workers=al.Workers(num_workers=0)) as loader, \
            pytest.raises(al.ShardChangedError, match=f"s3://{prefix}/{FILE}") as info:
        list(loader)
    assert "attempt" not in str(info.value), info.value  # a diagnosis, not a retried transient fault
    requests = [r for r in s3.proxy.requests if r.path.endswith(f"{prefix}/{FILE}")]
    assert len(requests) == 1, requests  # found by the first request of the object: no retry spent
