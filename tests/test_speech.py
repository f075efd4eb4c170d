"""Whole utterances: length policy, padded batches, duration bucketing, transcripts, resume, exactly once."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torchdata.nodes import BaseNode

import audioloader as al
from audioloader.dsp.audio import load_clip, probe_seconds
from audioloader.dsp.features import compute_features
from audioloader.nodes import DurationBucketer
from audioloader.nodes.duration_bucketer import estimate_boundaries, plan
from audioloader.samples import BatchEnd
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    corpus_table,
    durations,
    loader_factory,
    roundtrip,
    write_ipc_file,
    write_parquet,
)

RATE = 16000
FBANK = al.FbankConfig(num_mel_bins=40)
MEL = al.MelSpectrogramConfig(sample_rate=RATE, clip_seconds=1.0, n_fft=400, hop_length=160, n_mels=40)
WHOLE = al.LengthPolicy(crop=None)
N = 48


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("speech")
    table = corpus_table(durations())
    write_ipc_file(folder / "a.arrow", table.slice(0, 30), batch_rows=6)
    write_ipc_file(folder / "b.arrow", table.slice(30), batch_rows=6)
    return folder


SPEECH_OPTIONS = {"batch_size": 6, "features": FBANK, "seed": 3, "columns": ["text"], "length": WHOLE}
_speech_loader = loader_factory(**SPEECH_OPTIONS, storage=al.Storage(split_rows=6), workers=al.Workers(num_workers=2),
                                train_options={"shuffle": al.Shuffle(buffer_size=16, min_size=8)})


def speech_loader(source, **kwargs) -> al.AudioLoader:
    """A whole-utterance fbank loader over ``source`` read without labels (6-row splits, 2 workers)."""
    return _speech_loader(al.Source(source, label_column=None), **kwargs)


def efficiency(batches) -> float:
    """Real frames / padded frames over the batches (padding entries of eval count as padding)."""
    return sum(int(b["lengths"].sum()) for b in batches) / sum(b["padding_mask"].numel() for b in batches)


# ---------------------------------------------------------------------------------------- lengths, padding


def test_whole_utterances_come_padded_with_lengths_and_mask(corpus):
    with speech_loader(corpus, train=False) as loader:
        batches = list(loader)
    seconds = durations()
    seen = 0
    for b in batches:
        x, lengths, mask = b["fbank"], b["lengths"], b["padding_mask"]
        assert x.dtype == torch.float32 and x.shape[0] == len(lengths) and x.shape[2] == FBANK.num_features
        assert mask.shape == x.shape[:2] and x.shape[1] == int(lengths.max())
        for i, n in enumerate(lengths.tolist()):
            assert not mask[i, :n].any() and mask[i, n:].all()
            assert float(x[i, n:].abs().sum()) == 0  # padding is zeros
            if b["valid"][i]:
                index = int(b["index"][i])
                assert n == FBANK.num_frames(round(seconds[index] * RATE))
                seen += 1
    assert seen == N


def test_padded_features_equal_each_utterances_own(corpus):
    with speech_loader(corpus, train=False, features=MEL) as loader:
        batch = next(iter(loader))
    reader = al.nodes.ArrowShardReader.of(corpus, label_column=None)
    for i, index in enumerate(batch["index"].tolist()):
        raw = reader.fetch([al.Key(index, 0)])[0]
        wave = load_clip(raw.audio, RATE, None, train=False, draw=lambda n: 0)
        n = int(batch["lengths"][i])
        torch.testing.assert_close(batch["spectrogram"][i, :, :n], compute_features(wave, MEL), rtol=1e-5, atol=1e-5)


def test_max_seconds_crops_and_min_seconds_skips(corpus):
    length = al.LengthPolicy(crop=None, max_seconds=1.5, min_seconds=0.6)
    seconds = durations()
    for train in (False, True):
        with speech_loader(corpus, train=train, length=length, infinite=False) as loader:
            batches = list(loader)
            stats = loader.stats()
        kept = [int(i) for b in batches for i in b["index"][b.get("valid", torch.ones(len(b["index"]),
                                                                                  dtype=torch.bool))]]
        assert sorted(kept) == [i for i, s in enumerate(seconds) if s >= 0.6]
        assert max(int(b["lengths"].max()) for b in batches) == FBANK.num_frames(round(1.5 * RATE))
        skipped = stats["skipped_rows"]
        assert sorted(r["index"] for r in skipped) == [i for i, s in enumerate(seconds) if s < 0.6]
        assert all("too short" in r["reason"] for r in skipped)
        assert stats["counters"].get("bad_rows", 0) == 0  # a length skip is not an error


def test_too_long_rows_are_skipped_and_reported_not_raised(corpus):
    length = al.LengthPolicy(crop=None, max_seconds=2.0, too_long="skip")
    with speech_loader(corpus, train=False, length=length, on_error="raise") as loader:
        indices = [int(i) for b in loader for i in b["index"][b["valid"]]]
        stats = loader.stats()
    long_ones = [i for i, s in enumerate(durations()) if s > 2.0]
    assert long_ones and sorted(indices) == [i for i in range(N) if i not in long_ones]
    assert sorted(r["index"] for r in stats["skipped_rows"]) == long_ones
    assert stats["counters"]["skipped_rows"] == len(long_ones)


def test_random_window_of_long_utterances_depends_on_key_not_workers(corpus):
    length = al.LengthPolicy(crop=None, max_seconds=1.0)
    runs = []
    for workers, kind in ((0, "thread"), (3, "thread"), (2, "process")):
        with speech_loader(corpus, length=length, workers=al.Workers(num_workers=workers, kind=kind)) as loader:
            runs.append([next(iter(loader)) for _ in range(1)])
    for run in runs[1:]:
        assert_same_batches(run, runs[0])


def test_waveform_features_are_the_resampled_audio(corpus):
    with speech_loader(corpus, train=False, features=al.WaveformConfig(sample_rate=8000)) as loader:
        batch = next(iter(loader))
    assert "waveform" in batch and batch["waveform"].dim() == 2
    for i, index in enumerate(batch["index"].tolist()):
        assert int(batch["lengths"][i]) == round(durations()[index] * 8000)


# ---------------------------------------------------------------------------------------- bucketing


def test_bucketing_pads_little_and_respects_the_budget(corpus):
    bucketing = al.Bucketing(max_duration=8.0, num_buckets=8)
    with speech_loader(corpus, train=False, batching=bucketing) as bucketed, \
            speech_loader(corpus, train=False, batch_size=6) as fixed:
        buckets, plain = list(bucketed), list(fixed)
    seconds = durations()
    for b in buckets:
        idx = b["index"][b["valid"]].tolist()
        assert sum(seconds[i] for i in idx) <= 8.0 or len(idx) == 1
    assert efficiency(buckets) >= 0.9
    assert efficiency(plain) < efficiency(buckets)


def test_bucketing_on_a_large_mixed_set_reaches_090(tmp_path):
    seconds = [float(s) for s in np.random.default_rng(5).uniform(1.0, 20.0, 400)]
    sizes = plan(seconds, estimate_boundaries(seconds, 16), max_duration=120.0, max_batch_size=None)
    assert sum(sizes) == 400
    padded = real = 0
    bounds = estimate_boundaries(seconds, 16)
    bucketer = DurationBucketer.of(_Rows(seconds), max_duration=120.0, boundaries=bounds,
                                duration_fn=lambda item: item[1])
    batch: list[float] = []
    for item in bucketer:
        if isinstance(item, BatchEnd):
            padded += max(batch) * len(batch)
            real += sum(batch)
            batch = []
        else:
            batch.append(item[1])
    assert real / padded >= 0.9


class _Rows(BaseNode):
    """(key, seconds) pairs with an O(1) state."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self):
        if self.i >= len(self.seconds):
            raise StopIteration
        self.i += 1
        return _Row(al.Key(self.i - 1, 0), self.seconds[self.i - 1])

    def get_state(self):
        return {"i": self.i}


