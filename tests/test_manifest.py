"""The dataset manifest (issue 26): compact, read in place; a start from it makes no LIST and no request per file;
fetched once per machine; a changed file is refused at its first read; the same batches as without it."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pytest

import audioloader as al
from audioloader.nodes import ArrowShardReader
from audioloader.shards.catalog.manifest import MANIFEST_NAME, Manifest, manifest_columns, write_manifest
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.storage import machine_cache
from tests.helpers import SMALL, assert_resumes_exactly, assert_same_batches, make_shards, take, upload_shards

FAST = al.Retry(attempts=4, initial_delay=0.01, max_delay=0.05, timeout=2.0)
ROWS = [13, 9, 18, 7]
FORMATS = ["ipc_file", "ipc_stream", "parquet", "orc"]
#: HEADs a file's first read costs: none through obstore (`audioloader.shards.storage.direct`), pyarrow's open
#: otherwise.
HEADS = 0 if importlib.util.find_spec("obstore") and os.environ.get("AUDIOLOADER_DIRECT_READS") != "0" else 1


@pytest.fixture(scope="module", autouse=True)
def _no_launchers_job():
    """This module's processes belong to no launcher's job (which would name the copies a machine shares)."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("AUDIOLOADER_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
            env.delenv(name, raising=False)
        yield


def requests_by_kind(proxy) -> Counter:
    """``{"LIST": n, "HEAD <name>": n, "GET <name>": n}`` of the requests the proxy saw."""
    counts: Counter = Counter()
    for request in proxy.requests:
        if request.method == "GET" and "/" not in request.path.strip("/"):
            counts["LIST"] += 1
        else:
            counts[f"{request.method} {request.path.rsplit('/', 1)[-1]}"] += 1
    return counts


def rows_of(dataset, **kwargs) -> list[tuple]:
    return [(tuple(s.key), bytes(s.audio), s.label) for s in ArrowShardReader.of(dataset, **kwargs)]


def loader(source, **kwargs) -> al.AudioLoader:
    return al.AudioLoader(source, batch_size=8, seed=1, features=SMALL,
                          shuffle=al.Shuffle(buffer_size=12, min_size=6),
                          workers=al.Workers(num_workers=2, kind="thread"),
                          storage=al.Storage(split_rows=4, retry=FAST), **kwargs)


def upload_with_manifest(s3, tmp_path_factory, fmt: str, prefix: str):
    folder, _ = upload_shards(s3, tmp_path_factory.mktemp(fmt), prefix, ROWS, fmt, seconds=0.2)
    write_folder_manifest(s3.url(prefix, direct=True))
    return folder


# ----------------------------------------------------------------------------- the format


def test_a_million_file_manifest_is_under_64_bytes_a_file(tmp_path):
    count = 1_000_000
    schema = pa.schema([("audio", pa.binary()), ("label", pa.int64())]).serialize().to_pybytes()
    names = [f"train/part-{i:07d}.parquet" for i in range(count)]
    table = manifest_columns(names, sizes=[1 << 20] * count, formats=["parquet"] * count, schemas=[schema],
                             schema_ids=[0] * count, unit_rows=[(100,)] * count, digests=["0123456789abcdef"] * count,
                             etags=[f'ETag:"{i:032x}"' for i in range(count)])
    path = str(tmp_path / MANIFEST_NAME)
    nbytes = write_manifest(table, path)
    assert nbytes / count <= 64, nbytes / count
    manifest = Manifest(path, path)
    assert manifest.num_files == count and manifest.name(123_456) == "train/part-0123456.parquet"
    assert manifest.etag(77) == f'ETag:"{77:032x}"' and manifest.unit_rows(5) == (100,)
    assert int(manifest.file_rows.sum()) == 100 * count and manifest.schema(9).names == ["audio", "label"]


def test_names_without_a_pattern_keep_only_what_differs(tmp_path):
    names = ["a/x.parquet", "a/yy.parquet", "b/z.parquet"]
    table = manifest_columns(names, sizes=[1, 2, 3], formats=["parquet"] * 3, schemas=[pa.schema([]).serialize()
                                                                                       .to_pybytes()],
                             schema_ids=[0] * 3, unit_rows=[(1, 2), (), (3,)], digests=["0" * 16] * 3,
                             etags=['ETag:"abc"', None, 'ETag:"d-2"'], mtimes=[5, None, 7])
    assert table.column("name").to_pylist() == ["a/x", "a/yy", "b/z"]
    manifest = Manifest(pa.BufferReader(_written(table, tmp_path)).read_buffer(), "test")
    assert manifest.names() == names and [manifest.unit_rows(i) for i in range(3)] == [(1, 2), (), (3,)]
    assert [manifest.etag(i) for i in range(3)] == ['ETag:"abc"', None, 'ETag:"d-2"']
    assert [manifest.mtime_ns(i) for i in range(3)] == [5, None, 7]


