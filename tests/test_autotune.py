"""Workers(num_workers="auto"): the tuner's decisions, and batches, order and checkpoints that do not depend on them."""

from __future__ import annotations

import pytest
import torch

import audioloader as al
from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
from audioloader.nodes.parallel_map import ParallelMap
from audioloader.stats import LoaderStats
from audioloader.workers import autotune
from audioloader.workers.autotune import Autotuner
from tests.helpers import SMALL, assert_same_batches, roundtrip, take
from tests.test_parallel_map import Items, slow_square, tensor_of


def loader(source, num_workers, kind="process", **kwargs) -> al.AudioLoader:
    return al.AudioLoader(source, features=SMALL, batch_size=8, seed=1, storage=al.Storage(split_rows=4),
                          shuffle=al.Shuffle(buffer_size=12, min_size=6),
                          workers=al.Workers(num_workers=num_workers, kind=kind), **kwargs)


def feed(tuner: Autotuner, clock: list[float], rate: float, wait: float, windows: int = 1) -> list[int | None]:
    """``windows`` windows of ``rate`` items/s with the consumer waiting ``wait`` of the time; the counts decided."""
    decided = []
    for _ in range(windows):
        tuner.record(round(rate * autotune.WINDOW_SECONDS), wait * autotune.WINDOW_SECONDS)
        clock[0] += autotune.WINDOW_SECONDS
        decided.append(tuner.tick(clock[0]))
    return decided


# ---------------------------------------------------------------------------------------- the tuner


def test_a_worker_is_added_while_the_consumer_waits_and_kept_while_it_pays():
    clock = [0.0]
    tuner = Autotuner(maximum=4, initial=1)
    tuner.start(clock[0])
    assert feed(tuner, clock, rate=100, wait=0.6) == [2]
    # One window settles, then the new count is judged on JUDGE_WINDOWS windows: 1.8x the rate, kept.
    assert feed(tuner, clock, rate=180, wait=0.3, windows=1 + autotune.JUDGE_WINDOWS) == [None] * 3
    assert feed(tuner, clock, rate=180, wait=0.3) == [3]
    assert tuner.count == 3
    seconds, before, after, reason = tuner.report()["autotune"][0]
    assert (before, after) == (1, 2) and seconds == pytest.approx(1.0) and "waited 60%" in reason


def test_an_added_worker_that_does_not_pay_is_retired_and_not_tried_again_for_a_while():
    clock = [0.0]
    tuner = Autotuner(maximum=4, initial=2)
    tuner.start(clock[0])
    assert feed(tuner, clock, rate=200, wait=0.5) == [3]
    assert feed(tuner, clock, rate=203, wait=0.5, windows=1 + autotune.JUDGE_WINDOWS)[-1] == 2  # the cores are used
    assert "less than 5% more" in tuner.report()["autotune"][-1][3]
    windows = int(autotune.HOLD_SECONDS / autotune.WINDOW_SECONDS) - 1
    assert set(feed(tuner, clock, rate=200, wait=0.5, windows=windows)) == {None}  # held
    assert feed(tuner, clock, rate=200, wait=0.5) == [3]  # then tried again


def test_a_worker_is_retired_while_the_consumer_does_not_wait_and_comes_back_when_it_does():
    clock = [0.0]
    tuner = Autotuner(maximum=4, initial=3)
    tuner.start(clock[0])
    decided = feed(tuner, clock, rate=50, wait=0.0, windows=autotune.IDLE_WINDOWS)
    assert decided == [None] * (autotune.IDLE_WINDOWS - 1) + [2]
    # Two workers are too few: the consumer waits, the third comes back.
    decided = feed(tuner, clock, rate=40, wait=0.3, windows=1 + autotune.JUDGE_WINDOWS)
    assert decided[-1] == 3 and tuner.count == 3
    assert [d[1:3] for d in tuner.report()["autotune"]] == [(3, 2), (2, 3)]


def test_the_count_stays_between_one_and_the_maximum():
    clock = [0.0]
    tuner = Autotuner(maximum=2, initial=5)
    assert tuner.count == 2
    tuner.start(clock[0])
    assert set(feed(tuner, clock, rate=100, wait=0.9, windows=10)) == {None}  # all working already
    low = Autotuner(maximum=2, initial=1)
    low.start(clock[0])
    assert set(feed(low, clock, rate=100, wait=0.0, windows=10)) == {None}  # never below one
    assert 1 <= autotune.initial_guess(3) <= 3


