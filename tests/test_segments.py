"""Segments of long recordings: rows that name a window of their audio decode only that window.

The reference for every window is soundfile's read of the same frames (``sf.read(start=, stop=)``), mixed
down, and, at another rate, resampled by soxr with the loader's settings, as if the window were a file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
import soxr
import torch

import audioloader as al
from audioloader.dsp import audio, clip
from audioloader.dsp.spans import SEGMENT_END_TOLERANCE_S, span_frames
from audioloader.errors import DecodeError
from audioloader.nodes.duration_bucketer import row_seconds
from audioloader.samples import Key, RawSample
from audioloader.shards.formats.writer import ShardWriter
from tests.helpers import assert_resumes_exactly, assert_same_batches, encode, tone

RATE = 16000
WHOLE = al.LengthPolicy(crop=None)
WAVE = al.WaveformConfig(sample_rate=RATE)
SEGMENTS = al.Segments()  # start, end

# Recordings: (name, seconds, sample rate, channels, container, subtype).
RECORDINGS = [
    ("a.flac", 12.0, 22050, 2, "FLAC", "PCM_16"),
    ("b.wav", 10.0, 16000, 1, "WAV", "PCM_16"),  # at the loader's rate: the zero-copy PCM16 path
    ("c.wav", 9.0, 48000, 1, "WAV", "PCM_24"),
]


def reference(data: bytes, first: int, stop: int, target: int = RATE) -> np.ndarray:
    """soundfile's frames [first, stop), mixed down, resampled with the loader's soxr settings."""
    frames, rate = sf.read(io.BytesIO(data), start=first, stop=stop, dtype="float32", always_2d=True)
    mono = audio.mixdown(frames)
    return mono if rate == target else soxr.resample(mono, rate, target, quality=clip.RESAMPLE_QUALITY)


def segment_rows(seed: int = 0) -> list[dict]:
    """Segments of each recording: consecutive windows of 0.4-2.5 s with gaps, one overlapping, one open-ended."""
    rng = np.random.default_rng(seed)
    rows = []
    for r, (name, seconds, rate, channels, fmt, subtype) in enumerate(RECORDINGS):
        data = encode(tone(seconds, rate, freq=150.0 + 60 * r, channels=channels, amplitude=0.8, seed=r),
                      rate, fmt, subtype)
        t = 0.0
        while True:
            start = round(t + float(rng.uniform(0.0, 0.3)), 3)
            end = round(start + float(rng.uniform(0.4, 2.5)), 3)
            if end > seconds - 0.5:
                break
            rows.append({"audio": data, "path": name, "start": start, "end": end})
            t = end
        rows.append({"audio": data, "path": name, "start": 1.0, "end": 3.5})  # overlaps the first ones
        rows.append({"audio": data, "path": name, "start": round(seconds - 1.2, 3), "end": None})  # to the end
    for i, row in enumerate(rows):
        row["text"] = f"segment {i}"
        row["duration"] = sf.info(io.BytesIO(row["audio"])).duration  # the recording's: must not be used
    return rows


def expected_window(row: dict, target: int = RATE) -> np.ndarray:
    info = sf.info(io.BytesIO(row["audio"]))
    first = round(row["start"] * info.samplerate)
    stop = info.frames if row["end"] is None else round(row["end"] * info.samplerate)
    return reference(row["audio"], first, stop, target)


def write_segments(folder: Path, rows: list[dict], batch_rows: int = 5, fmt: str = "ipc_file") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    extra = {"path": pa.string(), "start": pa.float64(), "end": pa.float64(), "text": pa.string(),
             "duration": pa.float64()}
    name = "shard-00000.arrow" if fmt == "ipc_file" else "shard-00000.parquet"
    with ShardWriter(folder / name, fmt, labeled=False, extra_columns=extra, rows_per_batch=batch_rows) as writer:
        for row in rows:
            writer.write(row["audio"], **{k: row[k] for k in extra})
    return folder


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return segment_rows()


@pytest.fixture(scope="module")
def segments(tmp_path_factory, rows) -> Path:
    return write_segments(tmp_path_factory.mktemp("segments"), rows)


def segment_loader(source, *, segments=SEGMENTS, num_workers=2, worker_type="auto", rank=None,
                   world_size=None, **kwargs) -> al.AudioLoader:
    """A whole-utterance waveform loader over ``source`` read as `Segments` (the test's shards: 5-row splits)."""
    options = {"batch_size": 4, "features": WAVE, "seed": 5, "columns": ["text"], "length": WHOLE,
               "workers": al.Workers(num_workers=num_workers, kind=worker_type),
               "storage": al.Storage(split_rows=5, rank=rank, world_size=world_size)}
    if kwargs.get("train", True):
        options["shuffle"] = al.Shuffle(buffer_size=8, min_size=4)
    options.update(kwargs)
    if not isinstance(source, al.Mix):
        source = al.Source(source, label_column=None, segments=segments)
    return al.AudioLoader(source, **options)


def samples_by_index(batches, key: str = "waveform") -> dict[int, np.ndarray]:
    out = {}
    for b in batches:
        valid = b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool))
        for i, index in enumerate(b["index"].tolist()):
            if valid[i]:
                n = int(b["lengths"][i]) if "lengths" in b else b[key].shape[-1]
                assert index not in out, f"row {index} delivered twice"
                out[index] = b[key][i, :n].numpy()
    return out


