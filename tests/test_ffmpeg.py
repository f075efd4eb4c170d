"""The FFmpeg decoder backend (audioloader.dsp.ffmpeg): containers libsndfile cannot open (AAC in MP4/M4A, Opus in
WebM), sniffed from the bytes; lengths without encoder delay or padding; the same samples as the ``ffmpeg`` command;
samples pinned per (codec, backend); the crop window alone; the choice in ``Source(decoder=...)``, in the checkpoint
fingerprint. (Without PyAV: tests/test_ffmpeg_missing.py, which runs without it.)

The audio is made here: test signals encoded with PyAV itself (and soundfile for what libsndfile writes).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pytest

import audioloader as al
from audioloader.dsp import ffmpeg
from audioloader.dsp.audio import load_clip, mixdown, probe_seconds, resample
from audioloader.errors import DecodeError
from benchmarks.common import av_encode  # PyAV's encoder, shared with bench_codecs
from tests.helpers import encode, tone, truncated_flac, write_ipc_file

av = pytest.importorskip("av")



#: name -> (container, codec, sample rate): what each test clip is.
CODECS = {
    "aac_m4a": ("ipod", "aac", 16000),
    "aac_m4a_44k": ("ipod", "aac", 44100),
    "aac_mp4": ("mp4", "aac", 16000),
    "aac_mkv": ("matroska", "aac", 16000),
    "opus_webm": ("webm", "libopus", 48000),
    "opus_ogg": ("ogg", "libopus", 48000),
    "mp3": ("mp3", "libmp3lame", 16000),
    "flac": ("flac", "flac", 16000),
    "wav": ("wav", "pcm_s16le", 16000),
    "wma": ("asf", "wmav2", 16000),
}


def signal_for(rate: int, seconds: float = 1.0, channels: int = 1) -> np.ndarray:
    """A 440 Hz tone with a little noise and a fade-in (so a shift in time shows), float32."""
    x = tone(seconds, rate, freq=440.0, channels=channels, amplitude=0.5, seed=rate)
    ramp = np.minimum(1.0, np.arange(len(x)) / (0.1 * rate)).astype(np.float32)
    return (x * (ramp if x.ndim == 1 else ramp[:, None])).astype(np.float32)


def clip(name: str, seconds: float = 1.0, channels: int = 1) -> bytes:
    container, codec, rate = CODECS[name]
    bit_rate = 32000 if codec == "wmav2" else None  # its encoder has no default for 16 kHz
    return av_encode(signal_for(rate, seconds, channels), rate, container, codec, bit_rate)


def decoded(data: bytes, rate: int, backend: str) -> np.ndarray:
    """Every sample, mono, at the clip's own rate (no resampling), through ``backend``."""
    return load_clip(data, rate, None, train=False, draw=lambda n: 0, backend=backend)


def best_lag_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 64) -> tuple[float, int]:
    n = min(len(a), len(b)) - 2 * max_lag
    scores = [(float(np.corrcoef(a[max_lag:max_lag + n], b[max_lag + lag:max_lag + lag + n])[0, 1]), lag)
              for lag in range(-max_lag, max_lag + 1)]
    return max(scores)


# -- sniffing and routing ------------------------------------------------------------------------------------------


