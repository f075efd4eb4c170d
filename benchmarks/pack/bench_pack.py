"""``audioloader pack`` throughput: copy and re-encode, threads, parts, a resumed run, and Ray.

Data: ``--files`` synthetic clips of ``--seconds`` s, 44.1 kHz stereo 16-bit WAV (a tone plus noise), in
class folders, generated once into ``.cache/bench/pack-...``.

Contenders, each timed in a fresh process (wall time of the whole pack: listing, reading, encoding, writing,
index), best of ``--repeats``:

- ``copy``: the original bytes (no codec), 2 threads; ``copy --verify``: the same, every file decoded too;
- ``reencode wN``: decode, mono, soxr to 16 kHz, FLAC; N threads in one process;
- ``reencode 2 parts``: ``--part 0/2`` and ``--part 1/2`` as two processes at once, 1 thread each;
- ``resume``: the re-encode pack killed (SIGKILL, the test hook) once ``--kill-at`` of its shards are listed,
  then run again: the rerun's time against a full run's;
- ``ray 1 cpu`` / ``ray 2 cpus``: `audioloader.integrations.ray.pack` with 4 parts, 1 thread a task, on a
  local cluster of 1 or 2 CPUs (the cluster's start is not timed);
- ``--s3``: instead of the above, S3 to S3 on moto's server on loopback (tests/s3_server.py): the class
  folders uploaded to a bucket, packed (copy, and re-encode) into another prefix with 8 threads, against the
  same pack local to local; the peak RSS against the documented budget.

Reported per contender: seconds, files/s, hours of audio per second, peak RSS of the packing process, and the
ratios the targets name. Run on an idle machine for clean numbers; on a shared one, say so.

    python -m benchmarks.pack.bench_pack [--files 240] [--seconds 5] [--repeats 2] [--ray] [--s3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import CACHE, ROOT

RATE = 44100

_CHILD = r"""
import json, resource, sys, time
from audioloader.tools.pack import pack_dataset
src, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # user + system seconds, all threads
start, wall, cpu_start = time.perf_counter(), time.time(), cpu()
summary = pack_dataset(src, out, progress=False, **options)
print(json.dumps({"seconds": time.perf_counter() - start, "rows": summary.rows, "audio_s": summary.seconds,
                  "start": wall, "end": time.time(), "cpu_s": cpu() - cpu_start,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_RAY_CHILD = r"""
import json, sys, time
import ray
from audioloader.integrations import ray as al_ray
src, out, cpus, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
al_ray.pack(src, out + "-warm", parts=cpus, progress=False, **{**options, "shard_rows": 1000})  # workers up
start = time.perf_counter()
summary = al_ray.pack(src, out, parts=4, progress=False, **options)
print(json.dumps({"seconds": time.perf_counter() - start, "rows": summary.rows, "audio_s": summary.seconds,
                  "rss_mib": None}))
ray.shutdown()
"""


def make_corpus(cache: Path, files: int, seconds: float) -> Path:
    import numpy as np
    import soundfile as sf

    root = cache / f"pack-f{files}-s{seconds:g}-v1"
    if (root / "built").exists():
        return root / "src"
    shutil.rmtree(root, ignore_errors=True)
    n = round(seconds * RATE)
    t = np.arange(n) / RATE
    for i in range(files):
        cls = f"class{i % 4}"
        (root / "src" / cls).mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(i)
        signal = 0.3 * np.sin(2 * np.pi * (200 + 3 * i) * t)[:, None] + 0.05 * rng.standard_normal((n, 2))
        sf.write(root / "src" / cls / f"{i:05d}.wav", signal.astype(np.float32), RATE, subtype="PCM_16")
    (root / "built").write_text("ok")
    return root / "src"


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def run_child(src: Path, out: Path, options: dict, kill: str | None = None) -> dict | None:
    environment = env()
    if kill:
        environment["AUDIOLOADER_PACK_TEST_KILL"] = kill
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(out), json.dumps(options)],
                          capture_output=True, text=True, env=environment)
    if kill:
        return None
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=240)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kill-at", type=float, default=0.6, help="fraction of the shards listed before the kill")
    parser.add_argument("--ray", action="store_true", help="also measure Ray (needs audioloader[ray])")
    parser.add_argument("--s3", action="store_true", help="measure S3 to S3 (moto) instead")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    src = make_corpus(CACHE, args.files, args.seconds)
    if args.s3:
        return s3_main(src, args)
    work = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    shards = 10
    reencode = {"sample_rate": 16000, "shard_rows": max(1, args.files // shards)}
    contenders = []
    try:
        def single(options):
            def go(i, options=options):
                out = work / f"o-{len(contenders)}-{i}-{options['workers']}-{'sample_rate' in options}"
                result = run_child(src, out, options)
                shutil.rmtree(out, ignore_errors=True)
                return result
            return go

        contenders.append(("copy w2", single({"workers": 2})))
        contenders.append(("copy w2 --verify", single({"workers": 2, "verify": True})))  # decodes every stored file
        for workers in (1, 2):
            contenders.append((f"reencode w{workers}", single({**reencode, "workers": workers})))

        def parts(i):
            out = work / f"parts-{i}"
            procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(src), str(out),
                                       json.dumps({**reencode, "workers": 1, "part": f"{k}/2"})],
                                      stdout=subprocess.PIPE, text=True, env=env()) for k in range(2)]
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
            shutil.rmtree(out, ignore_errors=True)
            # From the first part's start to the last one's end (the imports before are not timed, as for the others).
            return {"seconds": max(o["end"] for o in outs) - min(o["start"] for o in outs),
                    "rows": sum(o["rows"] for o in outs),
                    "audio_s": sum(o["audio_s"] for o in outs), "rss_mib": max(o["rss_mib"] for o in outs),
                    "cpu_s": sum(o["cpu_s"] for o in outs)}

        contenders.append(("reencode 2 parts (2 processes, 1 thread each)", parts))

        def resumed(i):
            out = work / f"resume-{i}"
            run_child(src, out, {**reencode, "workers": 2}, kill=f"journal:{round(args.kill_at * shards)}")
            result = run_child(src, out, {**reencode, "workers": 2})
            shutil.rmtree(out, ignore_errors=True)
            return result

        contenders.append((f"reencode w2 rerun after a kill at {args.kill_at:.0%} of the shards", resumed))
        if args.ray:
            for cpus in (1, 2):
                def on_ray(i, cpus=cpus):
                    out = work / f"ray-{cpus}-{i}"
                    proc = subprocess.run([sys.executable, "-c", _RAY_CHILD, str(src), str(out), str(cpus),
                                           json.dumps({**reencode, "workers": 1})],
                                          capture_output=True, text=True, env=env())
                    if proc.returncode != 0:
                        raise RuntimeError(proc.stderr[-3000:])
                    shutil.rmtree(out, ignore_errors=True)
                    shutil.rmtree(str(out) + "-warm", ignore_errors=True)
                    return json.loads(proc.stdout.strip().splitlines()[-1])
                contenders.append((f"reencode on ray {cpus} cpu(s) 4 parts", on_ray))
        # Rounds: every contender once a round, so a change in the machine's load hits them all alike.
        runs: dict[str, list[dict]] = {label: [] for label, _ in contenders}
        for i in range(args.repeats):
            for label, fn in contenders:
                runs[label].append(fn(i))
                print(json.dumps({"contender": label, "round": i, **runs[label][-1]}), flush=True)
        results = [{"contender": label, **best(runs[label]),
                    "all_seconds": [round(r["seconds"], 3) for r in runs[label]]} for label, _ in contenders]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.files} files of {args.seconds:g} s, 44.1 kHz stereo WAV; {os.cpu_count()} cores\n")
    print("| contender | s | files/s | audio h/s | CPU s per audio h | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        rss = "-" if r["rss_mib"] is None else f"{r['rss_mib']:.0f}"
        cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s'] / (r['audio_s'] / 3600):.1f}"
        print(f"| {r['contender']} | {r['seconds']:.2f} | {r['rows'] / r['seconds']:.1f} | "
              f"{r['audio_s'] / 3600 / r['seconds']:.3f} | {cpu} | {rss} |")
    by = {r["contender"].split(" (")[0].split(" rerun")[0] + (" rerun" if "rerun" in r["contender"] else ""): r
          for r in results}
    w1, w2 = by["reencode w1"]["seconds"], by["reencode w2"]["seconds"]
    print(f"\nthreads: w2 / w1 speed-up {w1 / w2:.2f}x; 2 parts / w1 {w1 / by['reencode 2 parts']['seconds']:.2f}x; "
          f"resumed rerun / full {by['reencode w2 rerun']['seconds'] / w2:.2f}; --verify / copy "
          f"{by['copy w2 --verify']['seconds'] / by['copy w2']['seconds']:.2f}x time, "
          f"{by['copy w2 --verify']['cpu_s'] / by['copy w2']['cpu_s']:.2f}x CPU")
    if args.ray:
        ray = [r for r in results if r["contender"].startswith("reencode on ray")]
        print(f"ray: 2 cpus / 1 cpu speed-up {ray[0]['seconds'] / ray[1]['seconds']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def s3_main(src: Path, args: argparse.Namespace) -> None:
    from tests.s3_server import S3_ENVIRONMENT, S3Server

    os.environ.update(S3_ENVIRONMENT)
    server = S3Server()
    work = Path(tempfile.mkdtemp(prefix="bench-pack-s3-"))
    results = []
    try:
        fs = server.filesystem()
        fs.create_dir("bench")
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            with fs.open_output_stream(f"bench/src/{path.relative_to(src).as_posix()}") as out:
                out.write(path.read_bytes())
        for label, options in (("copy", {}), ("reencode", {"sample_rate": 16000})):
            options = {**options, "workers": 8, "shard_rows": max(1, args.files // 10)}
            for where in ("local to local", "s3 to s3"):
                def go(i, where=where, options=options, label=label):
                    if where == "s3 to s3":
                        return run_child(server.url("bench/src/", direct=True),
                                         server.url(f"bench/out-{label}-{i}", direct=True), options)
                    out = work / f"{label}-{i}"
                    result = run_child(src, out, options)
                    shutil.rmtree(out, ignore_errors=True)
                    return result
                results.append({"contender": f"{label} w8 {where}", **best([go(i) for i in range(args.repeats)])})
                print(json.dumps(results[-1]), flush=True)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| contender | s | files/s | audio h/s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['contender']} | {r['seconds']:.2f} | {r['rows'] / r['seconds']:.1f} | "
              f"{r['audio_s'] / 3600 / r['seconds']:.3f} | {r['rss_mib']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
