"""Decode, mix down, resample and crop one clip of encoded audio.

Everything here works on one clip's encoded bytes and returns float32 numpy
arrays of mono samples at the target rate, values in the codec's range
(``[-1, 1]`` for PCM). There are two ways to get a crop of ``clip_samples``
samples and they agree to ~1e-6 (tested to 1e-4):

* **full**: decode every frame (soundfile), mix down to mono (mean of the
  channels), resample the whole signal with soxr (HQ), then cut the window.
* **window**: read only the header, compute the length ``L`` the full path
  would produce, pick the offset from ``L``, then seek and decode only the
  source frames that the resampler needs for that window (plus a margin),
  resample them and cut. Used for formats whose header frame count is exact
  and whose seeking is sample-exact in libsndfile 1.2.2 (WAV/WAVEX/AIFF with
  PCM/float/u-law/A-law samples, and FLAC); everything else (Ogg/Vorbis,
  Opus, MP3, ...) falls back to the full path. Measured: Ogg/Vorbis and Opus
  seeks land on the wrong samples (errors up to 1.0); MP3 frame counts come
  from an estimate and overshoot for truncated files.

Why the window path matches the full path: soxr's resampler is a linear,
time-invariant polyphase filter for a rational ratio ``u:v`` (source:target,
reduced by their gcd). Output sample ``j`` sits at source time ``j * u / v``,
so a segment that starts at a source frame that is a multiple of ``u`` maps
onto output sample ``(start / u) * v`` exactly, with the same filter phases.
Away from the segment's edges (more than the filter's support) its output
equals the full signal's output up to float rounding; at the real start and
end of the file both see the same edge. The margin is measured: 128 samples
at the lower of the two rates brings the error below 1e-4 for every ratio we
tried; we use 512.

How the bytes reach libsndfile: through one reusable in-memory file (Linux
``memfd``) per thread, so libsndfile reads with ``read(2)`` and never calls back
into Python; soundfile's virtual IO over the buffer (`BufferFile`, zero-copy
but one GIL-holding Python callback per read) is the fallback for very large
clips and non-Linux systems. See `_ThreadMemfd` for the measurements.

Threads: every heavy call (libsndfile, soxr, numpy, torch) runs without the
GIL. The functions are re-entrant across threads but one thread must not nest
them (each thread has one memfd, rewritten per clip).

Errors: anything wrong with the audio itself (not decodable, empty, truncated,
no samples, unsupported codec) raises `DecodeError` whose ``reason`` says what.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import soundfile as sf

from ..errors import DecodeError
from . import ffmpeg
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
    timed,
)
from .headers import flac_seconds, wav_seconds
from .headers import pcm16_wav as _pcm16_wav
from .spans import Span, span_frames

#: Formats whose frame count comes from metadata rather than from the data size,
#: so a truncated file can claim more frames than it holds; the window path
#: checks that the last frame is readable (the full path fails on such files).
_METADATA_LENGTH_FORMATS = frozenset({"FLAC"})

#: Read in blocks (instead of one allocation of the claimed size) when a header
#: claims more float32 samples than this many times the encoded size.
_MAX_CLAIMED_EXPANSION = 64
_BLOCK_FRAMES = 1 << 20




class BufferFile:
    """A read-only, seekable file object over a bytes-like object, without copying it.

    soundfile's virtual IO calls ``readinto`` when the object has it, so libsndfile
    reads straight from the Arrow buffer into its own buffers (one copy, the one
    a decoder always makes). Accepts ``bytes``, ``pyarrow.Buffer``, ``memoryview``
    or anything else with the buffer protocol. Each read is a Python callback that
    takes the GIL; see `_ThreadMemfd` for why it is only the fallback.
    """

    __slots__ = ("_pos", "_size", "_view")

    def __init__(self, data: Any) -> None:
        view = memoryview(data)
        self._view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self._size = self._view.nbytes
        self._pos = 0

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        buffer[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        data = bytes(self._view[self._pos:end])
        self._pos = max(self._pos, end)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._size


# ---------------------------------------------------------------------------
# opening and reading

#: What libsndfile reports when its MP3 decoder finds no audio frames in data that is there (a corrupt or
#: truncated MP3): its "system error", which blames the file rather than the data.
_NOT_A_FILE = "File does not exist or is not a regular file (possibly a pipe?)"


def library_reason(error: Exception) -> str:
    """libsndfile's message without soundfile's "Error opening <object at 0x...>" prefix, and for data that was
    read but cannot be parsed, that rather than libsndfile's "File does not exist or is not a regular file"."""
    text = (getattr(error, "error_string", None) or str(error)).strip()
    if text.endswith(_NOT_A_FILE) or text.endswith(_NOT_A_FILE + "."):
        return "corrupt or truncated audio: libsndfile cannot parse it"
    return text.rstrip(".")


