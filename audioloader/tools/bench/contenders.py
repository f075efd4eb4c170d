"""The benchmark contenders. Each one runs in its own fresh process, started by `audioloader.tools.bench`.

Every contender produces the same output from the same shards: batches of 64
log-mel spectrograms of a 5 s crop at 32 kHz (n_fft 1024, hop 320, 128 mel
bands, ``log(mel + 1e-6)``), float32 ``[64, 128, 501]``, plus labels.

Contenders (``kind`` in the spec):

- ``audioloader``: `audioloader.AudioLoader`, train or eval mode.
- ``baseline``: what a user writes today without audioloader (`audioloader.tools.bench.baseline`):
  a map-style ``torch.utils.data.Dataset`` over the same shards (pyarrow
  memory-mapped tables, soundfile decode of the whole file,
  ``torchaudio.functional.resample`` or soxr, random 5 s crop,
  ``torchaudio.transforms.MelSpectrogram``, log), under
  ``DataLoader(num_workers=2, shuffle=True, batch_size=64)``.
- ``ceiling``: the project's own per-sample function
  (``DecodeSpectrogram.decode`` on `RawSample`s read beforehand) in a plain
  loop on one thread with one torch thread: no framework, no queues, no
  collation. Its rate times the number of cores is what a perfect parallel
  loader could reach on this machine.
- ``decode_threads``: the same function in N plain threads at once.
- ``resume_save`` / ``resume_load``: a train-mode AudioLoader whose shuffle
  buffer is filled to capacity, checkpointed with ``torch.save``; then, in a
  new process, ``load_state_dict`` and the first batch.

Protocol: ``python -m audioloader.tools.bench._child '<json spec>'`` prints one line
``BENCH-RESULT <json>`` on stdout. The parent samples the memory of this
process and its children from /proc while it runs (see `audioloader.tools.bench.runner`).

Units: seconds (``*_s``), bytes (``*_bytes``), samples per second (``samples_per_s``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "

#: The common output of every contender (the library's default features, `MelSpectrogramConfig()`).
FEATURES = {"sample_rate": 32000, "clip_seconds": 5.0, "n_fft": 1024, "hop_length": 320, "n_mels": 128}
LOG_OFFSET = 1e-6


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- process-tree CPU time ---------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return kids


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (Linux /proc; just ``[root]`` elsewhere)."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack += _children(pid)
    return pids


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds used so far by this process (all threads) and its live descendants."""
    root = os.getpid() if root is None else root
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return total


# -- the measurement loop, common to every stream of batches ---------------------------------------------


def _check_batch(spec_tensor: Any, batch_size: int) -> None:
    """Every contender must produce the same thing; a wrong shape would make the comparison meaningless.

    A batch may be smaller than ``batch_size`` (the last one of an epoch or pass), never larger.
    """
    import torch

    frames = 1 + round(FEATURES["clip_seconds"] * FEATURES["sample_rate"]) // FEATURES["hop_length"]
    shape = tuple(spec_tensor.shape)
    if spec_tensor.dtype != torch.float32 or shape[1:] != (FEATURES["n_mels"], frames):
        raise AssertionError(f"batch has dtype {spec_tensor.dtype} shape {shape}, expected float32 "
                             f"[B, {FEATURES['n_mels']}, {frames}]")
    if not 1 <= shape[0] <= batch_size:
        raise AssertionError(f"batch of {shape[0]} samples, expected 1..{batch_size}")


