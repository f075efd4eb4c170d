"""audioloader pack from and to object storage (moto's S3 server on loopback): the same rows as local to local,
manifests whose paths are relative to a bucket folder or full URLs, and uploads that never leave half a shard."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from audioloader.tools.pack import pack_dataset
from tests.test_pack_resume import content_hash, rows_of

OPTIONS = dict(shard_rows=4, rows_per_batch=2, progress=False, workers=4)


def upload_tree(s3, local, prefix):
    """Copy a local folder tree to ``prefix`` (``bucket/folder``)."""
    fs = s3.filesystem()
    fs.create_dir(prefix.split("/", 1)[0])
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        with fs.open_output_stream(f"{prefix}/{path.relative_to(local).as_posix()}") as out:
            out.write(path.read_bytes())


def remote_rows(s3, prefix):
    """The rows of the shards under ``prefix``, in name order."""
    fs = s3.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(prefix))
    names = sorted(i.path for i in infos if i.base_name.startswith("shard-"))
    tables = []
    for name in names:
        with fs.open_input_file(name) as handle:
            tables.append(pa.ipc.open_file(handle).read_all())
    return pa.concat_tables(tables).to_pylist(), [n.rsplit("/", 1)[1] for n in names]


def remote_names(s3, prefix):
    return sorted(i.base_name for i in s3.filesystem().get_file_info(pafs.FileSelector(prefix, allow_not_found=True)))


@pytest.mark.parametrize("codec", [None, "flac"])
def test_s3_class_folders_to_s3_give_the_rows_of_local_to_local(s3, src, tmp_path, request, codec):
    prefix = f"pack-{request.node.name[-6:].strip('[]-')}"
    upload_tree(s3, src, f"{prefix}/src")
    local = pack_dataset(src, tmp_path / "local", codec=codec, **OPTIONS)
    remote = pack_dataset(s3.url(f"{prefix}/src/"), s3.url(f"{prefix}/out"), codec=codec, **OPTIONS)
    rows, names = remote_rows(s3, f"{prefix}/out")
    assert names == [p.name for p in local.shards]
    assert content_hash(rows) == content_hash(rows_of(tmp_path / "local"))
    assert remote.shards == [f"s3://{prefix}/out/{n}" for n in names]  # no query string, no credentials
    assert (remote.rows, remote.skipped) == (local.rows, local.skipped)
    assert "cat/00.wav" in remote.examples["undecodable"][0]
    assert remote_names(s3, f"{prefix}/out") == sorted([*names, "_audioloader_manifest.arrow", "_audioloader_pack.json",
                                                        "labels.json"])
    fs = s3.filesystem()
    with fs.open_input_stream(f"{prefix}/out/labels.json") as handle:
        assert json.loads(handle.read()) == {"bird": 0, "cat": 1, "dog": 2}

    import audioloader as al  # a loader reads the packed prefix through its index

    assert al.ShardDataset(s3.url(f"{prefix}/out")).num_rows == local.rows


def test_a_manifest_in_a_bucket_with_relative_paths_and_urls(s3, src, tmp_path):
    upload_tree(s3, src, "manifests/data")
    lines = ["path,text", "bird/00.wav,one", "cat/01.wav,two", f"{s3.url('manifests/data/dog/02.wav')},three",
             "dog/missing.wav,four"]
    with s3.filesystem().open_output_stream("manifests/data/list.csv") as out:  # beside the class folders
        out.write(("\n".join(lines) + "\n").encode())
    summary = pack_dataset(s3.url("manifests/data/list.csv"), tmp_path / "out", **OPTIONS)
    rows = rows_of(tmp_path / "out")
    assert [r["text"] for r in rows] == ["one", "two", "three"]
    assert [r["path"] for r in rows] == ["bird/00.wav", "cat/01.wav", "s3://manifests/data/dog/02.wav"]
    assert [r["audio"] for r in rows] == [(src / "bird/00.wav").read_bytes(), (src / "cat/01.wav").read_bytes(),
                                          (src / "dog/02.wav").read_bytes()]
    assert summary.skipped == {"missing file": 1}
    assert "dog/missing.wav: no such object" in summary.examples["missing file"][0]
    assert "?" not in summary.examples["missing file"][0]  # the URL's options (endpoint) are not shown


def test_a_failed_upload_leaves_no_shard_under_its_name_and_the_rerun_finishes(s3, src, tmp_path):
    s3.filesystem().create_dir("failing")
    url = s3.url("failing/out")
    s3.proxy.inject("403", times=1, method="PUT", path="shard-00002")
    with pytest.raises(OSError) as info:
        pack_dataset(src, url, **OPTIONS)
    assert "shard-00002" in str(info.value) and "?" not in str(info.value)
    s3.proxy.clear()
    names = remote_names(s3, "failing/out")
    assert names == ["_audioloader_pack.json", "shard-00000.arrow", "shard-00001.arrow"]
    summary = pack_dataset(src, url, **OPTIONS)
    assert summary.resumed == 2
    rows, _ = remote_rows(s3, "failing/out")
    local = pack_dataset(src, tmp_path / "local", **OPTIONS)
    assert content_hash(rows) == content_hash(rows_of(tmp_path / "local")) and summary.rows == local.rows


def test_parts_into_a_bucket_then_index(s3, src, tmp_path):
    s3.filesystem().create_dir("parts")
    url = s3.url("parts/out")
    for k in (1, 0, 2):
        pack_dataset(src, url, part=f"{k}/3", **OPTIONS)
    assert "_audioloader_manifest.arrow" in remote_names(s3, "parts/out")
    rows, _ = remote_rows(s3, "parts/out")
    pack_dataset(src, tmp_path / "single", **OPTIONS)
    assert content_hash(rows) == content_hash(rows_of(tmp_path / "single"))


def test_killed_mid_upload_no_shard_appears_under_its_name_and_the_rerun_finishes(s3, src, tmp_path):
    from tests.test_pack_resume import run_pack

    s3.filesystem().create_dir("killed")
    args = ("--shard-size", "4", "--rows-per-batch", "2", "-q")
    temp = tmp_path / "temp"  # the machine's temp folder, where a remote pack stages its shard
    temp.mkdir()
    proc = run_pack(src, s3.url("killed/out"), *args, kill="upload:2", check=False, tmpdir=temp)  # 2nd shard
    assert proc.returncode == -9, proc.stderr
    assert remote_names(s3, "killed/out") == ["_audioloader_pack.json", "shard-00000.arrow"]
    left = [p.name for p in temp.iterdir()]
    assert len(left) == 1 and left[0].startswith("audioloader-pack-")  # SIGKILL cleaned nothing up
    run_pack(src, s3.url("killed/out"), *args, tmpdir=temp)
    assert list(temp.iterdir()) == [], "the killed pack's staging folder was left behind on the machine"
    rows, _ = remote_rows(s3, "killed/out")
    pack_dataset(src, tmp_path / "local", shard_rows=4, rows_per_batch=2, progress=False)
    assert content_hash(rows) == content_hash(rows_of(tmp_path / "local"))


def test_a_multipart_upload_killed_half_way_leaves_nothing_and_the_rerun_uploads_it_whole(s3, tmp_path):
    """A 14 MB shard goes up as a multipart upload (8 MiB a write): killed after its first part, no object."""
    from tests.helpers import encode, tone
    from tests.test_pack_resume import run_pack

    src = tmp_path / "big"
    (src / "loud").mkdir(parents=True)
    for i in range(14):  # 14 clips of 1 MB: one shard of 14 MB
        (src / "loud" / f"{i:02d}.wav").write_bytes(encode(tone(6.0, 44100, freq=200 + 10 * i, channels=2, seed=i),
                                                            44100))
    s3.filesystem().create_dir("multipart")
    s3.proxy.clear()
    temp = tmp_path / "temp"  # the staging folders, here rather than in the machine's temp folder
    temp.mkdir()
    proc = run_pack(src, s3.url("multipart/out"), "-q", kill="upload:1", check=False, tmpdir=temp)
    assert proc.returncode == -9, proc.stderr
    assert s3.proxy.log("POST", "multipart/out/shard-00000.arrow")  # CreateMultipartUpload was sent
    # The parts sent are not an object; the journal, written first, says the pack is not finished.
    assert remote_names(s3, "multipart/out") == ["_audioloader_pack.json"]
    run_pack(src, s3.url("multipart/out"), "-q", tmpdir=temp)
    rows, names = remote_rows(s3, "multipart/out")
    assert names == ["shard-00000.arrow"] and len(rows) == 14
    assert [r["audio"] for r in rows] == [(src / "loud" / f"{i:02d}.wav").read_bytes() for i in range(14)]
