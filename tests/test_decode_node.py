"""DecodeSpectrogram: determinism across threads, bad rows, error budget, failures, threads, state."""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import traceback

import numpy as np
import pytest
import torch
from torchdata.nodes import BaseNode, IterableWrapper, Loader

import audioloader as al
from audioloader.dsp import hashing
from audioloader.dsp.audio import load_clip
from audioloader.dsp.config import MelSpectrogramConfig
from audioloader.dsp.features import log_mel
from audioloader.errors import DecodeError, ErrorBudgetExceeded
from audioloader.nodes.decode_config import DecodeConfig
from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
from audioloader.samples import BadRow, Key, RawSample, Sample
from audioloader.stats import LoaderStats
from tests.helpers import BAD_AUDIO, encode, tone

CFG = MelSpectrogramConfig(sample_rate=16000, clip_seconds=0.25, n_fft=400, hop_length=160, n_mels=40)
FORMATS = [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("WAV", "FLOAT"), ("OGG", "VORBIS")]
RATES = [16000, 22050, 44100, 8000]


def good_audio(i: int) -> bytes:
    """Row i: 0.1-0.6 s (some shorter than the 0.25 s crop), mixed formats, rates, channels."""
    rate = RATES[i % len(RATES)]
    fmt, subtype = FORMATS[(i // 2) % len(FORMATS)]
    seconds = 0.1 + 0.1 * (i % 6)
    return encode(tone(seconds, rate, freq=150.0 + 45.0 * i, channels=1 + i % 2, seed=i), rate, fmt, subtype)


_GOOD = [good_audio(i) for i in range(24)]


_DEFAULT = object()


def raw(i: int, pass_index: int = 0, audio=_DEFAULT, problem=None) -> RawSample:
    """Row i; good audio unless ``audio`` (may be None: a null) or ``problem`` is given."""
    data = (_GOOD[i % len(_GOOD)] if problem is None else None) if audio is _DEFAULT else audio
    return RawSample(Key(i, pass_index), data, i % 3, {"uid": i}, f"shard-{i // 8}.arrow", i % 8, problem)


def rows(n: int, pass_index: int = 0) -> list[RawSample]:
    return [raw(i, pass_index) for i in range(n)]


def node_over(items, **kwargs) -> DecodeSpectrogram:
    kwargs.setdefault("num_workers", 2)
    return DecodeSpectrogram.of(IterableWrapper(items), CFG, **kwargs)


def run(items, **kwargs) -> list[Sample]:
    node = node_over(items, **kwargs)
    try:
        return list(node)
    finally:
        node.shutdown()


def assert_same(a: list[Sample], b: list[Sample]) -> None:
    assert [s.key for s in a] == [s.key for s in b]
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.spectrogram, y.spectrogram), x.key


def next_within(iterator, seconds: float = 60.0):
    """``next(iterator)`` in a helper thread; fails (instead of hanging the suite) if it does not return."""
    result: dict = {}

    def call():
        try:
            result["value"] = next(iterator)
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "next() hung"
    if "error" in result:
        raise result["error"]
    return result["value"]


# ---------------------------------------------------------------------------
# output and determinism

def expected_sample(r: RawSample, *, seed: int = 0, train: bool = True) -> torch.Tensor:
    def draw(n):
        return hashing.uniform_int(n, seed, hashing.SALT_CROP, r.key.index, r.key.pass_index)

    clip = load_clip(r.audio, CFG.sample_rate, CFG.clip_samples, train=train, draw=draw, window=False)
    return log_mel(clip, CFG)


def test_output_matches_the_reference_pipeline():
    items = rows(12)
    out = run(items, num_workers=2, seed=5)
    assert [s.key for s in out] == [r.key for r in items]
    for sample, r in zip(out, items, strict=True):
        assert sample.spectrogram.shape == (CFG.n_mels, CFG.n_frames)
        assert sample.spectrogram.dtype == torch.float32
        assert (sample.label, sample.extras, sample.file, sample.row) == (r.label, r.extras, r.file, r.row)
        torch.testing.assert_close(sample.spectrogram, expected_sample(r, seed=5), rtol=1e-4, atol=1e-3)


def test_identical_for_any_num_workers():
    items = rows(24)
    base = run(items, num_workers=0)
    assert_same(base, run(items, num_workers=1))
    assert_same(base, run(items, num_workers=4))


def test_crop_depends_on_seed_and_pass_not_threads():
    long_rows = [raw(i) for i in range(24) if i % 6 >= 3]  # 0.4-0.6 s: longer than the crop
    again = [raw(r.key.index, pass_index=1) for r in long_rows]
    one, four = run(long_rows, num_workers=1), run(long_rows, num_workers=4)
    assert_same(one, four)
    next_pass = run(again, num_workers=4)
    other_seed = run(long_rows, num_workers=4, seed=1)
    differ_pass = sum(not torch.equal(a.spectrogram, b.spectrogram) for a, b in zip(one, next_pass, strict=True))
    differ_seed = sum(not torch.equal(a.spectrogram, b.spectrogram) for a, b in zip(one, other_seed, strict=True))
    assert differ_pass >= len(long_rows) - 1 and differ_seed >= len(long_rows) - 1


def test_eval_is_center_crop_whatever_the_pass():
    items = rows(12)
    a = run(items, train=False)
    b = run(rows(12, pass_index=3), train=False, seed=9)
    for x, y, r in zip(a, b, items, strict=True):
        assert torch.equal(x.spectrogram, y.spectrogram)
        torch.testing.assert_close(x.spectrogram, expected_sample(r, train=False), rtol=1e-4, atol=1e-3)


def test_augment_is_seeded_by_key():
    def add_noise(wave, rng):
        return wave + 0.01 * rng.standard_normal(len(wave)).astype(np.float32)

    items = rows(12)
    a = run(items, num_workers=0, augment=add_noise, train=False)
    assert_same(a, run(items, num_workers=4, augment=add_noise, train=False))
    plain = run(items, num_workers=2, train=False)
    other_pass = run(rows(12, pass_index=1), augment=add_noise, train=False)
    assert all(not torch.equal(x.spectrogram, y.spectrogram) for x, y in zip(a, plain, strict=True))
    assert all(not torch.equal(x.spectrogram, y.spectrogram) for x, y in zip(a, other_pass, strict=True))


def test_window_and_full_paths_agree_through_the_node():
    items = rows(24)
    windowed, full = run(items, window=True), run(items, window=False)
    for x, y in zip(windowed, full, strict=True):
        torch.testing.assert_close(x.spectrogram, y.spectrogram, rtol=1e-3, atol=2e-3)


def test_decode_many_keeps_order_and_reports_bad_rows():
    items = rows(10)
    items[4] = raw(4, audio=b"not audio at all")
    node = node_over(items, num_workers=3)
    many = node.decode_many(items)
    assert isinstance(many[4], BadRow) and many[4].key == Key(4, 0)
    for got, r in zip(many, items, strict=True):
        single = node.decode(r)
        assert type(got) is type(single) and got.key == r.key
        if isinstance(got, Sample):
            assert torch.equal(got.spectrogram, single.spectrogram)
    assert node.decode_many([]) == []


def test_stage_timings_and_counters():
    stats = LoaderStats()
    run(rows(8), stats=stats)
    snap = stats.snapshot()
    assert snap["counters"]["samples_decoded"] == 8
    assert all(snap["seconds"][stage] > 0 for stage in ("decode", "resample", "mel"))


# ---------------------------------------------------------------------------
# bad rows

@pytest.mark.parametrize("num_workers", [0, 3])
def test_every_kind_of_bad_row_is_skipped_and_reported(num_workers):
    items = rows(20)
    bad_kinds = {**{kind: data for kind, (data, _) in BAD_AUDIO.items()}, "problem": None}
    reasons = {**{kind: words for kind, (_, words) in BAD_AUDIO.items()}, "problem": "label is null"}
    bad_at = {}
    for slot, kind in enumerate(sorted(bad_kinds)):
        i = 1 + 2 * slot
        items[i] = raw(i, problem="label is null") if kind == "problem" else raw(i, audio=bad_kinds[kind])
        bad_at[i] = kind
    stats = LoaderStats()
    out = run(items, num_workers=num_workers, stats=stats, max_error_fraction=1.0)
    good = [r for r in items if r.key.index not in bad_at]
    # nothing shifted or duplicated: exactly the good rows, in order, as if the bad ones were absent
    assert_same(out, run(good, num_workers=0))
    snap = stats.snapshot()
    assert snap["counters"]["bad_rows"] == len(bad_at)
    assert snap["counters"]["samples_decoded"] == len(good)
    reported = {r["index"]: r for r in snap["bad_rows"]}
    assert set(reported) == set(bad_at)
    for i, kind in bad_at.items():
        assert reported[i]["file"] == items[i].file and reported[i]["row"] == items[i].row
        assert reported[i]["pass"] == 0
        assert reasons[kind] in reported[i]["reason"], (kind, reported[i])


@pytest.mark.parametrize("kind", [*sorted(BAD_AUDIO), "problem"])
def test_on_error_raise_names_file_row_index_reason(kind):
    items = rows(6)
    items[3] = raw(3, problem="label is null") if kind == "problem" else raw(3, audio=BAD_AUDIO[kind][0])
    node = node_over(items, on_error="raise")
    got = [next(node) for _ in range(3)]
    assert [s.key.index for s in got] == [0, 1, 2]
    with pytest.raises(DecodeError) as info:
        next_within(node)
    error = info.value
    assert (error.file, error.row, error.index) == (items[3].file, items[3].row, 3)
    assert error.reason and error.reason in str(error)
    assert items[3].file in str(error) and "row 3" in str(error) and "index 3" in str(error)
    assert next_within(node).key.index == 4  # the stream goes on after the report
    node.shutdown()


def budget_rows() -> list[RawSample]:
    items = rows(30)
    for i in (2, 5, 8):  # 3 bad rows among the first 10
        items[i] = raw(i, audio=b"\x00" * 64)
    return items


def collect_until_budget(node) -> tuple[list[Sample], ErrorBudgetExceeded | None]:
    got = []
    try:
        for sample in node:
            got.append(sample)
    except ErrorBudgetExceeded as error:
        return got, error
    return got, None


def test_error_budget_trips():
    node = node_over(budget_rows(), error_budget_min_rows=10, max_error_fraction=0.2)
    got, error = collect_until_budget(node)
    node.shutdown()
    assert error is not None
    assert [s.key.index for s in got] == [0, 1, 3, 4, 6, 7, 9]  # raised before the 11th row: no sample lost
    assert len(error.report) == 3 and {r["index"] for r in error.report} == {2, 5, 8}
    assert "max_error_fraction" in str(error) and "3 of 10" in str(error)
    # The advice names the keyword AudioLoader takes, with fields OnError has.
    assert "on_error=al.OnError(max_fraction=..., min_rows=...)" in str(error)
    assert {"max_fraction", "min_rows"} <= {f.name for f in dataclasses.fields(al.OnError)}


def test_the_error_budget_comes_as_the_loaders_on_error_group():
    """``on_error=al.OnError(...)``, the group `AudioLoader` takes, decides as the flat keywords do."""
    node = node_over(budget_rows(), on_error=al.OnError(max_fraction=0.2, min_rows=10))
    got, error = collect_until_budget(node)
    node.shutdown()
    assert error is not None and [s.key.index for s in got] == [0, 1, 3, 4, 6, 7, 9]
    assert (node.on_error, node.max_error_fraction, node.error_budget_min_rows) == ("skip", 0.2, 10)
    with pytest.raises(ValueError, match="max_error_fraction"):  # the budget is given once, in the group
        node_over([], on_error=al.OnError(), max_error_fraction=0.5)


def test_who_decodes_comes_as_the_loaders_workers_group():
    """``workers=al.Workers(...)``, the group `AudioLoader` takes (kind and count decided), decodes as the keywords."""
    items = rows(6)
    node = DecodeSpectrogram(IterableWrapper(items), DecodeConfig(CFG), al.Workers(num_workers=2, kind="thread"))
    try:
        assert (node.num_workers, node.worker_type) == (2, "thread")
        assert_same(list(node), run(items, num_workers=2, worker_type="thread"))
    finally:
        node.shutdown()
    with pytest.raises(TypeError, match=r"\(num_workers=\).*DecodeSpectrogram\.of"):  # the groups, or the factory
        DecodeSpectrogram(IterableWrapper([]), DecodeConfig(CFG), al.Workers(num_workers=2, kind="thread"),
                          num_workers=1)
    with pytest.raises(ValueError, match="kind='thread' or 'process'"):  # "auto" is decided by AudioLoader
        DecodeSpectrogram(IterableWrapper([]), DecodeConfig(CFG), al.Workers(num_workers=2))


def test_error_budget_not_tripped_within_budget():
    node = node_over(budget_rows(), error_budget_min_rows=10, max_error_fraction=0.3)
    got, error = collect_until_budget(node)
    assert error is None and len(got) == 27


def test_error_budget_decisions_survive_resume():
    kwargs = {"error_budget_min_rows": 10, "max_error_fraction": 0.2}
    first = node_over(budget_rows(), **kwargs)
    head = [next(first) for _ in range(5)]  # rows 0..6 seen, 2 bad
    state = first.state_dict()
    first.shutdown()
    assert state["rows_seen"] == 7 and state["bad_rows"] == 2 and "mapper" in state
    resumed = node_over(budget_rows(), **kwargs)
    resumed.reset(state)
    tail, error = collect_until_budget(resumed)
    resumed.shutdown()
    assert error is not None
    assert [s.key.index for s in head + tail] == [0, 1, 3, 4, 6, 7, 9]


# ---------------------------------------------------------------------------
# exceptions from user code and from the source

class AugmentBoom(Exception):
    """A user exception whose constructor needs a keyword: torchdata's string rebuild would lose it."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


def exploding_augment(wave, rng):
    if float(wave.sum()) != 0.0 and rng.integers(0, 4) == 0:  # some rows, deterministically
        raise AugmentBoom("augment failed", code=42)
    return wave


@pytest.mark.parametrize("num_workers", [0, 2])
def test_augment_exception_reaches_caller_intact(num_workers):
    items = rows(12)
    node = node_over(items, num_workers=num_workers, augment=exploding_augment)
    seen, errors = [], []
    while True:
        try:
            seen.append(next_within(node).key.index)
        except StopIteration:
            break
        except AugmentBoom as error:
            errors.append(error)
            assert error.code == 42
            names = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
            assert "exploding_augment" in names
    node.shutdown()
    assert errors and len(seen) + len(errors) == len(items)


def test_augment_returning_wrong_shape_is_reported():
    node = node_over(rows(3), augment=lambda wave, rng: wave[:10])
    with pytest.raises(ValueError, match="augment returned shape"):
        next_within(node)
    node.shutdown()


class SourceBoom(Exception):
    def __init__(self, message: str, *, where: int) -> None:
        super().__init__(message)
        self.where = where


class ExplodingSource(BaseNode):
    """Yields ``items`` and raises `SourceBoom` when asked for item ``fail_at``."""

    def __init__(self, items, fail_at):
        super().__init__()
        self.items, self.fail_at = items, fail_at

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self):
        if self.i == self.fail_at:
            raise SourceBoom("shard went away", where=self.i)
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[self.i - 1]

    def get_state(self):
        return {"i": self.i}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_source_exception_reaches_caller_and_does_not_hang(num_workers):
    node = DecodeSpectrogram.of(ExplodingSource(rows(8), fail_at=5), CFG, num_workers=num_workers)
    got = [next_within(node).key.index for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    with pytest.raises(SourceBoom) as info:
        next_within(node)
    assert info.value.where == 5
    assert "next" in [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    with pytest.raises(StopIteration):
        next_within(node)
    node.shutdown()


# ---------------------------------------------------------------------------
# torch threads, shutdown, state

def num_threads_in_new_thread() -> int:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_user_torch_threads_untouched():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        run(rows(16), num_workers=4)
        node = node_over(rows(16), num_workers=2)
        next(node)
        node.reset()  # a mid-epoch reset, then shutdown
        next(node)
        node.shutdown()
        assert torch.get_num_threads() == 3
        assert num_threads_in_new_thread() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("num_workers,expected", [(0, None), (3, 1)])
def test_decode_threads_run_with_one_intra_op_thread(num_workers, expected):
    seen = set()

    def record(wave, rng):
        seen.add(torch.get_num_threads())
        return wave

    run(rows(8), num_workers=num_workers, augment=record)
    assert seen == {expected if expected is not None else torch.get_num_threads()}


def test_shutdown_stops_threads():
    before = set(threading.enumerate())
    node = node_over(rows(20), num_workers=4)
    next(node)
    # Threads were started (how many depends on timing: the pool reuses a thread that is idle).
    assert set(threading.enumerate()) - before
    node.shutdown()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_reset_restarts_and_state_resumes_exactly():
    items = rows(16)
    full = run(items)
    node = node_over(items, snapshot_frequency=3)
    [next(node) for _ in range(4)]
    node.reset()  # mid-epoch reset: starts over
    head = [next(node) for _ in range(5)]
    state = node.state_dict()
    node.shutdown()
    assert set(state) == {"mapper", "rows_seen", "bad_rows"}
    resumed = node_over(items, snapshot_frequency=3)
    resumed.reset(state)
    tail = list(resumed)
    assert_same(head + tail, full)


def test_works_under_a_loader_with_resume():
    items = rows(10)
    loader = Loader(node_over(items))
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    loader2 = Loader(node_over(items))
    loader2.load_state_dict(state)
    assert_same(head + list(loader2), run(items))


@pytest.mark.parametrize("kwargs,name", [
    ({"on_error": "ignore"}, "on_error"),
    ({"num_workers": -1}, "num_workers"),
    ({"max_error_fraction": 1.5}, "max_error_fraction"),
    ({"error_budget_min_rows": 0}, "error_budget_min_rows"),
    ({"snapshot_frequency": -1}, "snapshot_frequency"),
])
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DecodeSpectrogram.of(IterableWrapper([]), CFG, **kwargs)


@pytest.mark.parametrize("kwargs,name", [
    ({"augment": 3}, "augment"),
    ({"stats": {}}, "stats"),
    ({"seed": 1.5}, "seed"),
])
def test_wrong_types_name_the_argument(kwargs, name):
    with pytest.raises(TypeError, match=name):
        DecodeSpectrogram.of(IterableWrapper([]), CFG, **kwargs)


def test_wrong_source_and_features_types():
    with pytest.raises(TypeError, match="source"):
        DecodeSpectrogram.of([raw(0)], CFG)
    with pytest.raises(TypeError, match="features"):
        DecodeSpectrogram.of(IterableWrapper([]), {"sample_rate": 16000})


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_file_descriptor_or_thread_leak_over_epochs():
    def fds():
        return len(os.listdir("/proc/self/fd"))

    run(rows(4), num_workers=2)  # warm-up: this thread's memfd, imports
    before_fds, before_threads = fds(), threading.active_count()
    for _ in range(4):
        run(rows(8), num_workers=3)
    gc.collect()
    # At most as many as before: threads of earlier tests (a Lightning or Ray helper) may end meanwhile.
    assert fds() <= before_fds and threading.active_count() <= before_threads


def test_augment_may_return_views_and_read_only_arrays():
    def reverse_read_only(wave, rng):
        out = wave[::-1]
        out.flags.writeable = False
        return out

    forward = run(rows(4), train=False)
    reversed_ = run(rows(4), train=False, augment=reverse_read_only)
    assert all(x.spectrogram.shape == y.spectrogram.shape for x, y in zip(forward, reversed_, strict=True))
    assert not torch.equal(forward[1].spectrogram, reversed_[1].spectrogram)
