"""Local shards vs the same shards on a loopback S3 server: reader and loader throughput, memory, resume.

    .venv/bin/python -m benchmarks.remote.bench_s3 [--rows 1200] [--batches 40] [--repeats 2] [--features default]
        [--formats ipc,parquet] [--variants reader,train,resume]

Writes ``--rows`` clips (2 s PCM16 WAV at 16 kHz, 8 Arrow IPC files with record
batches of 16 rows, and the same as Parquet with row groups of 16) to a
temporary folder, uploads them to moto's S3 server on 127.0.0.1 (tests/s3_server.py,
a child process, read directly, without the fault proxy), then runs each
variant in a fresh process (so peak memory is its own):

* ``reader``: one training pass of `ArrowShardReader` alone (rows/s, MB/s);
* ``train``: `AudioLoader` training batches (64 samples, ``--features``: the
  default log-mel, 5 s x 128 mels at 32 kHz, or ``small``: 1 s x 64 mels at
  16 kHz; buffer 1000 / min 500), with the shuffle buffer before decode (raw rows) and
  after it (decoded samples): samples/s after the first batch, time to the first
  batch, peak PSS of the process tree;
* ``resume``: a checkpoint taken with the buffer full, resumed in a new loader:
  seconds to the first batch (the buffer's rows read back by key, and decoded).

moto is a Python server on the same 2 cores as the loader: it is a stand-in for
S3's protocol and request pattern (ranged GETs), not for its bandwidth or
latency (real S3: ~20-50 ms to the first byte, high parallel bandwidth). The
ratios say how much each design depends on the per-request cost.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.common import emit_result, median_of, module_command, run_child, table

#: ``--features small``: 64 mels of 1 s at 16 kHz (26 KB a sample); ``default``: MelSpectrogramConfig() (256 KB).
FEATURES = {"small": dict(sample_rate=16000, clip_seconds=1.0, n_fft=400, hop_length=160, n_mels=64),
            "default": {}}

#: Each variant with its shuffle buffer before decode (raw rows: True) or after it (decoded samples: False).
VARIANTS = [("reader", None), ("train", True), ("train", False), ("resume", True), ("resume", False)]


def write_data(folder: Path, rows: int) -> None:
    from tests.helpers import audio_table, write_ipc_file

    per_file = rows // 8
    for fmt in ("ipc", "parquet"):
        (folder / fmt).mkdir()
    for i in range(8):
        table = audio_table(i * per_file, per_file, seconds=2.0, sample_rate=16000)
        write_ipc_file(folder / "ipc" / f"part-{i}.arrow", table, batch_rows=16)
        pq.write_table(table, folder / "parquet" / f"part-{i}.parquet", row_group_size=16)


def child(args: argparse.Namespace) -> dict:
    """One variant, in this (fresh) process."""
    import audioloader as al

    features = al.MelSpectrogramConfig(**FEATURES[args.features])
    options = dict(batch_size=64, features=features, seed=0, workers=al.Workers(num_workers=2, kind="process"),
                   shuffle=al.Shuffle(buffer_size=1000, min_size=500, before_decode=args.before_decode))
    out: dict = {}
    if args.variant == "reader":
        reader = al.nodes.ArrowShardReader.of(args.source, shuffle=True)
        start = time.perf_counter()
        rows = nbytes = 0
        for sample in reader:
            rows += 1
            nbytes += len(sample.audio)
        seconds = time.perf_counter() - start
        out.update(rows_per_s=rows / seconds, mb_per_s=nbytes / seconds / 1e6)
    elif args.variant == "train":
        with al.AudioLoader(args.source, **options) as loader:
            start = time.perf_counter()
            it = iter(loader)
            next(it)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(args.batches):
                next(it)
            out.update(first_batch_s=first, samples_per_s=64 * args.batches / (time.perf_counter() - start))
    else:
        with al.AudioLoader(args.source, **options) as loader:
            it = iter(loader)
            for _ in range(20):  # the buffer is full (1000) after the first batch: well into the pass
                next(it)
            state = loader.state_dict()
        with al.AudioLoader(args.source, **options) as resumed:
            start = time.perf_counter()
            resumed.load_state_dict(state)
            next(iter(resumed))
            out.update(resume_s=time.perf_counter() - start)
    return out


def run_variant(variant: str, source: str, before_decode: bool | None, batches: int, features: str) -> dict:
    """The variant's figures (`child`'s) and the peak PSS of its process, in MiB."""
    args = ["--child", variant, "--source", source, "--batches", str(batches), "--features", features]
    if before_decode is not None:
        args += ["--before-decode", str(int(before_decode))]
    result = run_child(module_command(__spec__, *args), timeout=900)
    if not result["ok"]:
        raise RuntimeError(f"{variant} on {source}: {result['error']}")
    return {key: result[key] for key in (*result["figures"], "peak_pss_mb")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1200)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--features", choices=sorted(FEATURES), default="default")
    parser.add_argument("--formats", default="ipc,parquet", help="comma-separated: ipc, parquet")
    parser.add_argument("--variants", default="reader,train,resume", help="comma-separated: reader, train, resume")
    parser.add_argument("--child")
    parser.add_argument("--source")
    parser.add_argument("--before-decode", type=int)
    args = parser.parse_args()
    if args.child:
        args.variant = args.child
        args.before_decode = None if args.before_decode is None else bool(args.before_decode)
        figures = child(args)
        emit_result({**figures, "figures": sorted(figures)})
        return

    from tests.s3_server import S3_ENVIRONMENT, S3Server

    os.environ.update(S3_ENVIRONMENT)
    server = S3Server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_data(folder, args.rows)
            for fmt in ("ipc", "parquet"):
                server.upload(folder / fmt, f"bench/{fmt}")
            rows = []
            for fmt in args.formats.split(","):
                sources = {"local": str(folder / fmt), "s3": server.url(f"bench/{fmt}", direct=True)}
                variants = [(variant, before) for variant, before in VARIANTS if variant in args.variants.split(",")]
                for variant, before in variants:
                    results = {name: [] for name in sources}
                    for _ in range(args.repeats):  # interleaved: local, s3, local, s3
                        for name, source in sources.items():
                            results[name].append(run_variant(variant, source, before, args.batches, args.features))
                    label = variant if before is None else f"{variant}, buffer {'raw' if before else 'decoded'}"
                    for metric in results["local"][0]:
                        local, remote = median_of(results["local"], metric), median_of(results["s3"], metric)
                        rows.append((fmt, label, metric, local, remote, remote / local))
            print(table(("format", "variant", "metric", "local", "s3", "s3/local"),
                        [(fmt, label, metric, f"{local:.2f}", f"{remote:.2f}", f"{ratio:.2f}")
                         for fmt, label, metric, local, remote, ratio in rows]))
    finally:
        server.close()


if __name__ == "__main__":
    main()