# ---------------------------------------------------------------------------------------- the pool


def test_workers_added_and_retired_mid_stream_keep_order_and_exactly_once():
    stats = LoaderStats()
    node = ParallelMap.of(Items(120), tensor_of, num_workers=3, backend="process", chunk_size=3, stats=stats)
    node.reset()
    got = []
    for count in (1, 3, 2, 1, 3):
        node.set_count(count)
        got.extend(next(node) for _ in range(20))
    got.extend(node)
    node.shutdown()
    assert [r["i"] for r in got] == list(range(120))
    assert all(torch.equal(r["data"], torch.full((300, 7), float(r["i"]))) for r in got)
    workers = stats.snapshot()["workers"]
    assert {name: workers[name] for name in ("kind", "started", "count", "autotune")} == {
        "kind": "process", "started": 3, "count": 3, "autotune": None}
    assert workers["start_method"] in {"fork", "forkserver", "spawn"} and workers["start_method_reason"]
    with pytest.raises(ValueError, match="between 1 and num_workers=3"):
        node.set_count(4)


def test_an_autotuned_pool_resumes_exactly_on_a_fixed_one():
    node = ParallelMap.of(Items(40), slow_square, num_workers="auto", backend="process", chunk_size=3)
    node.reset()
    head = [next(node) for _ in range(17)]
    state = node.state_dict()
    node.shutdown()
    fixed = ParallelMap.of(Items(40), slow_square, num_workers=1, backend="process", chunk_size=5)
    fixed.reset(state)
    assert head + list(fixed) == [i * i for i in range(40)]
    fixed.shutdown()


# ---------------------------------------------------------------------------------------- the loader


def test_auto_gives_the_batches_of_every_fixed_count(ipc_shards):
    with loader(ipc_shards, "auto") as auto:
        expected = take(auto, 6)
        workers = auto.stats()["workers"]
    assert workers["kind"] == "process" and 1 <= workers["count"] <= workers["started"]
    assert isinstance(workers["autotune"], list)
    for count in (1, 2):
        with loader(ipc_shards, count) as fixed:
            assert_same_batches(take(fixed, 6), expected)
    with loader(ipc_shards, 2, kind="thread") as threads:
        assert_same_batches(take(threads, 6), expected)


def test_a_checkpoint_taken_under_auto_resumes_exactly_and_does_not_depend_on_the_count(ipc_shards):
    with loader(ipc_shards, "auto") as auto:
        it = iter(auto)
        head = [next(it) for _ in range(3)]
        state = roundtrip(auto.state_dict())
        tail = [next(it) for _ in range(4)]
    with loader(ipc_shards, 1) as fixed:
        it = iter(fixed)
        assert_same_batches([next(it) for _ in range(3)], head)
        assert fixed.state_dict() == state
    for resumed_with in (1, "auto"):
        with loader(ipc_shards, resumed_with) as resumed:
            resumed.load_state_dict(state)
            assert_same_batches(take(resumed, 4), tail)


def test_auto_with_threads_is_the_thread_default(ipc_shards):
    with loader(ipc_shards, "auto", kind="thread") as threads:
        assert isinstance(threads.num_workers, int) and threads.num_workers >= 1
        take(threads, 1)
        assert threads.stats()["workers"]["autotune"] is None


@pytest.mark.parametrize("value", ["auto2", "AUTO", "2", 2.5, -1])
def test_a_bad_worker_count_is_refused_with_the_choices(value):
    with pytest.raises(ValueError, match=r"Workers\.num_workers=.*must be an integer >= 0"):
        al.Workers(num_workers=value)


def test_a_bad_worker_count_on_the_node_is_refused_with_the_choices(ipc_shards):
    from audioloader.nodes.arrow_shard_reader import ArrowShardReader

    with pytest.raises(ValueError, match=r"num_workers='auto2': must be an integer >= 0 .* or 'auto'"):
        DecodeSpectrogram.of(ArrowShardReader.of(str(ipc_shards)), SMALL, num_workers="auto2", worker_type="process")
