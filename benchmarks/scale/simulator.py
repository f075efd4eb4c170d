"""The simulator of ``bench_scale.py``: the start of a large job, simulated with the real code: how many requests and
bytes each rank and machine makes before its first batch, how much memory its metadata takes, and how long that
takes under a model of S3.

    .venv/bin/python -m benchmarks.scale.bench_scale --files 1000000 --ranks 1024 --ranks-per-machine 8 \\
        --latency-ms 50 --machine-mbps 800 [--index manifest|v03|none] [--project DIR] [--sample-machines 2]

What is real: the dataset is written with audioloader's own writer (the manifest, ``--index manifest``; or the
0.3 metadata index, ``--index v03``; or nothing, ``--index none``: the files are listed and scanned), and each
rank runs audioloader's own start: `ShardDataset` (listing, manifest or index, footer scans, splits), the split
assignment of its rank (`ArrowShardReader.splits_for_pass`), and the reads of its first batch's rows. Every
request goes to `scale_store.SimStore`, a pyarrow filesystem plugged in with ``Storage(filesystem=...)``, which
serves synthetic Arrow IPC files (all with one content: ``--rows-per-file`` rows in record batches of
``--batch-rows``) and counts the requests as pyarrow's S3 filesystem makes them (a HEAD per opened file, a LIST
per 1,000 keys, a ranged GET per read; where the code reads S3 without pyarrow's HEAD, through obstore, one GET a
read: `scale_store.SimDirect`, unless ``--pyarrow-only``).

Ranks run one after the other in this process, each with its machine's cache folder (``AUDIOLOADER_CACHE``) and
the job's id (``AUDIOLOADER_JOB_ID``), as the ranks of one machine of a job would: the first rank of a machine
is its leader. ``--before`` (or ``--index v03`` with ``--project`` at a 0.3 checkout) gives every rank its own
cache folder, as 0.3's ranks that start at the same time find nothing of each other's. Machines are all alike:
``--sample-machines K`` runs the ranks of K machines (the first and the last ones) and counts the others as
theirs (the report says so, and checks the sampled machines agree), and ``--run-ranks-per-machine K`` runs the
first K local ranks of those, counting the others as the last one run (the ranks after a machine's leader all do
the same); the split assignment is computed for
every rank (`ArrowShardReader.assignment`, the real function) and checked to give each split to exactly one.

What is modelled (no time passes in the store; `phase_seconds`):

- a request costs ``--latency-ms``; requests a rank's own thread makes are in sequence, those of its pools
  (fetch, footer scan) run ``min(max_requests, 25)`` at a time (pyarrow's S3 client keeps 25 connections);
- a machine's link carries ``--machine-mbps``: a phase's bytes of all the ranks of a machine share it;
- the store serves ``--get-rate`` GET/HEAD and ``--list-rate`` LIST a second per prefix (S3: 5,500 and 3,500):
  a phase takes at least the job's requests of a kind over that rate;
- the ranks of a machine that wait for their leader (the manifest, the listing) finish with it.

``--project DIR`` imports audioloader from DIR (e.g. ``git archive v0.3 | tar -x -C /tmp/al03``; bench_scale.py
runs the simulation in a fresh process for it), so the 0.3 start and the new one are measured by this one tool.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import json
import math
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import audioloader
from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.shards import ShardDataset
from benchmarks.scale.scale_store import SimDirect, SimStore, filesystem


def shards_module(*paths: str) -> Any:
    """The first of the modules ``audioloader.shards.<path>`` this audioloader has: its place in shards/'s
    sub-packages first, then in the flat folder of the versions before them (0.3, for ``--project``)."""
    for path in paths[:-1]:
        with contextlib.suppress(ImportError):
            return importlib.import_module(f"audioloader.shards.{path}")
    return importlib.import_module(f"audioloader.shards.{paths[-1]}")


RemoteReads = shards_module("storage.options", "storage").RemoteReads


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--ranks-per-machine", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--machine-mbps", type=float, default=800.0, help="a machine's link, Mbit/s")
    parser.add_argument("--get-rate", type=float, default=5500.0, help="GET/HEAD a second per prefix")
    parser.add_argument("--list-rate", type=float, default=3500.0, help="LIST a second per prefix")
    parser.add_argument("--max-requests", type=int, default=24, help="Storage(max_requests=)")
    parser.add_argument("--index", choices=("manifest", "v03", "none"), default="manifest")
    parser.add_argument("--before", action="store_true",
                        help="0.3's start: no machine sharing (every rank its own cache folder, no job id)")
    parser.add_argument("--project", help="import audioloader from this checkout (e.g. 0.3's)")
    parser.add_argument("--sample-machines", type=int, default=2, help="machines whose ranks are run (0: all)")
    parser.add_argument("--run-ranks-per-machine", type=int, default=0,
                        help="local ranks run on a sampled machine (0: all); the others are counted as the last run")
    parser.add_argument("--format", choices=("ipc", "parquet"), default="ipc", help="the shards' format")
    parser.add_argument("--rows-per-file", type=int, default=32)
    parser.add_argument("--batch-rows", type=int, default=8)
    parser.add_argument("--row-bytes", type=int, default=16_000, help="bytes of audio a row")
    parser.add_argument("--split-rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--memory-ranks", type=int, default=2, help="sampled ranks whose memory is traced")
    parser.add_argument("--eval-pass", action="store_true",
                        help="each rank reads its whole evaluation share (shuffle=False) instead of a first batch")
    parser.add_argument("--cache", action="store_true", help="a local cache of objects per machine (cache_dir)")
    parser.add_argument("--pyarrow-only", action="store_true",
                        help="no HEAD-less reads (as without obstore): every opened file costs pyarrow's HEAD")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)



BUCKET, PREFIX = "sim-bucket", "speech/train"
#: pyarrow's S3 client keeps at most this many connections: requests in flight per rank.
CONNECTIONS = 25


# ----------------------------------------------------------------------------------------- the dataset


def template(rows: int, batch_rows: int, row_bytes: int, fmt: str = "ipc") -> bytes:
    """One synthetic shard: an Arrow IPC file (or Parquet, ``fmt``) of ``rows`` rows of a speech dataset's columns
    (audio: ``row_bytes`` of noise; label, duration, text, speaker, sample rate), in record batches of ``batch_rows``.
    Every file of the simulated dataset has these bytes."""
    rng = np.random.default_rng(0)
    table = pa.table({"audio": pa.array([rng.bytes(row_bytes) for _ in range(rows)], pa.binary()),
                      "label": pa.array([i % 3 for i in range(rows)], pa.int64()),
                      "duration": pa.array([row_bytes / 32000] * rows, pa.float32()),
                      "text": pa.array([f"utterance number {i}" for i in range(rows)], pa.string()),
                      "speaker": pa.array([f"speaker-{i % 7}" for i in range(rows)], pa.string()),
                      "sample_rate": pa.array([16000] * rows, pa.int32())})
    sink = io.BytesIO()
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sink, row_group_size=batch_rows, compression="none")
        return sink.getvalue()
    with pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return sink.getvalue()


def template_meta(data: bytes, folder: str) -> Any:
    """The template's `FileMeta`, scanned by the real scanner from a local copy."""
    scan = shards_module("formats.scan", "formats")
    locations = shards_module("storage.locations", "sources")
    scan_all = getattr(scan, "scan_all", None) or scan._scan_all
    location = getattr(locations, "Location", None) or locations._Location

    path = os.path.join(folder, "template.parquet" if data[:4] == b"PAR1" else "template.arrow")
    Path(path).write_bytes(data)
    return scan_all([location(path, None, path)])[0]


