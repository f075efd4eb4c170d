"""The consumer's CPU a sample for the hand-off alone: worker results read into batch rows, copied or not.

Two `ProcessPool` s of 2 forked workers run a job that costs nothing (the same 256 KiB log-mel,
float32 [128, 501], for every item), so that only the hand-off is measured: chunks of 8 sent, answers
read in order, 64 rows made a batch by `BatchArenas.batch_of`. ``copy``: the results come through the
worker's slot and the consumer copies each into the batch's row (the path before the shared arenas, and
still the path after a skipped row); ``shared``: the worker writes them into the rows reserved in the
shared arenas and the consumer copies nothing. Rounds interleaved in one process; reported: the
consumer's ``time.process_time()`` a sample (median and each round).

    python -m benchmarks.pipeline.bench_handoff --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from audioloader.samples import Key, Sample
from audioloader.workers.pool import ProcessPool
from audioloader.workers.recycle import BatchArenas

SHAPE = (128, 501)
BATCH = 64
CHUNK = 8


class SameFeatures:
    """A decode job that costs nothing: a copy of one 256 KiB log-mel for every key."""

    def __init__(self) -> None:
        self.features = torch.randn(*SHAPE)

    def __call__(self, index: int) -> Sample:
        return Sample(Key(index, 0), self.features.clone(), 3, {}, "/data/part-00000.arrow", index, None, 1)


def one_round(pool: ProcessPool, arenas: BatchArenas, batches: int) -> float:
    """Microseconds of the consumer's CPU a sample over ``batches`` batches."""
    arenas.restart()
    in_flight: list[int] = []
    rows: list[torch.Tensor] = []
    seq = delivered = 0
    started = time.process_time()
    while delivered < batches * BATCH:
        if len(in_flight) >= pool.num_workers * pool.depth:
            results, _ = pool.result(in_flight.pop(0), arenas)
            rows.extend(r.features for r in results)
        pool.submit(seq, list(range(seq * CHUNK, (seq + 1) * CHUNK)), arenas)
        in_flight.append(seq)
        seq += 1
        while len(rows) >= BATCH:
            if arenas.batch_of(rows[:BATCH]) is None:
                raise RuntimeError("the rows are not one arena's: the benchmark measures the wrong path")
            del rows[:BATCH]
            delivered += BATCH
    spent = time.process_time() - started
    pool.cancel()
    return 1e6 * spent / delivered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=10, help="batches of 64 a round")
    args = parser.parse_args()
    pools = {}
    for name, shared in (("copy", False), ("shared", True)):
        arenas = BatchArenas(BATCH, SHAPE, 8 * BATCH * 4 * SHAPE[0] * SHAPE[1])
        pool = ProcessPool(SameFeatures(), 2, arenas=arenas if shared else None, start_method="fork")
        pool.start()
        one_round(pool, arenas, 2)  # warm-up: slots grown, arenas touched
        pools[name] = (pool, arenas)
    spent: dict[str, list[float]] = {name: [] for name in pools}
    try:
        for _ in range(args.rounds):
            for name, (pool, arenas) in pools.items():
                spent[name].append(one_round(pool, arenas, args.batches))
    finally:
        for pool, _ in pools.values():
            pool.shutdown()
    for name, values in spent.items():
        print(f"{name:7s} consumer CPU a sample: median {statistics.median(values):6.1f} us  "
              f"(rounds: {', '.join(f'{v:.0f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
