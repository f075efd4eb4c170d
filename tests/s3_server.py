"""A real S3-compatible server on loopback (moto's server mode) and a fault-injecting proxy in front of it.

Nothing here leaves 127.0.0.1: the server and the proxy bind it with a port the
OS picks, requests go only to them, and both stop when the test session ends.
The proxy forwards every request to the server and logs it (method, object,
``Range`` header, status, body bytes), so tests can prove what was read; it can
answer with an HTTP 503 or 500, refuse access (403 AccessDenied), reset the
connection, or stall (send nothing until the client gives up), a given number of
times for matching requests. The server can also enforce real authentication
(moto's IAM: unknown keys, wrong secrets and users without a policy are refused).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow.fs as pafs

#: Longest a stalled response waits for the client to give up (the proxy's stop also ends it).
STALL_CAP_SECONDS = 30.0

FAULTS = ("503", "500", "403", "reset", "stall")

_ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected by the test '
               'proxy</Message></Error>')


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


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.requests: list[Request] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

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
            self.requests.append(request)

    def log(self, method: str = "GET", path: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and path in r.path]

    def close(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the S3 client expects
        disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._serve()

        do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            path = self.path.split("?", 1)[0]
            fault = proxy.take_fault(self.command, path)
            if fault:
                self._inject(fault, path)
                return
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
            finally:
                upstream.close()
            # Logged before the client has the answer: a test that checks the log after its read sees the request.
            proxy.record(Request(self.command, path, self.headers.get("Range"), response.status,
                                 0 if self.command == "HEAD" else len(data), ""))
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                    self.send_header(name, value)
            declared = response.getheader("Content-Length")
            self.send_header("Content-Length", declared if self.command == "HEAD" and declared else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _inject(self, fault: str, path: str) -> None:
            proxy.record(Request(self.command, path, self.headers.get("Range"), 0, 0, fault))
            if fault in ("503", "500", "403"):
                code = {"503": "SlowDown", "500": "InternalError", "403": "AccessDenied"}[fault]
                payload = _ERROR_BODY.format(code=code).encode()
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


# Run in a child process (its own GIL, so the server does not slow the loader under test): starts
# moto's server on a port the OS picks, prints it, and stops when its standard input closes.
_SERVER_SCRIPT = """
import logging, sys
from moto.server import ThreadedMotoServer
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
    """moto's S3 server on 127.0.0.1 (a free port, in a child process), with a `FaultProxy` in front of it.

    ``enforce_auth``: requests must be signed with the keys of an IAM user allowed to make them (moto's IAM);
    the server's own `access_key` / `secret_key` are then an admin's, and `add_user` makes others.
    """

    def __init__(self, enforce_auth: bool = False) -> None:
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_UNAUTHENTICATED_SETUP)) if enforce_auth else None
        self._process = subprocess.Popen([sys.executable, "-c", _SERVER_SCRIPT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=env)
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self._process.kill()
            raise RuntimeError(f"the S3 test server did not start (exit {self._process.wait()}); it needs "
                               "moto[server], part of audioloader's dev extra")
        upstream = ("127.0.0.1", int(line))
        self.direct_endpoint = f"127.0.0.1:{upstream[1]}"
        self.proxy = FaultProxy(upstream)
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
        self._process.stdin.close()  # the server stops and exits
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


#: Environment for the S3 client: static test credentials, and no instance-metadata lookups (no network).
S3_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                  "AWS_EC2_METADATA_DISABLED": "true"}