def metadata_file(kind: str, names: list[str], data: bytes, meta: Any, folder: str) -> tuple[str, bytes, float]:
    """``(object name, bytes, seconds to write)`` of the folder's metadata, written by the real writer."""
    started = time.perf_counter()
    path = os.path.join(folder, "metadata.arrow")
    n = len(names)
    if kind == "manifest":
        manifest = shards_module("catalog.manifest", "manifest")

        table = manifest.manifest_columns(
            names, sizes=np.full(n, len(data), dtype=np.int64), formats=[meta.format] * n,
            schemas=[meta.schema.serialize().to_pybytes()], schema_ids=np.zeros(n, dtype=np.uint16),
            unit_rows=[meta.unit_rows] * n, digests=[meta.digest] * n)
        manifest.write_manifest(table, path)
        name = manifest.MANIFEST_NAME
    else:  # 0.3's metadata index
        index = shards_module("catalog.index", "index")
        index.write_table(index.index_table(names, [meta] * n, portable=True), path)
        name = shards_module("sources.resolve", "sources").INDEX_NAME
    return name, Path(path).read_bytes(), time.perf_counter() - started


def plug_identity(store: SimStore) -> None:
    """An object opened in the simulated store has the ETag S3's HEAD would give (pyarrow's ``metadata()``, which
    a Python file cannot carry): where audioloader reads it (`identity.object_identity`), ask the store first."""
    modules = [shards_module(*paths) for paths in (("storage.cache", "cache"), ("formats.scan", "formats"),
                                                   ("storage.remote", "remote"))]
    for paths in (("catalog.manifest_source", "manifest_source"), ("dataset.shard_dataset", "dataset"),
                  ("dataset.unit_reads", "unit_reads")):
        with contextlib.suppress(ImportError):  # where this version reads identities too (0.3: not there)
            modules.append(shards_module(*paths))
    for module in modules:
        real = getattr(module, "object_identity", None)
        if real is not None:
            module.object_identity = lambda f, real=real: store.identity(f) or real(f)


