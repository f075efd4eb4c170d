"""audioloader.dsp.audio: decode, mixdown, resample, crop/pad, and window decode == full decode."""

from __future__ import annotations

import functools
import io

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
import soxr

from audioloader.dsp import audio
from audioloader.errors import DecodeError
from tests.helpers import BAD_AUDIO, encode, tone, truncated_flac

FORMATS = [  # (container, subtype, window decode expected)
    ("WAV", "PCM_16", True),
    ("WAV", "FLOAT", True),
    ("WAV", "PCM_24", True),
    ("FLAC", "PCM_16", True),
    ("AIFF", "PCM_16", True),
    ("OGG", "VORBIS", False),
    ("MP3", "MPEG_LAYER_III", False),
]
SOURCE_RATES = [8000, 16000, 22050, 44100, 48000]
TARGET_RATES = [32000, 16000]


@functools.cache
def clip(fmt: str, subtype: str, rate: int, channels: int, seconds: float = 1.3) -> bytes:
    """A loud tone + noise (peaks near 0.95, the worst case for resampler ringing), encoded."""
    return encode(tone(seconds, rate, freq=330.0, channels=channels, amplitude=0.9, seed=rate + channels),
                  rate, fmt, subtype)


class Recorder:
    """A ``draw`` function that returns chosen offsets and records the ``n`` it was asked for."""

    def __init__(self, pick):
        self.pick = pick
        self.asked: list[int] = []

    def __call__(self, n: int) -> int:
        self.asked.append(n)
        return self.pick(n)