def measure_stream(batches: Iterator[Any], *, started: float, batch_size: int, warmup_batches: int,
                   measure_seconds: float, min_batches: int, max_batches: int | None,
                   count: Callable[[Any], int], spectrogram: Callable[[Any], Any],
                   whole: int = 1) -> dict[str, Any]:
    """Time a stream of batches.

    ``started`` is the ``perf_counter()`` taken just before the loader (or
    dataset) was constructed, so ``first_batch_s`` covers construction, start-up
    and the first batch. The first ``warmup_batches`` batches are then skipped;
    the steady-state window runs until it has lasted ``measure_seconds`` and has
    at least ``min_batches`` batches, or ``max_batches`` batches were measured,
    or the stream ends; with ``whole=k`` it also only stops after a multiple of
    ``k`` batches (whole eval passes). ``samples_per_s`` is samples in the window
    / window seconds (window = end of the last warm-up batch to end of the last
    measured one).
    """
    first = None
    seen = 0
    for batch in batches:
        seen += 1
        if first is None:
            first = time.perf_counter() - started
        _check_batch(spectrogram(batch), batch_size)
        if seen >= max(1, warmup_batches):
            break
    if first is None:
        raise RuntimeError("the stream produced no batch")
    window_start = time.perf_counter()
    cpu_start = tree_cpu_seconds()
    own_start = time.process_time()
    samples = measured = 0
    elapsed = 0.0
    for batch in batches:
        samples += count(batch)
        measured += 1
        _check_batch(spectrogram(batch), batch_size)
        elapsed = time.perf_counter() - window_start
        if measured % whole:
            continue
        if (elapsed >= measure_seconds and measured >= min_batches) or (
                max_batches is not None and measured >= max_batches):
            break
    cpu = tree_cpu_seconds() - cpu_start
    own = time.process_time() - own_start
    return {
        "first_batch_s": first,
        "warmup_batches": seen,
        "measured_batches": measured,
        "measured_samples": samples,
        "measured_s": elapsed,
        "samples_per_s": samples / elapsed if elapsed > 0 else None,
        # Cores kept busy during the window (CPU seconds of the process tree / wall seconds).
        "cores_used": cpu / elapsed if elapsed > 0 else None,
        # Work per sample, insensitive to how many cores other processes left us.
        "samples_per_cpu_s": samples / cpu if cpu > 0 else None,
        # Cores used by the consuming process alone (its threads, not worker processes): the
        # part that does not scale out, and what competes with a training loop's Python.
        "main_process_cores": own / elapsed if elapsed > 0 else None,
    }


def _features():
    from audioloader.dsp.config import MelSpectrogramConfig

    return MelSpectrogramConfig(**FEATURES, log=True, log_offset=LOG_OFFSET)


# -- audioloader -------------------------------------------------------------------------------------------


def run_audioloader(spec: dict[str, Any]) -> dict[str, Any]:
    """AudioLoader in train mode (infinite stream) or eval mode (one pass per ``iter``)."""
    from audioloader.audio_loader import AudioLoader
    from audioloader.options import Shuffle, Workers

    train = bool(spec["train"])
    # before_decode None: the library's default for these shards (spec may force either order); buffer and
    # min_fill None: the mode's preset.
    shuffle = Shuffle(buffer_size=spec.get("buffer"), min_size=spec.get("min_fill"),
                      before_decode=spec.get("shuffle_before_decode"))
    options: dict[str, Any] = {"batch_size": spec["batch_size"], "train": train, "seed": 0,
                               "features": _features(), "shuffle": shuffle,
                               "workers": Workers(num_workers=spec["workers"], kind=spec.get("worker_type", "auto"))}
    warmup = spec["warmup_batches"]
    max_batches = spec.get("max_batches")
    started = time.perf_counter()
    loader = AudioLoader(spec["source"], **options)
    construct_s = time.perf_counter() - started
    whole = 1
    if train:
        # The shuffle buffer grows by one item per emitted sample (two pulls per
        # emit) from min fill to capacity; until it is full the loader decodes
        # two rows per delivered sample. That is start-up, not steady state.
        growth = loader.shuffle_buffer_size - loader.shuffle_min_size
        warmup = max(warmup, math.ceil(growth / spec["batch_size"]) + 1)
        batches: Iterator[Any] = iter(loader)
    else:
        # Eval is one pass per `for` loop. Within a pass the rate is uneven (the
        # eval shuffle buffer grows during the first half, then drains without
        # decoding), so the first pass is the warm-up and the window is whole passes.
        whole = warmup = len(loader)
        batches = _passes(loader)
    result = measure_stream(batches, started=started, batch_size=spec["batch_size"], warmup_batches=warmup,
                            measure_seconds=spec["measure_seconds"], min_batches=spec["min_batches"],
                            max_batches=max_batches, count=_valid_count, spectrogram=lambda b: b["spectrogram"],
                            whole=whole)
    stats = loader.stats()
    loader.shutdown()
    result.update(construct_s=construct_s, shuffle_buffer_size=loader.shuffle_buffer_size,
                  shuffle_min_size=loader.shuffle_min_size, num_workers=loader.num_workers,
                  shuffle_before_decode=loader.shuffle_before_decode, worker_type=loader.worker_type,
                  stage_seconds=stats["seconds"], counters=stats["counters"])
    return result