class _Row(tuple):
    def __new__(cls, key, seconds):
        return super().__new__(cls, (key, seconds))

    @property
    def key(self):
        return self[0]


def test_plan_counts_what_the_node_emits():
    seconds = durations(200, seed=9)
    bounds = estimate_boundaries(seconds, 6)
    for max_batch_size, drop_last in ((None, False), (4, False), (None, True)):
        bucketer = DurationBucketer.of(_Rows(seconds), max_duration=7.0, boundaries=bounds,
                                    max_batch_size=max_batch_size, drop_last=drop_last,
                                    duration_fn=lambda item: item[1])
        sizes, count = [], 0
        for item in bucketer:
            if isinstance(item, BatchEnd):
                sizes.append(count)
                count = 0
            else:
                count += 1
        assert sizes == plan(seconds, bounds, 7.0, max_batch_size, drop_last)
        if max_batch_size:
            assert max(sizes) <= max_batch_size


def test_boundaries_split_total_duration_evenly():
    seconds = durations(1000, seed=2)
    bounds = estimate_boundaries(seconds, 4)
    parts = np.split(np.sort(seconds), np.searchsorted(np.sort(seconds), bounds, side="right"))
    totals = [p.sum() for p in parts]
    assert len(bounds) == 3 and max(totals) / min(totals) < 1.1