def test_the_container_is_sniffed_from_the_bytes():
    expected = {"aac_m4a": "mp4", "aac_mp4": "mp4", "aac_mkv": "matroska", "opus_webm": "matroska",
                "opus_ogg": "ogg", "mp3": "mp3", "flac": "flac", "wav": "wav", "wma": "asf"}
    for name, container in expected.items():
        assert ffmpeg.sniff(clip(name, 0.2)) == container, name
    assert ffmpeg.sniff(encode(tone(0.2, 16000), 16000, "OGG")) == "ogg"
    assert ffmpeg.sniff(encode(tone(0.2, 16000), 16000, "MP3")) == "mp3"  # libsndfile's MP3: a bare frame sync
    assert ffmpeg.sniff(b"\xff\xf1\x50\x80" + bytes(60)) == "adts"
    assert ffmpeg.sniff(bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c") + bytes(40)) == "asf"
    assert ffmpeg.sniff(b"not audio at all, whatever the name says") == "unknown"


def test_auto_sends_to_ffmpeg_only_what_libsndfile_cannot_open():
    for name in ("aac_m4a", "aac_mkv", "opus_webm", "wma"):
        assert ffmpeg.route(clip(name, 0.2), "auto") == "ffmpeg", name
    for name in ("opus_ogg", "mp3", "flac", "wav"):
        assert ffmpeg.route(clip(name, 0.2), "auto") == "sndfile", name
        assert ffmpeg.route(clip(name, 0.2), "ffmpeg") == "ffmpeg", name
    with pytest.raises(DecodeError, match=r"MP4/M4A \(AAC or ALAC\) audio: libsndfile cannot decode it .*"
                                          r"decoder='sndfile'; use Source\(decoder='auto'\)"):
        decoded(clip("aac_m4a", 0.2), 16000, "sndfile")


# -- what the samples are ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["aac_m4a", "aac_m4a_44k", "aac_mp4", "opus_webm", "opus_ogg", "mp3"])
def test_lossy_clips_decode_to_the_encoded_signal_without_delay_or_padding(name):
    # Priming samples (AAC's 1024, Opus's pre-skip, LAME's delay) are removed and an AAC stream's padding after its
    # last frame is cut to the edit list's duration: the decode lines up with the input, sample for sample.
    _, _, rate = CODECS[name]
    source = signal_for(rate, 1.0)
    out = decoded(clip(name), rate, "ffmpeg")
    assert len(out) == len(source), (len(out), len(source))
    correlation, lag = best_lag_correlation(out, source)
    assert lag == 0 and correlation >= 0.99, (correlation, lag)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="no ffmpeg command on this machine (apt-get install "
                                                            "ffmpeg); the input-signal test above still runs")
@pytest.mark.parametrize("name", ["aac_m4a", "aac_m4a_44k", "opus_webm"])
def test_aac_and_opus_decode_to_what_the_ffmpeg_command_gives(name, tmp_path):
    # The command keeps an AAC stream's padding after its last frame (up to 1023 samples; we cut it to the edit
    # list's duration, the input's length): within 1% from about 6 s at 16 kHz, so the clip is 10 s.
    _, _, rate = CODECS[name]
    data = clip(name, 10.0)
    path = tmp_path / "clip.bin"  # no extension: ffmpeg sniffs too
    path.write_bytes(data)
    out = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "f32le", "-ac", "1", "-ar", str(rate),
                          "-"], capture_output=True, check=True).stdout
    reference = np.frombuffer(out, np.float32)
    ours = decoded(data, rate, "ffmpeg")
    assert len(ours) == round(10.0 * rate)
    assert abs(len(ours) - len(reference)) <= 0.01 * len(reference), (len(ours), len(reference))
    n = min(len(ours), len(reference))
    assert np.corrcoef(ours[:n], reference[:n])[0, 1] >= 0.99


#: sha256 (first 16 hex digits) of the float32 samples `decoded` gives, per (clip, backend). A library upgrade that
#: changes what these bytes decode to fails here instead of changing training data silently. The clips are encoded
#: by this test with PyAV, so an encoder change fails too: check the new samples (the tests above) and re-pin.
PINNED = {
    ("aac_m4a", "ffmpeg"): "46a19968f3bf83d7",
    ("aac_m4a_44k", "ffmpeg"): "e5fc9280912279bf",
    ("aac_mkv", "ffmpeg"): "eb9179fa76a8b85c",
    ("flac", "ffmpeg"): "c796b3ecc03aa13f",
    ("flac", "sndfile"): "c796b3ecc03aa13f",
    ("mp3", "ffmpeg"): "37fc2edf082c365f",
    ("mp3", "sndfile"): "00e914812ffd80aa",
    ("opus_ogg", "ffmpeg"): "6d1f14e7ce998b73",
    ("opus_ogg", "sndfile"): "7eb4e96443073ef8",
    ("opus_webm", "ffmpeg"): "6d1f14e7ce998b73",
    ("wav", "ffmpeg"): "c796b3ecc03aa13f",
    ("wav", "sndfile"): "c796b3ecc03aa13f",
    ("wma", "ffmpeg"): "ace0fa1480a6dad8",
}