class _ThreadMemfd:
    """One anonymous in-memory file (Linux ``memfd``) per thread, reused for every clip.

    Why not only `BufferFile`: with soundfile's virtual IO, libsndfile calls back
    into Python for every read (~150 calls for 1.4 MB of FLAC), and each call must
    take the GIL. Alone that costs little, but while another thread runs Python
    (a training loop) each re-acquisition waits for the switch interval (5 ms):
    measured 1000 ms instead of 6 ms per 10 s FLAC. From a file descriptor,
    libsndfile reads with ``read(2)`` and never needs the GIL: 25 ms under the same
    load, and as fast as virtual IO without it (one memcpy into the memfd, which
    keeps its pages between clips, replaces the callbacks' copies).
    """

    _close = staticmethod(os.close)  # still reachable from __del__ at interpreter exit

    def __init__(self) -> None:
        self.fd = os.memfd_create("audioloader-clip", os.MFD_CLOEXEC)
        self.pid = os.getpid()

    def load(self, view: memoryview) -> int:
        """Make the file's content exactly ``view``; returns the fd, positioned at 0."""
        os.ftruncate(self.fd, view.nbytes)
        done = 0
        while done < view.nbytes:
            done += os.pwrite(self.fd, view[done:], done)
        os.lseek(self.fd, 0, os.SEEK_SET)
        return self.fd

    def __del__(self) -> None:
        self._close(self.fd)


_HAVE_MEMFD = hasattr(os, "memfd_create")
_THREAD_FILES = threading.local()

#: Clips up to this size are read through the thread's memfd; bigger ones (long
#: recordings, of which the window path reads a small part) through `BufferFile`,
#: so they are not copied whole (16 MB: ~1.5 min of 44.1 kHz stereo FLAC, copied
#: in a few ms). Set to 0 to always use `BufferFile`.
MEMFD_MAX_BYTES = 16 << 20


def _file_for(view: memoryview) -> Any:
    """A file soundfile can open for these bytes: the thread's memfd, or a `BufferFile`."""
    if _HAVE_MEMFD and view.nbytes <= MEMFD_MAX_BYTES:
        memfd = getattr(_THREAD_FILES, "memfd", None)
        if memfd is None or memfd.pid != os.getpid():  # a forked child must not share the parent's
            memfd = _THREAD_FILES.memfd = _ThreadMemfd()
        return memfd.load(view)
    return BufferFile(view)


def _open(data: Any) -> tuple[sf.SoundFile, int]:
    """Open encoded audio; returns the handle and the encoded size in bytes."""
    if data is None:
        raise DecodeError("audio is null", reason="audio is null")
    try:
        view = memoryview(data)
        view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except TypeError:
        reason = f"audio is a {type(data).__name__}, expected bytes"
        raise DecodeError(reason, reason=reason) from None
    if view.nbytes == 0:
        raise DecodeError("audio is empty (0 bytes)", reason="audio is empty (0 bytes)")
    try:
        handle = sf.SoundFile(_file_for(view), closefd=False)
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as error:
        reason = f"cannot open audio ({view.nbytes} bytes): {library_reason(error)}"
        raise DecodeError(reason, reason=reason) from error
    if handle.samplerate <= 0 or handle.channels <= 0:
        handle.close()
        reason = f"invalid header: sample rate {handle.samplerate}, {handle.channels} channels"
        raise DecodeError(reason, reason=reason)
    return handle, view.nbytes