# ---------------------------------------------------------------------------------------- decoding a window


WINDOW_FORMATS = [("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24"),
                  ("AIFF", "PCM_16")]


@pytest.mark.parametrize("fmt, subtype", WINDOW_FORMATS)
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("span", [(0.7311, 2.2), (0.0, 0.05), (2.5, None), (None, 1.0)])
def test_a_window_is_soundfiles_read_of_it(fmt, subtype, channels, span):
    rate = 22050
    data = encode(tone(3.0, rate, channels=channels, amplitude=0.9), rate, fmt, subtype)
    first = 0 if span[0] is None else round(span[0] * rate)
    stop = round(3.0 * rate) if span[1] is None else round(span[1] * rate)
    same_rate = audio.load_clip(data, rate, None, train=False, draw=None, span=span)
    np.testing.assert_array_equal(same_rate, reference(data, first, stop, rate))  # sample-exact
    resampled = audio.load_clip(data, RATE, None, train=False, draw=None, span=span)
    np.testing.assert_array_equal(resampled, reference(data, first, stop, RATE))
    # The reference path (decode everything, then cut) agrees.
    np.testing.assert_array_equal(audio.decode_full(data, RATE, span=span), resampled)


@pytest.mark.parametrize("fmt, subtype", [("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")])
def test_formats_without_exact_seek_cut_the_window_from_the_whole_decode(fmt, subtype):
    rate = 16000
    data = encode(tone(2.0, rate, amplitude=0.5), rate, fmt, subtype)
    whole, _ = sf.read(io.BytesIO(data), dtype="float32")
    got = audio.load_clip(data, rate, None, train=False, draw=None, span=(0.5, 1.25))
    np.testing.assert_allclose(got, whole[8000:20000], atol=1e-6)  # mpg123 differs in the last bit between runs


@pytest.mark.parametrize("fmt, subtype, rate", [("FLAC", "PCM_16", 44100), ("WAV", "PCM_16", 16000),
                                                ("WAV", "FLOAT", 8000)])
def test_crops_inside_a_window_are_crops_of_the_window(fmt, subtype, rate):
    data = encode(tone(6.0, rate, channels=2, amplitude=0.9), rate, fmt, subtype)
    span = (1.337, 4.1)
    window = reference(data, round(span[0] * rate), round(span[1] * rate))
    clip = RATE // 2
    asked = []
    for offset in (0, 1, 777, len(window) - clip):
        def draw(n, offset=offset):
            asked.append(n)
            return offset
        got = audio.load_clip(data, RATE, clip, train=True, draw=draw, span=span)
        np.testing.assert_allclose(got, window[offset:offset + clip], atol=1e-4)  # the window path's tolerance
    assert set(asked) == {len(window) - clip + 1}  # offsets are drawn over the window, not the recording
    center = audio.load_clip(data, RATE, clip, train=False, draw=None, span=span)
    start = (len(window) - clip) // 2
    np.testing.assert_allclose(center, window[start:start + clip], atol=1e-4)
    short = audio.load_clip(data, RATE, 5 * RATE, train=False, draw=None, span=span)  # longer than the window
    np.testing.assert_allclose(short, audio.fit(window, 5 * RATE, 0, train=False), atol=1e-6)


def test_a_long_recording_is_not_decoded_whole(monkeypatch):
    rate = 16000
    data = encode(tone(60.0, rate), rate, "FLAC")
    reads = []
    original = audio._read
    monkeypatch.setattr(audio, "_read", lambda handle, frames, nbytes: reads.append(frames) or
                        original(handle, frames, nbytes))
    got = audio.load_clip(data, RATE, None, train=False, draw=None, span=(30.0, 31.5))
    assert len(got) == 24000
    assert -1 not in reads and sum(reads) <= 24000 + 1  # the window (and the last frame's truncation check)


