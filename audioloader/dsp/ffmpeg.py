"""Decode through FFmpeg (PyAV): the containers libsndfile cannot open, and any codec when asked.

Which decoder reads a clip is the *backend* (``Source(decoder=...)``):

* ``"auto"`` (default): the container is sniffed from the first bytes (magic numbers, never a
  file name, see `sniff`). MP4/M4A/3GP (AAC, ALAC), Matroska/WebM (Opus, Vorbis, AAC), ASF
  (WMA), ADTS AAC and AMR go to FFmpeg; everything else (WAV, FLAC, Ogg, MP3, AIFF, CAF, ...)
  to libsndfile, exactly as before this backend existed.
* ``"sndfile"``: libsndfile only; a container only FFmpeg reads is a bad row naming the fix.
* ``"ffmpeg"``: FFmpeg for every row.

The backend is part of the data's identity: the same bytes decode to the same samples for a
given backend (tests/test_ffmpeg.py pins a hash of the decoded samples per codec and
backend), and a checkpoint records a backend other than ``"auto"``.

What FFmpeg gives, and what this module adds:

* Samples as float32 in ``[-1, 1]``, scaled as libsndfile scales them (int16 / 2**15,
  int32 / 2**31): for 16-bit FLAC and WAV the two backends give the same samples, bit for bit.
* Encoder delay (priming samples) is removed by FFmpeg itself: the MP4 edit list and
  iTunSMPB for AAC, the Opus pre-skip (Ogg) and CodecDelay (Matroska), LAME's gapless
  header for MP3. The padding after the last AAC frame is not (FFmpeg decodes whole
  frames): the decode is cut to the duration the container declares (the edit list),
  so an AAC clip has the length of the signal that was encoded.
* The crop window alone is decoded (seek, then the frames that cover it) where the
  container has an exact length and FFmpeg seeks to the exact frame: FLAC and PCM WAV.
  AAC, Opus, MP3 and the rest are decoded whole, as the libsndfile path does for
  MP3 and Opus. Both ways give the same crop (tested).
* Errors become `DecodeError`; without PyAV, a row that needs it is a bad row whose
  reason names the extra (``pip install "audioloader-arrow[ffmpeg]"``). PyAV is
  imported on the first row that needs it, so the library works without it.

Like the rest of ``dsp``, this works on a clip's bytes in memory; nothing is opened by name.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DecodeError
from .clip import (
    AudioInfo,
    Timer,
    crop_offset,
    cut_window,
    fit,
    mixdown,
    resample,
    resampled_length,
    segment_for_window,
)
from .spans import Span, span_frames

#: The backends a source can decode with (``Source(decoder=...)``).
BACKENDS = ("auto", "sndfile", "ffmpeg")

#: How to install the FFmpeg backend (named by every error that needs it).
INSTALL_HINT = 'pip install "audioloader-arrow[ffmpeg]"'

#: Containers that `sniff` recognises and only FFmpeg decodes: ``"auto"`` sends them to FFmpeg.
FFMPEG_CONTAINERS = frozenset({"mp4", "matroska", "asf", "adts", "amr"})

#: What the containers usually hold, for messages.
_DESCRIPTION = {"mp4": "MP4/M4A (AAC or ALAC)", "matroska": "Matroska/WebM (Opus, Vorbis or AAC)",
                "asf": "ASF (WMA)", "adts": "ADTS AAC", "amr": "AMR"}

#: Codecs whose stream length FFmpeg knows exactly and whose frames decode independently after a seek,
#: so the crop window alone is decoded (`_window`).
_WINDOW_CODECS = frozenset({"flac", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_u8", "pcm_s16be",
                            "pcm_s24be", "pcm_s32be", "pcm_f32be", "pcm_f64le"})

#: The scale that makes each of FFmpeg's sample types float in [-1, 1], as libsndfile scales integers
#: (u8 is offset by 128 first).
_SCALE = {np.int16: 1 / 32768, np.int32: 1 / 2 ** 31, np.uint8: 1 / 128, np.float32: 1, np.float64: 1}

#: numpy's type of each of FFmpeg's sample formats (the planar ones end in "p").
_SAMPLE_TYPES = {"s16": np.int16, "s32": np.int32, "u8": np.uint8, "flt": np.float32, "dbl": np.float64}

#: `av.open`'s options: the bytes FFmpeg reads to find the streams' parameters (see `_Clip`).
_OPEN_OPTIONS = {"probesize": "4096"}

_ISO_BRANDS = (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip")


def sniff(data: Any) -> str:
    """The container of encoded audio from its first bytes: ``"wav"``, ``"flac"``, ``"ogg"``, ``"mp3"``,
    ``"aiff"``, ``"caf"``, ``"mp4"``, ``"matroska"``, ``"asf"``, ``"adts"``, ``"amr"``, or ``"unknown"``.

    Magic numbers only (no file name): RIFF/RF64 + WAVE, ``fLaC``, ``OggS``, FORM + AIFF/AIFC,
    ``caff``, an ISO box (``ftyp``, ``moov``, ...) at byte 4, the EBML header ``1A 45 DF A3``,
    the ASF header GUID, ``#!AMR``, and MPEG sync words (layer 0 is ADTS AAC, layers 1-3 MPEG
    audio), after an ID3v2 tag if there is one.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        return "unknown"
    head = bytes(view[:64])
    if len(head) >= 12 and head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"caff":
        return "caf"
    if head[4:8] in _ISO_BRANDS:
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:16] == bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c"):
        return "asf"
    if head[:5] == b"#!AMR":
        return "amr"
    start = 0
    if head[:3] == b"ID3" and len(head) >= 10:  # an ID3v2 tag: its size is 4 syncsafe bytes
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
        start = 10 + size + (10 if head[5] & 0x10 else 0)
        if start + 2 > view.nbytes:
            return "mp3"
    sync = bytes(view[start:start + 2])
    if len(sync) == 2 and sync[0] == 0xFF and sync[1] & 0xE0 == 0xE0:
        return "adts" if sync[1] & 0x06 == 0 else "mp3"
    return "mp3" if start else "unknown"