def _info(handle: sf.SoundFile) -> AudioInfo:
    return AudioInfo(frames=int(handle.frames), sample_rate=int(handle.samplerate),
                     channels=int(handle.channels), format=str(handle.format), subtype=str(handle.subtype))


def probe(data: Any) -> AudioInfo:
    """Read only the header of encoded audio. Raises `DecodeError` if it cannot be opened."""
    handle, _ = _open(data)
    with handle:
        return _info(handle)


def _read(handle: sf.SoundFile, frames: int, nbytes: int) -> np.ndarray:
    """Read up to ``frames`` frames (-1: to the end) as float32 ``[n, channels]``."""
    try:
        claimed = handle.frames - handle.tell() if frames < 0 else frames
        if claimed * handle.channels <= _MAX_CLAIMED_EXPANSION * nbytes + _BLOCK_FRAMES:
            return handle.read(frames, dtype="float32", always_2d=True)
        # A header claiming far more samples than the bytes can hold: read in
        # blocks so memory follows what actually decodes, not the claim.
        blocks, left = [], claimed
        while left > 0:
            block = handle.read(min(left, _BLOCK_FRAMES), dtype="float32", always_2d=True)
            if len(block) == 0:
                break
            blocks.append(block)
            left -= len(block)
        return np.concatenate(blocks) if blocks else np.zeros((0, handle.channels), np.float32)
    except (sf.SoundFileError, RuntimeError, ValueError) as error:
        reason = f"cannot decode audio (truncated or corrupt?): {library_reason(error)}"
        raise DecodeError(reason, reason=reason) from error


# ---------------------------------------------------------------------------
# the two paths

def _no_samples(info: AudioInfo) -> DecodeError:
    reason = f"audio has no samples ({info.format}/{info.subtype}, {info.sample_rate} Hz)"
    return DecodeError(reason, reason=reason)


def _truncated(info: AudioInfo) -> DecodeError:
    reason = f"audio is truncated: the header announces {info.frames} frames but fewer decode"
    return DecodeError(reason, reason=reason)


def _seek(handle: sf.SoundFile, frame: int) -> None:
    try:
        handle.seek(frame)
    except (sf.SoundFileError, RuntimeError, ValueError) as error:
        reason = f"cannot seek in audio (truncated or corrupt?): {library_reason(error)}"
        raise DecodeError(reason, reason=reason) from error


def _read_frames(handle: sf.SoundFile, info: AudioInfo, nbytes: int, span: Span | None, seek: bool) -> np.ndarray:
    """Every frame ``[n, channels]``, or only the span's: seeking to it where that is exact (and ``seek``),
    else decoding everything and cutting it out (the reference)."""
    if span is None:
        return _read(handle, -1, nbytes)
    if seek and info.exact_seek:
        first, stop = span_frames(span, info.sample_rate, info.frames)
        _seek(handle, first)
        frames = _read(handle, stop - first, nbytes)
        if len(frames) != stop - first:
            raise _truncated(info)
        return frames
    frames = _read(handle, -1, nbytes)
    first, stop = span_frames(span, info.sample_rate, len(frames))
    return frames[first:stop]


def _decode_all(handle: sf.SoundFile, info: AudioInfo, nbytes: int, target_rate: int,
                timer: Timer | None, start: float, span: Span | None = None, seek: bool = True) -> np.ndarray:
    mono = mixdown(_read_frames(handle, info, nbytes, span, seek))
    if len(mono) == 0:
        raise _no_samples(info)
    start = timed(timer, "decode", start)
    signal = resample(mono, info.sample_rate, target_rate)
    timed(timer, "resample", start)
    if len(signal) == 0:
        raise _no_samples(info)
    return signal