@pytest.mark.parametrize("span, message", [
    ((2.0, 2.0), "end 2.0 s is not after its start 2.0 s"),
    ((2.0, 1.0), "not after its start"),
    ((-0.5, 1.0), "start -0.5 s is negative"),
    ((3.0, 3.5), "starts at 3.0 s, not before the end of the audio"),
    ((1.0, 3.2), r"ends at 3.2 s, after the end of the audio \(3.000 s\)"),
    ((float("nan"), 1.0), "start nan is not a finite"),
    ((0.0, float("inf")), "end inf is not a finite"),
    ((1.0, 1.00001), "holds no sample"),
])
def test_bad_windows_raise_a_decode_error_saying_why(span, message):
    data = encode(tone(3.0, 8000), 8000, "FLAC")
    with pytest.raises(DecodeError, match=message) as info:
        audio.load_clip(data, 8000, None, train=False, draw=None, span=span)
    assert info.value.reason


def test_an_end_just_past_the_audio_is_its_end():
    rate = 8000
    assert span_frames((1.0, 3.0 + SEGMENT_END_TOLERANCE_S), rate, 3 * rate) == (rate, 3 * rate)
    assert span_frames((None, None), rate, 100) == (0, 100)
    data = encode(tone(3.0, rate), rate, "WAV")
    got = audio.load_clip(data, rate, None, train=False, draw=None, span=(2.0, 3.004))
    np.testing.assert_array_equal(got, reference(data, 2 * rate, 3 * rate, rate))


def test_row_seconds_is_the_windows_length_not_the_recordings():
    data = encode(tone(4.0, 8000), 8000, "WAV")
    raw = RawSample(Key(0, 0), data, None, {"start": 1.0, "end": 2.5, "duration": 4.0})
    assert row_seconds(raw, "duration") == 4.0
    assert row_seconds(raw, "duration", al.Segments()) == 1.5
    raw.extras["end"] = None  # to the end of the audio: from its header
    assert row_seconds(raw, "duration", al.Segments()) == pytest.approx(3.0)
    offsets = RawSample(Key(0, 0), data, None, {"offset": 0.5, "duration": 2.0})
    assert row_seconds(offsets, None, al.Segments(start="offset", end=None, duration="duration")) == 2.0


# ---------------------------------------------------------------------------------------- the loader


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_whole_utterance_loader_yields_each_window(segments, rows, kind):
    with segment_loader(segments, train=False, worker_type=kind) as loader:
        batches = list(loader)
    got = samples_by_index(batches)
    assert sorted(got) == list(range(len(rows)))  # each segment exactly once
    for index, row in enumerate(rows):
        np.testing.assert_array_equal(got[index], expected_window(row), err_msg=f"segment {index}")
    texts = {int(i): t for b in batches for i, t in zip(b["index"], b["text"], strict=True)}
    assert texts[3] == "segment 3"


def test_offset_duration_columns(tmp_path, rows):
    chosen = [r for r in rows if r["end"] is not None][:6]
    extra = {"offset": pa.float64(), "duration": pa.float64()}
    with ShardWriter(tmp_path / "s.arrow", labeled=False, extra_columns=extra) as writer:
        for row in chosen:
            writer.write(row["audio"], offset=row["start"], duration=round(row["end"] - row["start"], 6))
    segments = al.Segments(start="offset", end=None, duration="duration")
    with segment_loader(tmp_path, train=False, columns=[], segments=segments) as loader:
        got = samples_by_index(list(loader))
    for index, row in enumerate(chosen):
        np.testing.assert_array_equal(got[index], expected_window(row))


def test_bucketing_uses_the_segments_duration(segments, rows):
    bucketing = al.Bucketing(max_duration=5.0, num_buckets=4)
    seconds = [(row["end"] if row["end"] is not None else row["duration"]) - row["start"] for row in rows]
    with segment_loader(segments, train=False, batching=bucketing) as loader:
        batches = list(loader)
    sizes = []
    for b in batches:
        picked = b["index"][b["valid"]].tolist()
        assert sum(seconds[i] for i in picked) <= 5.0 + 1e-6 or len(picked) == 1
        for i, n in zip(picked, b["lengths"][b["valid"]].tolist(), strict=True):
            assert n == len(expected_window(rows[i]))
        sizes.append(len(picked))
    assert sum(sizes) == len(rows) and max(sizes) >= 3  # the recordings' 9-12 s would give one row a batch


