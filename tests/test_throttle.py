"""Throttling survived: a store's "slow down" (S3's 503 SlowDown, HTTP 429) is retried with full-jitter backoff and
slows the process's requests to that store (an AIMD rate per store), counted in the loader's stats.

The end-to-end test puts moto behind the shaping proxy with ``max_rate``: it refuses every request above that rate
with 503 SlowDown, as S3 does while a prefix scales. No timing is asserted: counts only.
"""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

import audioloader as al
from audioloader.shards.storage.retry import is_throttled, is_transient, with_retries
from audioloader.shards.storage.throttle import FLOOR, INCREASE, StoreRate, forget_rates, store_of, store_rate
from tests.helpers import SMALL, make_shards, upload_shards
from tests.s3_server import THROTTLED


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_no_limit_until_the_store_refuses():
    clock = FakeClock()
    rate = StoreRate("s3://b", clock=clock, sleep=clock.sleep)
    for _ in range(1000):
        rate.acquire()
    assert rate.rate is None and clock.slept == []


def test_a_refusal_halves_the_rate_sent_once_per_epoch_and_successes_grow_it():
    clock = FakeClock()
    rate = StoreRate("s3://b", clock=clock, sleep=clock.sleep)
    epochs = []
    for _ in range(200):  # 200 requests sent in the same instant: 200 a second over the window
        epochs.append(rate.acquire()[0])
    for epoch in epochs[:24]:  # 24 requests in flight refused together: one decrease, not 24
        rate.refused(epoch)
    assert rate.rate == 100.0 and rate.decreases == 1 and rate.throttled == 24
    epoch, _ = rate.acquire()
    rate.refused(epoch)  # sent after the decrease: the store still refuses, halve again
    assert rate.rate == 50.0 and rate.decreases == 2
    for _ in range(8):
        rate.succeeded()
    assert rate.rate == 50.0 + 8 * INCREASE


def test_a_limited_rate_paces_every_request_never_a_tight_loop():
    clock = FakeClock()
    rate = StoreRate("s3://b", clock=clock, sleep=clock.sleep)
    for _ in range(40):
        rate.acquire()
    clock.now += 2.0  # a quiet moment: 0 requests sent in the last second
    rate.refused(rate.acquire()[0])  # one request a second sent: the floor, not 0
    assert rate.rate == FLOOR
    start = clock.now
    for _ in range(5):
        rate.acquire()
    assert clock.now - start >= 4 / FLOOR  # 5 requests at 0.5 a second: >= 8 s between the first and the last
    assert rate.waited == pytest.approx(sum(clock.slept))


def test_stores_are_named_without_secrets_and_shared_per_process():
    assert store_of("s3://KEY:SECRET@bucket/a/b.arrow?endpoint_override=x") == "s3://bucket"
    assert store_of("https://host:8080/data/x.parquet") == "https://host:8080"
    assert store_of("bucket/prefix/x.arrow") == "bucket"
    assert store_rate("s3://same-bucket/a") is store_rate("s3://same-bucket/b/c")
    assert store_rate("s3://same-bucket/a") is not store_rate("s3://other-bucket/a")


@pytest.mark.parametrize("text", [
    # pyarrow's words for S3's answers, as seen from moto behind the proxy (a HEAD has no body: the status only)
    "When reading information for key 'k' in bucket 'b': AWS Error UNKNOWN (HTTP status 503) during HeadObject "
    "operation: No response body.",
    "When listing objects under key '' in bucket 'b': AWS Error SLOW_DOWN during ListObjectsV2 operation: Please "
    "reduce your request rate.",
    "AWS Error UNKNOWN (HTTP status 429) during ListObjectsV2 operation: Unable to parse ExceptionName: "
    "TooManyRequests Message: slow down",
    "429, message='Too Many Requests', url='https://huggingface.co/x'",  # aiohttp (fsspec's http)
    "Throttling: Rate exceeded",
])
def test_throttling_is_recognised_in_every_clients_words(text):
    assert is_throttled(OSError(text)) and is_transient(OSError(text))


