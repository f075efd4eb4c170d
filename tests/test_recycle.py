"""Reused result and batch memory: never written while anything still refers to it; batches as stacked."""

from __future__ import annotations

import numpy as np
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
