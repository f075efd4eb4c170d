"""CUDA and worker processes, on the CPU: a process that has initialised CUDA is never forked for workers (a
forked worker that touches CUDA aborts with SIGABRT), and code in a worker that would initialise CUDA gets a clear
error. ``torch.cuda.is_initialized`` returning True stands in for a model already moved to the GPU."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest
import torch

import audioloader as al
from audioloader.nodes.parallel_map import ParallelMap
from audioloader.stats import LoaderStats
from audioloader.workers import cuda
from audioloader.workers.pool import CudaInWorkerError, WorkerError, start_method_and_reason
from tests.helpers import SMALL, assert_same_batches, take
from tests.test_parallel_map import Items, drain, tensor_of

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is chosen on Linux only")


@pytest.fixture
def cuda_initialised(monkeypatch):
    """This process has initialised CUDA, as far as audioloader can tell (torch's own flag)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)


@pytest.fixture
def no_cuda_here(monkeypatch):
    """This process has not used CUDA (also on a GPU machine whose earlier tests did)."""
    monkeypatch.setattr(cuda, "fork_unsafe_reason", lambda: None)


def reference_workers() -> dict:
    """The workers whose results the fork server's must equal: forked ones, or threads in a test process that has
    really used CUDA (on a GPU machine; a fork from it is what crashed)."""
    if cuda.fork_unsafe_reason() is None:
        return {"backend": "process", "start_method": "fork"}
    return {"backend": "thread"}


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def worker_parents(node: ParallelMap) -> set[int]:
    return {parent_pid(worker.process.pid) for worker in node._pool._workers}


def cuda_tensor_in_augment(wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A user augmentation that does its work on the GPU (which belongs in the main process)."""
    return (torch.from_numpy(wave.copy()).to("cuda") * 0.5).cpu().numpy()


def cuda_probe(i: int) -> dict:
    """What CUDA looks like from inside a worker process, and what touching it does."""
    try:
        torch.zeros(1, device="cuda")
        error = None
    except Exception as caught:
        error = f"{type(caught).__name__}: {caught}"
    return {"available": torch.cuda.is_available(), "error": error, "marked": os.environ.get(cuda.IN_WORKER_ENV)}


# ---------------------------------------------------------------------------------------- the start method


@linux_only
def test_with_cuda_initialised_workers_start_from_the_fork_server(cuda_initialised):
    method, reason = start_method_and_reason(None)
    assert method == "forkserver" and "CUDA is initialised" in reason


@linux_only
def test_without_cuda_the_only_thread_forks(no_cuda_here):
    if threading.active_count() > 1:
        pytest.skip("another Python thread runs in this test process")
    assert start_method_and_reason(None) == ("fork", "the only Python thread and no CUDA in this process")


def test_a_fork_asked_for_becomes_a_fork_server_when_cuda_is_initialised(cuda_initialised):
    method, reason = start_method_and_reason("fork")
    assert method == "forkserver" and "start_method='fork'" in reason and "CUDA is initialised" in reason
    assert start_method_and_reason("spawn") == ("spawn", "Workers(start_method=...)")


def test_the_cuda_driver_in_the_process_also_rules_out_a_fork(monkeypatch):
    monkeypatch.setattr(cuda, "_cuda_driver_loaded", lambda: True)
    assert "CUDA driver is loaded" in cuda.fork_unsafe_reason()
    monkeypatch.setattr(cuda, "_cuda_driver_loaded", lambda: False)
    assert cuda.fork_unsafe_reason() is None or torch.cuda.is_initialized()


@linux_only
def test_workers_are_not_forked_from_a_process_with_cuda_and_give_the_same_results(monkeypatch):
    forked = drain(ParallelMap.of(Items(9), tensor_of, num_workers=2, **reference_workers()))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    stats = LoaderStats()
    node = ParallelMap.of(Items(9), tensor_of, num_workers=2, backend="process", stats=stats, what="decode worker")
    node.reset()
    try:
        assert os.getpid() not in worker_parents(node)  # started by the fork server, not forked from here
        got = [next(node) for _ in range(9)]
    finally:
        node.shutdown()
    report = stats.snapshot()["workers"]
    assert report["kind"] == "process" and report["num_workers"] == 2
    assert report["start_method"] == "forkserver" and "CUDA is initialised" in report["start_method_reason"]
    assert [r["i"] for r in got] == [r["i"] for r in forked] == list(range(9))
    for a, b in zip(got, forked, strict=True):
        assert torch.equal(a["data"], b["data"]) and np.array_equal(a["small"], b["small"])


def test_an_explicit_fork_is_refused_with_a_warning_when_cuda_is_initialised(cuda_initialised):
    node = ParallelMap.of(Items(4), tensor_of, num_workers=1, backend="process", start_method="fork")
    with pytest.warns(RuntimeWarning, match="start with 'forkserver'.*CUDA is initialised"):
        node.reset()
    try:
        assert node._pool.method_used == "forkserver"
        assert [next(node)["i"] for _ in range(4)] == [0, 1, 2, 3]
    finally:
        node.shutdown()


# ---------------------------------------------------------------------------------------- the loader


@pytest.fixture(scope="module")
def shards(shard_folder):
    return shard_folder([10, 7], batch_rows=4, seconds=0.4)


def loader(shards, *, train: bool, augment=None, workers: al.Workers | None = None) -> al.AudioLoader:
    options = {"shuffle": al.Shuffle(buffer_size=8, min_size=4)} if train else {}
    return al.AudioLoader(shards, batch_size=4, features=SMALL, seed=2, train=train, augment=augment,
                          workers=workers or al.Workers(num_workers=2, kind="process"),
                          storage=al.Storage(split_rows=4), **options)


@linux_only
@pytest.mark.parametrize("train", [True, False])
def test_a_loader_built_after_cuda_was_initialised_gives_the_forked_batches(shards, monkeypatch, train):
    # The order of tests/test_augment.py's CUDA tests (and of training scripts): CUDA is initialised in this
    # process, then loaders with worker processes are built and iterated. On a GPU a forked worker aborted.
    reference = reference_workers()
    workers = al.Workers(num_workers=2, kind=reference["backend"], start_method=reference.get("start_method"))
    with loader(shards, train=train, workers=workers) as forked:
        expected = take(forked, 4) if train else list(forked)
        assert forked.stats()["workers"].get("start_method") == reference.get("start_method")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with loader(shards, train=train) as safe:
        got = take(safe, 4) if train else list(safe)
        workers = safe.stats()["workers"]
    assert workers["start_method"] == "forkserver" and "CUDA is initialised" in workers["start_method_reason"]
    assert_same_batches(got, expected)


def test_an_augmentation_that_uses_cuda_in_a_worker_gets_a_clear_error(shards):
    with (loader(shards, train=False, augment=cuda_tensor_in_augment) as workers,
          pytest.raises(CudaInWorkerError, match=r"decode worker.*device='cuda'") as caught):
        next(iter(workers))
    assert isinstance(caught.value, WorkerError)
    assert "cuda_tensor_in_augment" in "".join(_frames(caught.value))  # the worker's traceback came along


def _frames(error: BaseException) -> list[str]:
    import traceback

    return traceback.format_tb(error.__traceback__)


def test_the_same_augmentation_in_threads_is_left_alone(shards):
    # Threads share the main process's CUDA: no refusal there. On a GPU the batches come; here torch's own error.
    with loader(shards, train=False, augment=cuda_tensor_in_augment,
                workers=al.Workers(num_workers=2, kind="thread")) as threads:
        try:
            assert len(next(iter(threads))["index"]) == 4
        except CudaInWorkerError:
            raise
        except Exception:
            assert not torch.cuda.is_available()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_inside_a_worker_cuda_is_out_of_sight_and_refused(no_cuda_here, method):
    seen = drain(ParallelMap.of(Items(2), cuda_probe, num_workers=1, backend="process", start_method=method,
                             what="decode worker"))
    for probe in seen:
        assert probe["available"] is False and probe["marked"] == "1"
        assert probe["error"].startswith("CudaInWorkerError: audioloader: code running in a decode worker process")
    assert os.environ.get(cuda.IN_WORKER_ENV) is None  # the consumer is not marked
