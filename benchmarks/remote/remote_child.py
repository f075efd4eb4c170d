"""One audioloader contender of benchmarks/remote/bench_remote.py, in its own fresh process.

    python -P -m benchmarks.remote.remote_child '<json spec>'
        (PYTHONPATH: `benchmarks.common.checkout_python_path`, the audioloader checkout measured)

Prints ``BENCH-RESULT <json>`` as its last line. Only audioloader's public API is
used (``audioloader.AudioLoader``, ``audioloader.nodes.ArrowShardReader``, the
feature configs), so the same file measures an older checkout (``--project``).
The measuring window and the result line are shared with remote_peers.py
(`benchmarks.remote.protocol`).

Kinds (``spec["kind"]``):

- ``reader``: ``ArrowShardReader.of(source, shuffle=False)``, one pass: rows/s and MB/s
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

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.remote.protocol import FEATURES, MIN_BATCHES, emit, mark, measure_batches

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
    reader = ArrowShardReader.of(spec["source"], shuffle=False)
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
