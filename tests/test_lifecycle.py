"""Iterators like a DataLoader's, the trained position for prefetching consumers, fork safety, shutdown."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import audioloader as al
from audioloader.workers.pool import WorkerError
from tests.helpers import assert_same_batches, loader_for, roundtrip, take

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- iter() as often as liked


def test_a_dropped_or_never_used_iterator_holds_nothing(ipc_shards):
    with loader_for(ipc_shards) as reference:
        expected = take(reference, 2)
    with loader_for(ipc_shards) as loader:
        it = iter(loader)  # Lightning probes iter(dataloader) and drops it
        del it
        gc.collect()
        iter(loader)  # never used, still referenced
        assert_same_batches(take(loader, 2), expected)


def test_a_new_iterator_supersedes_the_old_one(ipc_shards):
    with loader_for(ipc_shards) as loader:
        first = iter(loader)
        next(first)
        second = iter(loader)
        next(second)
        with pytest.raises(RuntimeError, match="superseded: iter\\(loader\\) was called again"):
            next(first)
        next(second)  # the newest one goes on


def test_a_second_iter_of_a_train_loader_continues_where_the_state_says(ipc_shards):
    with loader_for(ipc_shards) as reference:
        expected = take(reference, 7)
    with loader_for(ipc_shards) as loader:
        head = take(loader, 2)
        state = roundtrip(loader.state_dict())
        middle = take(loader, 2)  # a new iterator: goes on with batch 3, the running chain untouched
        loader.shutdown()
        tail = take(loader, 3)  # after a shutdown: restarted from the state, exactly
    assert_same_batches(head + middle + tail, expected)
    with loader_for(ipc_shards) as resumed:
        resumed.load_state_dict(state)
        assert_same_batches(take(resumed, 5), expected[2:])


def test_a_second_iter_of_an_eval_loader_starts_the_pass_again(ipc_shards):
    with loader_for(ipc_shards, train=False) as loader:
        whole = list(loader)
        take(loader, 2)  # abandoned mid-pass
        assert_same_batches(list(loader), whole)


def test_two_threads_at_once_get_a_clear_error(ipc_shards):
    with loader_for(ipc_shards) as loader:
        it = iter(loader)
        next(it)
        entered, release = threading.Event(), threading.Event()
        stream = loader._stream
        inner = stream._it

        class Held:  # the chain's iterator, held inside next() until released
            def __next__(self):
                entered.set()
                release.wait()
                return next(inner)

        stream._it = Held()
        got = []
        other = threading.Thread(target=lambda: got.append(next(it)))
        other.start()
        entered.wait()
        try:
            with pytest.raises(RuntimeError, match="being iterated in another thread"):
                next(it)
            with pytest.raises(RuntimeError, match="being iterated in another thread"):
                next(iter(loader))
        finally:
            release.set()
            other.join()
        assert len(got) == 1


# ------------------------------------------------------------------------------------------- the trained position


def test_state_after_the_last_batch_marked_trained(ipc_shards):
    with loader_for(ipc_shards) as reference:
        expected = take(reference, 9)
    with loader_for(ipc_shards) as loader:
        it = iter(loader)
        states = []
        for _ in range(6):
            next(it)
            states.append(roundtrip(loader.state_dict()))  # after batch 1, 2, ... (no marking yet: the latest)
        loader.mark_trained(2)
        assert loader.state_dict() == states[1]  # the chain's snapshots are kept as they were
        loader.mark_trained()
        state = roundtrip(loader.state_dict())
        assert state == states[2]
        with pytest.raises(ValueError, match="only 3 batch\\(es\\) were handed out"):
            loader.mark_trained(4)
    with loader_for(ipc_shards) as resumed:
        resumed.load_state_dict(state)
        assert_same_batches(take(resumed, 6), expected[3:])


def test_a_prefetching_consumer_resumes_exactly_with_mark_trained(ipc_shards):
    def consume(loader, steps, on_checkpoint=None):
        """Lightning's fetcher: batch k+1 is taken before batch k is trained on; marked after training."""
        it, trained = iter(loader), []
        ahead = next(it)
        for step in range(steps):
            batch, ahead = ahead, next(it)
            trained.append(batch)
            loader.mark_trained()
            if on_checkpoint is not None and step == 2:
                on_checkpoint(roundtrip(loader.state_dict()))
        return trained

    saved = []
    with loader_for(ipc_shards) as loader:
        whole = consume(loader, 8, saved.append)
        # A new iterator goes on with the batch taken ahead but not trained (as the state says).
        assert_same_batches(take(loader, 1), take_after(ipc_shards, 8))
    with loader_for(ipc_shards) as resumed:
        resumed.load_state_dict(saved[0])
        assert_same_batches(consume(resumed, 5), whole[3:])