def test_durations_from_a_column_or_the_header_agree(tmp_path):
    seconds = durations(20, seed=4)
    write_ipc_file(tmp_path / "with.arrow", corpus_table(seconds, duration_column=True), batch_rows=5)
    first = corpus_table([1.234]).column("audio")[0]["bytes"].as_py()  # 22.05 kHz: 1.234 s to the nearest sample
    assert probe_seconds(first) == pytest.approx(1.234, abs=1 / 22050)
    results = []
    for duration_column in ("duration", None):
        with speech_loader(tmp_path, train=False, batching=al.Bucketing(max_duration=6.0,
                                                                        duration_column=duration_column)) as loader:
            results.append(list(loader))
            assert (loader._duration_column is not None) == (duration_column is not None)
    assert_same_batches(results[0], results[1])
    assert "duration" not in results[0][0]  # read for bucketing, not added to the batch


@pytest.mark.parametrize("train", [True, False])
def test_bucketed_resume_is_exact_at_random_cut_points(corpus, train):
    bucketing = al.Bucketing(max_duration=6.0, num_buckets=4)
    with speech_loader(corpus, train=train, batching=bucketing) as loader:
        reference = [next(it) for it in [iter(loader)] for _ in range(10)] if train else list(loader)
    rng = random.Random(int(train))
    for cut in sorted(rng.sample(range(1, len(reference) - 1), 3)):
        saved_with = rng.choice([(0, "thread"), (2, "thread"), (2, "process")])
        resumed_with = rng.choice([(1, "thread"), (3, "process")])
        build = functools.partial(speech_loader, corpus, train=train, batching=bucketing,
                                  workers=al.Workers(num_workers=saved_with[0], kind=saved_with[1]))
        assert_resumes_exactly(build, len(reference), [cut], reference,
                               workers=al.Workers(num_workers=resumed_with[0], kind=resumed_with[1]))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_bucketed_eval_yields_each_utterance_once_across_ranks(corpus, world_size):
    bucketing = al.Bucketing(max_duration=5.0, num_buckets=4)
    seen, counts = [], []
    for rank in range(world_size):
        with speech_loader(corpus, train=False, batching=bucketing,
                           storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            batches = list(loader)
            assert len(batches) == len(loader)
        counts.append(len(batches))
        seen += [int(i) for b in batches for i in b["index"][b["valid"]]]
    assert sorted(seen) == list(range(N))
    assert len(set(counts)) == 1  # equal batch counts: DDP collectives never wait on a rank


def test_bucketed_state_holds_keys_and_stays_small(corpus):
    import io

    with speech_loader(corpus, batching=al.Bucketing(max_duration=6.0)) as loader:
        it = iter(loader)
        [next(it) for _ in range(3)]
        state = loader.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() < 16 * 1024


# ---------------------------------------------------------------------------------------- transcripts, options


def test_transcripts_reach_the_batch_as_lists_of_strings_from_a_hugging_face_corpus(tmp_path):
    datasets = pytest.importorskip("datasets")
    seconds = durations(12, seed=7)
    table = corpus_table(seconds)
    ds = datasets.Dataset(table).cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    for source in (tmp_path / "hf", tmp_path / "hf.parquet"):
        with speech_loader(source, train=False, batching=al.Bucketing(max_duration=6.0)) as loader:
            got = {int(i): t for b in loader for i, t, ok in zip(b["index"], b["text"], b["valid"], strict=True)
                   if ok}
        assert got == {i: f"utterance number {i}" for i in range(12)}


def test_old_keywords_are_refused_naming_their_option_group(corpus):
    with pytest.raises(TypeError, match=r"AudioLoader\(shuffle_buffer_size=\.\.\.\) was removed in 0\.4: pass "
                                        r"shuffle=al\.Shuffle\(buffer_size=\.\.\.\)"):
        al.AudioLoader(al.Source(corpus, label_column=None), **SPEECH_OPTIONS, shuffle_buffer_size=16)
    with pytest.raises(TypeError, match=r"pass workers=al\.Workers\(num_workers=\.\.\.\)"):
        al.AudioLoader(corpus, num_workers=2, workers=al.Workers(num_workers=1))
    with pytest.raises(TypeError, match=r"batching must be an audioloader\.Bucketing"):
        speech_loader(corpus, batching={"max_duration": 5})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"length": al.LengthPolicy(), "batching": al.Bucketing(max_duration=5.0)}, "crop=None"),
    ({"length": al.LengthPolicy(), "features": al.FbankConfig()}, "clip_seconds"),
])
def test_contradictory_options_are_refused_with_the_fix(corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        speech_loader(corpus, **kwargs)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"crop": "left"}, "crop"), ({"too_long": "truncate"}, "too_long"), ({"max_seconds": -1.0}, "max_seconds"),
    ({"crop": None, "clip_seconds": 2.0}, "clip_seconds"), ({"min_seconds": 5.0, "max_seconds": 2.0}, "min_seconds"),
])
def test_length_policy_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"LengthPolicy\.{field}"):
        al.LengthPolicy(**kwargs)


