"""Memory as a budget: what the shuffle buffer and the bucketer hold is bounded in bytes, the first batch waits for a
bounded fill, a buffer holds one pass, stats() reports it, and checkpoints from before byte budgets still resume."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from torchdata.nodes import BaseNode

import audioloader as al
from audioloader import budget
from audioloader.nodes import DurationBucketer, ShuffleBuffer
from audioloader.samples import BatchEnd, Key
from tests import legacy_checkpoints
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    encode,
    make_shards,
    roundtrip,
    state_holding,
    take,
    tone,
    write_ipc_file,
    write_parquet,
)

RATE = 8000
FBANK = al.FbankConfig(sample_rate=RATE, num_mel_bins=16)
FIXTURE = Path(__file__).parent / "data" / "legacy_checkpoints.json.gz"


class Rows(BaseNode):
    """``rows`` items a pass, keys ``(i, pass)``, for ``passes`` passes; item ``i`` weighs ``sizes[i]`` bytes."""

    def __init__(self, rows: int, passes: int = 1, sizes: list[int] | None = None) -> None:
        super().__init__()
        self.rows, self.passes = rows, passes
        self.sizes = sizes if sizes is not None else [100] * rows
        self.pulled = 0

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.n = initial_state["n"] if initial_state else 0

    def next(self):
        if self.n >= self.rows * self.passes:
            raise StopIteration
        self.n += 1
        self.pulled += 1
        return Item(Key((self.n - 1) % self.rows, (self.n - 1) // self.rows), self.sizes[(self.n - 1) % self.rows])

    def get_state(self):
        return {"n": self.n}


class Item:
    def __init__(self, key: Key, size: int) -> None:
        self.key, self.size, self.checksum = key, size, 1


def size_of(item: Item) -> int:
    return item.size


# ---------------------------------------------------------------------------------------- the nodes


def test_the_buffer_holds_at_most_its_byte_budget_plus_one_item():
    sizes = np.random.default_rng(0).integers(100, 5000, 500).tolist()
    source = Rows(500, passes=4, sizes=sizes)
    buffer = ShuffleBuffer.of(source, capacity=10**6, min_size=10**6, max_bytes=20_000, size_fn=size_of, one_pass=True)
    it = iter(buffer)
    for _ in range(1500):
        next(it)
        assert buffer.held_bytes <= 20_000 + max(sizes)
        assert buffer.held_bytes == sum(item.size for item in buffer._items) + (
            buffer._fenced[0].size if buffer._fenced else 0)
    report = buffer._holding.report()
    assert report["peak_bytes"] <= 20_000 + max(sizes)
    assert report["limited_by"] == "bytes" and report["max_bytes"] == 20_000
    assert len(buffer) < 50  # the bytes, not the million rows, bounded it


@pytest.mark.parametrize(("min_bytes", "first_fill"), [(5_000, 5), (None, 40), (10**9, 40)])
def test_the_first_item_waits_for_min_size_rows_or_min_bytes_whichever_comes_first(min_bytes, first_fill):
    source = Rows(1000, sizes=[1000] * 1000)
    buffer = ShuffleBuffer.of(source, capacity=100, min_size=40, min_bytes=min_bytes, size_fn=size_of)
    next(iter(buffer))
    assert source.pulled == first_fill + 2  # the first fill, then two pulls for the first emit


def test_a_buffer_larger_than_a_pass_delivers_each_pass_whole_and_says_it_was_capped():
    source = Rows(30, passes=5)
    buffer = ShuffleBuffer.of(source, capacity=1000, min_size=800, size_fn=size_of, one_pass=True)
    out = list(buffer)
    assert len(out) == 150
    for p in range(5):
        chunk = out[30 * p:30 * (p + 1)]
        assert sorted(item.key.index for item in chunk) == list(range(30))  # no row twice within a pass
        assert {item.key.pass_index for item in chunk} == {p}
    report = buffer._holding.report()
    assert report["limited_by"] == "pass" and report["one_pass_caps"] == 4  # passes 0-3 ended with room left
    assert report["peak_bytes"] <= 31 * 100


def test_without_one_pass_the_buffer_mixes_passes():
    out = list(ShuffleBuffer.of(Rows(30, passes=5), capacity=1000, min_size=800, size_fn=size_of))
    assert len({item.key.index for item in out[:30]}) < 30  # what one pass prevents: repeats


def test_a_bucket_never_holds_an_utterance_twice_and_its_bytes_are_bounded():
    seconds = np.random.default_rng(1).uniform(0.5, 3.0, 20).tolist()
    source = Rows(20, passes=6, sizes=[int(1000 * s) for s in seconds])
    bucketer = DurationBucketer.of(source, max_duration=30.0, boundaries=[1.5], distinct=True, max_bytes=8_000,
                                duration_fn=lambda item: seconds[item.key.index], size_fn=size_of)
    batch, batches = [], []
    for item in bucketer:
        if isinstance(item, BatchEnd):
            batches.append(batch)
            batch = []
        else:
            batch.append(item.key.index)
            assert bucketer._holding.bytes <= 8_000 + 3000
    assert sum(len(b) for b in batches) == 120
    assert all(len(set(b)) == len(b) for b in batches)
    assert bucketer._holding.report()["early_batches"] > 0  # 8 KB is less than two buckets of 30 s


def test_a_node_state_keeps_the_item_set_aside_for_the_next_pass():
    def run(state=None, n=40):
        buffer = ShuffleBuffer.of(Rows(12, passes=6), capacity=100, min_size=50, size_fn=size_of, one_pass=True)
        buffer.reset(state)
        items = [buffer.next().key for _ in range(n)]
        return items, buffer

    reference, _ = run()
    head, buffer = run(n=12)  # the first pass out; the next pass's first row waits
    state = buffer.state_dict()
    assert "fenced_item" in state and state["pass"] == 0
    tail, _ = run(state, n=28)
    assert head + tail == reference


# ---------------------------------------------------------------------------------------- the loader


def speech_corpus(folder: Path, n: int, fmt: str = "parquet", seed: int = 0) -> Path:
    """``n`` WAV/FLAC utterances of 0.3-2 s, Hugging Face-shaped (audio struct, text, duration)."""
    seconds = [round(float(s), 3) for s in np.random.default_rng(seed).uniform(0.3, 2.0, n)]
    audio = [{"bytes": encode(tone(s, RATE, freq=120.0 + 9 * i, seed=i), RATE, "FLAC" if i % 2 else "WAV"),
              "path": f"u{i}.wav"} for i, s in enumerate(seconds)]
    table = pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "label": pa.array([i % 3 for i in range(n)], pa.int64()),
                      "text": pa.array([f"utterance {i}" for i in range(n)]), "duration": pa.array(seconds)})
    folder.mkdir(parents=True, exist_ok=True)
    write = write_parquet if fmt == "parquet" else write_ipc_file
    write(folder / f"a.{fmt}", table, 5)
    return folder


@pytest.fixture(scope="module")
def parquet_speech(tmp_path_factory) -> Path:
    return speech_corpus(tmp_path_factory.mktemp("budget") / "speech", 60)


def speech_loader(source, *, rank=None, world_size=None, **kwargs) -> al.AudioLoader:
    options = {"features": FBANK, "seed": 3, "columns": ["text"], "length": al.LengthPolicy(crop=None),
               "batching": al.Bucketing(max_duration=6.0, num_buckets=4), "workers": al.Workers(num_workers=0),
               "storage": al.Storage(split_rows=10, rank=rank, world_size=world_size)}
    options.update(kwargs)
    return al.AudioLoader(al.Source(source, label_column=None), **options)


def test_a_corpus_smaller_than_the_buffer_gives_batches_without_repeated_utterances(tmp_path):
    source = speech_corpus(tmp_path / "tiny", 24)
    with speech_loader(source) as loader:  # the training preset: 10000 rows, 256 MiB, one pass
        batches = take(loader, 40)
        memory = loader.stats()["memory"]
    assert sum(len(b["index"]) for b in batches) > 3 * 24  # several passes
    assert all(len(set(b["index"].tolist())) == len(b["index"]) for b in batches)
    assert memory["shuffle_buffer"]["limited_by"] == "pass" and memory["shuffle_buffer"]["one_pass_caps"] >= 2
    assert memory["shuffle_buffer"]["peak_bytes"] < 24 * 40_000  # one pass of rows, never the 8000 of the rows preset


def test_parquet_rows_are_held_as_their_own_bytes_within_the_budget(parquet_speech):
    budget_bytes = 120_000  # a few rows of 5-64 KB
    with speech_loader(parquet_speech, shuffle=al.Shuffle(max_bytes=budget_bytes)) as loader:
        assert loader.shuffle_before_decode  # the bucketer groups raw rows: the buffer before it holds raw rows
        take(loader, 30)
        memory = loader.stats()["memory"]
    largest = 2 * RATE * 2 + 1000  # a 2 s WAV row and its Python objects
    assert memory["loader_budget_bytes"] == budget_bytes and memory["interleave"] >= 1
    assert memory["peak_bytes"] <= memory["budget_bytes"] + largest
    assert memory["budget_bytes"] == budget_bytes - memory["interleave"] * memory["lane_bytes"]
    assert memory["shuffle_buffer"]["limited_by"] == "bytes"
    assert memory["shuffle_buffer"]["peak_bytes"] > 50_000  # the audio bytes are counted, not only the rows
    buffer = loader._chain.buffer
    assert all(isinstance(item.audio, np.ndarray) for item in buffer._items)  # its own copy: no row group kept alive


def test_a_decoded_buffer_is_bounded_by_bytes(tmp_path):
    make_shards(tmp_path, [30, 30], "parquet", batch_rows=5, seconds=0.4)
    features = al.MelSpectrogramConfig(sample_rate=RATE, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)
    sample_bytes = 16 * features.num_frames(features.clip_samples) * 4
    with al.AudioLoader(tmp_path, batch_size=4, features=features, seed=1, storage=al.Storage(split_rows=5),
                        workers=al.Workers(num_workers=0),
                        shuffle=al.Shuffle(max_bytes=10 * (sample_bytes + 600), interleave=1)) as loader:
        assert not loader.shuffle_before_decode  # local Parquet without batching: decoded samples
        take(loader, 10)
        report = loader.stats()["memory"]["shuffle_buffer"]
    assert report["rows"] <= 11 and report["limited_by"] == "bytes"


def test_stats_report_what_is_held(parquet_speech):
    with speech_loader(parquet_speech) as loader:
        take(loader, 3)
        memory = loader.stats()["memory"]
    assert {"budget_bytes", "held_bytes", "peak_bytes", "loader_budget_bytes", "interleave", "lane_bytes",
            "legacy_checkpoint", "shuffle_buffer", "bucketer"} <= set(memory)
    assert {"rows", "bytes", "peak_bytes", "max_rows", "max_bytes", "min_rows", "min_bytes", "limited_by",
            "one_pass_caps", "one_pass"} <= set(memory["shuffle_buffer"])
    assert {"rows", "bytes", "peak_bytes", "max_bytes", "early_batches", "distinct"} <= set(memory["bucketer"])
    assert memory["held_bytes"] == memory["shuffle_buffer"]["bytes"] + memory["bucketer"]["bytes"]
    assert memory["loader_budget_bytes"] == budget.TRAIN.max_bytes and memory["legacy_checkpoint"] is False


def test_interleave_of_the_preset_fits_the_budget(tmp_path, parquet_speech):
    ipc = speech_corpus(tmp_path / "ipc", 20, fmt="arrow")
    with speech_loader(ipc) as loader:
        assert loader.interleave == budget.MAX_INTERLEAVE  # memory-mapped: a lane costs nothing
    unit = budget.lane_bytes([al.nodes.ArrowShardReader.of(parquet_speech, label_column=None).dataset])
    assert unit > 0
    with speech_loader(parquet_speech, shuffle=al.Shuffle(max_bytes=8 * unit)) as loader:
        assert loader.interleave == 4  # half of the budget
    with speech_loader(parquet_speech, shuffle=al.Shuffle(max_bytes=8 * unit, interleave=2)) as loader:
        assert loader.interleave == 2  # given: kept
    with speech_loader(parquet_speech, train=False) as loader:
        assert loader.interleave == 1  # evaluation reads in file order


def test_bucketing_refuses_decoded_buffers(parquet_speech):
    with pytest.raises(ValueError, match=r"Shuffle\(before_decode=False\) with batching"):
        speech_loader(parquet_speech, shuffle=al.Shuffle(before_decode=False))


@pytest.mark.parametrize("budget_bytes", [None, 90_000])
def test_byte_bounded_bucketed_training_resumes_exactly_at_random_cuts(parquet_speech, budget_bytes):
    # 60 rows in a buffer of a few: early batches, passes and the row set aside between them all cross the cuts.
    shuffle = al.Shuffle(max_bytes=budget_bytes, min_bytes=30_000, interleave=2)

    def build(**extra):
        return speech_loader(parquet_speech, shuffle=shuffle, **extra)

    assert_resumes_exactly(build, 24, sorted(np.random.default_rng(7).choice(range(1, 24), 4, replace=False)))


def test_byte_bounded_batches_do_not_depend_on_workers(parquet_speech):
    shuffle = al.Shuffle(max_bytes=90_000)
    runs = []
    for workers, kind in ((0, "thread"), (2, "thread"), (2, "process")):
        with speech_loader(parquet_speech, shuffle=shuffle, workers=al.Workers(num_workers=workers, kind=kind)) \
                as loader:
            runs.append(take(loader, 12))
    for run in runs[1:]:
        assert_same_batches(run, runs[0])


@pytest.mark.parametrize("world_size", [1, 3])
def test_bucketed_parquet_eval_yields_each_utterance_once(parquet_speech, world_size):
    seen = []
    for rank in range(world_size):
        with speech_loader(parquet_speech, train=False, rank=rank, world_size=world_size) as loader:
            seen += [i for b in loader for i in b["index"][b["valid"]].tolist()]
    assert sorted(seen) == list(range(60))


def test_elastic_resume_delivers_the_row_set_aside_for_the_next_pass_once(tmp_path):
    make_shards(tmp_path, [20, 20], "ipc_file", batch_rows=4, seconds=0.3)
    features = al.MelSpectrogramConfig(sample_rate=RATE, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)

    def build(rank, world):
        return al.AudioLoader(tmp_path, batch_size=1, features=features, seed=4, workers=al.Workers(num_workers=0),
                              storage=al.Storage(split_rows=4, rank=rank, world_size=world),
                              shuffle=al.Shuffle(buffer_size=100, min_size=100))

    before, states = [], []
    for rank in range(2):
        with build(rank, 2) as loader:  # each rank holds its 20 rows of pass 0; the first of pass 1 waits
            before += [b["index"].item() for b in take(loader, 5)]
            states.append(roundtrip(loader.state_dict()))
    assert all(ShuffleBuffer.keys_of(state_holding(s, "draws"))[-1].pass_index == 1 for s in states)
    carried = []
    for rank in range(3):
        with build(rank, 3) as loader:
            loader.load_state_dict(states)
            carry = [al.nodes.arrow_shard_reader.Segment.from_list(s) for s in loader.reader.plan.start["carry"]]
            n = sum(loader.reader.segment_rows(s) for s in carry)
            carried += [b["index"].item() for b in take(loader, n)]  # one pass at a time: the carry comes first
    counts = Counter(before + carried)
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {2}  # passes 0 and 1, each row once each


# ---------------------------------------------------------------------------------------- old checkpoints


@pytest.mark.parametrize("case", list(legacy_checkpoints.CASES))
def test_checkpoints_from_before_byte_budgets_resume_exactly(tmp_path, case):
    """Checkpoints written by the row-count buffer's code (tests/legacy_checkpoints.py) resume as that code went on."""
    saved = json.loads(gzip.decompress(FIXTURE.read_bytes()))[case]
    folder = legacy_checkpoints.corpus(tmp_path / case, legacy_checkpoints.CASES[case])
    with legacy_checkpoints.loader(folder, legacy_checkpoints.CASES[case]) as loader:
        state = saved["state"]
        state["fingerprint"].update({k: loader._fingerprint[k] for k in legacy_checkpoints.FILE_FIELDS})
        loader.load_state_dict(roundtrip(state))
        after = [b["index"].tolist() for b in take(loader, legacy_checkpoints.AFTER)]
        memory = loader.stats()["memory"]
        again = roundtrip(loader.state_dict())
    assert after == saved["after"]
    assert memory["legacy_checkpoint"] and memory["loader_budget_bytes"] is None
    assert loader.shuffle_buffer_size == 10000 and loader.interleave == 1  # the settings it was taken with
    assert "memory" not in again["fingerprint"]  # the run stays as it began
    with legacy_checkpoints.loader(folder, legacy_checkpoints.CASES[case]) as resumed:
        resumed.load_state_dict(again)
        take(resumed, 1)


