"""The local cache of remote shards (Storage(cache_dir=...)): shared by processes, bounded, verified, crash-safe."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import audioloader as al
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.storage.cache import ObjectCache
from tests.helpers import SMALL, assert_same_batches, flip_audio_bytes, upload_shards

ROOT = Path(__file__).parent.parent
ROWS = [10, 10, 10, 10]
OPTIONS = {"batch_size": 8, "features": SMALL, "train": False, "workers": al.Workers(num_workers=1, kind="thread")}
#: Whether remote reads go through obstore (`audioloader.shards.storage.direct`): one GET a read, no HEAD.
DIRECT = importlib.util.find_spec("obstore") is not None and os.environ.get("AUDIOLOADER_DIRECT_READS") != "0"
RETRY = al.Retry(attempts=3, initial_delay=0.01, max_delay=0.05, timeout=5.0)


def storage(cache_dir=None, cache_limit=None) -> al.Storage:
    return al.Storage(split_rows=4, retry=RETRY, cache_dir=cache_dir, cache_limit=cache_limit)


@pytest.fixture
def shards(s3, tmp_path, request):
    """Four IPC shards, local and on S3 under a prefix of this test's own (so copies never carry over)."""
    return upload_shards(s3, tmp_path / "local", f"cache/{request.node.name.replace('[', '-').rstrip(']')}", ROWS)


def batches(source, cache_dir=None, cache_limit=None):
    with al.AudioLoader(source, storage=storage(cache_dir, cache_limit), **OPTIONS) as loader:
        return list(loader), loader.stats()


def downloads(s3, prefix: str) -> dict[str, int]:
    """Whole-object GETs per file name (a download asks for every byte at once; scans ask for a few)."""
    found: dict[str, int] = {}
    for request in s3.proxy.log("GET", f"/{prefix}/"):
        name = request.path.rsplit("/", 1)[-1]
        if request.range and request.body_bytes and request.range.startswith("bytes=0-") and \
                int(request.range.rsplit("-", 1)[1]) + 1 == request.body_bytes and request.body_bytes > 4096:
            found[name] = found.get(name, 0) + 1
    return found


# Two processes build a loader on the same remote shards and cache folder, wait until both are built, then read
# everything at once (so their downloads overlap), and save their batches.
READER = textwrap.dedent("""
    import json, sys, torch
    import audioloader as al
    from tests.test_cache import OPTIONS, storage
    url, cache, out = sys.argv[1:4]
    with al.AudioLoader(url, storage=storage(cache), **OPTIONS) as loader:
        print("built", flush=True)
        sys.stdin.readline()
        got = list(loader)
        counters = loader.stats()["counters"]
    torch.save(got, out)
    print(json.dumps({k: v for k, v in counters.items() if k.startswith("cache")}), flush=True)
""")