def sample_hash(samples: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(samples, dtype="<f4").tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(("name", "backend"), sorted(PINNED))
def test_decoded_samples_are_pinned_per_codec_and_backend(name, backend):
    data = clip(name)
    _, _, rate = CODECS[name]
    first, again = decoded(data, rate, backend), decoded(data, rate, backend)
    assert np.array_equal(first, again)  # deterministic
    assert sample_hash(first) == PINNED[name, backend], (
        f"{name} through {backend} now decodes to other samples (encoded bytes sha256 "
        f"{hashlib.sha256(data).hexdigest()[:16]}): a PyAV/FFmpeg or libsndfile upgrade changed the encoder or the "
        "decoder; check the samples and re-pin")


@pytest.mark.parametrize("channels", [1, 2])
def test_flac_and_wav_decode_to_the_same_samples_with_both_backends(channels):
    for fmt in ("FLAC", "WAV"):
        data = encode(signal_for(44100, 1.0, channels), 44100, fmt, "PCM_16")
        assert np.array_equal(decoded(data, 44100, "ffmpeg"), decoded(data, 44100, "sndfile")), fmt
    data = av_encode(signal_for(16000, 1.0, channels), 16000, "flac", "flac")  # written by FFmpeg, read by both
    assert np.array_equal(decoded(data, 16000, "ffmpeg"), decoded(data, 16000, "sndfile"))


# -- the crop window -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "subtype", "rate", "channels"), [("FLAC", "PCM_16", 44100, 2), ("FLAC", "PCM_24",
                                                                   16000, 1), ("WAV", "PCM_16", 22050, 1)])
def test_the_window_alone_gives_the_same_crop_as_decoding_everything(fmt, subtype, rate, channels):
    data = encode(signal_for(rate, 3.0, channels), rate, fmt, subtype)
    for offset_fraction in (0.0, 0.37, 1.0):
        def draw(n: int, fraction: float = offset_fraction) -> int:
            return min(n - 1, int(fraction * n))

        window = load_clip(data, 16000, 8000, train=True, draw=draw, window=True, backend="ffmpeg")
        full = load_clip(data, 16000, 8000, train=True, draw=draw, window=False, backend="ffmpeg")
        assert np.abs(window - full).max() < 1e-4, offset_fraction
        assert np.array_equal(full, load_clip(data, 16000, 8000, train=True, draw=draw, window=False,
                                              backend="sndfile"))


def test_a_truncated_flac_is_an_error_through_ffmpeg_as_through_libsndfile():
    data = truncated_flac()
    for window in (True, False):
        with pytest.raises(DecodeError, match="truncated"):
            load_clip(data, 16000, 4000, train=True, draw=lambda n: n // 2, window=window, backend="ffmpeg")


def test_garbage_is_an_error_naming_ffmpeg():
    with pytest.raises(DecodeError, match="FFmpeg"):
        load_clip(b"\x00\x00\x00\x18ftypM4A " + bytes(200), 16000, 4000, train=False, draw=lambda n: 0)


def test_the_header_duration_of_an_m4a_is_read_without_decoding():
    assert probe_seconds(clip("aac_m4a", 1.5)) == pytest.approx(1.5, abs=1e-3)


# -- the loader ------------------------------------------------------------------------------------------------------

FEATURES = al.WaveformConfig(sample_rate=16000)
LENGTH = al.LengthPolicy(clip_seconds=0.5)
#: Not AAC in Matroska: FFmpeg's muxer records no encoder delay there, so its 1024 priming samples stay in the decode
#: (as with the ffmpeg command): the crop is shifted by them.
ROW_CODECS = ["aac_m4a", "opus_webm", "wav", "flac", "opus_ogg", "mp3"]


def codec_shard(tmp_path, codecs=tuple(ROW_CODECS), extra: list[bytes] = ()):
    audio = [clip(name) for name in codecs] + list(extra)
    table = pa.table({"audio": pa.array(audio, pa.binary()), "label": pa.array(range(len(audio)), pa.int64())})
    write_ipc_file(tmp_path / "codecs.arrow", table)
    return tmp_path / "codecs.arrow"


def eval_batches(source, **kwargs):
    options = {"batch_size": 3, "train": False, "features": FEATURES, "length": LENGTH,
               "workers": al.Workers(num_workers=2, kind="thread"), **kwargs}
    with al.AudioLoader(source, **options) as loader:
        return list(loader), loader.stats()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_loader_reads_m4a_and_webm_rows_beside_wav_flac_ogg_and_mp3(tmp_path, kind):
    shard = codec_shard(tmp_path)
    batches, stats = eval_batches(shard, workers=al.Workers(num_workers=2, kind=kind))
    assert stats["counters"]["bad_rows"] == 0
    waveforms = np.concatenate([b["waveform"].numpy() for b in batches])
    labels = np.concatenate([b["label"].numpy() for b in batches])
    assert labels.tolist() == list(range(len(ROW_CODECS)))
    for row, name in enumerate(ROW_CODECS):
        _, _, rate = CODECS[name]
        reference = resample(signal_for(rate), rate, 16000)[4000:12000]  # the centre crop of the input
        correlation = np.corrcoef(waveforms[row], reference)[0, 1]
        assert correlation >= 0.99, (name, correlation)


def test_decoder_ffmpeg_gives_the_same_batches_as_auto_for_16_bit_flac_and_wav(tmp_path):
    shard = codec_shard(tmp_path, ("flac", "wav", "flac", "wav"))
    auto, _ = eval_batches(shard)
    forced, _ = eval_batches(al.Source(shard, decoder="ffmpeg"))
    for a, b in zip(auto, forced, strict=True):
        assert np.array_equal(a["waveform"].numpy(), b["waveform"].numpy())


def test_decoder_sndfile_makes_an_m4a_row_a_bad_row_naming_the_fix(tmp_path):
    shard = codec_shard(tmp_path, ("wav", "aac_m4a", "flac"))
    batches, stats = eval_batches(al.Source(shard, decoder="sndfile"))
    assert [int(x) for b in batches for x in b["label"] if x >= 0] == [0, 2]  # -1: padding of the last batch
    (bad,) = stats["bad_rows"]
    assert bad["row"] == 1 and "decoder='sndfile'" in bad["reason"] and "Source(decoder='auto')" in bad["reason"]


def test_the_decoder_is_part_of_the_checkpoint_fingerprint(tmp_path):
    shard = codec_shard(tmp_path, ("flac", "wav", "flac", "wav"))
    options = {"batch_size": 2, "features": FEATURES, "length": LENGTH, "workers": al.Workers(num_workers=0)}
    with al.AudioLoader(al.Source(shard, decoder="ffmpeg"), **options) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["fingerprint"]["decoder"] == ["ffmpeg"]
    with al.AudioLoader(shard, **options) as auto:
        assert "decoder" not in auto.state_dict()["fingerprint"]  # "auto": a 0.3 checkpoint still loads
        with pytest.raises(al.CheckpointMismatchError, match="decoder"):
            auto.load_state_dict(state)
    with al.AudioLoader(al.Source(shard, decoder="ffmpeg"), **options) as same:
        same.load_state_dict(state)


def test_an_unknown_decoder_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"Source.decoder='pyav': must be one of \('auto', 'sndfile', 'ffmpeg'\)"):
        al.Source("shards/", decoder="pyav")


