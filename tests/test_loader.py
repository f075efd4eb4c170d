"""audioloader.Loader: the torchdata 0.11 Loader bugs it fixes, with plain torchdata nodes."""

from __future__ import annotations

import threading

import pytest
from torchdata.nodes import BaseNode, Batcher, IterableWrapper, ParallelMapper

from audioloader.loader import Loader
from audioloader.nodes.catch_failures import CatchFailures
from audioloader.nodes.prefetcher import Prefetcher


def build(n=40, workers=2):
    node = ParallelMapper(IterableWrapper(range(n)), map_fn=lambda x: x * x, num_workers=workers, method="thread")
    node = Batcher(node, batch_size=4, drop_last=False)
    return Loader(Prefetcher(CatchFailures(node), prefetch_factor=2))


def test_resume_continues_exactly():
    ref = list(build())
    loader = build()
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    loader.shutdown()
    resumed = build()
    resumed.load_state_dict(state)
    assert head + list(resumed) == ref
    assert list(resumed) == ref  # the next epoch starts again from the beginning


def test_load_after_state_dict_is_not_ignored():
    ref = list(build())
    loader = build()
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    loader.shutdown()
    fresh = build()
    fresh.state_dict()  # a checkpoint manager probing the state first (torchdata #1548)
    fresh.load_state_dict(state)
    assert head + list(fresh) == ref
    fresh.shutdown()


def test_num_yielded_is_right_after_resume():
    loader = build()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["num_yielded"] == 3
    loader.shutdown()
    resumed = build()
    resumed.load_state_dict(state)
    it = iter(resumed)
    next(it)
    assert resumed.state_dict()["num_yielded"] == 4
    resumed.shutdown()


class Boom(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class FailingSource(BaseNode):
    """Yields 0..fail_at-1, then raises Boom (a custom exception with an extra attribute)."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at = fail_at

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.i = 0

    def next(self):
        if self.i == self.fail_at:
            raise Boom("source broke", code=42)
        self.i += 1
        return self.i - 1

    def get_state(self):
        return {"i": self.i}


def raise_in_source_of_node():
    raise Boom("inner", code=1)


def test_source_exception_keeps_type_attributes_and_traceback_and_does_not_hang():
    loader = Loader(Prefetcher(CatchFailures(FailingSource(fail_at=3)), prefetch_factor=2))
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Boom) as info:
        next(it)
    assert info.value.code == 42
    frames = [entry.name for entry in info.traceback]
    assert "next" in frames  # the traceback reaches into FailingSource.next
    with pytest.raises(StopIteration):
        next(it)  # ends instead of hanging (torchdata 0.11 hangs here)
    again = iter(loader)  # iterating again restarts the chain from the beginning
    assert [next(again) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Boom):
        next(again)
    loader.shutdown()


def test_dropping_a_loader_stops_its_threads_without_gc():
    import gc

    gc.disable()
    try:
        before = threading.active_count()
        for _ in range(5):
            loader = build(n=400)
            it = iter(loader)
            next(it)
            del it, loader
        assert threading.active_count() == before
    finally:
        gc.enable()


def test_context_manager_stops_threads():
    before = threading.active_count()
    with build(n=400) as loader:
        next(iter(loader))
        assert threading.active_count() > before
    assert threading.active_count() == before


def test_a_thread_that_does_not_stop_is_reported_with_its_stack():
    # Stopping waits for every thread without a deadline (giving up would leak it); one that
    # does not stop must at least say which it is and where it waits.
    import warnings

    from audioloader.workers.threads import join_or_report

    release = threading.Event()

    def waiting_for_release():
        release.wait()

    thread = threading.Thread(target=waiting_for_release, name="audioloader-stuck")
    thread.start()
    shown: list[str] = []

    def show(message, *args, **kwargs):
        shown.append(str(message))
        release.set()  # the report came: now let the thread end, and the join return

    # The join runs in a helper with a deadline, so a join that never reports fails instead of hanging.
    joiner = threading.Thread(target=join_or_report, args=(thread,), kwargs={"warn_after": 0.01})
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            joiner.start()
            joiner.join(30)
        finally:
            release.set()
    joiner.join()
    assert not thread.is_alive()
    assert len(shown) == 1
    assert "'audioloader-stuck' has not stopped" in shown[0] and "waiting_for_release" in shown[0]


def test_a_thread_that_stops_is_joined_without_a_report():
    import warnings

    from audioloader.workers.threads import join_or_report

    thread = threading.Thread(target=lambda: None)
    thread.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        join_or_report(thread, warn_after=30.0)
    assert not thread.is_alive()