def test_a_consumer_cycling_a_one_pass_loader_resumes_exactly(ipc_shards):
    # Lightning's CombinedLoader("max_size_cycle") iterates a shorter loader again when it ends, and its
    # fetcher takes a batch ahead: the batch ahead of the last one of a pass is the next pass's first.
    def cycle(loader):
        it = iter(loader)
        while True:
            try:
                yield next(it)
            except StopIteration:
                it = iter(loader)  # the next pass

    def consume(loader, steps, saved=None):
        source, trained = cycle(loader), []
        ahead = next(source)
        for _ in range(steps):
            batch, ahead = ahead, next(source)
            trained.append(batch)
            loader.mark_trained()
            if saved is not None:
                saved.append(roundtrip(loader.state_dict()))
        return trained

    saved = []
    with loader_for(ipc_shards, infinite=False) as loader:  # shuffled passes of 5 batches
        whole = consume(loader, 9, saved)
    for step in (3, 4, 5):  # inside pass 0, after its last batch (one of pass 1 ahead), inside pass 1
        with loader_for(ipc_shards, infinite=False) as resumed:
            resumed.load_state_dict(saved[step])
            assert_same_batches(consume(resumed, 3), whole[step + 1:step + 4])


def take_after(shards, n):
    with loader_for(shards) as loader:
        return take(loader, n + 1)[n:]


# ------------------------------------------------------------------------------------------- fork and shutdown


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_exiting_leaves_the_parents_workers_alone(ipc_shards):
    script = textwrap.dedent(f"""
        import os, sys
        import audioloader as al
        from tests.helpers import assert_same_batches, loader_for, take
        with loader_for({str(ipc_shards)!r}, workers=al.Workers(kind="process")) as reference:
            expected = take(reference, 12)
        loader = loader_for({str(ipc_shards)!r}, workers=al.Workers(kind="process"))
        it = iter(loader)
        first = next(it)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # never touches the loader; its exit runs multiprocessing's exit hook
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert_same_batches([first, *[next(it) for _ in range(11)]], expected)
        loader.shutdown()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr[-3000:]


def test_shutdown_is_safe_in_every_state(ipc_shards):
    loader = loader_for(ipc_shards)
    loader.shutdown()  # never started
    loader.shutdown()  # twice
    with loader:
        take(loader, 1)
    loader.shutdown()  # after the with block stopped it


def _decode_workers():
    return [p for p in multiprocessing.active_children() if p.name.startswith("audioloader-")]


def test_shutdown_after_a_killed_worker_shows_the_worker_error(ipc_shards):
    loader = loader_for(ipc_shards, workers=al.Workers(kind="process"))
    with pytest.raises(WorkerError, match="SIGKILL") as info, loader:
        it = iter(loader)
        next(it)
        workers = _decode_workers()
        assert workers
        for worker in workers:
            os.kill(worker.pid, signal.SIGKILL)
        # shutdown() on leaving the block once raised AttributeError ('Prefetcher' object has no attribute
        # '_it') in place of this error.
        for _ in range(100):  # the batches already decoded come first
            next(it)
    assert not getattr(info.value, "__notes__", None)  # the with block's shutdown() went through
    loader.shutdown()  # and again, outside


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_a_new_iterator_after_a_killed_worker_restarts_with_fresh_workers(shard_folder, train):
    # A new iter() after the error starts new workers (it raised the old WorkerError again until shutdown()): in
    # training right after the last batch handed out, nothing lost or repeated; in evaluation the pass anew.
    # 160 rows: after two batches of an evaluation pass more rows are left than the chain holds in flight, so the
    # workers are always still needed when they are killed (with 40, the pass could be decoded by then).
    ipc_shards = shard_folder([13, 9, 18] * 4)
    workers = al.Workers(kind="process", num_workers=2)
    with loader_for(ipc_shards, train=train, workers=workers) as reference:
        expected = take(reference, 12) if train else list(reference)
    with loader_for(ipc_shards, train=train, workers=workers) as loader:
        it = iter(loader)
        got = [next(it), next(it)]
        killed = {worker.pid for worker in _decode_workers()}
        assert len(killed) == 2
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="SIGKILL"):
            for _ in range(100):
                got.append(next(it))  # the batches decoded before the kill, then the error
        again = iter(loader)
        if train:
            assert_same_batches(got + [next(again) for _ in range(12 - len(got))], expected)
        else:
            assert_same_batches(list(again), expected)
        fresh = {worker.pid for worker in _decode_workers()}
        assert len(fresh) == 2 and not fresh & killed