def _passes(loader) -> Iterator[Any]:
    """Eval: pass after pass (each ``iter`` is one pass, as a user's eval loop would run it)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def _valid_count(batch: dict[str, Any]) -> int:
    valid = batch.get("valid")
    return int(valid.sum()) if valid is not None else len(batch["index"])


# -- the user baseline -------------------------------------------------------------------------------------


def run_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """The user baseline (`audioloader.tools.bench.baseline`) under ``DataLoader(num_workers=N, batch_size=64)``.

    One long shuffled epoch (``RandomSampler(num_samples=10**8)``), as a large
    training set would be: no worker restart at an epoch's end inside the window.
    """
    from .baseline import make_loader

    started = time.perf_counter()
    loader = make_loader(spec["source"], spec["resampler"], spec["batch_size"], spec["workers"], samples=10**8)
    construct_s = time.perf_counter() - started
    result = measure_stream(iter(loader), started=started, batch_size=spec["batch_size"],
                            warmup_batches=spec["warmup_batches"], measure_seconds=spec["measure_seconds"],
                            min_batches=spec["min_batches"], max_batches=spec.get("max_batches"),
                            count=lambda b: len(b[1]), spectrogram=lambda b: b[0])
    result.update(construct_s=construct_s, num_workers=spec["workers"])
    return result


# -- the ceiling ---------------------------------------------------------------------------------------------


def run_ceiling(spec: dict[str, Any]) -> dict[str, Any]:
    """``DecodeSpectrogram.decode`` in a loop on one thread, rows read beforehand; rate x cores."""
    import torch

    from audioloader.nodes.arrow_shard_reader import ArrowShardReader
    from audioloader.nodes.decode_spectrogram import DecodeSpectrogram

    torch.set_num_threads(1)
    reader = ArrowShardReader.of(spec["source"], seed=0, shuffle=True, infinite=True)
    reader.reset()
    node = DecodeSpectrogram.of(reader, _features(), seed=0, train=True, num_workers=0)
    warmup = max(1, spec["warmup_samples"])
    for _ in range(warmup):
        node.decode(next(reader))
    raws = [next(reader) for _ in range(spec["max_samples"])]  # read outside the timed loop
    if spec.get("wait_go"):  # several start their windows together (see benchmarks/end_to_end/bench_scaling.py)
        print("READY", flush=True)
        sys.stdin.readline()
    start = time.perf_counter()
    cpu_start = time.process_time()
    done = 0
    elapsed = 0.0
    for raw in raws:
        out = node.decode(raw)
        if not hasattr(out, "spectrogram"):
            raise RuntimeError(f"row did not decode: {out}")
        done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= spec["measure_seconds"] and done >= spec["min_samples"]:
            break
    cpu = time.process_time() - cpu_start
    one = done / elapsed
    n = cores()
    return {"samples_per_s": one * n, "one_thread_samples_per_s": one, "cores": n,
            "samples_per_cpu_s": done / cpu if cpu > 0 else None,
            "measured_samples": done, "measured_s": elapsed, "cores_used": cpu / elapsed,
            "ms_per_sample": 1000 * elapsed / done, "stage_seconds": node.stats.snapshot()["seconds"]}


def run_decode_threads(spec: dict[str, Any]) -> dict[str, Any]:
    """``DecodeSpectrogram.decode`` in ``workers`` plain Python threads (no framework, no queues), rows read before.

    Shows how far threads alone scale the per-sample function on this machine
    (the GIL is re-taken between its many short GIL-free calls).
    """
    import threading

    import torch

    from audioloader.nodes.arrow_shard_reader import ArrowShardReader
    from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
    from audioloader.workers.threads import pin_worker_to_one_thread

    reader = ArrowShardReader.of(spec["source"], seed=0, shuffle=True, infinite=True)
    reader.reset()
    node = DecodeSpectrogram.of(reader, _features(), seed=0, train=True, num_workers=0)
    raws = [next(reader) for _ in range(spec["max_samples"])]
    n, user = spec["workers"], torch.get_num_threads()
    go, stop = threading.Event(), threading.Event()
    counts = [0] * n

    def work(k: int) -> None:
        pin_worker_to_one_thread(user)
        node.decode(raws[k % len(raws)])  # warm-up
        go.wait()
        i = k
        while not stop.is_set():
            node.decode(raws[i % len(raws)])
            counts[k] += 1
            i += n

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(n)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    cpu_start, start = time.process_time(), time.perf_counter()
    go.set()
    time.sleep(spec["measure_seconds"])
    done, elapsed = sum(counts), time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    stop.set()
    for thread in threads:
        thread.join()
    return {"samples_per_s": done / elapsed, "measured_samples": done, "measured_s": elapsed,
            "cores_used": cpu / elapsed, "samples_per_cpu_s": done / cpu if cpu > 0 else None, "workers": n}


# -- resume ------------------------------------------------------------------------------------------------


def _resume_loader(spec: dict[str, Any]):
    from audioloader.audio_loader import AudioLoader
    from audioloader.options import Shuffle, Workers

    shuffle = Shuffle(buffer_size=spec["buffer"], min_size=spec["buffer"],
                      before_decode=bool(spec["shuffle_before_decode"]))
    return AudioLoader(spec["source"], batch_size=spec["batch_size"], train=True, seed=0, features=_features(),
                       workers=Workers(num_workers=spec["workers"]), shuffle=shuffle)


def run_resume_save(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill the buffer to capacity (min fill = capacity), take ``batches`` batches, checkpoint, go on one batch.

    The batch after the checkpoint is recorded so the loading process can check
    that resume is exact.
    """
    import torch

    started = time.perf_counter()
    loader = _resume_loader(spec)
    it = iter(loader)
    next(it)
    first = time.perf_counter() - started
    for _ in range(spec["batches"] - 1):
        next(it)
    t = time.perf_counter()
    state = loader.state_dict()
    state_dict_s = time.perf_counter() - t
    t = time.perf_counter()
    torch.save(state, spec["checkpoint"])
    save_s = time.perf_counter() - t
    expected = next(it)["index"].tolist()
    loader.shutdown()
    return {"first_batch_s": first, "state_dict_s": state_dict_s, "save_s": save_s,
            "checkpoint_bytes": os.path.getsize(spec["checkpoint"]), "expected_next_index": expected}


