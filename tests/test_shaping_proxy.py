"""The shaping proxy of tests/s3_server.py: it adds its latency to every request, caps each connection's bandwidth,
counts what it forwarded, and serves concurrent requests concurrently (in-process and in its own process).

The timings asserted are lower bounds the proxy guarantees by construction (it waits before forwarding, and paces
bytes before writing them): a busy machine only makes them larger. No upper bound on time is asserted.
"""

from __future__ import annotations

import http.client
import threading
import time

import pytest

from tests.s3_server import FaultProxy, ProxyProcess, request_kind

SIZE = 256 * 1024


@pytest.fixture(scope="module")
def s3(s3_servers):
    """This module's server (`conftest.s3_servers`), holding one object of `SIZE` bytes at ``shaping/blob``."""
    server = s3_servers()
    fs = server.filesystem()
    fs.create_dir("shaping")
    payload = bytes(range(256)) * (SIZE // 256)
    with fs.open_output_stream("shaping/blob") as out:
        out.write(payload)
    return server


@pytest.fixture
def proxy(s3):
    """A fresh in-process proxy in front of the module's server (its shaping and counters are this test's)."""
    host, port = s3.direct_endpoint.split(":")
    proxy = FaultProxy((host, int(port)))
    try:
        yield proxy
    finally:
        proxy.close()


def get(endpoint: str, path: str = "/shaping/blob", connection: http.client.HTTPConnection | None = None,
        headers: dict[str, str] | None = None) -> bytes:
    own = connection is None
    connection = connection or http.client.HTTPConnection(*endpoint.split(":"), timeout=60)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
        assert response.status in (200, 206), (response.status, body[:200])
        return body
    finally:
        if own:
            connection.close()


def test_every_request_waits_the_latency_first(proxy):
    proxy.configure(latency=0.05, bandwidth=None)
    connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
    started = time.perf_counter()
    for _ in range(6):
        assert len(get(proxy.endpoint, connection=connection)) == SIZE
    elapsed = time.perf_counter() - started
    connection.close()
    assert elapsed >= 6 * 0.05
    stats = proxy.stats()
    assert (stats["requests"], stats["GET"], stats["bytes"]) == (6, 6, 6 * SIZE)
    assert [r.body_bytes for r in proxy.log("GET", "/shaping/blob")] == [SIZE] * 6


def test_the_bandwidth_cap_paces_each_connection(proxy):
    cap = 2 * 1024 * 1024  # bytes/s: a 256 KiB object takes >= 1/8 s
    proxy.configure(latency=0.0, bandwidth=cap)
    connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
    started = time.perf_counter()
    first = get(proxy.endpoint, connection=connection)
    one = time.perf_counter() - started
    second = get(proxy.endpoint, connection=connection, headers={"Range": "bytes=1000-132071"})
    both = time.perf_counter() - started
    connection.close()
    assert first == bytes(range(256)) * (SIZE // 256)
    assert second == first[1000:132072]
    assert one >= SIZE / cap
    assert both >= (SIZE + len(second)) / cap  # the same connection's second response is paced after the first
    stats = proxy.stats()
    assert (stats["GET"], stats["bytes"]) == (2, SIZE + 131072)
    assert proxy.log("GET")[1].range == "bytes=1000-132071"


def test_concurrent_requests_are_served_concurrently(proxy):
    proxy.configure(latency=0.0, bandwidth=1024 * 1024)  # shaping on: a slow connection must not block the others
    proxy.hold()
    results: list[int] = []
    clients = [threading.Thread(target=lambda: results.append(len(get(proxy.endpoint)))) for _ in range(12)]
    for client in clients:
        client.start()
    try:
        # All 12 are held inside the proxy at once: a proxy serving one request at a time never gets there.
        assert proxy.wait_in_flight(12, timeout=60), f"only {proxy.stats()['max_in_flight']} requests in flight"
    finally:
        proxy.release()
        for client in clients:
            client.join()
    assert results == [SIZE] * 12
    stats = proxy.stats()
    assert (stats["GET"], stats["bytes"], stats["max_in_flight"]) == (12, 12 * SIZE, 12)


def test_counters_reset_and_name_the_request_kinds(proxy):
    get(proxy.endpoint, "/shaping?list-type=2")
    connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
    connection.request("HEAD", "/shaping/blob")
    response = connection.getresponse()
    response.read()
    connection.close()
    assert response.status == 200 and response.getheader("Content-Length") == str(SIZE)
    assert {k: proxy.stats()[k] for k in ("requests", "LIST", "HEAD", "GET")} == {
        "requests": 2, "LIST": 1, "HEAD": 1, "GET": 0}
    proxy.reset_counters()
    stats = proxy.stats()
    assert stats.pop("max_in_flight") <= 1  # the last response may not have left the proxy yet
    assert stats == {"requests": 0, "bytes": 0, "faults": 0, "throttled": 0, "GET": 0, "HEAD": 0, "LIST": 0}
    assert [request_kind(*r) for r in (("GET", "/b"), ("GET", "/b/"), ("GET", "/b/k"), ("HEAD", "/b/k"))] == [
        "LIST", "LIST", "GET", "HEAD"]


def test_faults_still_injected_and_counted_with_latency(proxy):
    proxy.configure(latency=0.02, bandwidth=None)
    proxy.inject("503", 1, path="/shaping/blob")
    connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
    connection.request("GET", "/shaping/blob")
    response = connection.getresponse()
    assert response.status == 503 and b"SlowDown" in response.read()
    assert len(get(proxy.endpoint, connection=connection)) == SIZE  # the same connection goes on
    connection.close()
    assert proxy.stats()["faults"] == 1 and proxy.stats()["requests"] == 2


@pytest.mark.parametrize("latency, bandwidth, name", [(-0.1, None, "latency"), (0.0, 0, "bandwidth")])
def test_bad_shaping_is_refused_by_name(proxy, latency, bandwidth, name):
    with pytest.raises(ValueError, match=name):
        proxy.configure(latency=latency, bandwidth=bandwidth)


def test_the_proxy_in_its_own_process_shapes_and_counts(s3):
    host, port = s3.direct_endpoint.split(":")
    proxy = ProxyProcess((host, int(port)), latency=0.05, bandwidth=None)
    try:
        assert proxy.pid != s3.pid
        started = time.perf_counter()
        connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
        for _ in range(4):
            assert len(get(proxy.endpoint, connection=connection)) == SIZE
        connection.close()
        assert time.perf_counter() - started >= 4 * 0.05
        stats = proxy.stats()
        assert (stats["requests"], stats["GET"], stats["bytes"]) == (4, 4, 4 * SIZE)
        proxy.reset_counters()
        assert proxy.stats()["requests"] == 0
        with pytest.raises(ValueError, match="bandwidth"):
            proxy.configure(latency=0.0, bandwidth=-1)
        proxy.configure(latency=0.0, bandwidth=4 * 1024 * 1024)
        started = time.perf_counter()
        assert len(get(proxy.endpoint)) == SIZE
        assert time.perf_counter() - started >= SIZE / (4 * 1024 * 1024)
    finally:
        proxy.close()


@pytest.mark.parametrize("status, code", [(503, b"SlowDown"), (429, b"TooManyRequests")])
def test_requests_above_max_rate_are_refused_as_a_throttling_store_does(proxy, status, code):
    proxy.configure(latency=0.0, bandwidth=None, max_rate=0.01, throttle_status=status)  # one request, then none
    connection = http.client.HTTPConnection(*proxy.endpoint.split(":"), timeout=60)
    answers = []
    for _ in range(5):
        connection.request("GET", "/shaping/blob")
        response = connection.getresponse()
        answers.append((response.status, code in response.read()))
    connection.close()
    assert answers == [(200, False)] + [(status, True)] * 4
    stats = proxy.stats()
    assert (stats["requests"], stats["throttled"], stats["faults"]) == (5, 4, 4)
    assert [r.fault for r in proxy.requests] == [""] + ["throttled"] * 4
    with pytest.raises(ValueError, match="max_rate"):
        proxy.configure(latency=0.0, bandwidth=None, max_rate=0)