def plug_simultaneous_start() -> None:
    """The ranks of a machine start together, and wait for their leader's manifest for seconds; here they run one
    after the other, minutes apart at a million files: keep the leader's published copy fresh for them (the
    machine cache's `shared_file` reuses a copy up to 5 minutes old, then fetches again)."""
    try:
        manifest_source = shards_module("catalog.manifest_source", "manifest_source")
    except ImportError:
        return  # 0.3: no machine sharing
    real = manifest_source.shared_file

    def shared_file(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("fresh_seconds", 10**9)
        return real(*args, **kwargs)

    manifest_source.shared_file = shared_file


def plug_direct_reads(fs: Any, store: SimStore) -> bool:
    """Where this audioloader reads S3 without pyarrow's HEAD (obstore: `audioloader.shards.storage.direct`), read the
    simulated store that way too (`scale_store.SimDirect`); False for a version without it (0.3)."""
    direct, remote = shards_module("storage.direct", "direct"), shards_module("storage.remote", "remote")

    # Where the stores are made: `direct.store_for` since the cache downloads read without a HEAD too (both the
    # reads and the cache go through `direct.DirectStores`); `remote.store_for` in the versions before.
    module = direct if hasattr(direct, "DirectStores") else remote
    if not hasattr(module, "store_for"):
        return False
    real = module.store_for
    module.store_for = lambda candidate: SimDirect(store) if candidate is fs else real(candidate)
    return True


# ----------------------------------------------------------------------------------------- one rank


def run_rank(rank: int, args: argparse.Namespace, store: SimStore, fs: Any, cache: str, trace: bool
             ) -> dict[str, Any]:
    """The real start of one rank: construction, its split assignment, its first batch's rows."""
    machine = rank // args.ranks_per_machine
    os.environ["AUDIOLOADER_CACHE"] = os.path.join(cache, f"rank-{rank}" if args.before else f"machine-{machine}")
    if args.before:
        os.environ.pop("AUDIOLOADER_JOB_ID", None)
    else:
        os.environ["AUDIOLOADER_JOB_ID"] = "sim-job"
    gc.collect()
    arrow_before = pa.total_allocated_bytes()
    if trace:
        tracemalloc.start()
    store.charge_to(rank, "metadata")
    started, cpu_started = time.perf_counter(), time.process_time()
    cache_dir = os.path.join(os.environ["AUDIOLOADER_CACHE"], "objects") if args.cache else None
    dataset, reader = open_rank(f"{BUCKET}/{PREFIX}", fs, rank, args.ranks, split_rows=args.split_rows,
                                max_requests=args.max_requests, eval_pass=args.eval_pass, cache_dir=cache_dir)
    mine = reader.splits_for_pass(0)
    cpu = time.perf_counter() - started
    out: dict[str, Any] = {"rank": rank, "machine": machine, "cpu_s": cpu,
                           "process_cpu_s": time.process_time() - cpu_started, "splits": len(mine),
                           "first_split": (mine[0].file_id, mine[0].start) if mine else None}
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["memory"] = {"python_bytes": current, "python_peak_bytes": peak,
                         "arrow_bytes": pa.total_allocated_bytes() - arrow_before}
    out["manifest_bytes"] = getattr(getattr(getattr(dataset, "manifest", None), "manifest", None), "nbytes", None)
    store.charge_to(rank, "first_batch")
    rows = read_rows(reader, None if args.eval_pass else min(args.batch_size, sum(s.num_rows for s in mine)))
    out["first_batch_rows"] = len(rows)
    if args.eval_pass:
        out["rows"] = rows
    if rank == 0:
        out["assignment"] = check_assignment(reader)
    dataset.remote.close()
    del dataset, reader, rows
    return out


def open_rank(source: str, fs: Any, rank: int, world_size: int, *, split_rows: int, max_requests: int,
              eval_pass: bool, cache_dir: str | None) -> tuple[Any, Any]:
    """``(ShardDataset, ArrowShardReader)`` of one rank, as the loader builds them (no read-ahead: the requests
    counted are the rank's own, in order); the real 32-process run (`bench_scale_real.py`) uses it too."""
    dataset = ShardDataset(source, filesystem=fs, split_rows=split_rows, cache_dir=cache_dir,
                           remote_reads=RemoteReads(readahead_bytes=0, max_requests=max_requests, index="auto"))
    reader = ArrowShardReader.of(dataset, rank=rank, world_size=world_size, shuffle=not eval_pass, seed=0,
                              split_rows=split_rows)
    return dataset, reader


def read_rows(reader: Any, count: int | None) -> list[int]:
    """The row indices of the reader's first ``count`` rows (None: its whole pass)."""
    reader.reset()
    rows = []
    for sample in reader:
        rows.append(sample.key.index)
        if count is not None and len(rows) >= count:
            break
    return rows


def check_assignment(reader: Any) -> dict[str, Any]:
    """Every rank's splits (the real assignment): each split given to exactly one rank."""
    started = time.perf_counter()
    parts = reader.assignment()
    ids = np.fromiter((s.split_id for part in parts for s in part), dtype=np.int64)
    counts = np.bincount(ids, minlength=len(reader.splits))
    sizes = [len(p) for p in parts]
    return {"ranks": len(parts), "splits": len(reader.splits), "each_split_once": bool((counts == 1).all()),
            "splits_per_rank_min": min(sizes), "splits_per_rank_max": max(sizes),
            "seconds": round(time.perf_counter() - started, 2)}


# ----------------------------------------------------------------------------------------- the model


def phase_seconds(tallies: dict[int, Any], machines: dict[int, list[int]], total_ranks: int, args: argparse.Namespace,
                  start: dict[int, float]) -> dict[int, float]:
    """Each run rank's end of a phase (seconds from the job's start), from its requests (see the module docstring).

    ``tallies``: rank -> `scale_store.Tally` of the phase; ``start``: when each rank's phase starts (its
    machine's end of the previous phase). The job-wide totals count every rank: the sampled ranks stand for the
    machines that were not run."""
    latency = args.latency_ms / 1000
    concurrent = min(args.max_requests, CONNECTIONS)
    link = args.machine_mbps * 1e6 / 8
    scale = total_ranks / max(1, len(tallies))
    gets = sum(t.requests.get("GET", 0) + t.requests.get("HEAD", 0) for t in tallies.values()) * scale
    lists = sum(t.requests.get("LIST", 0) for t in tallies.values()) * scale
    store_floor = max(gets / args.get_rate, lists / args.list_rate)
    end = {}
    for ranks in machines.values():
        machine_bytes = sum(tallies[r].bytes for r in ranks)
        for r in ranks:
            t = tallies[r]
            own = t.sequential * latency + math.ceil(t.pooled / concurrent) * latency
            if t.bytes:
                own += machine_bytes / link
            if t.total:
                own = max(own, store_floor)
            end[r] = start[r] + own
        leader_end = max(end[r] for r in ranks)  # who waited for the leader finishes with it
        for r in ranks:
            end[r] = leader_end if tallies[r].total == 0 else end[r]
    return end


# ----------------------------------------------------------------------------------------- the run


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    """Run the simulation of ``args`` (`parse_args`), print its report, and return its figures."""
    if args.ranks % args.ranks_per_machine:
        sys.exit(f"--ranks {args.ranks} is not a multiple of --ranks-per-machine {args.ranks_per_machine}")
    n_machines = args.ranks // args.ranks_per_machine
    sample = n_machines if args.sample_machines in (0, None) else min(n_machines, args.sample_machines)
    run_machines = sorted({*range(max(1, sample - 1)), n_machines - 1})[:sample] if sample < n_machines \
        else list(range(n_machines))
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as work:
        data = template(args.rows_per_file, args.batch_rows, args.row_bytes, args.format)
        meta = template_meta(data, work)
        names = [f"part-{i:07d}.{'parquet' if args.format == 'parquet' else 'arrow'}" for i in range(args.files)]
        store = SimStore()
        store.add_many([f"{BUCKET}/{PREFIX}/{n}" for n in names], data)
        meta_info: dict[str, Any] = {"kind": args.index}
        if args.index != "none":
            name, blob, seconds = metadata_file(args.index, names, data, meta, work)
            store.add(f"{BUCKET}/{PREFIX}/{name}", blob)
            meta_info.update(bytes=len(blob), bytes_per_file=len(blob) / args.files, write_seconds=round(seconds, 2))
        del names
        fs = filesystem(store)
        plug_identity(store)
        plug_simultaneous_start()
        meta_info["direct_reads"] = plug_direct_reads(fs, store) if not args.pyarrow_only else False
        results = {}
        traced = 0
        run_local = args.run_ranks_per_machine or args.ranks_per_machine
        for machine in run_machines:
            for local in range(min(run_local, args.ranks_per_machine)):
                rank = machine * args.ranks_per_machine + local
                trace = traced < args.memory_ranks and machine == run_machines[0]
                traced += trace
                results[rank] = run_rank(rank, args, store, fs, os.path.join(work, "cache"), trace)
                print(f"rank {rank}: construction and assignment {results[rank]['cpu_s']:.1f} s wall, "
                      f"{results[rank]['process_cpu_s']:.1f} s CPU", file=sys.stderr, flush=True)
            for local in range(run_local, args.ranks_per_machine):  # counted as the last local rank run
                rank, like = machine * args.ranks_per_machine + local, machine * args.ranks_per_machine + run_local - 1
                results[rank] = dict(results[like], rank=rank, counted_as=like)
                results[rank].pop("memory", None)
                for phase in ("metadata", "first_batch"):
                    store.tallies[(rank, phase)] = store.tallies[(like, phase)]
    machines = {m: [m * args.ranks_per_machine + i for i in range(args.ranks_per_machine)] for m in run_machines}
    tallies = {phase: {r: store.tallies[(r, phase)] for r in results} for phase in ("metadata", "first_batch")}
    meta_end = phase_seconds(tallies["metadata"], machines, args.ranks, args, dict.fromkeys(results, 0.0))
    first_end = phase_seconds(tallies["first_batch"], machines, args.ranks, args, meta_end)
    return report(args, results, tallies, machines, meta_end, first_end, meta_info, run_machines, n_machines)


def report(args, results, tallies, machines, meta_end, first_end, meta_info, run_machines, n_machines):
    def counts(t: Any) -> dict[str, int]:
        return {"LIST": t.requests.get("LIST", 0), "HEAD": t.requests.get("HEAD", 0), "GET": t.requests.get("GET", 0),
                "bytes": t.bytes}

    ranks = []
    for r, res in sorted(results.items()):
        ranks.append({"rank": r, "machine": res["machine"], "counted_as": res.get("counted_as"),
                      "metadata": counts(tallies["metadata"][r]),
                      "first_batch": counts(tallies["first_batch"][r]), "metadata_s": round(meta_end[r], 3),
                      "first_batch_s": round(first_end[r], 3), "cpu_s": round(res["cpu_s"], 2),
                      "process_cpu_s": round(res["process_cpu_s"], 2),
                      "splits": res["splits"], "memory": res.get("memory")})
    per_machine = []
    for m, members in machines.items():
        meta = [tallies["metadata"][r] for r in members]
        first = [tallies["first_batch"][r] for r in members]
        per_machine.append({"machine": m, "metadata_requests": sum(t.total for t in meta),
                            "metadata_bytes": sum(t.bytes for t in meta),
                            "first_batch_requests": sum(t.total for t in first),
                            "first_batch_bytes": sum(t.bytes for t in first),
                            "metadata_s": round(max(meta_end[r] for r in members), 3),
                            "first_batch_s": round(max(first_end[r] for r in members), 3)})
    alike = all(per_machine[0][k] == pm[k] for pm in per_machine for k in ("metadata_requests", "metadata_bytes",
                                                                            "first_batch_requests"))
    scale = args.ranks / len(results)
    job = {"metadata_requests": round(sum(t.total for t in tallies["metadata"].values()) * scale),
           "metadata_bytes": round(sum(t.bytes for t in tallies["metadata"].values()) * scale),
           "first_batch_requests": round(sum(t.total for t in tallies["first_batch"].values()) * scale),
           "metadata_s": max(meta_end.values()), "first_batch_s": max(first_end.values())}
    for kind in ("LIST", "HEAD", "GET"):
        job[kind] = round(sum(t.requests.get(kind, 0) for phase in tallies.values() for t in phase.values()) * scale)
    if args.eval_pass and len(results) == args.ranks:
        rows = np.sort(np.fromiter((i for res in results.values() for i in res["rows"]), dtype=np.int64))
        job["eval_rows"] = int(rows.size)
        job["eval_rows_exactly_once"] = bool(rows.size == args.files * args.rows_per_file
                                             and (rows == np.arange(rows.size)).all())
    memory = [r["memory"] for r in ranks if r["memory"]]
    out = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "audioloader": audioloader.__file__,
           "metadata_file": meta_info, "machines_run": run_machines, "machines": n_machines,
           "sampled_machines_alike": alike, "assignment": results[min(results)].get("assignment"),
           "ranks": ranks, "per_machine": per_machine, "job": job, "memory": memory}
    print_report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def print_report(out: dict[str, Any]) -> None:
    a = out["args"]
    print(f"\n{a['files']:,} files x {a['ranks']} ranks ({out['machines']} machines x {a['ranks_per_machine']}), "
          f"{a['latency_ms']:g} ms a request, {a['machine_mbps']:g} Mbit/s a machine; index: {a['index']}"
          f"{' (before: no machine sharing)' if a['before'] else ''}; {a['format']} shards; audioloader from "
          f"{out['audioloader']}; HEAD-less reads: {out['metadata_file'].get('direct_reads')}")
    info = out["metadata_file"]
    if "bytes" in info:
        print(f"metadata file: {info['bytes']:,} B ({info['bytes_per_file']:.1f} B a file), written in "
              f"{info['write_seconds']} s")
    print(f"ran machines {out['machines_run']} of {out['machines']} (the others counted as these; alike: "
          f"{out['sampled_machines_alike']}); assignment of every rank: {out['assignment']}")
    then = "whole pass" if a["eval_pass"] else "first batch"
    print(f"\nper rank (run ones)    LIST   HEAD    GET        bytes   metadata s  | {then}: req     bytes     s")
    for r in out["ranks"]:
        m, f = r["metadata"], r["first_batch"]
        if r["counted_as"] is not None and r["rank"] % a["ranks_per_machine"] != a["ranks_per_machine"] - 1:
            continue  # printed as the last rank counted as the same
        print(f"rank {r['rank']:5d} (machine {r['machine']:4d}) {m['LIST']:6d} {m['HEAD']:6d} {m['GET']:6d} "
              f"{m['bytes']:12,d} {r['metadata_s']:10.2f}  | {f['LIST'] + f['HEAD'] + f['GET']:6d} {f['bytes']:10,d} "
              f"{r['first_batch_s']:6.2f}")
    print(f"\nper machine   metadata requests        bytes   s  | {then} requests       bytes     s")
    for m in out["per_machine"]:
        print(f"machine {m['machine']:4d} {m['metadata_requests']:17,d} {m['metadata_bytes']:12,d} "
              f"{m['metadata_s']:5.2f}  | {m['first_batch_requests']:20,d} {m['first_batch_bytes']:11,d} "
              f"{m['first_batch_s']:5.2f}")
    j = out["job"]
    print(f"\njob requests: {j['LIST']:,} LIST, {j['HEAD']:,} HEAD, {j['GET']:,} GET"
          + (f"; eval rows {j['eval_rows']:,}, each exactly once: {j['eval_rows_exactly_once']}"
             if "eval_rows" in j else ""))
    print(f"job: {j['metadata_requests']:,} metadata requests, {j['metadata_bytes']:,} B; metadata phase "
          f"{j['metadata_s']:.2f} s; first batch of every rank by {j['first_batch_s']:.2f} s "
          f"({j['first_batch_requests']:,} requests)")
    for r in out["ranks"]:
        if r["counted_as"] is None:
            print(f"rank {r['rank']}: construction + split assignment {r['cpu_s']:.1f} s wall, "
                  f"{r['process_cpu_s']:.1f} s CPU")
    for m in out["memory"]:
        print(f"metadata memory of a traced rank: {m['python_bytes'] / 1e6:.1f} MB Python (peak "
              f"{m['python_peak_bytes'] / 1e6:.1f} MB) + {m['arrow_bytes'] / 1e6:.1f} MB Arrow")

