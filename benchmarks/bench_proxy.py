"""The shaping proxy alone (tests/s3_server.py): can it serve 100+ requests in flight without being the bottleneck?

    PYTHONPATH=. .venv/bin/python benchmarks/bench_proxy.py [--in-flight 128] [--size 65536] [--seconds 3]

Three processes on loopback: a load generator (asyncio, ``--in-flight`` keep-alive
connections, each issuing GETs of ``--size`` bytes back to back), the proxy in its
own process (`ProxyProcess`), and an upstream. Upstreams: a constant-bytes asyncio
server (the fastest thing Python serves, so the proxy's own ceiling shows), and
moto's S3 server (what the benchmarks really sit behind). For each: requests/s and
MB/s directly, through the proxy at 0 ms, and through the proxy at ``--latency``
(the ideal there is in-flight / latency requests/s), with the proxy's CPU use.

The proxy is not the bottleneck when, at the latency, it delivers close to the
ideal (or to what the upstream serves directly, whichever is lower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A constant-bytes HTTP/1.1 server with keep-alive: answers every request with ``size`` bytes.
_UPSTREAM = """
import asyncio, sys
size = int(sys.argv[1])
body = b"x" * size
head = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nContent-Type: application/octet-stream\\r\\n\\r\\n" % size
async def serve(reader, writer):
    try:
        while True:
            request = await reader.readuntil(b"\\r\\n\\r\\n")
            writer.write(head + (b"" if request.startswith(b"HEAD") else body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""

# The load: ``in_flight`` connections, each GET after GET for ``seconds`` (a new connection where the server said
# "Connection: close", as moto's server does); prints requests, bytes, seconds.
_LOAD = """
import asyncio, json, sys, time
host, port, path, in_flight, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
request = f"GET {path} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode()
counts = [0, 0]
async def client(stop):
    reader = None
    while time.perf_counter() < stop:
        if reader is None:
            reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\\r\\n\\r\\n"), 60)
        lines = [line.lower() for line in head.split(b"\\r\\n")]
        status = int(lines[0].split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
        await asyncio.wait_for(reader.readexactly(length), 60)
        if status != 200:
            raise RuntimeError(f"status {status}")
        counts[0] += 1
        counts[1] += length
        if b"connection: close" in lines:
            writer.close()
            reader = None
    if reader is not None:
        writer.close()
async def main():
    start = time.perf_counter()
    await asyncio.gather(*(client(start + seconds) for _ in range(in_flight)))
    print(json.dumps({"requests": counts[0], "bytes": counts[1], "seconds": time.perf_counter() - start}))
asyncio.run(main())
"""


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(endpoint: str, path: str, in_flight: int, seconds: float, proxy_pid: int | None) -> dict:
    host, port = endpoint.split(":")
    cpu = _cpu_seconds(proxy_pid) if proxy_pid else 0.0
    done = subprocess.run([sys.executable, "-c", _LOAD, host, port, path, str(in_flight), str(seconds)],
                          capture_output=True, text=True, check=True, timeout=seconds + 120)
    out = json.loads(done.stdout)
    out["req_per_s"] = out["requests"] / out["seconds"]
    out["mb_per_s"] = out["bytes"] / out["seconds"] / 1e6
    if proxy_pid:
        out["proxy_cores"] = (_cpu_seconds(proxy_pid) - cpu) / out["seconds"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", type=int, default=128, help="concurrent keep-alive connections (128)")
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per response (64 KiB)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (3)")
    parser.add_argument("--latency", type=float, default=0.05, help="the proxy's added latency in s (0.05)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results to FILE")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.s3_server import S3_ENVIRONMENT, ProxyProcess, S3Server

    os.environ.update(S3_ENVIRONMENT)
    rows = []
    upstream = subprocess.Popen([sys.executable, "-c", _UPSTREAM, str(args.size)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    s3 = S3Server(proxy_process=True)
    try:
        fast = ("127.0.0.1", int(upstream.stdout.readline()))
        proxy = ProxyProcess(fast)
        fs = s3.filesystem()
        fs.create_dir("proxycheck")
        with fs.open_output_stream("proxycheck/blob") as out:
            out.write(os.urandom(args.size))
        for name, direct, through in (("constant-bytes server", f"{fast[0]}:{fast[1]}", proxy),
                                      ("moto", s3.direct_endpoint, s3.proxy)):
            path = "/proxycheck/blob"
            for label, latency in (("direct", None), ("proxy, 0 ms", 0.0),
                                   (f"proxy, {args.latency * 1000:g} ms", args.latency)):
                endpoint = direct if latency is None else through.endpoint
                if latency is not None:
                    through.configure(latency=latency, bandwidth=None)
                    through.reset_counters()
                result = load(endpoint, path, args.in_flight, args.seconds, None if latency is None else through.pid)
                if latency is not None:
                    result["proxy_max_in_flight"] = through.stats()["max_in_flight"]
                result.update(upstream=name, route=label, latency=latency)
                rows.append(result)
        proxy.close()
    finally:
        s3.close()
        upstream.stdin.close()
        upstream.wait()
    ideal = args.in_flight / args.latency
    print(f"{args.in_flight} requests in flight, {args.size} B each; ideal at {args.latency * 1000:g} ms: "
          f"{ideal:,.0f} req/s; load average {os.getloadavg()[0]:.2f}")
    print(f"{'upstream':22s} {'route':16s} {'req/s':>9s} {'MB/s':>8s} {'proxy cores':>12s} {'max in flight':>14s}")
    for r in rows:
        cores = f"{r['proxy_cores']:.2f}" if "proxy_cores" in r else "-"
        print(f"{r['upstream']:22s} {r['route']:16s} {r['req_per_s']:9,.0f} {r['mb_per_s']:8.1f} {cores:>12s} "
              f"{r.get('proxy_max_in_flight', '-'):>14}")
    if args.json:
        Path(args.json).write_text(json.dumps({"in_flight": args.in_flight, "size": args.size, "ideal_req_per_s": ideal,
                                               "loadavg": os.getloadavg(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