def test_fixed_crops_of_fbank_need_a_length_and_then_have_one_shape(corpus):
    with speech_loader(corpus, train=False, length=al.LengthPolicy(clip_seconds=1.0)) as loader:
        batch = next(iter(loader))
    assert batch["fbank"].shape == (6, FBANK.num_frames(RATE), 40) and "lengths" not in batch


def test_batched_device_features_equal_per_sample_for_whole_utterances(corpus):
    for features in (FBANK, MEL):
        with speech_loader(corpus, train=False, features=features) as per_sample, \
                speech_loader(corpus, train=False, features=features, device="cpu") as batched:
            for x, y in zip(per_sample, batched, strict=True):
                key = features.batch_key
                assert torch.equal(x["lengths"], y["lengths"]) and torch.equal(x["padding_mask"], y["padding_mask"])
                torch.testing.assert_close(y[key], x[key], rtol=1e-4, atol=1e-4)


def test_parquet_corpus_buckets_too(tmp_path):
    write_parquet(tmp_path / "c.parquet", corpus_table(durations(20, seed=11)), row_group_rows=5)
    with speech_loader(tmp_path, train=False, batching=al.Bucketing(max_duration=5.0)) as loader:
        assert sorted(int(i) for b in loader for i in b["index"][b["valid"]]) == list(range(20))


# ---------------------------------------------------------------------------------------- bucket count


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """15 utterances of 4-11 s, 115 s in all: the getting-started snippet's data, LibriSpeech-shaped."""
    folder = tmp_path_factory.mktemp("small-speech")
    seconds = [round(float(s), 3) for s in np.random.default_rng(1).uniform(4.0, 11.0, 15)]
    write_ipc_file(folder / "a.arrow", corpus_table(seconds, duration_column=True), batch_rows=4)
    return folder


