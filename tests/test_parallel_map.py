"""ParallelMap: order, exact resume across worker counts and kinds, exceptions, dead workers, clean shutdown."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torchdata.nodes import BaseNode, Loader

from audioloader.nodes.parallel_map import ParallelMap
from audioloader.stats import LoaderStats
from audioloader.workers import cuda as _cuda
from audioloader.workers import pool as _pool
from audioloader.workers.pool import ProcessPool, WorkerError

SETUPS = [(0, "thread"), (1, "thread"), (3, "thread"), (1, "process"), (2, "process")]


class Boom(Exception):
    """An exception whose constructor needs a keyword (a rebuild from a string would lose it)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


def tensor_of(i: int) -> dict:
    """A result holding a tensor (travels through shared memory) and plain values."""
    return {"i": i, "data": torch.full((300, 7), float(i)), "small": np.arange(i % 5)}


def boom_at_7(i: int) -> int:
    if i == 7:
        raise Boom("seven", code=7)
    return i * 10


def die_at_5(i: int) -> int:
    if i == 5:
        os._exit(3)
    return i


def sleep_an_hour(i: int) -> int:
    time.sleep(3600)
    return i


def slow_square(i: int) -> int:
    time.sleep(0.02)
    return i * i


class CountingJob:
    """A picklable job with its own stats: worker processes report them back."""

    def __init__(self) -> None:
        self.stats = LoaderStats()

    def __call__(self, i: int) -> int:
        self.stats.add_seconds("work", 0.5)
        return i + 1


class Items(BaseNode):
    """0..n-1 with an O(1) state; raises ``Boom`` instead of item ``fail_at``."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        super().__init__()
        self.n, self.fail_at = n, fail_at

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self):
        if self.i == self.fail_at:
            raise Boom("source failed", code=self.i)
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self):
        return {"i": self.i}


def mapper(job, n=40, num_workers=2, backend="thread", **kwargs) -> ParallelMap:
    return ParallelMap.of(Items(n), job, num_workers=num_workers, backend=backend, **kwargs)


def drain(node) -> list:
    try:
        return list(node)
    finally:
        node.shutdown()


@pytest.mark.parametrize(("num_workers", "backend"), SETUPS)
def test_results_in_source_order_with_tensors_intact(num_workers, backend):
    got = drain(mapper(tensor_of, 30, num_workers, backend, chunk_size=4))
    assert [r["i"] for r in got] == list(range(30))
    for r in got:
        assert torch.equal(r["data"], torch.full((300, 7), float(r["i"])))
        assert np.array_equal(r["small"], np.arange(r["i"] % 5))


def test_results_are_private_copies_that_outlive_the_slot():
    node = mapper(tensor_of, 40, 2, "process", chunk_size=3, depth=1)
    kept = [next(node) for _ in range(40)]  # every slot was rewritten many times since the first
    node.shutdown()
    assert all(torch.equal(r["data"], torch.full((300, 7), float(r["i"]))) for r in kept)
    kept[0]["data"].add_(1)  # writable, and not shared with anything else
    assert kept[1]["data"][0, 0] == 1.0


# Saved with no worker and with 2 processes in the default run (each resumed with other setups); the other three
# (about 4 s each on a 2-core machine) with `-m slow`.
@pytest.mark.parametrize("saved_with", [setup if setup in (SETUPS[0], SETUPS[-1]) else
                                        pytest.param(setup, marks=pytest.mark.slow) for setup in SETUPS])
def test_resume_is_exact_at_random_cuts_for_any_workers(saved_with):
    rng = random.Random(SETUPS.index(saved_with))
    for cut in sorted(rng.sample(range(1, 40), 4)):
        node = mapper(slow_square, 40, *saved_with, chunk_size=3)
        head = [next(node) for _ in range(cut)]
        state = node.state_dict()
        node.shutdown()
        resumed_with = rng.choice(SETUPS)
        other = mapper(slow_square, 40, *resumed_with, chunk_size=rng.choice([1, 2, 5]))
        other.reset(state)
        assert head + drain(other) == [i * i for i in range(40)], (cut, resumed_with)


def test_resume_skips_items_instead_of_mapping_them_again():
    calls = []

    def record(i):
        calls.append(i)
        return i

    node = ParallelMap.of(Items(20), record, num_workers=0)
    [next(node) for _ in range(7)]
    state = node.state_dict()
    calls.clear()
    again = ParallelMap.of(Items(20), record, num_workers=0)
    again.reset(state)
    assert list(again) == list(range(7, 20))
    assert calls == list(range(7, 20))


def test_accepts_torchdata_parallel_mapper_states():
    assert drain_from({"it_state": {"snapshot": {"i": 5}, "steps_since_snapshot": 2}}) == list(range(7, 12))
    assert drain_from({"it_state": {"source": {"i": 9}}}) == [9, 10, 11]


def drain_from(state) -> list:
    node = ParallelMap.of(Items(12), int, num_workers=2)
    node.reset(state)
    return drain(node)


@pytest.mark.parametrize(("num_workers", "backend"), SETUPS)
def test_job_exception_is_raised_in_place_then_iteration_goes_on(num_workers, backend):
    node = mapper(boom_at_7, 12, num_workers, backend)
    seen = [next(node) for _ in range(7)]
    with pytest.raises(Boom) as info:
        next(node)
    assert info.value.code == 7
    assert "boom_at_7" in [entry.name for entry in info.traceback]  # the worker's frames, even from a process
    seen += drain(node)
    assert seen == [i * 10 for i in range(12) if i != 7]


@pytest.mark.parametrize(("num_workers", "backend"), SETUPS)
def test_source_exception_comes_after_earlier_items_then_the_node_ends(num_workers, backend):
    node = ParallelMap.of(Items(20, fail_at=6), slow_square, num_workers=num_workers, backend=backend)
    assert [next(node) for _ in range(6)] == [i * i for i in range(6)]
    with pytest.raises(Boom) as info:
        next(node)
    assert info.value.code == 6
    with pytest.raises(StopIteration):
        next(node)
    node.shutdown()


def test_a_dead_worker_process_is_reported_not_waited_for():
    node = mapper(die_at_5, 20, 2, "process", chunk_size=2)
    assert [next(node) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(WorkerError, match=r"exited with code 3.*working on 2 items"):
        next(node)
    node.shutdown()


def test_unpicklable_job_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="importable"):
        mapper(lambda i: i, 4, 2, "process")


def test_worker_stats_reach_the_consumer():
    stats = LoaderStats()
    drain(ParallelMap.of(Items(6), CountingJob(), num_workers=2, backend="process", chunk_size=2, stats=stats))
    assert stats.snapshot()["seconds"]["work"] == pytest.approx(3.0)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_map_all_keeps_the_stream_intact(backend):
    node = mapper(slow_square, 30, 2, backend, chunk_size=2)
    head = [next(node) for _ in range(5)]
    assert node.map_all(list(range(100, 111))) == [i * i for i in range(100, 111)]
    assert head + drain(node) == [i * i for i in range(30)]


class Epochs(Items):
    """``(epoch, i)`` for i < n; every reset without a state starts the next epoch (1, 2, ...)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.epoch = 0

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.epoch += 1

    def next(self):
        return self.epoch, super().next()