def _written(table, tmp_path) -> bytes:
    path = tmp_path / MANIFEST_NAME
    write_manifest(table, str(path))
    return path.read_bytes()


def test_a_manifest_of_another_version_is_refused_naming_the_command(tmp_path):
    make_shards(tmp_path, [3], "parquet")
    path = write_folder_manifest(tmp_path)
    table = pa.ipc.open_file(path).read_all()
    write_manifest(table.replace_schema_metadata({**table.schema.metadata, b"audioloader_manifest": b"9"}), path)
    with pytest.raises(al.ShardReadError, match="audioloader index"):
        al.ShardDataset(tmp_path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_local_manifest_gives_the_same_files_and_rows_as_a_scan(tmp_path, fmt):
    make_shards(tmp_path, ROWS, fmt, batch_rows=4, seconds=0.1)
    scanned = al.ShardDataset(tmp_path, split_rows=4)
    write_folder_manifest(tmp_path)
    listed = al.ShardDataset(tmp_path, split_rows=4)
    assert listed.manifest.origin == "local" and not any(m.located for m in listed.units.metas)
    assert listed.files == scanned.files and listed.splits == scanned.splits
    paths = listed.files.paths  # made all at once when iterated, one by one when indexed: the same
    assert list(paths) == [paths[i] for i in range(len(paths))] == list(scanned.files.paths)
    for kwargs in ({"shuffle": False}, {"shuffle": True, "seed": 4}):
        assert rows_of(listed, **kwargs) == rows_of(scanned, **kwargs)
    assert listed.identity() == scanned.identity()  # once read, the footers are the scan's
    assert [listed.mapped_state(i) for i in range(len(ROWS))] == [scanned.mapped_state(i) for i in range(len(ROWS))]


# ----------------------------------------------------------------------------- S3: requests at start


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_a_start_from_a_manifest_makes_no_list_and_no_request_per_file(s3, proxy, tmp_path_factory, fmt):
    folder = upload_with_manifest(s3, tmp_path_factory, fmt, f"manifest/{fmt}")
    proxy.clear()
    dataset = al.ShardDataset(s3.url(f"manifest/{fmt}"), retry=FAST, split_rows=4)
    assert requests_by_kind(proxy) == {f"HEAD {MANIFEST_NAME}": 1, f"GET {MANIFEST_NAME}": 1}
    assert dataset.manifest.origin == "store" and dataset.files == al.ShardDataset(s3.url(f"manifest/{fmt}"),
                                                                                  retry=FAST, split_rows=4,
                                                                                  remote_reads=al.shards.RemoteReads(
                                                                                      index="off")).files
    proxy.clear()
    assert rows_of(dataset, shuffle=False) == rows_of(al.ShardDataset(folder, split_rows=4), shuffle=False)
    counts = requests_by_kind(proxy)
    assert counts["LIST"] == 0
    for i in range(len(ROWS)):  # a small file's first read fetches it whole, footer and data (pyarrow: a HEAD too)
        name = f"part-{i:05d}.{'arrow' if fmt == 'ipc_file' else fmt}"
        assert counts[f"HEAD {name}"] == HEADS and counts[f"GET {name}"] == 1, counts


def test_loader_batches_and_resume_from_a_manifest_equal_local_disk(s3, tmp_path_factory):
    folder = upload_with_manifest(s3, tmp_path_factory, "parquet", "manifest/resume")
    url = s3.url("manifest/resume")
    for train, n in ((False, 5), (True, 7)):
        with loader(folder, train=train) as local, loader(url, train=train) as remote:
            assert remote.reader.dataset.manifest is not None
            assert_same_batches(take(local, n), take(remote, n))
    assert_resumes_exactly(lambda **options: loader(url, **options), 6, (2,))


@pytest.mark.parametrize("change", ["same size", "longer"])
def test_a_changed_file_is_a_shard_changed_error_at_its_first_read(s3, tmp_path_factory, change):
    prefix = f"manifest/changed-{change.replace(' ', '-')}"
    folder = upload_with_manifest(s3, tmp_path_factory, "ipc_file", prefix)
    data = bytearray((folder / "part-00002.arrow").read_bytes())
    if change == "same size":  # the footer unchanged: only the ETag tells
        data[len(data) // 2] ^= 0xFF
    else:
        make_shards(folder, [*ROWS[:2], ROWS[2] + 1], "ipc_file", batch_rows=4, seconds=0.2)
        data = bytearray((folder / "part-00002.arrow").read_bytes())
    with s3.filesystem().open_output_stream(f"{prefix}/part-00002.arrow") as out:
        out.write(bytes(data))
    dataset = al.ShardDataset(s3.url(prefix), retry=FAST, split_rows=4)  # nothing read yet: nothing known
    assert dataset.located(1).located
    with pytest.raises(al.ShardChangedError, match=f"s3://{prefix}/part-00002.arrow") as info:
        dataset.located(2)
    assert ("identity ETag" in str(info.value)) if change == "same size" else ("bytes now" in str(info.value))
    with pytest.raises(al.ShardChangedError, match="part-00002"):
        rows_of(al.ShardDataset(s3.url(prefix), retry=FAST, split_rows=4), shuffle=False)


# ----------------------------------------------------------------------------- once per machine

_CHILD = """
import sys
import audioloader as al
dataset = al.ShardDataset(sys.argv[1], retry=al.Retry(attempts=4, initial_delay=0.01, timeout=5.0), split_rows=4)
print(dataset.manifest.origin, dataset.num_rows, flush=True)
"""


def start_ranks(url: str, n: int, cache: str, job: str) -> list[tuple[str, int]]:
    """``n`` processes of one job on one machine (a machine cache) constructing the dataset at once."""
    env = dict(os.environ, AUDIOLOADER_CACHE=cache, AUDIOLOADER_JOB_ID=job, PYTHONPATH=os.getcwd())
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, url], env=env, stdout=subprocess.PIPE, text=True)
                for _ in range(n)]
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    return [(line.split()[0], int(line.split()[1])) for line in outputs]