def route(data: Any, backend: str) -> str:
    """The decoder of these bytes under ``backend``: ``"sndfile"`` or ``"ffmpeg"``.

    Raises `DecodeError` naming the fix when ``backend="sndfile"`` meets a container only FFmpeg reads.
    """
    if backend == "ffmpeg":
        return "ffmpeg"
    container = sniff(data) if data is not None else "unknown"
    if container not in FFMPEG_CONTAINERS:
        return "sndfile"
    if backend == "sndfile":
        reason = (f"{_DESCRIPTION[container]} audio: libsndfile cannot decode it and this source decodes with "
                  "decoder='sndfile'; use Source(decoder='auto') or 'ffmpeg' (FFmpeg through PyAV)")
        raise DecodeError(reason, reason=reason)
    return "ffmpeg"


def _error(reason: str) -> DecodeError:
    return DecodeError(reason, reason=reason)


def _av(data: Any) -> Any:
    """PyAV, or a `DecodeError` naming the extra to install."""
    av = sys.modules.get("av")  # imported by an earlier clip
    if av is not None:
        return av
    try:
        import av
    except ImportError as error:
        container = sniff(data)
        what = f"{_DESCRIPTION[container]} audio" if container in _DESCRIPTION else "decoding with FFmpeg"
        raise _error(f"{what} needs FFmpeg through PyAV, which is not installed: {INSTALL_HINT}") from error
    return av


def _view(data: Any) -> memoryview:
    if data is None:
        raise _error("audio is null")
    try:
        view = memoryview(data)
        view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except TypeError:
        raise _error(f"audio is a {type(data).__name__}, expected bytes") from None
    if view.nbytes == 0:
        raise _error("audio is empty (0 bytes)")
    return view