def test_two_processes_sharing_a_cache_download_each_object_once(s3, shards, tmp_path):
    local, prefix = shards
    expected, _ = batches(local)
    cache = tmp_path / "cache"
    children = [subprocess.Popen([sys.executable, "-c", READER, s3.url(prefix), str(cache), str(tmp_path / f"{i}.pt")],
                                 cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for i in range(2)]
    try:
        assert [child.stdout.readline().strip() for child in children] == ["built", "built"]
        s3.proxy.clear()
        s3.proxy.configure(latency=0.05, bandwidth=None)  # downloads take a while: the two processes overlap
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        counters = [json.loads(child.stdout.readline()) for child in children]
        assert [child.wait(timeout=300) for child in children] == [0, 0]
    finally:
        s3.proxy.configure(latency=0.0, bandwidth=None)
        for child in children:
            child.kill()
            child.wait()
    assert downloads(s3, prefix) == {f"part-0000{i}.arrow": 1 for i in range(len(ROWS))}
    assert sum(c.get("cache_misses", 0) for c in counters) == len(ROWS)
    assert sum(c.get("cache_hits", 0) for c in counters) == len(ROWS)  # the other process's downloads
    for i in range(2):
        assert_same_batches(torch.load(tmp_path / f"{i}.pt", weights_only=False), expected)


def test_a_second_pass_reads_nothing_remote_and_matches_local(s3, shards, tmp_path):
    local, prefix = shards
    expected, _ = batches(local)
    cache = tmp_path / "cache"
    first, stats = batches(s3.url(prefix), cache, "50MB")
    assert stats["counters"]["cache_misses"] == len(ROWS) and stats["gauges"]["cache_hit_rate"] == 0.0
    s3.proxy.clear()
    second, stats = batches(s3.url(prefix), cache, "50MB")
    assert stats["counters"]["cache_hits"] == len(ROWS) and stats["gauges"]["cache_hit_rate"] == 1.0
    assert "cache_misses" not in stats["counters"]
    # Construction too: at most one request a file (none where the machine's metadata index agrees with the
    # listing; else its size and ETag: through obstore a GET of its tail, through pyarrow a HEAD), nothing downloaded.
    assert all(n == 1 for n in requests_per_file(s3, prefix).values())
    assert_same_batches(first, expected)
    assert_same_batches(second, expected)


def test_eviction_keeps_the_cache_under_its_limit(s3, shards, tmp_path):
    local, prefix = shards
    sizes = [p.stat().st_size for p in sorted(local.iterdir())]
    limit = int(2.5 * max(sizes))  # two files fit, not three
    expected, _ = batches(local)
    for _ in range(2):
        got, stats = batches(s3.url(prefix), tmp_path / "cache", limit)
        assert_same_batches(got, expected)
        cache = ObjectCache(str(tmp_path / "cache"), limit, al.Retry())
        assert 0 < cache.usage() <= limit
        assert stats["gauges"]["cache_bytes"] <= limit
    assert stats["counters"]["cache_evictions"] >= 2 and stats["counters"]["cache_bytes_evicted"] >= 2 * min(sizes)


def test_a_cache_too_small_for_a_shard_is_refused_naming_it(s3, shards, tmp_path):
    local, prefix = shards
    largest = max(p.stat().st_size for p in local.iterdir())
    with pytest.raises(ValueError, match=rf"Storage\(cache_limit={largest - 1:,}\) is smaller than shard "
                                         rf"s3://{prefix}/part-0000\d\.arrow \({largest:,} bytes\).*Raise cache_limit"):
        batches(s3.url(prefix), tmp_path / "cache", largest - 1)


def test_a_folder_of_other_files_is_never_taken_for_a_cache(s3, shards, tmp_path):
    local, prefix = shards
    with pytest.raises(ValueError, match="holds other files and is not an audioloader cache"):
        batches(s3.url(prefix), local)  # eviction would delete the user's shards
    assert len(list(local.iterdir())) == len(ROWS)


def test_a_changed_remote_object_is_downloaded_again(s3, shards, tmp_path):
    local, prefix = shards
    batches(s3.url(prefix), tmp_path / "cache")
    flip_audio_bytes(local / "part-00002.arrow", row=3)  # same size, same footer: only the ETag tells
    with s3.filesystem().open_output_stream(f"{prefix}/part-00002.arrow") as out:
        out.write((local / "part-00002.arrow").read_bytes())
    expected, _ = batches(local)
    s3.proxy.clear()
    got, stats = batches(s3.url(prefix), tmp_path / "cache")
    assert_same_batches(got, expected)
    # Downloaded again once. (Through obstore the scan's one GET a file, no HEAD, fetches a small file whole, as
    # without a cache: the listing changed, so the machine's index was not used and every file was scanned.)
    whole = downloads(s3, prefix)
    assert (whole.pop("part-00002.arrow") == 2 and whole == dict.fromkeys(whole, 1)) if DIRECT else \
        whole == {"part-00002.arrow": 1}
    assert stats["counters"]["cache_misses"] == 1 and stats["counters"]["cache_hits"] == len(ROWS) - 1


def requests_per_file(s3, prefix: str) -> dict[str, int]:
    """``{"GET part-00000.arrow": n, "HEAD ...": n}``: the requests the proxy saw for each shard of ``prefix``."""
    counts: dict[str, int] = {}
    for request in s3.proxy.requests:
        if f"/{prefix}/part-" in request.path:
            kind = f"{request.method} {request.path.rsplit('/', 1)[-1]}"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def test_a_first_read_into_the_cache_is_one_request_a_file(s3, shards, tmp_path):
    # It was pyarrow's HEAD + GET for each download, and a HEAD + GET for each scan without a manifest: through obstore
    # one GET says the object's size and ETag (checked before a byte is kept), as without the cache.
    local, prefix = shards
    expected, _ = batches(local)
    names = [f"part-{i:05d}.arrow" for i in range(len(ROWS))]
    s3.proxy.clear()
    got, _ = batches(s3.url(prefix), tmp_path / "listed")  # no manifest: a GET of its tail, then the download
    assert_same_batches(got, expected)
    if DIRECT:  # (a small file's "tail" is all of it, as without a cache)
        assert requests_per_file(s3, prefix) == {f"GET {n}": 2 for n in names}
    write_folder_manifest(s3.url(prefix, direct=True))
    s3.proxy.clear()
    got, stats = batches(s3.url(prefix), tmp_path / "manifest")  # the footers are read from the downloaded copies
    assert_same_batches(got, expected)
    methods = ("GET",) if DIRECT else ("HEAD", "GET")
    assert requests_per_file(s3, prefix) == {f"{m} {n}": 1 for n in names for m in methods}
    assert stats["counters"]["cache_misses"] == len(ROWS) and downloads(s3, prefix) == dict.fromkeys(names, 1)


# Builds a loader, says so, and reads when told: its first download is then held at the proxy, and it is killed.
KILLED = textwrap.dedent("""
    import sys
    import audioloader as al
    from tests.test_cache import OPTIONS, storage
    with al.AudioLoader(sys.argv[1], storage=storage(sys.argv[2]), **OPTIONS) as loader:
        print("built", flush=True)
        sys.stdin.readline()
        list(loader)
""")


def test_a_download_killed_midway_leaves_nothing_a_later_reader_uses(s3, shards, tmp_path):
    local, prefix = shards
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", KILLED, s3.url(prefix), str(cache)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "built"
        s3.proxy.hold()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert s3.proxy.wait_in_flight(1, timeout=120), "the download never started"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        s3.proxy.release()
        child.kill()
        child.wait()
    left = sorted(os.listdir(cache / "objects"))
    assert len(left) == 1 and left[0].endswith(".part"), left  # reserved at full size: a torn copy if it were used
    assert os.path.getsize(cache / "objects" / left[0]) == (local / "part-00000.arrow").stat().st_size
    expected, _ = batches(local)
    got, stats = batches(s3.url(prefix), cache)
    assert_same_batches(got, expected)
    assert stats["counters"]["cache_misses"] == len(ROWS)
    assert not [name for name in os.listdir(cache / "objects") if name.endswith(".part")]


def test_storage_arguments_are_checked():
    with pytest.raises(ValueError, match="without cache_dir"):
        al.Storage(cache_limit="1GB")
    with pytest.raises(ValueError, match=r"'12 parsecs'.*e\.g\. '200GB'"):
        al.Storage(cache_dir="/tmp/c", cache_limit="12 parsecs")
    assert al.Storage(cache_dir="/tmp/c", cache_limit="1.5GiB").cache_limit == 3 * 2**29
    with pytest.raises(TypeError, match="Storage"):
        al.AudioLoader("unused", storage={"cache_dir": "/tmp/c"})
    with pytest.raises(ValueError, match=r"Storage.cache_dir=3: must be a folder path"):
        al.Storage(cache_dir=3)
