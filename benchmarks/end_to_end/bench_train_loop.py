"""End to end: a training loop fed by each loader; samples/s and the fraction of time it waits for data.

The loop is what a user runs: ``for batch in loader: step(batch)``. Each
configuration runs in a fresh process (the loader, its workers and the training
step share the machine as they would in training). The step is:

- ``--step cnn`` (default with a GPU): the demo's SmallCNN, forward, backward
  and AdamW on the GPU, then ``loss.item()``; the batch is copied there
  (``non_blocking``, from pinned memory);
- ``--step standin`` (default without a GPU): a stand-in for a GPU step that
  does not need one: ``--python-ms`` of pure Python holding the GIL (a training
  loop's own Python: the optimizer, logging, kernel launches) then
  ``--device-ms`` of waiting with the GIL released (the GPU computing). It
  shows what matters on the CPU side: whether the loader's work competes with
  the training loop's Python.

Loaders: AudioLoader with threads and with processes (both pinned on a GPU),
AudioLoader with features on the GPU (``device="cuda"``, GPU only), and the
DataLoader baseline (`audioloader.tools.bench.baseline`, ``num_workers=N``).

Reported: samples/s, data wait (seconds in ``next()`` / wall seconds), the
mean step time excluding the wait, and the consuming process's CPU use.

    python -m benchmarks.end_to_end.bench_train_loop [--datasets flac,pcm16] [--workers 2] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.common import emit_result, module_command, run_child


def stand_in_step(python_ms: float, device_ms: float) -> None:
    """Hold the GIL for ``python_ms`` of Python work, then wait ``device_ms`` with it released."""
    end = time.perf_counter() + python_ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += sum(range(100))
    time.sleep(device_ms / 1000)


def make_step(kind: str, python_ms: float, device_ms: float):
    """``step(spectrogram, label) -> None`` and the device the batch goes to."""
    import torch

    if kind == "standin":
        return lambda x, y: stand_in_step(python_ms, device_ms), torch.device("cpu")
    from audioloader.tools.demo import SmallCNN

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = SmallCNN(10).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y) -> None:
        loss = torch.nn.functional.cross_entropy(model(x.to(device, non_blocking=True)),
                                                 y.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    return step, device


def run_one(spec: dict) -> dict:
    """One configuration, in this process."""
    import torch

    from audioloader import AudioLoader, Shuffle, Workers
    from audioloader.tools.bench.baseline import make_loader
    from audioloader.tools.bench.contenders import _features

    step, device = make_step(spec["step"], spec["python_ms"], spec["device_ms"])
    pin = device.type == "cuda"
    if spec["loader"] == "dataloader":
        loader = make_loader(spec["source"], "torchaudio", 64, spec["workers"], samples=10**8)
        loader.pin_memory = pin
        batches = iter(loader)
        unpack = lambda b: b  # noqa: E731
        warm = max(5, 2 * spec["workers"])
    else:
        loader = AudioLoader(spec["source"], batch_size=64, train=True, seed=0, features=_features(),
                             workers=Workers(num_workers=spec["workers"], kind=spec["worker_type"], pin_memory=pin),
                             device="cuda" if spec["loader"] == "gpu-features" else None,
                             shuffle=Shuffle(buffer_size=1000, min_size=64))
        batches = iter(loader)
        unpack = lambda b: (b["spectrogram"], b["label"])  # noqa: E731
        warm = 5
    for _ in range(warm):
        step(*unpack(next(batches)))
    if device.type == "cuda":
        torch.cuda.synchronize()
    cpu0, start = time.process_time(), time.perf_counter()
    waited = 0.0
    samples = steps = 0
    while time.perf_counter() - start < spec["seconds"] or steps < 5:
        t = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - t
        x, y = unpack(batch)
        step(x, y)
        samples += len(y)
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if spec["loader"] != "dataloader":
        loader.shutdown()
    return {"samples_per_s": samples / elapsed, "wait_fraction": waited / elapsed,
            "step_ms": 1000 * (elapsed - waited) / steps, "process_cores": cpu / elapsed, "steps": steps,
            "device": str(device)}


def compute_only(spec: dict) -> dict:
    """The step alone on a fixed batch: the rate the model could take."""
    import torch

    step, device = make_step(spec["step"], spec["python_ms"], spec["device_ms"])
    x, y = torch.randn(64, 128, 501), torch.randint(0, 10, (64,))
    if device.type == "cuda":
        x, y = x.to(device), y.to(device)
    for _ in range(5):
        step(x, y)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < 3.0 or steps < 5:
        step(x, y)
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"samples_per_s": 64 * steps / elapsed, "step_ms": 1000 * elapsed / steps, "device": str(device)}


def in_child(spec: dict) -> dict:
    return run_child(module_command(__spec__, "--child", json.dumps(spec)), timeout=spec.get("seconds", 10) + 600,
                     interval=0.25, pss_every=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--datasets", default="flac,pcm16")
    parser.add_argument("--workers", default=None, help="worker threads/processes (default: the cores)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--step", choices=("cnn", "standin"), default=None)
    parser.add_argument("--python-ms", type=float, default=8.0, help="stand-in step: GIL-holding Python, ms")
    parser.add_argument("--device-ms", type=float, default=15.0, help="stand-in step: GIL-free wait, ms")
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = compute_only(spec) if spec["loader"] == "none" else run_one(spec)
        emit_result(result)
        return 0

    import torch

    from audioloader.tools.bench import dataset as bench_dataset
    from audioloader.tools.bench.settings import DISTURBED_CORES

    gpu = torch.cuda.is_available()
    step = args.step or ("cnn" if gpu else "standin")
    workers = [int(w) for w in args.workers.split(",")] if args.workers else [os.cpu_count() or 1]
    spec0 = {"step": step, "python_ms": args.python_ms, "device_ms": args.device_ms, "seconds": args.seconds}
    spec = bench_dataset.DatasetSpec(clips=args.clips)
    sources = {"flac": bench_dataset.standard_dataset(spec, args.cache_dir),
               "pcm16": bench_dataset.packed_dataset(spec, 32000, "pcm16", args.cache_dir)}
    alone = in_child({**spec0, "loader": "none"})
    print(f"step alone: {alone.get('step_ms', 0):.1f} ms/step = {alone.get('samples_per_s', 0):.0f} samples/s "
          f"({step} on {alone.get('device')})", flush=True)
    rows = []
    for name in args.datasets.split(","):
        for n in workers:
            configs = [("threads", {"loader": "audioloader", "worker_type": "thread"}),
                       ("processes", {"loader": "audioloader", "worker_type": "process"}),
                       ("dataloader", {"loader": "dataloader"})]
            if gpu:
                configs.insert(2, ("processes+gpu-features", {"loader": "gpu-features", "worker_type": "process"}))
            for label, extra in configs:
                r = in_child({**spec0, **extra, "source": str(sources[name]), "workers": n})
                rows.append((name, f"{label}-{n}", r))
                print(f"{name:6s} {label}-{n:<3d} " + (
                    f"{r['samples_per_s']:7.1f} samples/s  wait {r['wait_fraction']:5.1%}  step {r['step_ms']:6.1f} ms"
                    f"  process cores {r['process_cores']:.2f}" if r["ok"] else f"FAILED {r['error']}"), flush=True)
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"step_alone": alone, "rows": rows}, fh, indent=2)
    print(f"\nTraining loop ({step} step, {alone.get('step_ms', 0):.1f} ms alone = "
          f"{alone.get('samples_per_s', 0):.0f} samples/s possible), {os.cpu_count()} cores:")
    print(f"{'dataset':7s} {'loader':26s} {'samples/s':>9s} {'data wait':>9s} {'step ms':>8s} {'cores':>6s} "
          f"{'others':>7s}")
    for name, label, r in rows:
        if r["ok"]:
            others = "-" if r["others_cores"] is None else f"{r['others_cores']:.2f}" + ("!" if r["disturbed"] else "")
            print(f"{name:7s} {label:26s} {r['samples_per_s']:9.1f} {r['wait_fraction']:9.1%} {r['step_ms']:8.1f} "
                  f"{r['process_cores']:6.2f} {others:>7s}")
    print("cores: CPU of the training process itself (its loader threads included, worker processes not); "
          f"others: cores other processes used meanwhile (! = over {DISTURBED_CORES}: re-run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