def test_a_checkpoint_taken_with_the_old_default_bucket_count_resumes_with_it(tmp_path):
    """0.2's default was 16 buckets; now the count is fitted to the data (at most 32). A loader given no count
    resumes a 16-bucket checkpoint with 16 (the fixture's batches), starts fresh runs with the fitted count, and a
    count given explicitly is kept and refused by name."""
    case = legacy_checkpoints.CASES["speech_parquet"]
    saved = json.loads(gzip.decompress(FIXTURE.read_bytes()))["speech_parquet"]
    assert saved["state"]["fingerprint"]["batching"]["num_buckets"] == 16
    folder = legacy_checkpoints.corpus(tmp_path / "s", case)
    with legacy_checkpoints.loader(folder, case) as fresh:
        fitted = fresh.stats()["bucketing"]
        assert fitted["fitted"] and fresh._fingerprint["batching"]["num_buckets"] == fitted["num_buckets"] != 16
    with legacy_checkpoints.loader(folder, case) as ours:
        state = saved["state"]
        state["fingerprint"].update({k: ours._fingerprint[k] for k in legacy_checkpoints.FILE_FIELDS})
        ours.load_state_dict(roundtrip(state))
        assert ours._fingerprint["batching"]["num_buckets"] == 16
        assert [b["index"].tolist() for b in take(ours, legacy_checkpoints.AFTER)] == saved["after"]
    explicit = al.AudioLoader(al.Source(folder, label_column=None), features=legacy_checkpoints.FEATURES, seed=5,
                              length=al.LengthPolicy(crop=None), columns=["text"],
                              batching=al.Bucketing(max_duration=6.0, num_buckets=8),
                              storage=al.Storage(split_rows=5), workers=al.Workers(num_workers=0))
    with explicit:
        state = saved["state"]
        state["fingerprint"].update({k: explicit._fingerprint[k] for k in legacy_checkpoints.FILE_FIELDS})
        with pytest.raises(al.CheckpointMismatchError, match="batching"):
            explicit.load_state_dict(roundtrip(state))


