"""How a contender of ``bench_remote.py`` talks to it, shared by audioloader's child (``remote_child.py``) and the
peers' (``remote_peers.py``, which runs in the peers' virtual environment): the result and mark lines, the feature
settings, and the measuring window over a stream of batches. Nothing here imports audioloader.

Units: seconds (``*_s``), samples per second.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Iterable
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
