"""What the trained position costs per batch: the state kept after every batch, and ``mark_trained()``.

Every batch handed out, the loader keeps its state (the chain's own snapshot dicts, made by
its prefetch thread anyway) in a deque of the last 16, so that ``state_dict()`` can be the
position after the last batch marked trained (Lightning's fetcher is a batch ahead,
docs/integrations.md). This times, at a position in the middle of a run:

* ``keep``: taking and keeping the state after one batch (``Loader.state_dict()`` + append);
* ``mark``: one ``loader.mark_trained()``;
* ``state_dict``: ``loader.state_dict()`` while one batch is ahead (a checkpoint's lookup);
* ``batch``: a whole ``next()`` of the same loader, for scale.

    python -m benchmarks.pipeline.bench_trained_state [--batches 200] [--repeat 20000]

Prints nanoseconds per call (median of 5 rounds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import audioloader as al
from audioloader.tools.synthetic import make_classification_dataset
from benchmarks.common import median_ns_per_call

FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=1.0, n_fft=512, hop_length=256, n_mels=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200, help="batches timed before the micro-timings")
    parser.add_argument("--repeat", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data = make_classification_dataset(Path(scratch) / "data", 16, seed=0, num_classes=4, max_seconds=2.0)
        loader = al.AudioLoader(data, batch_size=16, train=True, features=FEATURES,
                                shuffle=al.Shuffle(buffer_size=64, min_size=16), workers=al.Workers(num_workers=2))
        with loader:
            it = iter(loader)
            next(it)  # start-up
            start = time.perf_counter_ns()
            for _ in range(args.batches):
                next(it)
            batch_ns = (time.perf_counter_ns() - start) / args.batches
            stream = loader._stream
            state = stream.loader.state_dict
            trail = stream._trail

            def keep() -> None:
                trail.append((0, state()))

            keep_ns = median_ns_per_call(keep, args.repeat)
            # mark_trained needs batches handed out and not marked: count as many as it will mark.
            stream._handed = stream._trained + 5 * args.repeat + 1
            mark_ns = median_ns_per_call(loader.mark_trained, args.repeat)
            stream._handed = stream._trained + 1  # one batch ahead, as under Lightning
            trail.append((stream._trained, state()))
            state_ns = median_ns_per_call(loader.state_dict, args.repeat)
    print(f"keep the state after a batch: {keep_ns:8.0f} ns per batch")
    print(f"mark_trained():               {mark_ns:8.0f} ns per batch")
    print(f"state_dict(), a batch ahead:  {state_ns:8.0f} ns per call")
    print(f"next() (for scale):           {batch_ns:8.0f} ns per batch")


if __name__ == "__main__":
    main()