def test_processes_of_a_machine_fetch_the_manifest_once(s3, proxy, tmp_path_factory, tmp_path):
    upload_with_manifest(s3, tmp_path_factory, "parquet", "manifest/shared")
    proxy.clear()
    origins = start_ranks(s3.url("manifest/shared"), 3, str(tmp_path / "machine"), "job-a")
    assert sorted(origins) == [("machine", sum(ROWS))] * 2 + [("store", sum(ROWS))]
    assert requests_by_kind(proxy) == {f"HEAD {MANIFEST_NAME}": 1, f"GET {MANIFEST_NAME}": 1}


def test_an_old_shared_manifest_is_kept_while_the_store_has_the_same_one(s3, proxy, tmp_path_factory, tmp_path,
                                                                        monkeypatch):
    """Freshness by identity, not by age alone: a copy older than `SHARED_FRESH_SECONDS` costs one HEAD while the
    store's manifest is the one it was made from (was: fetched again), and is fetched again once it changed."""
    upload_with_manifest(s3, tmp_path_factory, "parquet", "manifest/aged")
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "machine"))
    monkeypatch.setenv("AUDIOLOADER_JOB_ID", "job-aged")
    url = s3.url("manifest/aged")

    def start_later() -> al.ShardDataset:
        for published in (tmp_path / "machine" / "shared").glob("manifest-*.arrow"):
            os.utime(published, (1e9, 1e9))  # published long ago
        proxy.clear()
        return al.ShardDataset(url, retry=FAST, split_rows=4)

    assert al.ShardDataset(url, retry=FAST, split_rows=4).manifest.origin == "store"
    kept = start_later()
    assert kept.manifest.origin == "machine" and kept.num_rows == sum(ROWS)
    assert requests_by_kind(proxy) == {f"HEAD {MANIFEST_NAME}": 1}
    changed = tmp_path_factory.mktemp("changed")
    make_shards(changed, [*ROWS, 5], "parquet", batch_rows=4, seconds=0.2)
    s3.upload(changed, "manifest/aged")
    write_folder_manifest(s3.url("manifest/aged", direct=True))
    fetched = start_later()
    assert fetched.manifest.origin == "store" and fetched.num_rows == sum(ROWS) + 5
    assert requests_by_kind(proxy)[f"GET {MANIFEST_NAME}"] == 1