def decode_full(data: Any, target_rate: int, *, timer: Timer | None = None, span: Span | None = None) -> np.ndarray:
    """Decode every frame, mix down, resample: float32 mono ``[L]`` at ``target_rate`` Hz.

    ``span``: only the frames of this segment (see `span_frames`), cut from the whole
    decode before resampling, as if the segment were a file of its own.
    ``L`` is the length every crop offset is drawn from. Raises `DecodeError`.
    """
    start = time.perf_counter()
    handle, nbytes = _open(data)
    with handle:
        return _decode_all(handle, _info(handle), nbytes, target_rate, timer, start, span, seek=False)


def _decode_window(handle: sf.SoundFile, info: AudioInfo, target_rate: int, offset: int,
                   clip_samples: int, nbytes: int, timer: Timer | None, start: float,
                   base: int = 0) -> np.ndarray | None:
    """Decode only the source frames of the window; None when the result cannot be trusted.

    ``base``: the frame where the part of the file the row is (its segment) begins;
    ``info.frames`` is then the segment's length, so the segment is treated as a file of its own.
    """
    if info.format in _METADATA_LENGTH_FORMATS:
        # The full path fails on a truncated FLAC ("lost sync"); make the window
        # path fail too instead of quietly decoding the intact part.
        _seek(handle, base + info.frames - 1)
        if len(_read(handle, 1, nbytes)) != 1:
            raise _truncated(info)
    segment = segment_for_window(info, target_rate, offset, clip_samples)
    _seek(handle, base + segment.start)
    frames = _read(handle, segment.stop - segment.start, nbytes)
    if len(frames) != segment.stop - segment.start:
        raise _truncated(info)
    mono = mixdown(frames)
    start = timed(timer, "decode", start)
    part = resample(mono, info.sample_rate, target_rate)
    timed(timer, "resample", start)
    return cut_window(part, segment, info, target_rate, offset, clip_samples)  # a view of `part`: nothing else holds it


def _load_pcm16_at_rate(pcm: np.ndarray, clip_samples: int, *, train: bool,
                        draw: Callable[[int], int], pad: bool) -> np.ndarray:
    """Crop int16 ``[n, channels]`` already at the target rate: float32 mono ``[clip_samples]``."""
    offset = crop_offset(len(pcm), clip_samples, train=train, draw=draw)
    part = pcm[offset:offset + clip_samples].astype(np.float32)
    part *= np.float32(1 / 32768)  # the scale soundfile uses for PCM16 -> float32
    return fit(mixdown(part), clip_samples, 0, train=train, pad=pad)