class _Clip:
    """An opened container and its first audio stream (a context manager)."""

    def __init__(self, data: Any) -> None:
        view = _view(data)
        self.av = _av(data)
        self.nbytes = view.nbytes
        try:
            # A small probe: FFmpeg otherwise reads and decodes up to 5 MB to find the stream's parameters, 120 ms
            # for 10 s of 44.1 kHz stereo WAV (0.7 ms with 4 KB; every container here has them in its header), and
            # with 16 KB, reading a 16 kHz WAV's packets took 40x as long as with 4 KB (measured, not explained).
            self.container = self.av.open(io.BytesIO(view), mode="r", options=_OPEN_OPTIONS)
        except (self.av.FFmpegError, ValueError, OSError) as error:
            raise _error(f"cannot open audio with FFmpeg ({view.nbytes} bytes): {_message(error)}") from error
        if not self.container.streams.audio:
            self.container.close()
            raise _error("no audio stream in the container (FFmpeg)")
        self.stream = self.container.streams.audio[0]
        context = self.stream.codec_context
        self.rate = int(context.sample_rate or 0)
        self.codec = context.name
        if self.rate <= 0:
            self.container.close()
            raise _error(f"invalid header: sample rate {self.rate} ({self.codec}, FFmpeg)")

    def __enter__(self) -> _Clip:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.container.close()

    def declared_frames(self) -> int | None:
        """The stream's length in samples as the container declares it (None when it does not, or not in samples)."""
        stream = self.stream
        if stream.duration is None or stream.duration <= 0 or stream.time_base is None:
            return None
        if stream.time_base.numerator != 1 or stream.time_base.denominator != self.rate:
            return None
        return int(stream.duration)

    def _seek(self, first: int) -> None:
        """Seek to a frame at or before sample ``first``. FFmpeg 8's FLAC demuxer fails (EPERM) on some targets in
        the last frames of a stream (a binary search by frame headers that runs off the end); an earlier target
        then lands before them, and the frames up to ``first`` are decoded and cut off by their timestamps."""
        for back in (0, self.rate, 16 * self.rate):
            try:
                self.container.seek(max(0, first - back), stream=self.stream, backward=True, any_frame=False)
                return
            except (self.av.FFmpegError, OSError):
                if first - back <= 0:
                    raise
        self.container.seek(0, stream=self.stream, backward=True, any_frame=False)

    def rewind(self) -> None:
        """Back to the first frame (after a window that could not be used)."""
        try:
            self.container.seek(0, stream=self.stream, backward=True)
        except self.av.FFmpegError as error:
            raise _error(f"cannot seek in audio with FFmpeg: {_message(error)}") from error

    def frames(self, first: int | None = None) -> Any:
        """Decoded frames as ``(pts, samples [n, channels])`` (FFmpeg's sample type, see `_to_float`); from the
        frame holding sample ``first`` (a seek) when given."""
        av = self.av
        try:
            if first is not None:
                self._seek(first)
            # Packet by packet: 4x faster than ``container.decode(stream)`` on a 16 kHz WAV (2.3 vs 10 ms, PyAV 18).
            frames = (frame for packet in self.container.demux(self.stream) for frame in packet.decode())
            for frame in frames:
                if frame.sample_rate != self.rate:
                    raise _error(f"the sample rate changes inside the stream ({self.rate} -> {frame.sample_rate} Hz)")
                yield frame.pts, _samples(frame)
        except av.FFmpegError as error:
            raise _error(f"cannot decode audio with FFmpeg (truncated or corrupt?): {_message(error)}") from error


def _message(error: BaseException) -> str:
    return (getattr(error, "strerror", None) or str(error)).strip().rstrip(".")


def _samples(frame: Any) -> np.ndarray:
    """One decoded frame's samples ``[n, channels]`` in FFmpeg's own sample type (converted once per clip,
    by `_to_float`: one conversion of the whole clip instead of one per frame of ~1,000 samples).

    Read from the frame's planes with ``np.frombuffer`` (views, copied once by the caller's concatenation):
    PyAV's ``to_ndarray`` stacks them with ``np.vstack``, which took as long as FFmpeg's decoding of the frame
    (16 kHz FLAC, profiled).
    """
    kind = _SAMPLE_TYPES.get(frame.format.name.rstrip("p"))
    if kind is None:
        raise _error(f"unsupported sample format {frame.format.name!r} from FFmpeg")
    channels, samples = len(frame.layout.channels), frame.samples
    if not frame.format.is_planar:
        return np.frombuffer(frame.planes[0], kind, count=samples * channels).reshape(samples, channels)
    return np.stack([np.frombuffer(plane, kind, count=samples) for plane in frame.planes[:channels]], axis=1)


def _to_float(array: np.ndarray) -> np.ndarray:
    """Samples as float32 in [-1, 1], integers scaled as libsndfile scales them."""
    kind = array.dtype.type
    out = array.astype(np.float32)  # a copy: ``array`` may be a view of the decoder's last frame
    if kind is np.uint8:
        out -= np.float32(128)
    if _SCALE[kind] != 1:
        out *= np.float32(_SCALE[kind])
    return out


def read_all(data: Any) -> tuple[np.ndarray, int]:
    """Decode every frame with FFmpeg: ``(float32 [n, channels], sample_rate)``. Raises `DecodeError`."""
    with _Clip(data) as clip:
        return _read_all(clip), clip.rate


def _read_all(clip: _Clip) -> np.ndarray:
    parts = [samples for _, samples in clip.frames()]
    channels = {part.shape[1] for part in parts}
    if len(channels) > 1:
        raise _error(f"the channel count changes inside the stream ({sorted(channels)}, FFmpeg)")
    if not parts:
        raise _error(f"audio has no samples ({clip.codec}, {clip.rate} Hz, FFmpeg)")
    frames = _to_float(np.concatenate(parts) if len(parts) > 1 else parts[0])
    declared = clip.declared_frames()
    if declared is not None and len(frames) > declared:
        frames = frames[:declared]  # the padding after an AAC stream's last frame (the edit list's duration)
    elif declared is not None and len(frames) < declared and clip.codec in _WINDOW_CODECS:
        # FFmpeg decodes what is there of a truncated FLAC or WAV; libsndfile refuses it, and so do we.
        raise _error(f"audio is truncated: the header announces {declared} frames but {len(frames)} decode (FFmpeg)")
    return frames