def test_a_legacy_checkpoint_does_not_override_what_the_user_gave(tmp_path):
    case = legacy_checkpoints.CASES["classification_ipc"]
    saved = json.loads(gzip.decompress(FIXTURE.read_bytes()))["classification_ipc"]
    folder = legacy_checkpoints.corpus(tmp_path / "c", case)
    given = {**case, "options": {**case["options"], "shuffle": al.Shuffle(buffer_size=500)}}
    with legacy_checkpoints.loader(folder, given) as ours:
        state = saved["state"]
        state["fingerprint"].update({k: ours._fingerprint[k] for k in legacy_checkpoints.FILE_FIELDS})
        with pytest.raises(al.CheckpointMismatchError, match="shuffle_buffer_size"):
            ours.load_state_dict(state)


def test_a_checkpoint_with_other_settings_gets_a_chain_built_with_them(tmp_path):
    """No node is rewired: the settings a checkpoint resumes with (a legacy buffer, a 16-bucket count) make a new
    chain whose nodes were built with them; a checkpoint refused by name leaves the loader as it was."""
    case = legacy_checkpoints.CASES["speech_parquet"]
    saved = json.loads(gzip.decompress(FIXTURE.read_bytes()))["speech_parquet"]
    folder = legacy_checkpoints.corpus(tmp_path / "s", case)
    with legacy_checkpoints.loader(folder, case) as loader:
        first = loader._chain
        state = saved["state"]
        state["fingerprint"].update({k: loader._fingerprint[k] for k in legacy_checkpoints.FILE_FIELDS})
        loader.load_state_dict(roundtrip(state))
        chain, settings = loader._chain, loader.settings
        assert chain is not first and settings.shuffle.legacy and settings.buckets.count == 16
        assert chain.bucketer.boundaries == settings.buckets.boundaries and chain.bucketer.max_bytes is None
        assert (chain.buffer.capacity, chain.buffer.min_size, chain.buffer.max_bytes) == (10000, 8000, None)
        assert [reader.interleave for reader in chain.readers] == [settings.shuffle.interleave] == [1]
    given = {**case, "options": {**case["options"], "shuffle": al.Shuffle(buffer_size=500)}}
    with legacy_checkpoints.loader(folder, given) as ours:
        first, settings = ours._chain, ours.settings
        with pytest.raises(al.CheckpointMismatchError, match="shuffle_buffer_size"):
            ours.load_state_dict(roundtrip(saved["state"]))
        assert ours._chain is first and ours.settings is settings