GATE = threading.Event()
STARTED: list[tuple[int, int]] = []


def gated_square(item: tuple[int, int]) -> int:
    """Records each item it starts; items of epoch 1 past the first chunk of 20 wait for `GATE`."""
    epoch, i = item
    STARTED.append(item)
    if epoch == 1 and i >= 20:
        GATE.wait()
    return i * i


class LoggedSlowSquare:
    """Records each item it starts in a file (from any process); items of epoch 1 past the first chunk take 0.25 s."""

    def __init__(self, log: Path) -> None:
        self.log = str(log)

    def __call__(self, item: tuple[int, int]) -> int:
        epoch, i = item
        with open(self.log, "a") as fh:
            fh.write(f"{epoch} {i}\n")
        if epoch == 1 and i >= 20:
            time.sleep(0.25)  # the work
        return i * i

    def started(self, epoch: int) -> list[int]:
        with open(self.log) as fh:
            return [int(i) for e, i in (line.split() for line in fh) if int(e) == epoch]


def test_reset_mid_stream_stops_thread_chunks_after_their_current_item():
    GATE.clear()
    STARTED.clear()
    node = ParallelMap.of(Epochs(400), gated_square, num_workers=2, backend="thread", chunk_size=20)
    node.reset()
    assert next(node) == 0  # chunk 0 done; chunks 1-4 (80 items) are in flight, the running ones blocked
    node.reset()
    GATE.set()  # the current items finish; the rest of their chunks must not start
    assert [next(node) for _ in range(3)] == [0, 1, 4]
    node.shutdown()  # waits for the worker threads
    started_late = [i for epoch, i in STARTED if epoch == 1 and i >= 20]
    assert len(started_late) <= 2, f"items {started_late} of cancelled chunks were started (at most one per worker)"


