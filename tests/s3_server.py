"""A real S3-compatible server on loopback (moto's server mode) and a shaping, fault-injecting proxy in front of it.

Nothing here leaves 127.0.0.1: the server and the proxy bind it with a port the
OS picks, requests go only to them, and both stop when the test session ends.

The proxy forwards every request to the server and counts it (method, bytes);
in-process it also logs it (method, object, ``Range`` header, status, body
bytes), so tests can prove what was read. It shapes the traffic like a remote
store: ``latency`` seconds are waited before each request is forwarded (an S3
GET's time to the first byte is 20-100 ms), and ``bandwidth`` bytes/s caps each
connection's response bodies, and ``max_rate`` refuses the requests above a rate as a store that throttles
does (503 SlowDown, as S3; or 429 Too Many Requests, as HTTP stores). It can answer with an HTTP 503 or 500, refuse
access (403 AccessDenied), reset the connection, or stall (send nothing until the
client gives up), a given number of times for matching requests. The server can also enforce real authentication
(moto's IAM: unknown keys, wrong secrets and users without a policy are refused).

Tests use `FaultProxy` in their own process. A benchmark runs the same proxy in
a child process (`ProxyProcess`, ``python -m tests.s3_server proxy HOST:PORT``)
so that its Python does not take the GIL from the loader it measures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

#: Longest a stalled response waits for the client to give up (the proxy's stop also ends it).
STALL_CAP_SECONDS = 30.0

FAULTS = ("503", "500", "403", "reset", "stall")
#: The fault recorded for a request refused above ``max_rate``.
THROTTLED = "throttled"
#: Requests a throttling proxy accepts at once above its rate: this many seconds of it (S3 publishes no burst).
THROTTLE_BURST_SECONDS = 0.1

#: The error code in the body of each injected HTTP error (S3's names).
_ERROR_CODES = {"503": "SlowDown", "500": "InternalError", "403": "AccessDenied", "429": "TooManyRequests"}
_ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected by the test '
               'proxy</Message></Error>')

#: Request headers not forwarded: hop-by-hop ones, and ``Expect`` (the proxy has read the whole body already).
_DROP_REQUEST = frozenset({"connection", "keep-alive", "expect", "proxy-connection"})
#: Response headers not forwarded (the proxy sets its own framing).
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"})

_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Fault:
    """Answer ``kind`` to the next ``times`` requests whose method is ``method`` and path contains ``path``."""

    kind: str
    times: int
    method: str = "GET"
    path: str = ""


@dataclass(frozen=True)
class Request:
    """One request the proxy saw: ``fault`` is the injected fault, or "" when it was forwarded."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    fault: str


def request_kind(method: str, path: str) -> str:
    """``"LIST"`` for a GET of a bucket (``/bucket`` or ``/bucket/``: a listing), else the method."""
    if method == "GET" and "/" not in path.strip("/"):
        return "LIST"
    return method


def _check_shaping(latency: float, bandwidth: float | None, max_rate: float | None = None,
                   throttle_status: int = 503) -> None:
    if not latency >= 0:
        raise ValueError(f"latency={latency!r}: seconds >= 0")
    if bandwidth is not None and not bandwidth > 0:
        raise ValueError(f"bandwidth={bandwidth!r}: bytes per second > 0, or None for no cap")
    if max_rate is not None and not max_rate > 0:
        raise ValueError(f"max_rate={max_rate!r}: requests per second > 0, or None for no limit")
    if throttle_status not in (503, 429):
        raise ValueError(f"throttle_status={throttle_status!r}: 503 (S3's SlowDown) or 429 (Too Many Requests)")