def _window(clip: _Clip, info: AudioInfo, target_rate: int, offset: int, clip_samples: int) -> np.ndarray | None:
    """Only the source frames of the crop window, resampled and cut: float32 ``[clip_samples]``, or None
    when the frames FFmpeg returned cannot be trusted (the caller then decodes everything)."""
    # A truncated file must fail here as on the full path: its last frame must decode.
    last = None
    for pts, samples in clip.frames(info.frames - 1):
        last = (pts, samples)
    if last is None or last[0] is None or last[0] + len(last[1]) != info.frames:
        raise _error(f"audio is truncated: the header announces {info.frames} frames but fewer decode (FFmpeg)")
    segment = segment_for_window(info, target_rate, offset, clip_samples)
    parts, position = [], None
    for pts, samples in clip.frames(segment.start):
        if pts is None:
            return None
        if position is None:
            if pts > segment.start:
                return None  # the seek landed after the segment: not exact
            position = pts
        elif pts != position:
            return None  # a gap or an overlap between frames
        parts.append(samples)
        position += len(samples)
        if position >= segment.stop:
            break
    if position is None or position < segment.stop:
        return None
    frames = np.concatenate(parts) if len(parts) > 1 else parts[0]
    first = position - len(frames)
    frames = _to_float(frames[segment.start - first:segment.stop - first])
    part = resample(mixdown(frames), info.sample_rate, target_rate)
    window = cut_window(part, segment, info, target_rate, offset, clip_samples)
    return None if window is None else np.ascontiguousarray(window)


def load_clip(data: Any, target_rate: int, clip_samples: int | None, *, train: bool,
              draw: Callable[[int], int], window: bool = True, timer: Timer | None = None,
              pad: bool = True, span: Span | None = None) -> np.ndarray:
    """`audioloader.dsp.audio.load_clip` through FFmpeg: float32 mono ``[clip_samples]`` at ``target_rate`` Hz.

    Decode (the crop window alone for FLAC and PCM WAV, else every frame), mix down, resample
    with soxr, crop or pad: the same steps and arithmetic as the libsndfile path. Raises `DecodeError`.
    """
    start = time.perf_counter()
    with _Clip(data) as clip:
        declared = clip.declared_frames()
        if (window and clip_samples is not None and span is None and declared
                and clip.codec in _WINDOW_CODECS):
            info = AudioInfo(declared, clip.rate, len(clip.stream.layout.channels), clip.container.format.name,
                             clip.codec)
            length = resampled_length(declared, clip.rate, target_rate)
            if length > clip_samples:
                offset = crop_offset(length, clip_samples, train=train, draw=draw)
                out = _window(clip, info, target_rate, offset, clip_samples)
                if out is not None:
                    _stage(timer, "decode", start)
                    return out
                clip.rewind()
        frames = _read_all(clip)
        rate = clip.rate
    if span is not None:
        first, stop = span_frames(span, rate, len(frames))
        frames = frames[first:stop]
    mono = mixdown(frames)
    start = _stage(timer, "decode", start)
    signal = resample(mono, rate, target_rate)
    _stage(timer, "resample", start)
    if len(signal) == 0:
        raise _error(f"audio has no samples ({clip.codec}, {rate} Hz, FFmpeg)")
    if clip_samples is None:
        return signal
    offset = crop_offset(len(signal), clip_samples, train=train, draw=draw)
    return fit(signal, clip_samples, offset, train=train, pad=pad)


def _stage(timer: Timer | None, stage: str, start: float) -> float:
    now = time.perf_counter()
    if timer is not None:
        timer(stage, now - start)
    return now


def probe_seconds(data: Any) -> float:
    """Duration in seconds from the container's header through FFmpeg (an estimate for some formats;
    no decoding). Raises `DecodeError`."""
    with _Clip(data) as clip:
        declared = clip.declared_frames()
        if declared is not None:
            return declared / clip.rate
        stream = clip.stream
        if stream.duration is not None and stream.duration > 0 and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
        if clip.container.duration is not None and clip.container.duration > 0:
            return clip.container.duration / 1_000_000  # AV_TIME_BASE
        return _read_all(clip).shape[0] / clip.rate  # no duration in the header (WebM): decode to count
