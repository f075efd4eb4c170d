"""Reused result and batch memory: never written while anything still refers to it; batches as stacked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import audioloader as al
from audioloader.workers.recycle import BatchArenas, Recycler
from tests.helpers import SMALL, assert_same_batches, take


def test_an_array_is_reused_only_once_nothing_refers_to_it():
    recycler = Recycler(max_bytes=1 << 20)
    first = recycler.empty(1000)
    address = first.ctypes.data
    view = torch.from_numpy(first[10:20])  # a tensor over part of it keeps it in use
    del first
    second = recycler.empty(1000)
    assert second.ctypes.data != address
    del view
    third = recycler.empty(1000)  # the first again
    assert third.ctypes.data == address
    assert recycler.tracked_bytes == 2000


def test_the_recycler_forgets_the_oldest_past_its_bytes():
    recycler = Recycler(max_bytes=2500)
    held = [recycler.empty(1000) for _ in range(3)]
    assert recycler.tracked_bytes == 2000
    assert len({a.ctypes.data for a in held}) == 3
    assert recycler.empty(5000).nbytes == 5000  # larger than it keeps: handed out, not kept
    assert recycler.tracked_bytes == 2000


def test_batch_arenas_give_a_batch_of_the_rows_in_order_and_nothing_else():
    arenas = BatchArenas(batch_size=3, shape=(2, 5), max_bytes=1 << 20)
    rows = [arenas.empty(40) for _ in range(5)]  # 40 bytes = float32 [2, 5]
    features = []
    for k, row in enumerate(rows):
        tensor = torch.from_numpy(row.view(np.float32).reshape(2, 5))
        tensor.fill_(k)
        features.append(tensor)
    batch = arenas.batch_of(features[:3])
    assert batch is not None and batch.shape == (3, 2, 5)
    assert torch.equal(batch, torch.stack(features[:3]))
    assert torch.equal(arenas.batch_of(features[3:5]), torch.stack(features[3:5]))  # a short last batch
    assert arenas.batch_of(features[1:4]) is None  # not one arena's rows from the first: stacked instead
    assert arenas.batch_of([features[0], features[2]]) is None
    other = arenas.empty(12)  # another size: not a row
    assert other.nbytes == 12
    del features, rows, other
    kept = batch.clone()
    fresh = [arenas.empty(40) for _ in range(6)]  # the held batch's arena is not among them
    assert torch.equal(batch, kept)
    assert all(not (batch.data_ptr() <= f.ctypes.data < batch.data_ptr() + 120) for f in fresh)


def test_process_batches_and_slices_of_them_outlive_many_later_batches(ipc_shards):
    def loader(kind):
        return al.AudioLoader(ipc_shards, features=SMALL, batch_size=4, seed=1, storage=al.Storage(split_rows=4),
                              shuffle=al.Shuffle(buffer_size=12, min_size=6),
                              workers=al.Workers(num_workers=2, kind=kind))

    with loader("thread") as threads:
        expected = take(threads, 30)
    with loader("process") as processes:
        it = iter(processes)
        kept_slices, kept_batches = [], []
        for k in range(30):
            batch = next(it)
            if k % 3 == 0:
                kept_slices.append((k, batch["spectrogram"][1:3]))  # the rest of the batch is dropped
            elif k % 3 == 1:
                kept_batches.append(batch)
    for k, part in kept_slices:
        assert torch.equal(part, expected[k]["spectrogram"][1:3])
    assert_same_batches(kept_batches, [expected[k] for k in range(30) if k % 3 == 1])


def _arena_row(arenas: BatchArenas, ring: bytearray, place: int | None, value: float) -> np.ndarray:
    """What a worker and then the consumer do with a sample's features: written at ``place`` of the shared
    arenas, then taken as the row due (a copy when that is another row)."""
    features = np.full(arenas.row_bytes // 4, value, np.float32).view(np.uint8)
    if place is None:  # a row of a private arena: the worker wrote into its slot, the consumer copies
        row = arenas.empty(arenas.row_bytes)
        row[:] = features
        return row
    ring[place:place + arenas.row_bytes] = features.tobytes()
    return arenas.take_placed(memoryview(ring), place)


def test_rows_written_where_reserved_become_the_batch_and_a_skipped_row_costs_copies_not_order():
    arenas = BatchArenas(batch_size=4, shape=(2, 3), max_bytes=1 << 20)
    ring = bytearray(arenas.ring_bytes)
    arenas.use_ring(memoryview(ring))
    # Chunks of 3 items; chunk 1's second item is skipped (no features), so chunks 2 and 3, in flight
    # meanwhile, hold rows one past the rows due.
    places = {c: arenas.reserve(c, 3) for c in range(4)}
    assert all(p is not None and None not in p for p in places.values())
    values, rows = iter(range(100)), []
    delivered = []
    for c in range(4):
        for i in range(3):
            if (c, i) == (1, 1):
                continue
            # a worker writes its j-th row-size buffer (not its i-th item) at the chunk's j-th place
            j = i - 1 if c == 1 and i == 2 else i
            v = float(next(values))
            rows.append(_arena_row(arenas, ring, places[c][j], v))
            delivered.append(v)
        arenas.settle(c)
        if c == 1:
            assert arenas.reserve(99, 3) is None  # rows are reserved again once the chunks one off are back
            arenas.settle(99)  # (no items of it delivered, for simplicity: none were sent)
    features = [torch.from_numpy(r.view(np.float32).reshape(2, 3)) for r in rows]
    assert [float(f[0, 0]) for f in features] == delivered
    for b in range(0, len(features), 4):
        part = features[b:b + 4]
        batch = arenas.batch_of(part)
        assert batch is not None and torch.equal(batch, torch.stack(part))
    # every chunk in flight with rows one off is back: the next reservation is the row due, taken without a copy
    due = arenas.reserve(5, 1)
    row = _arena_row(arenas, ring, due[0], 42.0)
    assert row.ctypes.data == np.frombuffer(ring, np.uint8).ctypes.data + due[0]


def test_a_shared_arena_is_reused_only_once_no_batch_refers_to_it():
    arenas = BatchArenas(batch_size=2, shape=(4,), max_bytes=1 << 20)
    ring = bytearray(arenas.ring_bytes)
    arenas.use_ring(memoryview(ring))
    first = arenas.reserve(0, 2)
    rows = [_arena_row(arenas, ring, place, 1.0) for place in first]
    arenas.settle(0)
    batch = arenas.batch_of([torch.from_numpy(r.view(np.float32)) for r in rows])
    del rows
    seen = set()
    for c in range(1, 40):  # far more batches than shared arenas, while `batch` is held
        places = arenas.reserve(c, 2)
        for place in places or [None, None]:
            _arena_row(arenas, ring, place, 2.0)
        arenas.settle(c)
        seen.update(p - p % arenas.arena_bytes for p in places or [] if p is not None)
    assert torch.equal(batch, torch.ones(2, 4))
    assert first[0] not in seen  # never handed out again while held


def test_process_batches_equal_thread_batches_when_rows_are_skipped(tmp_path):
    from tests.helpers import RATE, tone, write_audio

    # Every 5th clip is shorter than min_seconds: skipped in the workers, so the rows reserved for the chunks
    # after it are one off until they are back.
    clips = [tone(0.1 if i % 5 == 3 else 0.6, RATE, freq=200.0 + 10 * i, seed=i) for i in range(60)]
    # 64 mels x 32 frames: features large enough to travel out of band (`audioloader.workers.wire.INLINE_BYTES`)
    features = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.5, n_fft=256, hop_length=128, n_mels=64)
    write_audio(tmp_path / "part-00000.arrow", clips)

    def loader(kind):
        return al.AudioLoader(al.Source(tmp_path, label_column=None), features=features, batch_size=4, seed=3,
                              length=al.LengthPolicy(min_seconds=0.2),
                              shuffle=al.Shuffle(buffer_size=16, min_size=8, before_decode=True),
                              workers=al.Workers(num_workers=2, kind=kind))

    with loader("thread") as threads:
        expected = take(threads, 40)
    with loader("process") as processes:
        got = take(processes, 40)
        assert processes.stats()["counters"]["skipped_rows"] > 0
    assert_same_batches(got, expected)


_HEAP_SCRIPT = """
import resource, sys
import numpy as np
from audioloader.workers import memory

def faults():
    # One sample's temporaries, as a decode makes them: the decoded window, the resampled clip,
    # the complex STFT, the power spectrogram, the log-mel.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        a, b = np.ones(230000, np.float32), np.ones(160000, np.float32)
        c, d = np.ones(513 * 501 * 2, np.float32), np.ones(513 * 501, np.float32)
        del a, c
        e = np.ones(128 * 501, np.float32)
        del b, d, e
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[1] == "keep" and not memory.keep_heap_pages():
    print("unsupported")
    sys.exit()
faults()  # the heap grows to one sample's size
print(faults())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_worker_heap_keeps_its_pages_from_one_sample_to_the_next():
    """Issue 37: with glibc's default thresholds every sample's temporaries land on fresh pages (a fault and a
    zeroed page each); a decode worker fixes them (`memory.keep_heap_pages`) and faults no more."""
    def run(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, mode], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent.parent).stdout.strip()

    kept = run("keep")
    if kept == "unsupported":
        pytest.skip("not glibc")
    assert int(run("plain")) > 5000  # ~1,000 faults a sample
    assert int(kept) < 100