@pytest.mark.parametrize("text", ["AWS Error ACCESS_DENIED (HTTP status 403)", "HTTP status 500 InternalError",
                                  "Connection reset by peer", "NoSuchKey (HTTP status 404)"])
def test_other_faults_are_not_taken_for_throttling(text):
    assert not is_throttled(OSError(text))


def test_throttled_attempts_back_off_with_full_jitter_and_are_reported():
    calls, reports = [], []

    def read():
        calls.append(1)
        if len(calls) <= 40:
            raise OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.")
        return "data"

    waits: list[float] = []
    retry = al.Retry(attempts=41, initial_delay=0.1, max_delay=0.1)
    assert with_retries(read, what="x", retry=retry, sleep=waits.append,
                        on_throttle=lambda refused, s: reports.append((refused, s))) == "data"
    assert len(waits) == 40 and all(0 <= w <= 0.1 for w in waits)
    assert min(waits) < 0.05  # drawn from [0, cap], not [cap / 2, cap]
    assert reports == [(True, w) for w in waits]


def test_a_read_throttled_to_the_end_says_so():
    def read():
        raise OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body.")

    with pytest.raises(al.ShardReadError, match="3 of them refused for going too fast"):
        with_retries(read, what="shard s3://b/x.arrow", retry=al.Retry(attempts=3), sleep=lambda s: None)


# ----------------------------------------------------------------------------------------- end to end, on moto

FILES, ROWS_PER_FILE = 12, 8


@pytest.fixture(scope="module")
def s3(s3_servers, tmp_path_factory):
    """This module's server (`conftest.s3_servers`), holding the shards at ``throttle/data``."""
    server = s3_servers()
    upload_shards(server, tmp_path_factory.mktemp("throttled"), "throttle/data", [ROWS_PER_FILE] * FILES,
                  batch_rows=2, seconds=0.2)
    return server


def eval_indices(s3, retry):
    """Every row index of one eval pass over the shards (through the proxy), and the loader's counters."""
    loader = al.AudioLoader(s3.url("throttle/data"), batch_size=8, train=False, seed=0, features=SMALL,
                            workers=al.Workers(num_workers=0),
                            storage=al.Storage(split_rows=2, index="off", retry=retry, readahead_bytes=0))
    with loader:
        indices = sorted(i for batch in loader for i in batch["index"][batch["valid"]].tolist())
        stats = loader.stats()
    return indices, stats


@pytest.mark.parametrize("status", [pytest.param(503, marks=pytest.mark.slow), 429])  # 12 s each: one by default
def test_a_store_that_refuses_requests_above_a_rate_is_read_exactly(s3, status):
    patient = al.Retry(attempts=12, initial_delay=0.02, max_delay=0.5, timeout=5.0)
    s3.proxy.configure(latency=0.0, bandwidth=None)
    s3.proxy.reset_counters()
    expected, _ = eval_indices(s3, patient)
    needed = s3.proxy.stats()["requests"]
    assert expected == list(range(FILES * ROWS_PER_FILE)) and s3.proxy.stats()["throttled"] == 0

    forget_rates()  # what this process learned of the store in an earlier test is not this test's
    s3.proxy.configure(latency=0.0, bandwidth=None, max_rate=20.0, throttle_status=status)
    s3.proxy.clear()
    s3.proxy.reset_counters()
    try:
        got, stats = eval_indices(s3, patient)
    finally:
        s3.proxy.configure(latency=0.0, bandwidth=None)
    seen = s3.proxy.stats()
    assert got == expected  # every row exactly once
    assert seen["throttled"] > 0, "the loader never went above the rate: the test proves nothing"
    assert {r.fault for r in s3.proxy.requests if r.fault} == {THROTTLED}
    # Bounded: the refusals stay a fraction of the work (a tight loop would make them dominate).
    assert seen["requests"] <= 3 * needed, (seen, needed)
    # What the store refused is what the loader counted, construction (listing excepted) and reads together.
    # (The listing's requests, a LIST and a look for a Hugging Face state.json, are not the dataset's reads.)
    refused_listing = sum(1 for r in s3.proxy.requests if r.fault and not r.path.endswith(".arrow"))
    assert stats["counters"]["throttled_requests"] == seen["throttled"] - refused_listing
    assert stats["seconds"]["throttle_wait"] > 0