def run_resume_load(spec: dict[str, Any]) -> dict[str, Any]:
    """A new process: build the loader, ``load_state_dict``, first batch. Times the part a user waits for."""
    import torch

    started = time.perf_counter()
    loader = _resume_loader(spec)
    construct_s = time.perf_counter() - started
    t = time.perf_counter()
    state = torch.load(spec["checkpoint"], weights_only=True)
    torch_load_s = time.perf_counter() - t
    t = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    restore_s = time.perf_counter() - t
    got = batch["index"].tolist()
    loader.shutdown()
    return {"construct_s": construct_s, "torch_load_s": torch_load_s, "restore_first_batch_s": restore_s,
            "exact": got == spec.get("expected_next_index")}


CONTENDERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "audioloader": run_audioloader,
    "baseline": run_baseline,
    "ceiling": run_ceiling,
    "decode_threads": run_decode_threads,
    "resume_save": run_resume_save,
    "resume_load": run_resume_load,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    t = time.perf_counter()
    import torch  # noqa: F401  (import cost reported separately from the contender's own start-up)

    import_s = time.perf_counter() - t
    try:
        result = CONTENDERS[spec["kind"]](spec)
        result["import_s"] = import_s
        result["ok"] = True
    except Exception as error:  # reported to the parent, which shows it in the table
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