class _Admission:
    """A token bucket of ``rate`` requests a second (a burst of `THROTTLE_BURST_SECONDS` of it): `admit` says
    whether one more request is accepted now. Refused requests take no token (as a store that sheds load)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * THROTTLE_BURST_SECONDS)
        self.tokens = self.capacity
        self.at = time.monotonic()

    def admit(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of ``upstream`` (host, port).

    Args:
        upstream: the server's (host, port).
        latency: seconds waited before each request is forwarded (also before an injected fault).
        bandwidth: bytes per second a connection's response bodies may use, or None for no cap.
        max_rate: requests a second the proxy accepts (all connections together, after the latency); above it a
            request is refused with ``throttle_status`` (503 and S3's ``SlowDown`` error, or 429), recorded as the
            fault `THROTTLED` and counted in ``stats()["throttled"]``. None: no limit.
        keep_log: keep every `Request` in ``requests`` (a benchmark's long run keeps the counters only).
    """

    def __init__(self, upstream: tuple[str, int], *, latency: float = 0.0, bandwidth: float | None = None,
                 max_rate: float | None = None, throttle_status: int = 503, keep_log: bool = True) -> None:
        _check_shaping(latency, bandwidth, max_rate, throttle_status)
        self.upstream = upstream
        self.latency = latency
        self.bandwidth = bandwidth
        self.max_rate, self.throttle_status = max_rate, throttle_status
        self._admission = None if max_rate is None else _Admission(max_rate)
        self.keep_log = keep_log
        self.requests: list[Request] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._flight = threading.Condition(self._lock)
        self._counts: dict[str, int] = {}
        self._in_flight = 0
        self.stopping = threading.Event()
        self._open = threading.Event()  # cleared by hold(): requests wait before they are forwarded
        self._open.set()
        self._server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def configure(self, *, latency: float, bandwidth: float | None, max_rate: float | None = None,
                  throttle_status: int = 503) -> None:
        """The shaping of the requests that arrive from now on (``bandwidth=None``: no cap; ``max_rate=None``: no
        limit)."""
        _check_shaping(latency, bandwidth, max_rate, throttle_status)
        with self._lock:
            self.latency, self.bandwidth = latency, bandwidth
            self.max_rate, self.throttle_status = max_rate, throttle_status
            self._admission = None if max_rate is None else _Admission(max_rate)

    def admit(self) -> bool:
        """Whether a request arriving now is under ``max_rate`` (always, without one)."""
        with self._lock:
            return self._admission is None or self._admission.admit()

    def inject(self, kind: str, times: int = 1, *, method: str = "GET", path: str = "") -> None:
        if kind not in FAULTS:
            raise ValueError(f"fault {kind!r}: one of {FAULTS}")
        with self._lock:
            self._faults.append(Fault(kind, times, method, path))

    def clear(self) -> None:
        """Forget the log and the faults not yet injected."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()

    def take_fault(self, method: str, path: str) -> str:
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and fault.method == method and fault.path in path:
                    fault.times -= 1
                    return fault.kind
        return ""

    def record(self, request: Request) -> None:
        with self._lock:
            if self.keep_log:
                self.requests.append(request)
            counts = self._counts
            kind = request_kind(request.method, request.path)
            for key, n in (("requests", 1), (kind, 1), ("bytes", request.body_bytes),
                           ("faults", 1 if request.fault else 0), ("throttled", request.fault == THROTTLED)):
                counts[key] = counts.get(key, 0) + n

    def log(self, method: str = "GET", path: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and path in r.path]

    def stats(self) -> dict[str, int]:
        """Counters since the last `reset_counters`: ``requests``, per kind (``GET``, ``HEAD``, ``LIST``, ``PUT``,
        ...), ``bytes`` (response bodies, as declared), ``faults`` (``throttled`` among them: refused above
        ``max_rate``), ``max_in_flight`` (most requests held at once).

        A request is counted before its body is sent, so a client holding its response finds it counted."""
        with self._lock:
            out = {"requests": 0, "bytes": 0, "faults": 0, "throttled": 0, "GET": 0, "HEAD": 0, "LIST": 0}
            out.update(self._counts)
            return out

    def reset_counters(self) -> None:
        with self._lock:
            self._counts = {"max_in_flight": self._in_flight}

    # -- requests in flight (a request is in flight from its arrival to its last byte) ----------------------

    def hold(self) -> None:
        """Keep requests that arrive from now on waiting before they are forwarded, until `release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait_in_flight(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` requests are in flight at once; False if that did not happen within ``timeout`` s."""
        with self._flight:
            return self._flight.wait_for(lambda: self._in_flight >= n, timeout)

    def _enter(self) -> None:
        with self._flight:
            self._in_flight += 1
            self._counts["max_in_flight"] = max(self._counts.get("max_in_flight", 0), self._in_flight)
            self._flight.notify_all()

    def _leave(self) -> None:
        with self._flight:
            self._in_flight -= 1

    def close(self) -> None:
        self.stopping.set()
        self._open.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # 100+ clients may connect at once; the default backlog of 5 drops SYNs (1 s retries)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no error of the proxy's
            super().handle_error(request, client_address)


class _Pacer:
    """Paces one connection's response bytes to ``bandwidth`` bytes/s: `wait(n)` returns when n more bytes may go.

    Bytes are due one after another (a connection sends one response at a time);
    idle time earns no credit, so a response never bursts above the cap.
    """

    def __init__(self) -> None:
        self._free_at = 0.0

    def wait(self, n: int, bandwidth: float, stopping: threading.Event) -> None:
        now = time.monotonic()
        self._free_at = max(self._free_at, now) + n / bandwidth
        if self._free_at > now:
            stopping.wait(self._free_at - now)


def _chunk_size(bandwidth: float | None) -> int:
    """Bytes written at once: ~5 ms of the cap (16 KiB - 1 MiB), so the pacing is smooth and cheap."""
    if bandwidth is None:
        return 1 << 20
    return int(min(1 << 20, max(16 << 10, bandwidth * 0.005)))


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the S3 client expects
        disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls

        def setup(self) -> None:
            super().setup()
            self._upstream: http.client.HTTPConnection | None = None  # kept open across this connection's requests
            self._pacer = _Pacer()

        def finish(self) -> None:
            with contextlib.suppress(OSError):
                super().finish()
            if self._upstream is not None:
                self._upstream.close()

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            proxy._enter()
            try:
                self._serve()
            finally:
                proxy._leave()

        do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                body = self._chunked_body()
            path = self.path.split("?", 1)[0]
            proxy._open.wait()
            if proxy.latency:
                proxy.stopping.wait(proxy.latency)  # the store's time to first byte, before the request goes on
            fault = proxy.take_fault(self.command, path) or ("" if proxy.admit() else THROTTLED)
            if fault:
                self._inject(fault, path)
                return
            response = self._forward(body)
            try:
                self._answer(response, Request(self.command, path, self.headers.get("Range"), response.status, 0,
                                               ""))
            except BaseException:  # the client left mid-body: the upstream response is half read
                self._drop_upstream()
                self.close_connection = True
                raise

        def _chunked_body(self) -> bytes:
            """A chunked request body (an upload's parts), framing and trailers included: forwarded as it came
            (``Transfer-Encoding`` is kept, so http.client sends it unchanged)."""
            raw = bytearray()
            while True:
                line = self.rfile.readline()
                raw += line
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers (e.g. the aws-chunked checksum), then an empty line
                        trailer = self.rfile.readline()
                        raw += trailer
                        if trailer in (b"\r\n", b"\n", b""):
                            return bytes(raw)
                raw += self.rfile.read(size + 2)  # the data and its CRLF

        def _answer(self, response: http.client.HTTPResponse, request: Request) -> None:
            """Send the upstream response on; the request is counted before its body goes out, so a client that
            has its whole response finds it counted."""
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in _DROP_RESPONSE:
                    self.send_header(name, value)
            declared = response.getheader("Content-Length")
            if self.command == "HEAD":
                response.read()
                proxy.record(request)
                self.send_header("Content-Length", declared or "0")
                self.end_headers()
            elif declared is not None and response.getheader("Transfer-Encoding") is None:
                proxy.record(dataclasses.replace(request, body_bytes=int(declared)))
                self.send_header("Content-Length", declared)
                self.end_headers()
                if not self._stream(response, int(declared)):
                    self._drop_upstream()  # the server sent less than it declared: neither side can go on
                    self.close_connection = True
            else:  # no length given (chunked): read it whole, then send it with a length
                data = response.read()
                proxy.record(dataclasses.replace(request, body_bytes=len(data)))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self._send(data)

        def _forward(self, body: bytes | None) -> http.client.HTTPResponse:
            """Send this request upstream over the connection kept for this client; a kept connection that went
            stale (the server closed it while idle) is replaced once."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROP_REQUEST}
            while True:
                reused = self._upstream is not None
                if not reused:
                    self._upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    self._upstream.request(self.command, self.path, body=body, headers=headers)
                    return self._upstream.getresponse()
                except (http.client.HTTPException, OSError):
                    self._drop_upstream()
                    if not reused:
                        raise

        def _drop_upstream(self) -> None:
            if self._upstream is not None:
                self._upstream.close()
                self._upstream = None

        def _stream(self, response: http.client.HTTPResponse, length: int) -> bool:
            """Copy ``length`` body bytes from upstream to the client; False if upstream sent fewer."""
            sent = 0
            while sent < length:
                block = response.read(min(_chunk_size(proxy.bandwidth), length - sent))
                if not block:
                    return False
                self._send(block)
                sent += len(block)
            return True

        def _send(self, data: bytes) -> None:
            """Write ``data``, paced to the bandwidth cap when there is one (each piece waits for its slot first,
            so the client's last byte arrives no sooner than bytes / bandwidth after the first)."""
            view = memoryview(data)
            step = _chunk_size(proxy.bandwidth)
            for at in range(0, len(view), step):
                piece = view[at:at + step]
                if proxy.bandwidth is not None:
                    self._pacer.wait(len(piece), proxy.bandwidth, proxy.stopping)
                self.wfile.write(piece)

        def _inject(self, fault: str, path: str) -> None:
            proxy.record(Request(self.command, path, self.headers.get("Range"), 0, 0, fault))
            if fault == THROTTLED:
                fault = str(proxy.throttle_status)
            if fault in ("503", "500", "403", "429"):
                payload = _ERROR_BODY.format(code=_ERROR_CODES[fault]).encode()
                self.send_response(int(fault))
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return
            if fault == "stall":  # nothing until the client times out and leaves (or the proxy stops)
                proxy.stopping.wait(STALL_CAP_SECONDS)
            # reset (and the end of a stall): close with RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.close()

    return Handler


class ProxyProcess:
    """The same proxy in a child process (its own GIL), for benchmarks: counters and shaping over a pipe.

    ``python -m tests.s3_server proxy HOST:PORT`` prints its port, then answers one
    JSON line per JSON line on its standard input (``{"op": "stats"}``,
    ``{"op": "reset"}``, ``{"op": "configure", "latency": s, "bandwidth": b or null, "max_rate": r or null}``), and
    stops when its standard input closes. No request log (counters only).
    """

    def __init__(self, upstream: tuple[str, int], *, latency: float = 0.0, bandwidth: float | None = None,
                 max_rate: float | None = None) -> None:
        _check_shaping(latency, bandwidth, max_rate)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server", "proxy", f"{upstream[0]}:{upstream[1]}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_ROOT, env=env)
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self._process.kill()
            raise RuntimeError(f"the proxy process did not start (exit {self._process.wait()})")
        self.upstream = upstream
        self.endpoint = f"127.0.0.1:{int(line)}"
        self.pid = self._process.pid
        self.configure(latency=latency, bandwidth=bandwidth, max_rate=max_rate)

    def _call(self, **message: Any) -> dict[str, Any]:
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()
        answer = json.loads(self._process.stdout.readline())
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer

    def configure(self, *, latency: float, bandwidth: float | None, max_rate: float | None = None,
                  throttle_status: int = 503) -> None:
        self._call(op="configure", latency=latency, bandwidth=bandwidth, max_rate=max_rate,
                   throttle_status=throttle_status)

    def stats(self) -> dict[str, int]:
        return self._call(op="stats")

    def reset_counters(self) -> None:
        self._call(op="reset")

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def _serve_proxy(upstream: str) -> None:
    """The child of `ProxyProcess`: a `FaultProxy` answering commands on stdin until it closes."""
    host, port = upstream.rsplit(":", 1)
    proxy = FaultProxy((host, int(port)), keep_log=False)
    print(proxy.endpoint.rsplit(":", 1)[1], flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "stats":
                answer: dict[str, Any] = proxy.stats()
            elif message["op"] == "reset":
                proxy.reset_counters()
                answer = {}
            elif message["op"] == "configure":
                proxy.configure(latency=message["latency"], bandwidth=message["bandwidth"],
                                max_rate=message.get("max_rate"), throttle_status=message.get("throttle_status", 503))
                answer = {"latency": proxy.latency, "bandwidth": proxy.bandwidth, "max_rate": proxy.max_rate}
            else:
                answer = {"error": f"unknown op {message['op']!r}"}
        except ValueError as error:
            answer = {"error": str(error)}
        print(json.dumps(answer), flush=True)
    proxy.close()


# Run in a child process (its own GIL, so the server does not slow the loader under test): starts
# moto's server on a port the OS picks, prints it, and stops when its standard input closes.
_SERVER_SCRIPT = """
import logging, sys
from moto.server import ThreadedMotoServer
if sys.argv[1:] == ["--ranges-in-place"]:
    # moto answers a ranged GET by reading and copying the whole object (FakeKey.value), under the key's lock:
    # a 4 MiB range of a 157 MB object costs a 157 MB read, and ranges of one object are served one at a time.
    # S3 costs the range. Keep each object's bytes once (immutable), so a range costs its own slice.
    import moto.s3.models as models
    whole = models.FakeKey.value
    def _get(key):
        value = key.__dict__.get("_whole_value")
        if value is None:
            value = key.__dict__["_whole_value"] = whole.fget(key)
        return value
    def _set(key, value):
        key.__dict__.pop("_whole_value", None)
        whole.fset(key, value)
    models.FakeKey.value = property(_get, _set)
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


#: Requests moto serves without authentication when it enforces it: the admin user's creation (`S3Server`).
_UNAUTHENTICATED_SETUP = 3


class S3Server:
    """moto's S3 server on 127.0.0.1 (a free port, in a child process), with a proxy in front of it.

    Args:
        latency, bandwidth: the proxy's shaping (see `FaultProxy`); `proxy.configure` changes it later.
        proxy_process: run the proxy in its own process (`ProxyProcess`: counters, no log, no faults)
            instead of a thread of this one (`FaultProxy`).
        enforce_auth: requests must be signed with the keys of an IAM user allowed to make them (moto's
            IAM); the server's own `access_key` / `secret_key` are then an admin's, and `add_user` makes others.
        ranges_in_place: serve a ranged GET from the object's bytes held once, at the cost of the range (moto
            reads and copies the whole object for every request, one request of an object at a time: with
            objects of 100+ MB that, not the client, bounds a benchmark). For benchmarks.
    """

    def __init__(self, *, latency: float = 0.0, bandwidth: float | None = None, proxy_process: bool = False,
                 enforce_auth: bool = False, ranges_in_place: bool = False) -> None:
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_UNAUTHENTICATED_SETUP)) if enforce_auth else None
        argv = [sys.executable, "-c", _SERVER_SCRIPT, *(["--ranges-in-place"] if ranges_in_place else [])]
        self._process = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=env)
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self._process.kill()
            raise RuntimeError(f"the S3 test server did not start (exit {self._process.wait()}); it needs "
                               "moto[server], part of audioloader's dev extra")
        upstream = ("127.0.0.1", int(line))
        self.pid = self._process.pid
        self.direct_endpoint = f"127.0.0.1:{upstream[1]}"
        kind = ProxyProcess if proxy_process else FaultProxy
        try:
            self.proxy: Any = kind(upstream, latency=latency, bandwidth=bandwidth)
        except BaseException:
            self._stop_server()
            raise
        self.access_key = self.secret_key = "testing"
        if enforce_auth:  # the first requests are served unauthenticated: they make the admin
            self.access_key, self.secret_key = self.add_user("admin", allowed=True, keys=("testing", "testing"))

    def add_user(self, name: str, allowed: bool, keys: tuple[str, str] | None = None) -> tuple[str, str]:
        """Make an IAM user (allowed everything, or nothing) and return its ``(access key, secret key)``."""
        import boto3

        key, secret = keys or (self.access_key, self.secret_key)
        iam = boto3.client("iam", endpoint_url=f"http://{self.direct_endpoint}", region_name="us-east-1",
                           aws_access_key_id=key, aws_secret_access_key=secret)
        iam.create_user(UserName=name)
        created = iam.create_access_key(UserName=name)["AccessKey"]
        if allowed:
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
            iam.put_user_policy(UserName=name, PolicyName="everything", PolicyDocument=json.dumps(policy))
        return created["AccessKeyId"], created["SecretAccessKey"]

    def filesystem(self, direct: bool = True, **options: Any) -> pafs.S3FileSystem:
        """An S3 filesystem for this server (uploading goes straight to it, reads through the proxy)."""
        endpoint = self.direct_endpoint if direct else self.proxy.endpoint
        return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region="us-east-1",
                                 scheme="http", endpoint_override=endpoint, allow_bucket_creation=True, **options)

    def url(self, path: str, direct: bool = False) -> str:
        """An ``s3://`` URL of ``path`` (bucket/key) read through the proxy (``direct``: straight from the server)."""
        endpoint = self.direct_endpoint if direct else self.proxy.endpoint
        return f"s3://{path}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    def upload(self, local_folder: Any, prefix: str) -> list[str]:
        """Copy every file of a local folder to ``prefix`` (``bucket/folder``); returns the keys."""
        fs = self.filesystem()
        bucket = prefix.split("/", 1)[0]
        fs.create_dir(bucket)
        keys = []
        for path in sorted(p for p in local_folder.iterdir() if p.is_file()):
            key = f"{prefix}/{path.name}"
            with fs.open_output_stream(key) as out:
                out.write(path.read_bytes())
            keys.append(key)
        return keys

    def close(self) -> None:
        self.proxy.close()
        self._stop_server()

    def _stop_server(self) -> None:
        self._process.stdin.close()  # the server stops and exits
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


#: Environment for the S3 client: static test credentials, and no instance-metadata lookups (no network).
S3_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                  "AWS_EC2_METADATA_DISABLED": "true"}


if __name__ == "__main__":
    if sys.argv[1:2] != ["proxy"] or len(sys.argv) != 3:
        sys.exit("usage: python -m tests.s3_server proxy HOST:PORT")
    _serve_proxy(sys.argv[2])