def small_corpus_loader(folder, num_buckets=None, **options):
    return al.AudioLoader(al.Source(folder, label_column=None), features=al.WaveformConfig(sample_rate=RATE),
                          length=al.LengthPolicy(crop=None, max_seconds=20.0),
                          batching=al.Bucketing(max_duration=200.0, num_buckets=num_buckets),
                          workers=al.Workers(num_workers=0), **options)


def test_bucketing_fits_the_bucket_count_to_a_small_dataset(small_corpus):
    """`Bucketing(max_duration=200.0)` on 115 s: 32 buckets gave batches of one utterance (each bucket held 3.5 s of
    a pass); the count fitted to the data gives whole passes, and stats() says how many buckets and why."""
    with small_corpus_loader(small_corpus) as loader:
        sizes = [len(b["lengths"]) for _, b in zip(range(6), loader, strict=False)]
        bucketing = loader.stats()["bucketing"]
    assert min(sizes) >= 10, sizes
    assert bucketing["num_buckets"] == 1 and bucketing["fitted"] and bucketing["pass_seconds"] == pytest.approx(
        sum(np.random.default_rng(1).uniform(4.0, 11.0, 15).round(3)))
    assert "1 bucket(s), not 32: a pass of this rank holds about 115 s" in bucketing["why"]
    with small_corpus_loader(small_corpus, num_buckets=32) as loader:  # given: kept, and stats() says what it costs
        sizes = [len(b["lengths"]) for _, b in zip(range(6), loader, strict=False)]
        bucketing = loader.stats()["bucketing"]
    assert max(sizes) <= 2 and bucketing["num_buckets"] == 32 and not bucketing["fitted"]
    assert "less than a batch of 200 s: batches leave smaller" in bucketing["why"]
    with small_corpus_loader(small_corpus, storage=al.Storage(rank=0, world_size=2)) as loader:
        assert loader.stats()["bucketing"]["pass_seconds"] == pytest.approx(bucketing["pass_seconds"] / 2)


def test_fitted_bucket_counts_grow_with_the_data_up_to_32():
    from audioloader.nodes.duration_bucketer import fit_bucket_count

    sample = [4.0, 6.0, 8.0, 10.0, 12.0]  # mean 8 s
    fit = dict(max_duration=200.0, max_batch_size=None, most=32, full_batches=1)
    assert fit_bucket_count(sample, 115.0, **fit) == 1
    assert fit_bucket_count(sample, 595.0, **fit) == 2
    assert fit_bucket_count(sample, 8 * 800.0, **{**fit, "full_batches": 4}) == 8  # 8 buckets of 4 batches of 200 s
    assert fit_bucket_count(sample, 6237.0, **fit) == 31
    assert fit_bucket_count(sample, 100 * 3600.0, **fit) == 32  # LibriSpeech-100: the most
    assert fit_bucket_count(sample, 8 * 40.0, **{**fit, "max_batch_size": 5}) == 8  # batches of 5 x 8 s
    assert fit_bucket_count([], 0.0, **fit) == 1


@pytest.mark.parametrize("train", [True, False])
def test_a_checkpoint_taken_with_0_3s_default_of_32_buckets_resumes_exactly(small_corpus, train):
    """0.3 bucketed every dataset into 32 buckets and recorded 32: a loader given no count resumes such a
    checkpoint with 32 buckets, batch for batch, though it would fit 1 to this data on a fresh start."""
    with small_corpus_loader(small_corpus, 32, train=train) as loader:
        it = iter(loader)
        [next(it) for _ in range(3)]
        state = roundtrip(loader.state_dict())
        expected = [next(it) for _ in range(4)]
    assert state["fingerprint"]["batching"]["num_buckets"] == 32
    with small_corpus_loader(small_corpus, train=train) as resumed:
        assert resumed.stats()["bucketing"]["num_buckets"] == 1
        resumed.load_state_dict(state)
        assert resumed.stats()["bucketing"]["num_buckets"] == 32
        if not train:  # the batches a rank yields in eval follow from the edges: the checkpoint's
            assert len(resumed) == len(loader)
        got = [b for _, b in zip(range(4), resumed, strict=False)]
    assert_same_batches(got, expected)