def test_reset_mid_stream_stops_process_chunks_and_keeps_the_workers(tmp_path):
    job = LoggedSlowSquare(tmp_path / "started.log")
    node = ParallelMap.of(Epochs(400), job, num_workers=2, backend="process", chunk_size=20)
    node.reset()
    workers = [worker.process.pid for worker in node._pool._workers]
    assert next(node) == 0  # chunk 0 is done; chunks 1-4 (80 items of 0.25 s) are in flight
    node.reset()  # returns once every worker has answered for its chunks
    cancelled = job.started(epoch=1)
    assert [next(node) for _ in range(3)] == [0, 1, 4]
    assert [worker.process.pid for worker in node._pool._workers] == workers  # reset reuses the processes
    node.shutdown()
    assert job.started(epoch=1) == cancelled  # nothing of the old epoch ran after the reset returned
    # Each in-flight chunk stopped after its current item: a whole chunk of slow items (5 s) never ran.
    late = [i for i in cancelled if i >= 20]
    assert len(late) < 20, f"{len(late)} items of the cancelled chunks ran; each worker should stop after one"


def children() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


def test_shutdown_leaves_no_process_or_thread_behind():
    before_threads = set(threading.enumerate())
    before = children()
    for _ in range(3):
        node = mapper(slow_square, 50, 2, "process")
        next(node)
        node.shutdown()
        node.reset()  # starts again after a shutdown
        assert next(node) == 0
        node.shutdown()
    assert children() == before
    assert not [t for t in set(threading.enumerate()) - before_threads if t.is_alive()]


def test_forking_workers_frees_mkl_buffers_first(monkeypatch):
    if _cuda.fork_unsafe_reason() is not None:
        pytest.skip("CUDA is in use in this test process: workers are never forked from it")
    calls = []
    monkeypatch.setattr(_pool, "free_mkl_buffers", lambda: calls.append(os.getpid()) or True)
    assert drain(mapper(slow_square, 4, 2, "process", start_method="fork")) == [0, 1, 4, 9]
    assert calls == [os.getpid()]  # once, in the consumer, before its workers were forked


def test_mkl_buffers_can_be_freed_where_torch_has_mkl():
    assert _pool.free_mkl_buffers() == (torch.backends.mkl.is_available() and sys.platform.startswith("linux"))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_stuck_in_a_job_exit_when_the_consumer_is_killed(method):
    # A worker stuck in native code never reads its socket; killed with SIGKILL, the
    # consumer cannot stop it. It must not outlive the consumer as an orphan.
    script = textwrap.dedent(f"""
        import multiprocessing, time
        from tests.test_parallel_map import Items, sleep_an_hour
        from audioloader.nodes.parallel_map import ParallelMap
        node = ParallelMap.of(Items(8), sleep_an_hour, num_workers=2, backend="process", start_method={method!r})
        node.reset()
        print(*[p.pid for p in multiprocessing.active_children() if p.name.startswith("audioloader")], flush=True)
        next(node)
    """)
    consumer = subprocess.Popen([sys.executable, "-c", script], text=True,
                                stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent, start_new_session=True)
    workers = [int(pid) for pid in consumer.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    os.kill(consumer.pid, signal.SIGKILL)
    consumer.wait()
    deadline = time.monotonic() + 30  # the check runs every PARENT_CHECK_SECONDS; generous on a busy machine
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes {left} outlived their consumer"


def test_shutdown_from_another_thread_ends_a_waiting_consumer():
    node = mapper(slow_square, 10_000, 2, "process", chunk_size=50)
    next(node)
    ended = threading.Event()

    def consume():
        for _ in node:
            pass
        ended.set()

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.05)
    node.shutdown()
    thread.join(5)
    assert ended.is_set()


def test_under_a_loader_resume_across_backends():
    def build(backend):
        return Loader(ParallelMap.of(Items(25), slow_square, num_workers=2, backend=backend, chunk_size=3))

    loader = build("process")
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    state = loader.state_dict()
    loader.root.shutdown()
    resumed = build("thread")
    resumed.load_state_dict(state)
    assert head + list(resumed) == [i * i for i in range(25)]
    resumed.root.shutdown()


def test_forked_child_cannot_use_the_parents_workers():
    node = mapper(slow_square, 20, 2, "process")
    next(node)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must get an error at once, not a hang
        try:
            next(node)
            os.write(write, b"no error")
        except RuntimeError as error:
            os.write(write, b"error: " + str(error).encode()[:200])
        os._exit(0)
    os.waitpid(pid, 0)
    message = os.read(read, 300).decode()
    assert message.startswith("error:") and "build the loader in the process that iterates it" in message
    assert next(node) == 1  # the parent is unaffected
    node.shutdown()


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_every_start_method_gives_the_same_results(method):
    pool = ProcessPool(slow_square, 1, start_method=method)
    assert pool.start_method == method
    node = ParallelMap.of(Items(5), tensor_of, num_workers=2, backend="process", start_method=method)
    got = drain(node)
    assert [r["i"] for r in got] == list(range(5)) and torch.equal(got[4]["data"], torch.full((300, 7), 4.0))


