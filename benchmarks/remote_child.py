"""One audioloader contender of benchmarks/bench_remote.py, in its own fresh process.

    python benchmarks/remote_child.py '<json spec>'      (PYTHONPATH = the audioloader checkout measured)

Prints ``BENCH-RESULT <json>`` as its last line. Only audioloader's public API is
used (``audioloader.AudioLoader``, ``audioloader.nodes.ArrowShardReader``, the
feature configs), so the same file measures an older checkout (``--project``).
`measure_batches` and `emit` are shared with benchmarks/remote_peers.py, which
runs in the peers' virtual environment: nothing here imports audioloader at the
top.

Kinds (``spec["kind"]``):

- ``reader``: ``ArrowShardReader(source, shuffle=False)``, one pass: rows/s and MB/s
  after the first row, construction and first-row seconds.
- ``loader``: ``AudioLoader(source, batch_size, train, features, ...)`` with the
  library's defaults for everything else (workers, prefetch), except the train
  shuffle buffer (``buffer``/``min_fill``; None: the default). Eval is one pass.
- ``construct``: ``phase="cold"``: construct a train loader, take its first batch,
  save ``state_dict()`` to ``state_file`` (and note the next batch's rows);
  ``phase="resume"``: construct it again, ``load_state_dict``, first batch (what a
  restarted job waits for; ``exact``: it is the batch the cold run yielded next).

Units: seconds (``*_s``), bytes (``*_bytes``), samples or rows per second.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "
MARK_PREFIX = "BENCH-MARK "
#: Fewest batches (after the first) in a measuring window: one slow batch is not a rate.
MIN_BATCHES = 3

#: The two feature settings: the I/O-bound one of issue 19 (0.5 s of 16 kHz waveform) and the library's default
#: log-mel (5 s at 32 kHz, 128 mels). Shapes of one sample, after the batch axis.
FEATURES = {"waveform": {"sample_rate": 16000, "clip_seconds": 0.5, "shape": (8000,)},
            "mel": {"sample_rate": 32000, "clip_seconds": 5.0, "shape": (128, 501)}}


def measure_batches(batches: Iterable[Any], *, started: float, measure_seconds: float,
                    count: Callable[[Any], int], features: Callable[[Any], Any], feature: str,
                    min_batches: int = MIN_BATCHES) -> dict[str, Any]:
    """Time a stream of batches: the first batch, then a window of at least ``measure_seconds`` and
    ``min_batches`` batches (or to the stream's end).

    ``started`` is ``perf_counter()`` just before construction, so ``first_batch_s``
    counts construction, start-up and the first batch. ``samples_per_s`` is the
    rate after the first batch; ``samples_per_s_total`` the rate from ``started``.
    """
    shape = FEATURES[feature]["shape"]
    first = None
    window_start = 0.0
    samples = total = batches_seen = 0
    for batch in batches:
        tensor = features(batch)
        if tuple(tensor.shape[1:]) != shape or str(tensor.dtype) != "torch.float32":
            raise AssertionError(f"batch of {tuple(tensor.shape)} {tensor.dtype}, expected float32 [B, *{shape}]")
        n = count(batch)
        total += n
        batches_seen += 1
        now = time.perf_counter()
        if first is None:
            first, window_start = now - started, now
            continue
        samples += n
        if now - window_start >= measure_seconds and batches_seen > min_batches:
            break
    if first is None:
        raise RuntimeError("the stream produced no batch")
    end = time.perf_counter()
    elapsed = end - window_start
    return {"first_batch_s": first, "measured_samples": samples, "measured_s": elapsed, "batches": batches_seen,
            "samples_per_s": samples / elapsed if samples and elapsed > 0 else None,
            "samples_per_s_total": total / (end - started)}


def mark(spec: dict[str, Any], label: str) -> float:
    """Tell the parent ``label`` happened (it snapshots the proxy's counters) and wait for its answer, so the
    requests made before and after are told apart exactly. A no-op unless the parent asked (``spec["marks"]``).

    Returns the seconds it took, for the caller to leave out of its timings (``started += mark(...)``).
    """
    if not spec.get("marks"):
        return 0.0
    started = time.perf_counter()
    sys.stdout.write(f"{MARK_PREFIX}{label}\n")
    sys.stdout.flush()
    sys.stdin.readline()
    return time.perf_counter() - started


def emit(run: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str]) -> int:
    """Run ``run(spec)`` on the JSON spec in ``argv[1]`` and print its result line (or the error)."""
    spec = json.loads(argv[1])
    try:
        result = run(spec)
        result["ok"] = True
    except Exception as error:  # reported to the parent, which shows it in the table
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1


# -- audioloader ------------------------------------------------------------------------------------------


def _feature_options(feature: str) -> dict[str, Any]:
    import audioloader as al

    if feature == "waveform":
        setting = FEATURES["waveform"]
        return {"features": al.WaveformConfig(sample_rate=setting["sample_rate"]),
                "length": al.LengthPolicy(clip_seconds=setting["clip_seconds"])}
    return {"features": al.MelSpectrogramConfig()}


def _loader(spec: dict[str, Any]):
    import audioloader as al

    options: dict[str, Any] = {"batch_size": spec["batch_size"], "train": spec["train"], "seed": 0,
                               **_feature_options(spec["feature"])}
    if spec["train"] and spec.get("buffer"):
        options["shuffle"] = al.Shuffle(buffer_size=spec["buffer"], min_size=spec["min_fill"])
    return al.AudioLoader(spec["source"], **options)


def _valid(batch: dict[str, Any]) -> int:
    valid = batch.get("valid")
    return int(valid.sum()) if valid is not None else len(batch["index"])


def _batch_key(feature: str) -> str:
    return "waveform" if feature == "waveform" else "spectrogram"


def _passes(node: Any, reset: Callable[[], Any]) -> Iterator[Any]:
    """Pass after pass of ``node`` (each started by ``reset()``, as a user's eval loop does), until one is empty."""
    while True:
        reset()
        empty = True
        for item in node:
            empty = False
            yield item
        if empty:
            return


def run_reader(spec: dict[str, Any]) -> dict[str, Any]:
    """One pass after another (a local pass can take milliseconds) until the window is long enough."""
    from audioloader.nodes import ArrowShardReader

    started = time.perf_counter()
    reader = ArrowShardReader(spec["source"], shuffle=False)
    construct_s = time.perf_counter() - started
    started += mark(spec, "constructed")
    first = None
    rows = nbytes = 0
    for sample in _passes(reader, reader.reset):
        if first is None:
            first = time.perf_counter()
            continue
        rows += 1
        nbytes += len(sample.audio)
        if rows >= MIN_BATCHES * 64 and time.perf_counter() - first >= spec["measure_seconds"]:
            break
    if first is None:
        raise RuntimeError("the reader yielded no row")
    elapsed = time.perf_counter() - first
    return {"construct_s": construct_s, "first_row_s": first - started, "measured_rows": rows, "measured_s": elapsed,
            "rows_per_s": rows / elapsed if rows else None, "mb_per_s": nbytes / elapsed / 1e6 if rows else None}


def run_loader(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    loader = _loader(spec)
    construct_s = time.perf_counter() - started
    started += mark(spec, "constructed")
    key = _batch_key(spec["feature"])
    # Eval: pass after pass (each `iter` is one pass), so a short pass still fills the window.
    batches = iter(loader) if spec["train"] else _passes(loader, lambda: None)
    try:
        result = measure_batches(batches, started=started, measure_seconds=spec["measure_seconds"], count=_valid,
                                 features=lambda b: b[key], feature=spec["feature"])
        stats = loader.stats()
    finally:
        loader.shutdown()
    result.update(construct_s=construct_s, num_workers=getattr(loader, "num_workers", None),
                  counters=stats.get("counters"))
    return result


def run_construct(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    loader = _loader(spec)
    construct_s = time.perf_counter() - started
    started += mark(spec, "constructed")
    key = _batch_key(spec["feature"])
    try:
        if spec["phase"] == "resume":
            state = torch.load(spec["state_file"], weights_only=True)
            loader.load_state_dict(state)
        batches = iter(loader)
        batch = next(batches)
        first = time.perf_counter() - started
        out = {"construct_s": construct_s, "first_batch_s": first, "batch_shape": list(batch[key].shape)}
        if spec["phase"] == "cold":
            torch.save(loader.state_dict(), spec["state_file"])
            out["next_index"] = next(batches)["index"].tolist()  # what the resumed loader must yield first
        else:
            out["exact"] = batch["index"].tolist() == spec.get("expected_next_index")
    finally:
        loader.shutdown()
    return out


KINDS = {"reader": run_reader, "loader": run_loader, "construct": run_construct}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    # Imported before any clock starts: construction times leave the imports (torch: seconds) out.
    import audioloader.nodes  # noqa: F401

    import_s = time.perf_counter() - started
    return {**KINDS[spec["kind"]](spec), "import_s": import_s}


if __name__ == "__main__":
    sys.exit(emit(run, sys.argv))