@pytest.mark.parametrize(("fmt", "etags"), [("ipc_file", True), ("parquet", True), ("parquet", False)])
def test_with_a_cache_each_object_is_fetched_once_a_machine(s3, proxy, tmp_path_factory, tmp_path, fmt, etags):
    """Was twice: its first read fetched the small file for its footer, then the cache downloaded it again.
    ``etags`` False: a manifest written before the upload (`audioloader pack`), which has no ETags."""
    if etags:
        folder = upload_with_manifest(s3, tmp_path_factory, fmt, f"manifest/cached-{fmt}")
    else:
        folder = tmp_path_factory.mktemp("packed")
        make_shards(folder, ROWS, fmt, batch_rows=4, seconds=0.2)
        write_folder_manifest(folder)
        s3.upload(folder, f"manifest/cached-{fmt}-packed")
    prefix = f"manifest/cached-{fmt}" + ("" if etags else "-packed")
    proxy.clear()
    expected = rows_of(al.ShardDataset(folder, split_rows=4), shuffle=False)
    for _ in range(2):  # two ranks of one machine: one cache
        dataset = al.ShardDataset(s3.url(prefix), retry=FAST, split_rows=4, cache_dir=str(tmp_path / "cache"))
        assert rows_of(dataset, shuffle=False) == expected
    counts = requests_by_kind(proxy)
    for i in range(len(ROWS)):
        name = f"part-{i:05d}.{'arrow' if fmt == 'ipc_file' else fmt}"
        # Without ETags in the manifest each rank asks for the object's identity (a HEAD), the download one more.
        assert counts[f"GET {name}"] == 1 and counts[f"HEAD {name}"] <= (1 if etags else 3), counts


def test_without_a_manifest_a_machine_lists_and_scans_once(s3, proxy, tmp_path_factory, tmp_path):
    upload_shards(s3, tmp_path_factory.mktemp("unindexed"), "manifest/unindexed", ROWS, "parquet", seconds=0.2)
    proxy.clear()
    origins = start_ranks(s3.url("manifest/unindexed"), 3, str(tmp_path / "machine"), "job-b")
    assert sorted(origins) == [("listing", sum(ROWS))] + [("machine", sum(ROWS))] * 2
    counts = requests_by_kind(proxy)
    assert counts["LIST"] <= 2, counts  # one listing pass (pyarrow: the folder, then its files)
    for i in range(len(ROWS)):  # one scan a file for the machine: one GET (pyarrow: after a HEAD)
        assert counts[f"GET part-{i:05d}.parquet"] == 1 and counts[f"HEAD part-{i:05d}.parquet"] == HEADS, counts


def test_a_process_waiting_for_its_machine_times_out_naming_the_file_and_the_leader(tmp_path, monkeypatch):
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path))
    lock = tmp_path / "shared" / "manifest-x.arrow.lock"
    lock.parent.mkdir()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process of the machine is fetching it
        held.write("pid 4242 on node-7")
        held.flush()
        with pytest.raises(machine_cache.SharedFileTimeout) as info:
            machine_cache.shared_file("manifest-x.arrow", lambda path: None, what="the manifest of s3://b/d",
                                      timeout=0.2)
    message = str(info.value)
    assert "the manifest of s3://b/d" in message and "pid 4242 on node-7" in message
    assert str(tmp_path / "shared" / "manifest-x.arrow") in message and "AUDIOLOADER_SHARED_TIMEOUT" in message


def test_large_files_from_a_manifest_read_their_footer_then_their_units(s3, proxy, tmp_path_factory):
    # ~430 KiB a file: more than a first read
    folder, _ = upload_shards(s3, tmp_path_factory.mktemp("large"), "manifest/large", [9, 7], "parquet", batch_rows=3,
                              seconds=1.5)
    write_folder_manifest(s3.url("manifest/large", direct=True))
    proxy.clear()
    dataset = al.ShardDataset(s3.url("manifest/large"), retry=FAST, split_rows=3)
    for kwargs in ({"shuffle": False}, {"shuffle": True, "seed": 2}):
        assert rows_of(dataset, **kwargs) == rows_of(al.ShardDataset(folder, split_rows=3), **kwargs)
    counts = requests_by_kind(proxy)
    assert counts["LIST"] == 0 and all(counts[f"GET part-{i:05d}.parquet"] >= 2 for i in range(2)), counts


@pytest.mark.skipif(HEADS, reason="needs obstore (reads that send If-Match)")
def test_a_file_rewritten_after_its_first_read_is_refused_by_the_store(s3, tmp_path_factory):
    # larger than a first read: data read later
    folder, _ = upload_shards(s3, tmp_path_factory.mktemp("rewritten"), "manifest/rewritten", [9], "parquet",
                              batch_rows=3, seconds=1.5)
    write_folder_manifest(s3.url("manifest/rewritten", direct=True))
    dataset = al.ShardDataset(s3.url("manifest/rewritten"), retry=FAST, split_rows=3)
    assert dataset.located(0).located  # its first read: footer and ETag checked
    data = bytearray((folder / "part-00000.parquet").read_bytes())
    data[len(data) // 3] ^= 0xFF  # same size, same footer: another ETag
    with s3.filesystem().open_output_stream("manifest/rewritten/part-00000.parquet") as out:
        out.write(bytes(data))
    with pytest.raises(al.ShardChangedError, match=r"part-00000\.parquet changed while it was being read"):
        rows_of(dataset, shuffle=False)