def test_crops_of_segments_in_eval_are_centre_crops_of_the_window(segments, rows):
    length = al.LengthPolicy(clip_seconds=0.5)
    with segment_loader(segments, train=False, length=length, batch_size=8) as loader:
        got = {int(i): w.numpy() for b in loader for i, w, ok in zip(b["index"], b["waveform"], b["valid"],
                                                                      strict=True) if ok}
    for index, row in enumerate(rows):
        window = expected_window(row)
        start = max(len(window) - RATE // 2, 0) // 2
        np.testing.assert_allclose(got[index], audio.fit(window, RATE // 2, start, train=False), atol=1e-4)


def test_training_over_segments_resumes_exactly(segments):
    def build(**options):
        return segment_loader(segments, batching=al.Bucketing(max_duration=4.0, num_buckets=3), **options)

    assert_resumes_exactly(build, total=9, cuts=[2, 5], num_workers=1)


def test_parquet_segments_resume_through_a_buffer_of_decoded_samples(tmp_path, rows):
    folder = write_segments(tmp_path / "pq", rows, fmt="parquet")

    def build(**options):
        return segment_loader(folder, **options)

    with build() as loader:
        assert not loader.shuffle_before_decode  # local Parquet: the buffer holds decoded windows
    assert_resumes_exactly(build, total=8, cuts=[3], num_workers=1)
    with segment_loader(folder, train=False) as loader:
        got = samples_by_index(list(loader))
    for index, row in enumerate(rows):
        np.testing.assert_array_equal(got[index], expected_window(row))


def test_eval_over_segments_is_exactly_once_across_ranks(segments, rows):
    seen = []
    for rank in range(2):
        with segment_loader(segments, train=False, rank=rank, world_size=2,
                            batching=al.Bucketing(max_duration=4.0)) as loader:
            seen += list(samples_by_index(list(loader)))
    assert sorted(seen) == list(range(len(rows)))


def test_a_window_outside_its_audio_is_a_reported_bad_row(tmp_path, rows):
    bad = dict(rows[0], start=1.0, end=60.0)
    folder = write_segments(tmp_path / "bad", [rows[1], bad, rows[2]])
    with segment_loader(folder, train=False, on_error=al.OnError(max_fraction=1.0)) as loader:
        kept = sorted(samples_by_index(list(loader)))
        report = loader.stats()["bad_rows"]
    assert kept == [0, 2]
    assert [r["row"] for r in report] == [1]
    assert "ends at 60.0 s, after the end of the audio (12.000 s)" in report[0]["reason"]
    with segment_loader(folder, train=False, on_error="raise") as loader, \
            pytest.raises(al.DecodeError, match=r"row 1 of .*shard-00000.arrow.*after the end of the audio"):
        list(loader)


def test_a_process_and_a_thread_loader_give_the_same_training_batches(segments):
    runs = []
    for kind in ("thread", "process"):
        with segment_loader(segments, worker_type=kind, batching=al.Bucketing(max_duration=4.0)) as loader:
            it = iter(loader)
            runs.append([next(it) for _ in range(4)])
    assert_same_batches(runs[0], runs[1])


def test_segment_options_fail_early_and_name_the_fix(tmp_path, segments, rows):
    with pytest.raises(ValueError, match=r"no column 'begin'.*name the columns"):
        segment_loader(segments, segments=al.Segments(start="begin"))
    with pytest.raises(ValueError, match=r"column 'text' has type string.*numbers"):
        segment_loader(segments, segments=al.Segments(end="text"))
    with pytest.raises(ValueError, match="give one of end= and duration="):
        al.Segments(end=None)
    with pytest.raises(ValueError, match="give one of end= and duration="):
        al.Segments(duration="duration")
    with pytest.raises(TypeError, match=r"Source.segments must be an audioloader\.Segments"):
        segment_loader(segments, segments=("start", "end"))
    with pytest.raises(ValueError, match=r"Mix source\(s\) \['a'\] have segments=: a Mix does not take segments"):
        segment_loader(al.Mix({"a": (al.Source(segments, label_column=None, segments=al.Segments()), 1.0),
                               "b": (al.Source(segments, label_column=None), 1.0)}))
    # Shards whose rows were cut by `audioloader pack` must not be cut again.
    cut = tmp_path / "cut"
    cut.mkdir()
    extra = {"start": pa.float64(), "end": pa.float64()}
    with ShardWriter(cut / "s.arrow", labeled=False, extra_columns=extra, metadata={"segments": "cut"}) as writer:
        writer.write(rows[0]["audio"], start=1.0, end=2.0)
    with pytest.raises(ValueError, match=r"already its segment.*Leave segments= out"):
        segment_loader(cut, columns=[])
    with segment_loader(cut, columns=[], segments=None, train=False) as loader:
        assert len(samples_by_index(list(loader))[0]) == len(expected_window(dict(rows[0], start=0.0, end=None)))