def test_a_throttled_listing_teaches_the_stores_rate(monkeypatch):
    # A LIST that S3 refuses for going too fast slows this process's later requests to the same bucket too.
    import pyarrow.fs as pafs

    from audioloader.shards.sources import resolve as sources

    forget_rates()
    monkeypatch.setattr("audioloader.shards.storage.retry.time.sleep", lambda seconds: None)
    calls = []

    class ThrottlingFilesystem:
        def get_file_info(self, selector):
            calls.append(selector)
            if len(calls) == 1:
                raise OSError("AWS Error SLOW_DOWN during ListObjectsV2 operation: Please reduce your request rate.")
            if isinstance(selector, pafs.FileSelector):  # nothing under it as a folder: then it is asked about
                return []
            return pafs.FileInfo(selector, pafs.FileType.File, size=10)

    sources._expand_remote("s3://listed-bucket/data", ThrottlingFilesystem(), "listed-bucket/data",
                           al.Retry(attempts=3, initial_delay=0.0, max_delay=0.0))
    assert len(calls) >= 2  # refused, then tried again
    assert store_rate("s3://listed-bucket/other").rate is not None  # the bucket's rate is limited from now on
    forget_rates()


# ----------------------------------------------------------------------------- HTTP(S) stores through fsspec

class ThrottlingFiles(http.server.SimpleHTTPRequestHandler):
    """Serves a folder's files (ranged GETs too), answering ``refuse`` requests in a row with ``status`` (429, or 503
    with ``Retry-After``) when told to; records what it was asked (`requests`)."""

    refuse, status, requests = 0, 429, []

    def log_message(self, format, *args):  # quiet
        pass

    def refused(self) -> bool:
        type(self).requests.append((self.command, self.headers.get("Range")))
        if type(self).refuse <= 0:
            return False
        type(self).refuse -= 1
        self.send_response(type(self).status)
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_HEAD(self):
        if not self.refused():
            super().do_HEAD()

    def do_GET(self):
        if self.refused():
            return
        span = self.headers.get("Range")
        if span is None:
            return super().do_GET()
        with open(self.translate_path(self.path), "rb") as f:
            data = f.read()
        first, last = (int(x) for x in span.split("=", 1)[1].split("-"))
        last = min(last, len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self.wfile.write(data[first:last + 1])


@pytest.fixture
def http_files(tmp_path):
    pytest.importorskip("aiohttp")  # fsspec's http
    # 300 KB: more than a scan reads whole (256 KiB), so its row groups are fetched when read
    make_shards(tmp_path / "files", [16], "parquet", batch_rows=4, seconds=0.6)
    handler = type("Handler", (ThrottlingFiles,), {"requests": []})
    serve = functools.partial(handler, directory=str(tmp_path / "files"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/part-00000.parquet", handler
    server.shutdown()
    thread.join()


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("when", ["construction", "reading"])
def test_an_http_store_throttling_is_retried_and_counted_not_a_missing_or_corrupt_file(http_files, when, status):
    # fsspec's http turned a 429 into FileNotFoundError ("no such file or folder" at construction; at reading the
    # file's open said missing) or a client error read as a "truncated or corrupt" file: never retried or counted.
    url, server = http_files
    server.status = status
    server.refuse = 2 if when == "construction" else 0
    loader = al.AudioLoader(url, batch_size=4, features=SMALL, train=False, workers=al.Workers(num_workers=0),
                            storage=al.Storage(retry=al.Retry(attempts=5, initial_delay=0.01, max_delay=0.05)))
    with loader:
        if when == "reading":
            server.refuse = 2
        rows = sorted(i for batch in loader for i in batch["index"].tolist())
        throttled = loader.stats()["counters"].get("throttled_requests", 0)
    assert rows == list(range(16))  # every row of the file, once
    assert server.refuse == 0, server.requests  # both refusals were answered ...
    if when == "reading":  # ... and counted (at construction: a listing's, paced but not a loader's request yet)
        assert throttled >= 1