def test_shutdown_while_another_thread_starts_the_workers_leaves_none_running():
    # Ctrl-C in the main thread while a background thread resets the chain (starting the decode workers): the
    # shutdown must return only once no worker runs (CI saw 2 of 2 still alive when the interrupt arrived).
    pool = ProcessPool(slow_square, 2, start_method="spawn")
    launch, launched, started = pool._launch, threading.Event(), []

    def launch_then_wait_for_the_shutdown(context, index):
        worker = launch(context, index)
        started.append(worker.process)
        launched.set()
        pool._closed.wait(30)  # the shutdown has begun; this start goes on from the middle of its work
        return worker

    pool._launch = launch_then_wait_for_the_shutdown
    outcome = []

    def start():
        try:
            pool.start()
            outcome.append("started")
        except _pool.PoolClosed:
            outcome.append("closed")

    starter = threading.Thread(target=start)
    starter.start()
    assert launched.wait(60)
    pool.shutdown()
    assert started and [p.is_alive() for p in started] == [False] * len(started)
    starter.join(60)
    assert outcome == ["closed"]
    assert not pool._workers


def test_fork_only_while_this_is_the_only_python_thread(monkeypatch):
    from audioloader.workers.pool import DEFAULT_START_METHOD, choose_start_method

    monkeypatch.setattr(_cuda, "fork_unsafe_reason", lambda: None)  # CUDA's rule: tests/test_cuda_workers.py
    if not sys.platform.startswith("linux"):
        pytest.skip("fork is chosen on Linux only")
    assert choose_start_method() == ("fork" if threading.active_count() == 1 else DEFAULT_START_METHOD)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert choose_start_method() == DEFAULT_START_METHOD
    finally:
        stop.set()
        other.join()


# A chunk message over 16 KiB (a chunk of remote rows carries their bytes) is written to the worker's socket in
# pieces. Here its first half is written, then the sender waits until another thread either writes to the socket
# (the stop message of shutdown, sent without the pool's lock: it lands inside the chunk) or asks for the pool's
# lock (the stop waits its turn). The worker then read a broken pickle and printed `UnpicklingError: invalid load
# key` (11 of 30 shutdowns of a loader on S3, issue 19); now its stream stays whole and it exits quietly.
INTERLEAVED_STOP = textwrap.dedent("""
    import os, struct, threading
    from audioloader.workers.pool import ProcessPool

    pool = ProcessPool(len, 1, start_method="fork")
    pool.start()
    worker = pool._workers[0]
    midway, resume = threading.Event(), threading.Event()
    sender = threading.Thread(target=pool.submit, args=(0, [b"x" * 40000] * 2))

    def write_all(data):
        view = memoryview(data)
        while view:
            view = view[os.write(worker.conn.fileno(), view):]

    class SplitWrites:
        def __init__(self, conn):
            self.conn = conn

        def send_bytes(self, data):
            framed = struct.pack("!i", len(data)) + data
            if threading.current_thread() is sender:
                write_all(framed[:len(framed) // 2])
                midway.set()
                assert resume.wait(60), "nobody wrote to the socket or asked for the lock"
                write_all(framed[len(framed) // 2:])
            else:
                write_all(framed)
                resume.set()

        def __getattr__(self, name):
            return getattr(self.conn, name)

    class WatchedLock:
        def __init__(self, lock):
            self.lock = lock

        def acquire(self, blocking=True, timeout=-1):
            if midway.is_set() and threading.current_thread() is not sender:
                resume.set()
            return self.lock.acquire(blocking, timeout)

        def release(self):
            self.lock.release()

        def __enter__(self):
            self.acquire()

        def __exit__(self, *exc):
            self.release()

    worker.conn = SplitWrites(worker.conn)
    pool._io_lock = WatchedLock(pool._io_lock)
    sender.start()
    midway.wait()
    pool.shutdown()
    sender.join()
    print("exit code", worker.process.exitcode)
""")


def test_a_stop_during_a_chunk_message_leaves_the_workers_stream_whole():
    result = subprocess.run([sys.executable, "-c", INTERLEAVED_STOP], cwd=Path(__file__).parent.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # The worker's traceback, if it read a broken message (it exits with code 1 then, 0 after the stop).
    assert result.stderr == "", result.stdout + result.stderr[-3000:]