def load_clip(data: Any, target_rate: int, clip_samples: int | None, *, train: bool,
              draw: Callable[[int], int], window: bool = True, timer: Timer | None = None,
              pad: bool = True, span: Span | None = None, backend: str = "auto") -> np.ndarray:
    """Decode encoded audio into one crop: float32 mono ``[clip_samples]`` at ``target_rate`` Hz.

    Args:
        data: encoded bytes (``bytes``, ``pyarrow.Buffer``, ``memoryview``, ...).
        target_rate: output sample rate in Hz.
        clip_samples: crop length in output samples; ``None``: the whole signal.
        train: random crop (``draw``) and end padding, else centre crop and centred padding.
        draw: ``draw(n) -> int in [0, n)``, the seeded crop offset (used in train mode).
        window: decode only the crop window where the format allows; False always
            decodes everything (the reference path). Both give the same crop.
        timer: ``timer(stage, seconds)`` receives the time of the "decode" and
            "resample" stages.
        pad: False returns a signal shorter than ``clip_samples`` whole, unpadded
            (whole utterances cut to a maximum length).
        span: ``(start, end)`` seconds: the row is this segment of the audio (see
            `span_frames`), resampled and cropped as if it were a file of its own.
            Where the format seeks exactly (WAV, FLAC, AIFF) only the segment is
            decoded (or only the crop window inside it); elsewhere the whole audio.
        backend: the decoder: ``"auto"`` (containers only FFmpeg reads go to FFmpeg, the rest to
            libsndfile), ``"sndfile"`` or ``"ffmpeg"`` (see `audioloader.dsp.ffmpeg`).

    Raises:
        DecodeError: the audio cannot be decoded, or the span lies outside it; ``.reason`` says why.
    """
    start = time.perf_counter()
    wav = _pcm16_wav(data) if window and data is not None and backend != "ffmpeg" else None
    if wav is not None and wav[1] == target_rate:
        pcm = wav[0]
        if span is not None:
            first, stop = span_frames(span, target_rate, len(pcm))
            pcm = pcm[first:stop]
        clip = _load_pcm16_at_rate(pcm, len(pcm) if clip_samples is None else clip_samples, train=train,
                                   draw=draw, pad=pad)
        timed(timer, "decode", start)
        return clip
    # after the PCM16 path: sniffing costs ~10 us, a tenth of that path
    if data is not None and ffmpeg.route(data, backend) == "ffmpeg":
        return ffmpeg.load_clip(data, target_rate, clip_samples, train=train, draw=draw, window=window,
                                timer=timer, pad=pad, span=span)
    handle, nbytes = _open(data)
    with handle:
        info = _info(handle)
        if window and info.exact_seek and clip_samples is not None:
            base, part = 0, info
            if span is not None:
                base, stop = span_frames(span, info.sample_rate, info.frames)
                part = dataclasses.replace(info, frames=stop - base)
            length = resampled_length(part.frames, info.sample_rate, target_rate)
            if length > clip_samples:
                offset = crop_offset(length, clip_samples, train=train, draw=draw)
                out = _decode_window(handle, part, target_rate, offset, clip_samples, nbytes, timer, start, base)
                if out is not None:
                    return out
                _seek(handle, 0)
                start = time.perf_counter()
        signal = _decode_all(handle, info, nbytes, target_rate, timer, start, span, seek=window)
    if clip_samples is None:
        return signal
    offset = crop_offset(len(signal), clip_samples, train=train, draw=draw)
    return fit(signal, clip_samples, offset, train=train, pad=pad)


# ---------------------------------------------------------------------------
# duration from the header, without decoding

def probe_seconds(data: Any) -> float:
    """Duration of encoded audio in seconds, from its header (no decoding).

    WAV and FLAC headers are parsed directly (microseconds); other formats
    through libsndfile's header (an estimate for MP3). Used to batch rows by
    duration before they are decoded. Raises `DecodeError` if the audio cannot
    be opened.
    """
    if data is None:
        raise DecodeError("audio is null", reason="audio is null")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        view = None
    if view is not None and view.nbytes >= 12:
        head = bytes(view[:4])
        seconds = None
        if head == b"RIFF" and bytes(view[8:12]) == b"WAVE":
            seconds = wav_seconds(view)
        elif head == b"fLaC":
            seconds = flac_seconds(view)
        if seconds is not None:
            return seconds
        if ffmpeg.route(data, "auto") == "ffmpeg":
            return ffmpeg.probe_seconds(data)
    info = probe(data)
    return info.frames / info.sample_rate


def span_seconds(span: Span, data: Any) -> float:
    """Seconds of the segment ``span`` of encoded audio ``data``: ``end - start``, from the header when
    ``end`` is None (no decoding). An approximation for batching; the decode checks the segment."""
    start, end = span
    if end is None:
        return max(probe_seconds(data) - (start or 0.0), 0.0)
    return max(end - (start or 0.0), 0.0)