def test_durations_for_the_bucket_edges_are_read_from_their_column_alone(parquet_speech, tmp_path):
    dataset = al.nodes.ArrowShardReader.of(parquet_speech, label_column=None, columns=["duration"]).dataset
    picks = [59, 0, 17, 17, 33, 5]
    rows = dataset.read_rows(picks)
    assert dataset.read_column("duration", picks) == [row.extras["duration"] for row in rows]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_rows_in_flight_to_the_decode_workers_are_counted_and_bounded(backend):
    from audioloader.nodes import ParallelMap
    from audioloader.stats import LoaderStats

    def run(cap):
        stats = LoaderStats()
        mapper = ParallelMap.of(Rows(200, sizes=[1000] * 200), _weight, num_workers=2, backend=backend, chunk_size=4,
                             depth=4, stats=stats, size_fn=size_of, max_bytes_in_flight=cap)
        mapper.reset(None)
        try:
            out = list(mapper)
        finally:
            mapper.shutdown()
        return out, stats.memory.report()

    free, free_report = run(None)
    capped, report = run(5_000)
    assert capped == free == [100 * i for i in list(range(200))]  # when work is handed out changes no result
    assert report["decode_in_flight"]["peak_bytes"] <= 5_000 + 4 * 1000  # the cap, plus the chunk that crossed it
    assert free_report["decode_in_flight"]["peak_bytes"] == 8 * 4 * 1000  # 2 workers x 4 chunks of 4 rows
    assert report["held_bytes"] == 0  # reported beside the budgeted total, not in it


def _weight(item: Item) -> int:
    return item.key.index * 100


def test_lanes_come_out_of_the_budget_down_to_a_quarter_left_for_the_buffer():
    settings = budget.resolve(al.Shuffle(max_bytes=1000), train=True, bucketing=True, mixed=False)
    assert settings.fitted(100).interleave == 5 and settings.fitted(100).buffer_max_bytes == 500
    assert settings.fitted(0).interleave == budget.MAX_INTERLEAVE and settings.fitted(0).buffer_max_bytes == 1000
    asked = budget.resolve(al.Shuffle(max_bytes=1000, interleave=16), train=True, bucketing=True, mixed=False)
    assert asked.fitted(100).interleave == 16 and asked.fitted(100).buffer_max_bytes == 250
    assert asked.fitted(100).bucketer_max_bytes == 125
    evaluation = budget.resolve(al.Shuffle(), train=False, bucketing=True, mixed=False).fitted(100)
    assert evaluation.interleave == 1 and evaluation.buffer_max_bytes is None
    assert evaluation.bucketer_max_bytes is None