def offsets_to_try(n: int, rng: np.random.Generator, count: int = 6) -> list[int]:
    """First, last, around the middle, and random offsets in [0, n)."""
    picks = {0, n - 1, n // 2, max(n // 2 - 1, 0)} | {int(x) for x in rng.integers(0, n, count)}
    return sorted(picks)


# ---------------------------------------------------------------------------
# resampling arithmetic

@pytest.mark.parametrize("source", [8000, 11025, 16000, 22050, 32000, 44100, 48000, 12345, 96000])
@pytest.mark.parametrize("target", [32000, 16000, 22050])
def test_resampled_length_matches_soxr(source, target):
    lengths = [*range(1, 40), 441, 1000, 1001, 4409, 44099, 44100, 44101, 100003]
    for n in lengths:
        expected = n if source == target else len(soxr.resample(np.zeros(n, np.float32), source, target))
        assert audio.resampled_length(n, source, target) == expected, (n, source, target)


# ---------------------------------------------------------------------------
# window decode == full decode

@pytest.mark.parametrize("fmt,subtype,exact", FORMATS)
def test_exact_seek_formats(fmt, subtype, exact):
    info = audio.probe(clip(fmt, subtype, 16000, 1))
    assert info.exact_seek is exact
    assert info.sample_rate == 16000 and info.channels == 1


@pytest.mark.parametrize("fmt,subtype", [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"),
                                         ("AIFF", "PCM_16")])
def test_exact_formats_seek_to_the_sample(fmt, subtype):
    """The premise of the window path: libsndfile seeks these formats sample-exactly."""
    data = clip(fmt, subtype, 44100, 2)
    full, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert sf.info(io.BytesIO(data)).frames == len(full)
    for start in (0, 1, 4095, 4096, 4097, 20000, len(full) - 5):
        with sf.SoundFile(audio.BufferFile(data)) as f:
            f.seek(start)
            part = f.read(300, dtype="float32", always_2d=True)
        np.testing.assert_array_equal(part, full[start:start + 300])


@pytest.mark.parametrize("target", TARGET_RATES)
@pytest.mark.parametrize("source", SOURCE_RATES)
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("fmt,subtype,exact", FORMATS)
def test_window_equals_full(fmt, subtype, exact, channels, source, target):
    data = clip(fmt, subtype, source, channels)
    clip_samples = target // 2  # 0.5 s crops out of 1.3 s
    rng = np.random.default_rng(source + target + channels)
    probe_draw = Recorder(lambda n: 0)
    full = audio.decode_full(data, target)
    audio.load_clip(data, target, clip_samples, train=True, draw=probe_draw, window=True)
    # both paths draw the offset from the same length L
    assert probe_draw.asked == [len(full) - clip_samples + 1]
    for offset in offsets_to_try(len(full) - clip_samples + 1, rng):
        window = audio.load_clip(data, target, clip_samples, train=True, draw=lambda n, o=offset: o)
        reference = audio.load_clip(data, target, clip_samples, train=True, draw=lambda n, o=offset: o,
                                    window=False)
        np.testing.assert_array_equal(reference, full[offset:offset + clip_samples])
        assert window.dtype == np.float32 and window.shape == (clip_samples,)
        np.testing.assert_allclose(window, reference, rtol=0, atol=1e-4, err_msg=f"offset {offset}")


@pytest.mark.parametrize("source,target", [(44100, 48000), (32050, 32000), (32000, 32000), (96000, 16000)])
def test_window_equals_full_odd_ratios(source, target):
    data = clip("FLAC", "PCM_24", source, 2)
    clip_samples = target // 3
    full = audio.decode_full(data, target)
    for offset in offsets_to_try(len(full) - clip_samples + 1, np.random.default_rng(0)):
        window = audio.load_clip(data, target, clip_samples, train=True, draw=lambda n, o=offset: o)
        np.testing.assert_allclose(window, full[offset:offset + clip_samples], rtol=0, atol=1e-4)


def test_window_path_reads_less():
    """The window path decodes only the segment: far fewer frames read than the full path."""
    data = clip("FLAC", "PCM_16", 44100, 1, seconds=6.0)
    reads: list[int] = []
    original = audio._read

    def counting(handle, frames, nbytes):
        out = original(handle, frames, nbytes)
        reads.append(len(out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(audio, "_read", counting)
        audio.load_clip(data, 32000, 32000, train=True, draw=lambda n: n // 2)
        window_frames = sum(reads)
        reads.clear()
        audio.load_clip(data, 32000, 32000, train=True, draw=lambda n: n // 2, window=False)
        full_frames = sum(reads)
    assert full_frames == 6 * 44100
    assert window_frames < 1.1 * 44100


# ---------------------------------------------------------------------------
# crop / pad

def wav_of_length(frames: int, rate: int = 16000) -> tuple[bytes, np.ndarray]:
    signal = np.linspace(-0.5, 0.5, frames, dtype=np.float32) if frames else np.zeros(0, np.float32)
    return encode(signal, rate, "WAV", "FLOAT"), signal


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("length", [1, 999, 1000, 1001, 1003, 3000])
def test_crop_and_pad(length, train, window):
    clip_samples = 1000
    data, signal = wav_of_length(length)
    draw = Recorder(lambda n: n - 1)  # the last offset in train mode
    out = audio.load_clip(data, 16000, clip_samples, train=train, draw=draw, window=window)
    assert out.dtype == np.float32 and out.shape == (clip_samples,)
    if length > clip_samples:
        offset = length - clip_samples if train else (length - clip_samples) // 2
        np.testing.assert_array_equal(out, signal[offset:offset + clip_samples])
    else:
        left = 0 if train else (clip_samples - length) // 2
        expected = np.zeros(clip_samples, np.float32)
        expected[left:left + length] = signal
        np.testing.assert_array_equal(out, expected)
        if not train:  # equal padding, the odd sample at the end
            assert clip_samples - length - left in (left, left + 1)
    assert draw.asked == ([max(length - clip_samples, 0) + 1] if train else [])


def test_fit_center_pads_equally():
    out = audio.fit(np.ones(4, np.float32), 9, 0, train=False)
    np.testing.assert_array_equal(out, [0, 0, 1, 1, 1, 1, 0, 0, 0])
    out = audio.fit(np.ones(4, np.float32), 9, 0, train=True)
    np.testing.assert_array_equal(out, [1, 1, 1, 1, 0, 0, 0, 0, 0])


def test_crop_offset():
    assert audio.crop_offset(100, 40, train=False, draw=lambda n: 0) == 30
    assert audio.crop_offset(101, 40, train=False, draw=lambda n: 0) == 30
    assert audio.crop_offset(30, 40, train=False, draw=lambda n: 0) == 0
    asked = []
    assert audio.crop_offset(100, 40, train=True, draw=lambda n: asked.append(n) or 7) == 7
    assert asked == [61]


# ---------------------------------------------------------------------------
# decoding details

def test_mixdown_is_mean_of_channels():
    stereo = tone(0.2, 16000, channels=3)
    data = encode(stereo, 16000, "WAV", "FLOAT")
    np.testing.assert_allclose(audio.decode_full(data, 16000), stereo.mean(axis=1), atol=1e-7)


@pytest.mark.parametrize("wrap", [bytes, pa.py_buffer, memoryview, bytearray])
def test_decodes_from_any_buffer(wrap):
    data = clip("FLAC", "PCM_16", 22050, 2)
    expected = audio.decode_full(data, 32000)
    np.testing.assert_array_equal(audio.decode_full(wrap(data), 32000), expected)


def test_buffer_file_does_not_copy():
    buffer = pa.py_buffer(b"0123456789")
    file = audio.BufferFile(buffer)
    assert file._view.obj is buffer
    target = bytearray(4)
    assert file.readinto(target) == 4 and target == b"0123"
    assert file.seek(-2, 2) == 8 and file.read() == b"89" and file.read(5) == b""
    assert file.seek(3) == 3 and file.tell() == 3


def test_block_reads_give_the_same_signal(monkeypatch):
    """A header claiming far more samples than the bytes hold is read in blocks; same result."""
    data = clip("FLAC", "PCM_16", 16000, 2)
    expected = audio.decode_full(data, 16000)
    monkeypatch.setattr(audio, "_MAX_CLAIMED_EXPANSION", 0)
    monkeypatch.setattr(audio, "_BLOCK_FRAMES", 1000)
    np.testing.assert_array_equal(audio.decode_full(data, 16000), expected)


def timer_stages():
    seen: dict[str, float] = {}
    return seen, lambda stage, seconds: seen.__setitem__(stage, seen.get(stage, 0.0) + seconds)


@pytest.mark.parametrize("window", [True, False])
def test_timer_gets_decode_and_resample(window):
    seen, timer = timer_stages()
    audio.load_clip(clip("FLAC", "PCM_16", 44100, 1), 32000, 16000, train=True, draw=lambda n: 0,
                    window=window, timer=timer)
    assert set(seen) == {"decode", "resample"} and all(v > 0 for v in seen.values())


# ---------------------------------------------------------------------------
# bad audio

@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("kind", sorted(BAD_AUDIO))
def test_bad_audio_raises_decode_error(kind, window):
    data, words = BAD_AUDIO[kind]
    with pytest.raises(DecodeError) as info:
        audio.load_clip(data, 16000, 4000, train=True, draw=lambda n: 0, window=window)
    assert words in info.value.reason
    assert "0x" not in info.value.reason  # no object addresses in reports


def test_truncated_flac_fails_on_both_paths_whatever_the_window():
    data = truncated_flac()
    for offset in (0, 100):
        with pytest.raises(DecodeError, match=r"truncated|corrupt"):
            audio.load_clip(data, 16000, 4000, train=True, draw=lambda n, o=offset: o)


# ---------------------------------------------------------------------------
# how the bytes reach libsndfile

@pytest.mark.parametrize("fmt,subtype,exact", FORMATS)
def test_memfd_and_buffer_file_decode_the_same(fmt, subtype, exact, monkeypatch):
    data = clip(fmt, subtype, 44100, 2)

    def both():
        return (audio.decode_full(data, 32000),
                audio.load_clip(data, 32000, 16000, train=True, draw=lambda n: n // 3))

    via_memfd = both()
    monkeypatch.setattr(audio, "MEMFD_MAX_BYTES", 0)  # force soundfile's virtual IO
    via_buffer = both()
    for a, b in zip(via_memfd, via_buffer, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not audio._HAVE_MEMFD, reason="memfd is Linux-only")
def test_reads_do_not_call_back_into_python(monkeypatch):
    """Through the memfd libsndfile reads with read(2): no per-read Python callback needing the GIL."""
    calls = []
    original = audio.BufferFile.readinto
    monkeypatch.setattr(audio.BufferFile, "readinto", lambda self, b: calls.append(1) or original(self, b))
    data = clip("FLAC", "PCM_16", 44100, 2)
    audio.load_clip(data, 32000, 16000, train=True, draw=lambda n: 0)
    assert calls == []
    monkeypatch.setattr(audio, "MEMFD_MAX_BYTES", 0)
    audio.load_clip(data, 32000, 16000, train=True, draw=lambda n: 0)
    assert len(calls) > 5  # the virtual-IO path does, once per read


def test_memfd_is_per_thread_and_reused():
    import threading

    data = clip("WAV", "PCM_16", 16000, 1)
    audio.decode_full(data, 16000)
    mine = audio._THREAD_FILES.memfd
    audio.decode_full(clip("FLAC", "PCM_16", 16000, 1), 16000)
    assert audio._THREAD_FILES.memfd is mine
    other = []
    thread = threading.Thread(target=lambda: (audio.decode_full(data, 16000),
                                              other.append(audio._THREAD_FILES.memfd.fd)))
    thread.start()
    thread.join()
    assert other and other[0] != mine.fd


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("seconds", [0.3, 1.0, 2.7])
@pytest.mark.parametrize("train", [True, False])
def test_pcm16_wav_fast_path_equals_soundfile_path(channels, seconds, train):
    from audioloader.dsp.audio import _pcm16_wav, load_clip

    rate, clip = 16000, 16000
    data = encode(tone(seconds, rate, channels=channels, seed=3), rate, "WAV", "PCM_16")
    assert _pcm16_wav(data) is not None  # the fast path applies

    def draw(n):
        return (n * 7) // 11

    fast = load_clip(data, rate, clip, train=train, draw=draw)
    # window=False skips the fast path: the reference decode through soundfile
    reference = load_clip(data, rate, clip, train=train, draw=draw, window=False)
    np.testing.assert_array_equal(fast, reference)


@pytest.mark.parametrize(("fmt", "subtype"), [("WAV", "FLOAT"), ("WAV", "PCM_24"), ("FLAC", "PCM_16")])
def test_pcm16_wav_fast_path_declines_other_encodings(fmt, subtype):
    from audioloader.dsp.audio import _pcm16_wav

    assert _pcm16_wav(encode(tone(0.2, 8000), 8000, fmt, subtype)) is None


def test_pcm16_wav_fast_path_declines_truncated_files():
    from audioloader.dsp.audio import _pcm16_wav

    data = encode(tone(0.5, 8000), 8000, "WAV", "PCM_16")
    assert _pcm16_wav(data[: len(data) // 2]) is None
