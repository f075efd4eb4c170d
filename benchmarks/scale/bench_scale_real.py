"""The scale simulator checked against a real run: M "machines" x R ranks, each rank its own process reading an
evaluation pass from a real S3 server (moto) behind a proxy per machine that counts every request; the requests the
simulator (`bench_scale.py`, the same code against its counting store) predicts are compared with those the proxies
saw.

    .venv/bin/python -m benchmarks.scale.bench_scale_real --files 20000 --machines 8 --ranks-per-machine 4

The dataset: ``--files`` copies of one small Arrow IPC file (``--rows-per-file`` rows of ``--row-bytes`` bytes), and
its manifest written by the real writer (``--index manifest``; ``none``: no manifest, the machine's leader lists and
scans). Each rank (`child`) builds its `ShardDataset` / `ArrowShardReader` exactly as the simulator does
(`simulator.open_rank`: ``Storage(rank=, world_size=)``, ``cache_dir`` in its machine's cache folder with
``--cache``), with its machine's ``AUDIOLOADER_CACHE`` and the job's ``AUDIOLOADER_JOB_ID``, and reads its whole
evaluation share. Machines run one after the other (their R ranks at once), so 2 cores are not asked to hold
M x R processes; a machine's requests do not depend on the others'.

Checked: requests of each kind (LIST, HEAD, GET) predicted = seen (within ``--tolerance``, 5 %), per machine and
for the job; every row read exactly once; how many objects a machine fetched more than once (bytes beyond the
object's size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, module_command
from benchmarks.scale import simulator

KINDS = ("LIST", "HEAD", "GET")
BUCKET, PREFIX = "scale-real", "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--machines", type=int, default=8)
    parser.add_argument("--ranks-per-machine", type=int, default=4)
    parser.add_argument("--rows-per-file", type=int, default=2)
    parser.add_argument("--batch-rows", type=int, default=1)
    parser.add_argument("--row-bytes", type=int, default=2000)
    parser.add_argument("--index", choices=("manifest", "none"), default="manifest")
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--latency-ms", type=float, default=5.0,
                        help="the proxies' latency (the counts do not depend on it)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", nargs=5, metavar=("URL", "RANK", "WORLD", "SPLIT_ROWS", "OUT"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def simulator_args(args: argparse.Namespace) -> argparse.Namespace:
    return simulator.parse_args([
        "--files", str(args.files), "--ranks", str(args.machines * args.ranks_per_machine),
        "--ranks-per-machine", str(args.ranks_per_machine), "--index", args.index, "--sample-machines", "0",
        "--rows-per-file", str(args.rows_per_file), "--batch-rows", str(args.batch_rows),
        "--row-bytes", str(args.row_bytes), "--eval-pass", "--memory-ranks", "0", *(["--cache"] if args.cache else [])])


# ----------------------------------------------------------------------------------------- one rank (a process)


def child(url: str, rank: int, world: int, split_rows: int, out: str, cache: bool) -> None:
    cache_dir = os.path.join(os.environ["AUDIOLOADER_CACHE"], "objects") if cache else None
    dataset, reader = simulator.open_rank(url, None, rank, world, split_rows=split_rows, max_requests=24,
                                            eval_pass=True, cache_dir=cache_dir)
    rows = simulator.read_rows(reader, None)
    Path(out).write_text(json.dumps({"rank": rank, "rows": rows}))
    dataset.remote.close()


# ----------------------------------------------------------------------------------------- the real run


def upload(server: Any, data: bytes, names: list[str], metadata: tuple[str, bytes] | None) -> float:
    started = time.perf_counter()
    fs = server.filesystem()
    fs.create_dir(BUCKET)

    def put(item: tuple[str, bytes]) -> None:
        with fs.open_output_stream(f"{BUCKET}/{PREFIX}/{item[0]}") as out:
            out.write(item[1])

    items = [(n, data) for n in names] + ([metadata] if metadata else [])
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, items))
    return time.perf_counter() - started


def run_machine(machine: int, args: argparse.Namespace, proxy: Any, work: Path, split_rows: int) -> list[dict]:
    from tests.s3_server import S3_ENVIRONMENT

    world = args.machines * args.ranks_per_machine
    url = f"s3://{BUCKET}/{PREFIX}?endpoint_override={proxy.endpoint}&scheme=http&region=us-east-1"
    env = {**os.environ, **S3_ENVIRONMENT, "AUDIOLOADER_CACHE": str(work / f"machine-{machine}"),
           "AUDIOLOADER_JOB_ID": "real-job", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    processes, outs = [], []
    for local in range(args.ranks_per_machine):
        rank = machine * args.ranks_per_machine + local
        out = work / f"rank-{rank}.json"
        outs.append(out)
        command = module_command(__spec__, "--child", url, str(rank), str(world), str(split_rows), str(out),
                                 *([] if args.cache else ["--no-cache"]))
        processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    for process in processes:
        output = process.communicate(timeout=1800)[0]
        if process.returncode != 0:
            raise RuntimeError(f"a rank of machine {machine} failed:\n{output[-3000:]}")
    return [json.loads(o.read_text()) for o in outs]


def seen_by(proxy: Any, size: int) -> dict[str, Any]:
    stats = proxy.stats()
    fetched: dict[str, int] = defaultdict(int)
    for r in proxy.requests:
        if r.method == "GET" and r.path.endswith(".arrow") and "/_" not in r.path:
            fetched[r.path] += r.body_bytes
    return {**{k: stats.get(k, 0) for k in KINDS}, "objects_fetched": len(fetched),
            "objects_fetched_more_than_once": sum(1 for b in fetched.values() if b > size),
            "bytes": sum(fetched.values())}


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.s3_server import S3_ENVIRONMENT, FaultProxy, S3Server

    os.environ.update(S3_ENVIRONMENT)
    sim_args = simulator_args(args)
    print(f"simulating {args.files:,} files x {sim_args.ranks} ranks ...", file=sys.stderr, flush=True)
    predicted = simulator.simulate(sim_args)
    data = simulator.template(args.rows_per_file, args.batch_rows, args.row_bytes)
    names = [f"part-{i:07d}.arrow" for i in range(args.files)]
    with tempfile.TemporaryDirectory(prefix="bench-scale-real-") as tmp:
        work = Path(tmp)
        metadata = None
        if args.index == "manifest":
            meta = simulator.template_meta(data, tmp)
            name, blob, _ = simulator.metadata_file("manifest", names, data, meta, tmp)
            metadata = (name, blob)
        server = S3Server()
        proxies = []
        try:
            host, port = server.direct_endpoint.split(":")
            seconds = upload(server, data, names, metadata)
            print(f"uploaded {len(names):,} objects in {seconds:.0f} s", file=sys.stderr, flush=True)
            proxies = [FaultProxy((host, int(port)), latency=args.latency_ms / 1000) for _ in range(args.machines)]
            reports = []
            started = time.perf_counter()
            for machine, proxy in enumerate(proxies):
                reports += run_machine(machine, args, proxy, work, sim_args.split_rows)
                print(f"machine {machine}: {proxy.stats()['requests']:,} requests", file=sys.stderr, flush=True)
            wall = time.perf_counter() - started
            seen = [seen_by(p, len(data)) for p in proxies]
        finally:
            for proxy in proxies:
                proxy.close()
            server.close()
    return compare(args, predicted, seen, reports, wall)


def compare(args: argparse.Namespace, predicted: dict, seen: list[dict], reports: list[dict], wall: float) -> dict:
    by_machine = defaultdict(Counter)
    for r in predicted["ranks"]:
        for phase in ("metadata", "first_batch"):
            for kind in KINDS:
                by_machine[r["machine"]][kind] += r[phase][kind]
    machines = []
    for m, s in enumerate(seen):
        machines.append({"machine": m, "predicted": {k: by_machine[m][k] for k in KINDS},
                         "seen": {k: s[k] for k in KINDS}, "objects_fetched": s["objects_fetched"],
                         "objects_fetched_more_than_once": s["objects_fetched_more_than_once"]})
    job_predicted = {k: predicted["job"][k] for k in KINDS}
    job_seen = {k: sum(s[k] for s in seen) for k in KINDS}
    total_p, total_s = sum(job_predicted.values()), sum(job_seen.values())
    rows = sorted(i for r in reports for i in r["rows"])
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("json", "child")},
           "predicted": job_predicted, "seen": job_seen,
           "within_tolerance": all(abs(job_seen[k] - job_predicted[k]) <= args.tolerance * max(1, job_predicted[k])
                                   for k in KINDS),
           "ratio_seen_to_predicted": round(total_s / max(1, total_p), 4),
           "rows_exactly_once": rows == list(range(args.files * args.rows_per_file)),
           "machines": machines, "wall_s": round(wall, 1),
           "objects_fetched_more_than_once": sum(m["objects_fetched_more_than_once"] for m in machines)}
    print(f"\nreal run: {args.files:,} files, {args.machines} machines x {args.ranks_per_machine} ranks (processes), "
          f"index {args.index}, cache {'on' if args.cache else 'off'}, {wall:.0f} s")
    print("machine   predicted LIST/HEAD/GET        seen LIST/HEAD/GET   objects fetched (more than once)")
    for m in machines:
        p, s = m["predicted"], m["seen"]
        print(f"{m['machine']:7d}   {p['LIST']:6,d} {p['HEAD']:7,d} {p['GET']:8,d}   {s['LIST']:6,d} {s['HEAD']:7,d} "
              f"{s['GET']:8,d}   {m['objects_fetched']:,} ({m['objects_fetched_more_than_once']:,})")
    print(f"job: predicted {job_predicted}, seen {job_seen}: seen/predicted {out['ratio_seen_to_predicted']}, within "
          f"{args.tolerance:.0%}: {out['within_tolerance']}; every row exactly once: {out['rows_exactly_once']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.child:
        url, rank, world, split_rows, out_path = ARGS.child
        child(url, int(rank), int(world), int(split_rows), out_path, ARGS.cache)
    else:
        main(ARGS)
