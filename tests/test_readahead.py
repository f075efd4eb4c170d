"""Remote read-ahead, construction requests and the metadata index, on a real S3 server (moto, loopback) behind the
shaping, fault-injecting proxy: rows equal local rows, the byte budget holds, requests are few and concurrent."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import threading

import pyarrow.compute as pc
import pytest

import audioloader as al
from audioloader.nodes import ArrowShardReader
from audioloader.shards.catalog import index as shard_index
from audioloader.shards.storage import remote
from audioloader.shards.storage.options import RemoteReads
from tests.helpers import make_shards, upload_shards

ROWS = [23, 17, 30]  # 70 rows in three files, record batches / row groups of 4 rows
FAST = al.Retry(attempts=6, initial_delay=0.01, max_delay=0.05, timeout=1.0)
UNIT_BYTES = 4 * 12_844  # 4 rows of 0.4 s PCM16 WAV at 16 kHz (12,800 bytes of samples + header)


@pytest.fixture(scope="module")
def data(s3, tmp_path_factory) -> dict[str, tuple]:
    """Per format: (local folder, the same files on S3 at ``ahead/<format>``)."""
    return {fmt: upload_shards(s3, tmp_path_factory.mktemp(fmt), f"ahead/{fmt}", ROWS, fmt)
            for fmt in ("ipc_file", "parquet")}


def rows_of(samples) -> list[tuple]:
    return [(tuple(s.key), None if s.audio is None else bytes(s.audio), s.label, s.extras) for s in samples]


def take(reader: ArrowShardReader, n: int) -> list[tuple]:
    return rows_of(next(reader) for _ in range(n))


MODES = {  # name: reader arguments
    "eval": dict(shuffle=False),
    "train": dict(shuffle=True),
    "interleave": dict(shuffle=True, interleave=3),
    "filter": dict(shuffle=False, filter=(pc.field("uid") < 12) | (pc.field("uid") > 40), columns=("uid",)),
    "interleave+filter": dict(shuffle=True, interleave=3, filter=(pc.field("uid") < 30) | (pc.field("uid") >= 50),
                              columns=("uid",)),
}


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_rows_equal_local_and_the_budget_holds(s3, data, proxy, fmt, mode):
    local, prefix = data[fmt]
    budget = int(2.5 * UNIT_BYTES)  # a few units: the window turns over many times in a pass
    for rank in range(2):
        arguments = dict(seed=5, rank=rank, world_size=2, split_rows=4, **MODES[mode])
        expected = rows_of(ArrowShardReader.of(str(local), **arguments))
        reader = ArrowShardReader.of(s3.url(prefix), retry=FAST, remote_reads=RemoteReads(readahead_bytes=budget),
                                  **arguments)
        assert rows_of(reader) == expected
        ahead = reader._readahead
        assert ahead.misses == 0, "a unit was read that the read-ahead did not foresee"
        assert 0 < ahead.peak_bytes <= budget, (ahead.peak_bytes, budget)


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_requests_are_coalesced_and_in_flight_together(s3, data, proxy, fmt):
    _, prefix = data[fmt]
    reader = ArrowShardReader.of(s3.url(prefix), shuffle=False, split_rows=4, retry=FAST)
    units = sum(len(f.batch_rows) for f in reader.dataset.files)
    proxy.clear()
    proxy.hold()  # requests wait at the proxy: the reader's first row needs the read-ahead's requests
    first = threading.Thread(target=next, args=(reader,))
    first.start()
    try:
        assert proxy.wait_in_flight(len(ROWS), timeout=60), "the files' data were not requested at once"
    finally:
        proxy.release()
        first.join()
    rest = list(reader)
    assert len(rest) == sum(ROWS) - 1
    gets = [r for r in proxy.log("GET") if "/part-" in r.path]
    assert len(gets) <= len(ROWS) < units  # one coalesced request per file here, not one (or ~9) per unit


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_a_long_read_goes_out_as_parts_in_flight_together(s3, data, proxy, fmt, monkeypatch):
    """A unit longer than a part (a store caps each connection's rate) is fetched as parts at once; rows and
    the byte budget are as with one request a unit, under faults too."""
    local, prefix = data[fmt]
    monkeypatch.setattr(remote, "PART_BYTES", 8 * 1024)  # a unit (~51 KB) in 7 parts
    arguments = dict(seed=3, shuffle=True, split_rows=4)
    expected = rows_of(ArrowShardReader.of(str(local), **arguments))
    proxy.inject("503", 1, path=f"/{prefix}/part-00001")
    reader = ArrowShardReader.of(s3.url(prefix), retry=FAST, remote_reads=RemoteReads(readahead_bytes=UNIT_BYTES),
                              **arguments)
    proxy.clear()
    proxy.hold()
    first = threading.Thread(target=next, args=(reader,))
    first.start()
    try:  # one unit's worth of budget: its parts are all in flight before any arrives
        assert proxy.wait_in_flight(UNIT_BYTES // remote.PART_BYTES, timeout=60), "a unit's parts were not at once"
    finally:
        proxy.release()
        first.join()
    reader = ArrowShardReader.of(s3.url(prefix), retry=FAST, remote_reads=RemoteReads(readahead_bytes=UNIT_BYTES),
                              **arguments)
    assert rows_of(reader) == expected
    assert reader._readahead.misses == 0
    assert reader._readahead.peak_bytes <= 2 * UNIT_BYTES  # a unit over the budget is fetched alone
    gets = [r for r in proxy.log("GET") if "/part-" in r.path and not r.fault]
    assert gets and max(r.body_bytes for r in gets) <= remote.PART_BYTES


def test_resume_at_random_cuts_is_exact_under_latency_and_faults(s3, data, proxy):
    _, prefix = data["ipc_file"]
    arguments = dict(seed=2, shuffle=True, infinite=True, split_rows=4, interleave=2, retry=FAST,
                     remote_reads=RemoteReads(readahead_bytes=3 * UNIT_BYTES))
    reference = take(ArrowShardReader.of(s3.url(prefix), **arguments), 2 * sum(ROWS))
    proxy.configure(latency=0.005, bandwidth=None)
    cuts = sorted(random.Random(7).sample(range(1, len(reference)), 4))
    reader = ArrowShardReader.of(s3.url(prefix), **arguments)
    got = take(reader, cuts[0])
    for cut, after in zip(cuts, [*cuts[1:], len(reference)], strict=True):
        state = reader.get_state()
        for kind in ("503", "reset", "stall"):
            proxy.inject(kind, 1, path=f"/{prefix}/part-")
        reader = ArrowShardReader.of(s3.url(prefix), **arguments)
        reader.reset(state)
        got += take(reader, after - cut)
    assert got == reference
    assert {r.fault for r in proxy.requests if r.fault} == {"503", "reset", "stall"}


def test_eval_reads_every_row_once_under_latency_and_faults(s3, data, proxy):
    _, prefix = data["parquet"]
    proxy.configure(latency=0.005, bandwidth=None)
    proxy.inject("503", 2, path=f"/{prefix}/part-00001")
    proxy.inject("reset", 1, path=f"/{prefix}/part-00002")
    proxy.inject("stall", 1, path=f"/{prefix}/part-00000")
    indices = []
    for rank in range(2):
        reader = ArrowShardReader.of(s3.url(prefix), shuffle=False, rank=rank, world_size=2, split_rows=4, retry=FAST,
                                  remote_reads=RemoteReads(readahead_bytes=2 * UNIT_BYTES))
        indices += [sample.key.index for sample in reader]
    assert sorted(indices) == list(range(sum(ROWS)))
    assert not any(fault.times for fault in proxy._faults), "a fault was planned but never hit"


def test_random_access_fetches_units_concurrently(s3, data, proxy):
    local, prefix = data["parquet"]
    keys = [al.Key(i, 0) for i in random.Random(3).sample(range(sum(ROWS)), 30)]
    remote = ArrowShardReader.of(s3.url(prefix), split_rows=4, retry=FAST)
    expected = rows_of(ArrowShardReader.of(str(local), split_rows=4).fetch(keys))
    proxy.clear()
    proxy.hold()
    result: list = []
    fetching = threading.Thread(target=lambda: result.append(remote.fetch(keys)))
    fetching.start()
    try:
        assert proxy.wait_in_flight(len(ROWS), timeout=60), "the rows' units were fetched one after another"
    finally:
        proxy.release()
        fetching.join()
    assert rows_of(result[0]) == expected


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_random_access_fetches_long_units_in_parts(s3, data, proxy, fmt, monkeypatch):
    """Rows read by key (a resume, a worker process) fetch a unit longer than a part as parts, like the read-ahead."""
    local, prefix = data[fmt]
    monkeypatch.setattr(remote, "PART_BYTES", 8 * 1024)
    keys = [al.Key(i, 0) for i in random.Random(5).sample(range(sum(ROWS)), 12)]
    expected = rows_of(ArrowShardReader.of(str(local), split_rows=4).fetch(keys))
    reader = ArrowShardReader.of(s3.url(prefix), split_rows=4, retry=FAST)
    proxy.clear()
    assert rows_of(reader.fetch(keys)) == expected
    gets = [r for r in proxy.log("GET") if "/part-" in r.path and not r.fault]
    assert len(gets) > len(ROWS) and max(r.body_bytes for r in gets) <= remote.PART_BYTES


def small_files(folder, n: int):
    for i in range(n):
        make_shards(folder / f"f{i:03d}", [2], "ipc_file", batch_rows=2, seconds=0.1)
        (folder / f"f{i:03d}" / "part-00000.arrow").rename(folder / f"part-{i:05d}.arrow")
        (folder / f"f{i:03d}").rmdir()


def shard_requests(proxy, prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in proxy.requests:
        kind = "LIST" if request.method == "GET" and "/" not in request.path.strip("/") else request.method
        name = request.path.rsplit("/", 1)[-1] if request.path.startswith(f"/{prefix}/") else ""
        counts[f"{kind} {name}".strip()] = counts.get(f"{kind} {name}".strip(), 0) + 1
    return counts


def opened_with_requests(s3, proxy, tmp_path, monkeypatch, name: str, files: int) -> tuple[al.ShardDataset, dict]:
    """``files`` small shards uploaded to ``ahead/NAME``, a new `ShardDataset` of them (no machine-local copy to
    lean on), and the requests its construction made (`shard_requests`)."""
    small_files(tmp_path / name, files)
    s3.upload(tmp_path / name, f"ahead/{name}")
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "cache"))
    proxy.clear()
    dataset = al.ShardDataset(s3.url(f"ahead/{name}"), retry=FAST)
    return dataset, shard_requests(proxy, f"ahead/{name}")


def test_construction_requests_without_and_with_an_index(s3, proxy, tmp_path, monkeypatch):
    dataset, counts = opened_with_requests(s3, proxy, tmp_path, monkeypatch, "many", 24)
    listing = {k: n for k, n in counts.items() if "part-" not in k}
    # a manifest? (none), the folder: is it one, a Hugging Face state.json in it, its files
    assert sum(listing.values()) <= 5, listing
    shards = {k: n for k, n in counts.items() if "part-" in k}
    # per file: one GET of its last 64 KiB (here the whole file); through pyarrow also the HEAD of its open
    direct = importlib.util.find_spec("obstore") and os.environ.get("AUDIOLOADER_DIRECT_READS") != "0"
    methods = ("GET",) if direct else ("GET", "HEAD")
    assert shards == {f"{m} part-{i:05d}.arrow": 1 for i in range(24) for m in methods}, shards
    assert dataset.index_stats == {"indexed": 0, "stale": 0, "unindexed": 24}

    path = shard_index.write_index(s3.url("ahead/many", direct=True), portable=True)  # uploads go straight in
    assert path == "s3://ahead/many/_audioloader_index.arrow"
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "cache2"))  # no machine-local copy to lean on
    proxy.clear()
    indexed = al.ShardDataset(s3.url("ahead/many"), retry=FAST)
    counts = shard_requests(proxy, "ahead/many")
    assert {k: n for k, n in counts.items() if k not in listing} == {f"{m} _audioloader_index.arrow": 1
                                                                     for m in methods}, counts
    assert sum(counts.values()) <= 7
    assert indexed.index_stats == {"indexed": 24, "stale": 0, "unindexed": 0}
    assert indexed.files == dataset.files and indexed.identity() == dataset.identity()
    assert rows_of(ArrowShardReader.of(indexed, shuffle=False)) == rows_of(ArrowShardReader.of(dataset, shuffle=False))


def test_a_remote_folder_is_listed_in_one_call(s3, proxy, tmp_path, monkeypatch):
    # Before its files are read a folder costs one LIST (and the look for its manifest), not also the folder check
    # (a HEAD and a LIST) and a look for a Hugging Face state.json: three round trips fewer at 20-100 ms each.
    dataset, counts = opened_with_requests(s3, proxy, tmp_path, monkeypatch, "once", 6)
    assert {k: n for k, n in counts.items() if "part-" not in k} == {"LIST": 1, "HEAD _audioloader_manifest.arrow": 1}
    assert len(dataset.files) == 6 and dataset.num_rows == 12


def test_a_remote_hugging_face_folder_still_reads_only_the_files_its_state_json_names(s3, proxy, tmp_path):
    # The listing shows state.json: its files are the dataset, a cache-*.arrow beside them is not.
    small_files(tmp_path / "hf", 3)
    os.rename(tmp_path / "hf" / "part-00002.arrow", tmp_path / "hf" / "cache-1234.arrow")
    names = ["part-00000.arrow", "part-00001.arrow"]
    (tmp_path / "hf" / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    s3.upload(tmp_path / "hf", "ahead/hf")
    dataset = al.ShardDataset(s3.url("ahead/hf"), retry=FAST)
    assert [p.rsplit("/", 1)[-1] for p in dataset.files.paths] == names and dataset.num_rows == 4


def test_a_remote_file_or_missing_path_is_still_found_or_refused(s3, proxy, tmp_path):
    # A path with no shard extension that is a file (nothing under it as a folder) is asked about as before.
    small_files(tmp_path / "single", 1)
    s3.upload(tmp_path / "single", "ahead/single")
    fs = s3.filesystem()
    fs.copy_file("ahead/single/part-00000.arrow", "ahead/single/noext")
    dataset = al.ShardDataset(s3.url("ahead/single/noext"), retry=FAST)
    assert dataset.num_rows == 2
    with pytest.raises(al.SourceNotFoundError, match="no such file or folder"):
        al.ShardDataset(s3.url("ahead/nothing-here"), retry=FAST)


def test_a_stale_index_entry_is_not_used(s3, proxy, tmp_path, monkeypatch):
    folder = tmp_path / "stale"
    make_shards(folder, [6, 6], "parquet", batch_rows=3, seconds=0.2)
    s3.upload(folder, "ahead/stale")
    shard_index.write_index(s3.url("ahead/stale", direct=True), portable=True)
    make_shards(folder, [6, 9], "parquet", batch_rows=3, seconds=0.2)  # part-00001 rewritten: more rows
    s3.upload(folder, "ahead/stale")
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "cache"))
    dataset = al.ShardDataset(s3.url("ahead/stale"), retry=FAST)
    assert dataset.index_stats == {"indexed": 1, "stale": 1, "unindexed": 0}
    assert [f.num_rows for f in dataset.files] == [6, 9]
    expected = rows_of(ArrowShardReader.of(str(folder), shuffle=False))
    assert rows_of(ArrowShardReader.of(dataset, shuffle=False)) == expected


def test_a_cached_entry_is_trusted_only_when_scanned_after_the_mtime_resolution():
    class Listed:
        size, mtime_ns = 100, 5_000_000_000

    entry = {"size": 100, "mtime_ns": 5_000_000_000, "scanned_ns": 5_900_000_000, "etag": None}
    assert not shard_index.matches(entry, Listed())  # scanned within the same second: a rewrite may hide
    assert shard_index.matches({**entry, "scanned_ns": 8_000_000_000}, Listed())
    assert not shard_index.matches({**entry, "scanned_ns": 8_000_000_000, "size": 101}, Listed())
    assert shard_index.matches({**entry, "mtime_ns": None}, Listed())  # portable (pack): size (and ETag) only


def test_index_command_writes_the_manifest(tmp_path, capsys):
    from audioloader.shards.catalog.manifest import Manifest
    from audioloader.tools.cli import main

    make_shards(tmp_path, [5, 6], "parquet", batch_rows=2)
    plain = al.ShardDataset(tmp_path)
    assert main(["index", str(tmp_path)]) == 0
    # the manifest's path with what it lists (issue 39: `index` printed the path alone)
    assert capsys.readouterr().out.strip() == f"{tmp_path / '_audioloader_manifest.arrow'}: 2 shard file(s), 11 rows"
    manifest = Manifest(str(tmp_path / "_audioloader_manifest.arrow"), "test")
    assert manifest.names() == ["part-00000.parquet", "part-00001.parquet"]
    assert [manifest.unit_rows(i) for i in range(2)] == [(2, 2, 1), (2, 2, 2)]
    assert manifest.mtime_ns(0) is None and manifest.etag(0) is None  # portable: nothing a copy changes
    dataset = al.ShardDataset(tmp_path)
    assert dataset.manifest.origin == "local" and dataset.files == plain.files
