"""Speech batches that keep every GPU busy (issue 34): cost-aware and token budgets, 2-D buckets, a batch size per
bucket found by an out-of-memory search, ranks in step, the largest batch first; exact and resumable."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import audioloader as al
from audioloader.nodes.bucket_rules import BucketLimits, BucketSchedule, plan
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    encode,
    loader_factory,
    roundtrip,
    tone,
    write_ipc_file,
)

RATE = 8000
N = 96
SECONDS = [round(float(s), 3) for s in np.random.default_rng(34).uniform(0.3, 3.0, N)]
# About 3 tokens a second, every 8th transcript five times as dense (a dense outlier pads a batch of sparse ones).
TOKENS = [max(1, round(3 * s * (5 if i % 8 == 0 else 1))) for i, s in enumerate(SECONDS)]
FEATURES = al.FbankConfig(sample_rate=RATE, num_mel_bins=16)
WHOLE = al.LengthPolicy(crop=None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """`N` WAV utterances of 0.3-3 s at 8 kHz with ``duration``, ``tokens`` and ``text``, in two files."""
    folder = tmp_path_factory.mktemp("batching")
    audio = [{"bytes": encode(tone(s, RATE, freq=100.0 + 5 * i, seed=i), RATE), "path": f"u{i}.wav"}
             for i, s in enumerate(SECONDS)]
    table = pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "text": pa.array([f"utterance {i}" for i in range(N)]),
                      "duration": pa.array(SECONDS, pa.float64()), "tokens": pa.array(TOKENS, pa.int64())})
    write_ipc_file(folder / "a.arrow", table.slice(0, 50), batch_rows=8)
    write_ipc_file(folder / "b.arrow", table.slice(50), batch_rows=8)
    return folder


_loader = loader_factory(features=FEATURES, length=WHOLE, seed=11, columns=["text"], batch_size=4,
                         storage=al.Storage(split_rows=8), workers=al.Workers(num_workers=0),
                         train_options={"shuffle": al.Shuffle(buffer_size=24, min_size=12)})


def loader(folder, **kwargs) -> al.AudioLoader:
    return _loader(al.Source(folder, label_column=None), **kwargs)


def rows_of(batch) -> list[int]:
    index = batch["index"]
    return index[batch["valid"]].tolist() if "valid" in batch else index.tolist()


def take(it, n) -> list[dict]:
    return [next(it) for _ in range(n)]


TOKEN_BUCKETING = al.Bucketing(max_duration=6.0, quadratic_duration=3.0, max_tokens=24, token_column="tokens",
                               num_buckets=3, token_buckets=2)


# ---------------------------------------------------------------------------------------- budgets and 2-D buckets


def test_every_batch_respects_the_quadratic_and_the_token_budget(corpus):
    with loader(corpus, train=False, batching=TOKEN_BUCKETING) as evaluation:
        batches = list(evaluation)
    seen = [i for b in batches for i in rows_of(b)]
    assert sorted(seen) == list(range(N))  # every utterance once
    for b in batches:
        rows = rows_of(b)
        cost = sum(SECONDS[i] + SECONDS[i] ** 2 / 3.0 for i in rows)
        assert len(rows) == 1 or (cost <= 6.0 and sum(TOKENS[i] for i in rows) <= 24), rows
    # The quadratic cost makes long utterances count more: the longest batches hold fewer rows than plain seconds.
    linear = al.Bucketing(max_duration=6.0, num_buckets=3)
    with loader(corpus, train=False, batching=linear) as plain:
        assert len(batches) > len(list(plain))


def test_2d_buckets_keep_dense_transcripts_apart_and_stats_show_the_grid(corpus):
    with loader(corpus, train=False, batching=TOKEN_BUCKETING) as evaluation:
        batches = list(evaluation)
        report = evaluation.stats()["bucketing"]
    grid = report["token_boundaries"]
    assert len(grid) == len(report["boundaries"]) + 1 and {len(row) for row in grid} == {1}
    assert len(report["shares"]) == 2 * len(grid) and sum(report["shares"]) == pytest.approx(1.0)
    limits = BucketLimits(6.0, tuple(report["boundaries"]), token_boundaries=tuple(map(tuple, grid)))
    for b in batches:
        assert len({limits.bucket_of(SECONDS[i], TOKENS[i]) for i in rows_of(b)}) == 1  # one bucket a batch
    assert "tokens" not in batches[0]  # read for the budget, not added to the batch (not in columns=)
    # The transcripts a text decoder pads: real tokens / (rows x longest), against buckets by duration alone.
    efficiency = {}
    for per_duration in (1, 2):
        grid = al.Bucketing(max_duration=6.0, token_column="tokens", num_buckets=3, token_buckets=per_duration)
        with loader(corpus, train=False, batching=grid) as evaluation:
            efficiency[per_duration] = token_efficiency(list(evaluation))
    assert efficiency[2] > efficiency[1] + 0.1, efficiency


def token_efficiency(batches) -> float:
    real = sum(TOKENS[i] for b in batches for i in rows_of(b))
    return real / sum(len(rows_of(b)) * max(TOKENS[i] for i in rows_of(b)) for b in batches)


def test_plan_counts_what_the_node_makes_with_costs_tokens_and_sizes():
    limits = BucketLimits(5.0, (1.0, 2.0), quadratic_duration=4.0, max_tokens=15, token_column="tokens",
                          token_boundaries=((3.0,), (3.0,), (3.0,)), batch_sizes=(6, 5, 4, 3, 2, 2))
    sizes = plan(SECONDS, limits=limits, tokens=TOKENS)
    assert sum(sizes) == N
    with pytest.raises(ValueError, match="batch_sizes has 2 sizes for 6 buckets"):
        BucketLimits(5.0, (1.0, 2.0), token_boundaries=((3.0,),) * 3, batch_sizes=(1, 2))


def test_a_batch_size_per_bucket_bounds_each_buckets_batches(corpus):
    bucketing = al.Bucketing(boundaries=(1.0, 2.0), batch_sizes=(7, 4, 2))
    with loader(corpus, train=False, batching=bucketing) as evaluation:
        batches = list(evaluation)
    assert sorted(i for b in batches for i in rows_of(b)) == list(range(N))
    full = Counter()
    for b in batches:
        rows = rows_of(b)
        bucket = int(np.searchsorted([1.0, 2.0], SECONDS[rows[0]], side="right"))
        assert len(rows) <= (7, 4, 2)[bucket]
        full[bucket] += len(rows) == (7, 4, 2)[bucket]
    assert all(full[b] >= 2 for b in range(3))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_duration": 5.0, "batch_sizes": (3, 2)}, "needs the buckets fixed"),
    ({"boundaries": (1.0,), "batch_sizes": (3, 2, 1)}, "3 sizes for 2 buckets"),
    ({"max_duration": 5.0, "max_tokens": 10}, "token_column"),
    ({"quadratic_duration": 10.0, "batch_sizes": (2,), "boundaries": ()}, "give max_duration too"),
    ({}, "needs a budget"),
    ({"max_duration": 5.0, "first": "smallest"}, "Bucketing.first"),
])
def test_bad_bucketing_is_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        al.Bucketing(**kwargs)


def test_a_missing_or_non_integer_token_column_is_named(corpus):
    with pytest.raises(ValueError, match=r"no column 'n_tokens'.*--tokenizer"):
        loader(corpus, train=False, batching=al.Bucketing(max_duration=5.0, token_column="n_tokens"))
    with pytest.raises(ValueError, match="'text' has type string"):
        loader(corpus, train=False, columns=[], batching=al.Bucketing(max_duration=5.0, token_column="text"))


# ---------------------------------------------------------------------------------------- the out-of-memory search

#: The CPU stand-in for a GPU: a step runs out of memory when its padded batch (rows × longest frames) is larger.
FRAMES_BUDGET = 2400


def budget_step(batch) -> None:
    if batch["fbank"].shape[0] * batch["fbank"].shape[1] > FRAMES_BUDGET:
        raise MemoryError("over the budget")
    (batch["fbank"].sum() * 0).item()  # a forward pass that touches the batch


def test_tuned_sizes_are_within_10_percent_of_the_largest_that_fits_and_round_trip_json(corpus, tmp_path):
    bucketing = al.Bucketing(max_duration=6.0, num_buckets=4)
    calls = []

    def step(batch):
        calls.append(sorted(batch))
        budget_step(batch)

    tuned = al.tune_batch_sizes(al.Source(corpus, label_column=None), bucketing, step, columns=["text"],
                                margin=0.05, features=FEATURES, length=WHOLE)
    assert "text" in calls[0] and "lengths" in calls[0]  # probe batches hold the keys of real batches
    assert tuned.boundaries is not None and len(tuned.batch_sizes) == len(tuned.boundaries) + 1
    frames = [1 + (round(s * RATE) - 200) // 80 for s in SECONDS]  # fbank frames: 25 ms windows, 10 ms hop
    edges = (0.0, *tuned.boundaries, float("inf"))
    for b, size in enumerate(tuned.batch_sizes):
        longest = max(f for f, s in zip(frames, SECONDS, strict=True) if edges[b] < s <= edges[b + 1])
        best = FRAMES_BUDGET // longest  # the largest batch of the bucket's longest row that fits
        assert 0.9 * best <= size <= best, (b, size, best)
    path = tmp_path / "bucketing.json"
    tuned.save(path)
    assert al.Bucketing.load(path) == tuned
    assert json.loads(path.read_text())["batch_sizes"] == list(tuned.batch_sizes)
    with loader(corpus, train=False, batching=tuned) as evaluation:  # real batches of the tuned sizes fit
        for batch in evaluation:
            budget_step(batch)


def test_tuned_sizes_are_part_of_the_checkpoint(corpus):
    bucketing = al.Bucketing(boundaries=(1.0, 2.0), batch_sizes=(7, 4, 2))
    with loader(corpus, batching=bucketing) as first:
        take(iter(first), 2)
        state = roundtrip(first.state_dict())
    other = al.Bucketing(boundaries=(1.0, 2.0), batch_sizes=(7, 4, 3))
    with loader(corpus, batching=other) as resumed, \
            pytest.raises(al.CheckpointMismatchError, match=r"batching\.batch_sizes\[2\]"):
        resumed.load_state_dict(state)


def test_a_bucket_whose_one_row_does_not_fit_is_named(corpus):
    def never(batch):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(ValueError, match="bucket 0: a batch of one of its rows"):
        al.tune_batch_sizes(al.Source(corpus, label_column=None), al.Bucketing(max_duration=6.0, num_buckets=2),
                            never, features=FEATURES, length=WHOLE)


# ---------------------------------------------------------------------------------------- ranks in step


def bucket_of_batch(limits: BucketLimits, batch) -> set[int]:
    return {limits.bucket_of(SECONDS[i], TOKENS[i]) for i in rows_of(batch)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_in_step_take_every_batch_from_the_same_bucket(corpus, world_size):
    steps, seen = 30, []
    for rank in range(world_size):
        with loader(corpus, batching=TOKEN_BUCKETING, storage=al.Storage(rank=rank, world_size=world_size)) as it:
            limits = it.settings.bucket_limits
            assert limits.schedule is not None  # the default on several ranks in training
            seen.append([bucket_of_batch(limits, b) for b in take(iter(it), steps)])
            assert it.stats()["memory"]["bucketer"]["off_schedule"] == 0
    for step in range(steps):
        assert all(buckets == {limits.schedule.bucket_at(step)} for buckets in (rank[step] for rank in seen)), step
    # Without it, ranks draw buckets on their own: they differ at some step.
    apart = []
    for rank in range(world_size):
        out_of_step = al.Bucketing(**{**TOKEN_BUCKETING.__dict__, "sync_buckets": False})
        with loader(corpus, batching=out_of_step, storage=al.Storage(rank=rank, world_size=world_size)) as it:
            apart.append([bucket_of_batch(limits, b) for b in take(iter(it), steps)])
    assert any(len({frozenset(rank[step]) for rank in apart}) > 1 for step in range(steps))


def test_the_schedule_is_a_pure_function_of_seed_round_and_step_weighted_by_what_is_left():
    schedule = BucketSchedule((5, 1, 3), seed=4)
    rounds = [[schedule.bucket_at(r * 9 + k) for k in range(9)] for r in range(3)]
    stream = [bucket for order in rounds for bucket in order]
    assert all(Counter(order) == {0: 5, 1: 1, 2: 3} for order in rounds)  # each round gives each bucket its batches
    assert len({tuple(order) for order in rounds}) > 1  # rounds differ
    assert [BucketSchedule((5, 1, 3), seed=4).bucket_at(s) for s in range(27)] == stream
    assert [BucketSchedule((5, 1, 3), seed=5).bucket_at(s) for s in range(27)] != stream


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_pass_of_ranks_in_step_delivers_every_row_once_with_equal_batch_counts(corpus, world_size):
    seen, counts = [], []
    for rank in range(world_size):
        with loader(corpus, batching=TOKEN_BUCKETING, infinite=False,
                    storage=al.Storage(rank=rank, world_size=world_size)) as it:
            batches = list(it)
            assert len(batches) == len(it)
        counts.append(len(batches))
        seen += [i for b in batches for i in rows_of(b)]
        padding = [b for b in batches if not b["valid"].any()]
        assert all(len(b["valid"]) == 1 for b in padding)  # a rank that runs out pads with one-entry batches
    assert sorted(seen) == list(range(N))
    assert len(set(counts)) == 1, counts  # a pass ends on the same step on every rank: no DDP hang


def test_evaluation_with_ranks_in_step_asked_stays_exactly_once_with_equal_counts(corpus):
    bucketing = al.Bucketing(**{**TOKEN_BUCKETING.__dict__, "sync_buckets": True})
    counts, seen = [], []
    for rank in range(3):
        with loader(corpus, train=False, batching=bucketing, storage=al.Storage(rank=rank, world_size=3)) as it:
            batches = list(it)
            assert len(batches) == len(it)
        counts.append(len(batches))
        seen += [i for b in batches for i in rows_of(b)]
    assert sorted(seen) == list(range(N)) and len(set(counts)) == 1


# ---------------------------------------------------------------------------------------- the largest batch first


def padded_cost(batch) -> float:
    rows = rows_of(batch)
    return len(rows) * max(SECONDS[i] for i in rows)


def test_the_first_batch_is_the_most_expensive_and_the_rest_are_unchanged(corpus):
    sizes = al.Bucketing(boundaries=(1.0, 2.0), batch_sizes=(7, 4, 2))
    with loader(corpus, batching=sizes) as plain:
        reference = take(iter(plain), 12)
    with loader(corpus, batching=al.Bucketing(**{**sizes.__dict__, "first": "largest"})) as largest:
        batches = take(iter(largest), 13)
    assert_same_batches(batches[1:], reference)
    first, edges = batches[0], (0.0, 1.0, 2.0, float("inf"))
    # The most padded audio a bucket's batch can hold: its size x its longest utterance.
    worst = max(size * max(s for s in SECONDS if lo <= s < hi)
                for size, lo, hi in zip((7, 4, 2), edges[:-1], edges[1:], strict=True))
    assert padded_cost(first) == pytest.approx(worst)
    assert padded_cost(first) >= max(padded_cost(b) for b in reference)


# ---------------------------------------------------------------------------------------- resume, elastic resume

NEW_OPTIONS = {
    "tokens, 2-D, quadratic": TOKEN_BUCKETING,
    "sizes, largest first": al.Bucketing(boundaries=(1.0, 2.0), batch_sizes=(7, 4, 2), first="largest"),
}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", list(NEW_OPTIONS))
def test_resume_in_step_is_bit_identical_after_a_cut_at_any_step(corpus, world_size, name):
    bucketing, total = NEW_OPTIONS[name], 9
    for rank in (0, world_size - 1):
        storage = al.Storage(rank=rank, world_size=world_size)
        assert_resumes_exactly(functools.partial(loader, corpus, batching=bucketing, storage=storage), total,
                               range(1, total), workers=al.Workers(num_workers=2, kind="thread"))


@pytest.mark.parametrize("name", list(NEW_OPTIONS))
def test_batches_do_not_depend_on_the_workers(corpus, name):
    runs = []
    for workers in (al.Workers(num_workers=0), al.Workers(num_workers=2, kind="thread"),
                    al.Workers(num_workers=2, kind="process")):
        with loader(corpus, batching=NEW_OPTIONS[name], workers=workers,
                    storage=al.Storage(rank=1, world_size=2)) as it:
            runs.append(take(iter(it), 8))
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


@pytest.mark.parametrize("name", list(NEW_OPTIONS))
def test_elastic_resume_4_to_2_in_step_delivers_the_rest_once_and_exactly(corpus, name):
    bucketing = NEW_OPTIONS[name]
    options = dict(batching=bucketing, infinite=False)
    before, states = [], []
    for rank in range(4):
        with loader(corpus, storage=al.Storage(rank=rank, world_size=4), **options) as it:
            batches = take(iter(it), 3)
            before += [i for b in batches[1 if bucketing.first else 0:] for i in rows_of(b)]  # not the probe batch
            states.append(roundtrip(it.state_dict()))
    after, runs = [], []
    for rank in range(2):
        resumed = []
        for _ in range(2):  # twice: the resumed batches are a pure function of the states
            with loader(corpus, storage=al.Storage(rank=rank, world_size=2), **options) as it:
                it.load_state_dict(states)
                resumed.append(list(it))
        assert_same_batches(resumed[0], resumed[1])
        start = 1 if bucketing.first else 0  # a fresh start of the new ranks begins with the probe batch
        after += [i for b in resumed[0][start:] for i in rows_of(b)]
        runs.append(resumed[0])
    counts = Counter(before + after)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}


def test_a_checkpoint_of_several_ranks_from_before_ranks_in_step_resumes_as_it_was_taken(corpus):
    # 0.3 had no sync_buckets: its fingerprint has no such field, and its ranks were not in step.
    storage, apart = al.Storage(rank=1, world_size=2), al.Bucketing(max_duration=6.0, num_buckets=3, sync_buckets=False)
    with loader(corpus, batching=apart, storage=storage) as run:
        reference = take(iter(run), 6)
    with loader(corpus, batching=apart, storage=storage) as first:
        head = take(iter(first), 2)
        state = roundtrip(first.state_dict())
    assert "sync_buckets" not in state["fingerprint"]["batching"]  # out of step is recorded as 0.3 recorded it
    with loader(corpus, batching=al.Bucketing(max_duration=6.0, num_buckets=3), storage=storage) as resumed:
        resumed.load_state_dict(state)
        assert_same_batches(head + take(iter(resumed), 4), reference)