def test_a_stereo_m4a_is_mixed_down_like_any_clip():
    data = av_encode(signal_for(16000, 1.0, 2), 16000, "ipod", "aac")
    frames, rate = ffmpeg.read_all(data)
    assert frames.shape == (16000, 2) and rate == 16000
    assert np.array_equal(decoded(data, 16000, "auto"), mixdown(frames))


def test_each_source_of_a_mix_decodes_with_its_own_backend(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    strict, relaxed = codec_shard(tmp_path / "a", ("wav", "aac_m4a")), codec_shard(tmp_path / "b", ("wav", "aac_m4a"))
    mix = al.Mix({"strict": (al.Source(strict, decoder="sndfile"), 0.5), "relaxed": (al.Source(relaxed), 0.5)})
    batches, stats = eval_batches(mix)
    assert sum(int(x >= 0) for b in batches for x in b["label"]) == 3
    (bad,) = stats["bad_rows"]
    assert bad["file"].endswith("a/codecs.arrow") and "decoder='sndfile'" in bad["reason"]


def test_a_segment_of_a_clip_decodes_through_ffmpeg_as_through_libsndfile():
    data = encode(signal_for(16000, 3.0), 16000, "FLAC", "PCM_16")
    for span in [(0.5, 1.7), (None, 1.0), (2.0, None)]:
        ours = load_clip(data, 8000, None, train=False, draw=lambda n: 0, span=span, backend="ffmpeg")
        theirs = load_clip(data, 8000, None, train=False, draw=lambda n: 0, span=span, backend="sndfile")
        assert np.array_equal(ours, theirs), span
    m4a = clip("aac_m4a", 3.0)
    assert len(load_clip(m4a, 16000, None, train=False, draw=lambda n: 0, span=(1.0, 2.5))) == 24000
    with pytest.raises(DecodeError, match="after the end of the audio"):
        load_clip(m4a, 16000, None, train=False, draw=lambda n: 0, span=(1.0, 4.0))
