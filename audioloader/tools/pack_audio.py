"""What ``audioloader pack`` stores for one row: the file's own bytes, a re-encoding, or a segment cut from it.

- A whole file, no codec: its bytes, untouched; its duration from its header.
- A whole file with a codec / sample rate: decoded, mixed to mono, resampled (soxr),
  encoded as 16-bit FLAC or WAV (`reencode`).
- A segment ``[start, end)`` of a recording: only the frames
  ``[round(start * rate), round(end * rate))`` are stored, as a clip of their own
  (`cut_segment`). WAV, FLAC and AIFF recordings are read by seeking to the segment
  and written back in the same container and sample format: the stored samples are
  the recording's, bit for bit, and the segment costs its own length on disk, not
  the recording's. Other formats (MP3, Ogg, Opus, ...) cannot be cut without
  re-encoding: the recording is decoded once per pack thread and each segment is
  stored as FLAC (16-bit for lossy sources). With a codec the segment is re-encoded
  like a whole file.

A row that cannot be used comes back as `Skipped` (counted in the summary);
a segment whose times do not fit its recording raises `InputRowError`, naming
the manifest line: that is a mistake in the manifest, not in the audio.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from audioloader.dsp.audio import (
    decode_full,
    library_reason,
    mixdown,
    probe,
    probe_seconds,
)
from audioloader.dsp.clip import EXACT_SEEK_FORMATS, EXACT_SEEK_SUBTYPES
from audioloader.dsp.spans import span_frames
from audioloader.errors import DecodeError

from .input_lists import Entry
from .remote_files import RemoteFile, fetch

__all__ = ["CODECS", "InputRowError", "Packed", "Skipped", "cut_segment", "forget_decoded", "load_entry", "reencode"]

#: Re-encoding targets: lossless FLAC (16 bit) or WAV PCM16.
CODECS = ("flac", "pcm16")
#: Sample formats a cut of a non-seekable recording keeps in FLAC; anything else becomes 16 bit.
_FLAC_SUBTYPES = frozenset({"PCM_S8", "PCM_16", "PCM_24"})


class InputRowError(ValueError):
    """A row of the input is wrong (e.g. a segment past the end of its recording); the message names it."""


@dataclass(frozen=True)
class Packed:
    """The bytes stored for a row and their duration in seconds (from the header)."""

    data: bytes
    seconds: float


@dataclass(frozen=True)
class Skipped:
    """A row left out: ``reason`` is the summary's category, ``detail`` names the file and the cause."""

    reason: str
    detail: str


class _Unusable(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def load_entry(entry: Entry, sample_rate: int | None, codec: str | None, verify: bool = False) -> Packed | Skipped:
    """The bytes to store for ``entry``, or why it is left out (see the module docstring). A file stored as it is
    is checked by its header only, unless ``verify``: then every frame is decoded, as the loader will (a truncated
    FLAC has a good header); a re-encoded or cut row is decoded anyway."""
    try:
        if isinstance(entry.file, RemoteFile):  # read once, then decoded from memory like a local file
            entry = replace(entry, file=_Fetched(str(entry.file), _read_bytes(entry.file)))
        if entry.span is not None:
            data = cut_segment(entry, sample_rate, codec)
        elif codec is not None:
            data = _reencoded(entry.file, sample_rate, codec)
        else:
            data = _read_bytes(entry.file)
            if verify:
                _decodes(entry.file, data)
        seconds = _seconds(entry.file, data)
    except _Unusable as error:
        return Skipped(error.reason, f"{entry.where}: {error.detail}" if entry.where != entry.rel else error.detail)
    return Packed(data, seconds)


class _Fetched:
    """A remote file's bytes, read; ``str()`` is its URL (without query string) for messages."""

    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.data = name, data

    def __str__(self) -> str:
        return self.name


def _opened(file: Path | _Fetched) -> str | io.BytesIO:
    """What soundfile opens: a local path, or the fetched bytes."""
    return io.BytesIO(file.data) if isinstance(file, _Fetched) else str(file)


def _read_bytes(file: Path | RemoteFile | _Fetched) -> bytes:
    try:
        if isinstance(file, _Fetched):
            return file.data
        return fetch(file) if isinstance(file, RemoteFile) else file.read_bytes()
    except FileNotFoundError as error:
        if isinstance(file, RemoteFile):
            raise _Unusable("missing file", f"{file}: no such object") from error
        raise _Unusable("unreadable file", f"{file}: {error.strerror or error}") from error
    except OSError as error:
        raise _Unusable("unreadable file", f"{file}: {error.strerror or error}") from error


def _decodes(file: Path, data: bytes) -> None:
    """Decode every frame of ``data`` with the loader's decoder (at its own rate: nothing resampled)."""
    try:
        decode_full(data, probe(data).sample_rate)
    except DecodeError as error:
        raise _Unusable("undecodable", f"{file}: {error.reason or error}") from error


def _seconds(file: Path, data: bytes) -> float:
    try:
        seconds = probe_seconds(data)
    except DecodeError as error:
        raise _Unusable("undecodable", f"{file}: {error.reason or error}") from error
    if seconds <= 0:
        raise _Unusable("no audio frames", f"{file}: the audio is empty (0 s)")
    return seconds


# -- re-encoding ---------------------------------------------------------------------------------------


def _encode(signal: np.ndarray, rate: int, sample_rate: int | None, codec: str) -> bytes:
    """Mix ``signal`` (float ``[n]`` or ``[n, channels]``) to mono, resample to ``sample_rate``, encode as ``codec``."""
    # The loader's own mixdown (column adds: numpy's mean over a 2-wide axis was half of a re-encode's time).
    mono = mixdown(signal.reshape(len(signal), -1).astype(np.float32, copy=False))
    if sample_rate is not None and rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate)
        rate = sample_rate
    # Resampling can overshoot full scale; integer PCM would wrap around, so clip.
    mono = np.clip(mono, -1.0, 1.0)
    buf = io.BytesIO()
    sf.write(buf, mono, rate, format="FLAC" if codec == "flac" else "WAV", subtype="PCM_16")
    return buf.getvalue()


def reencode(path: str | os.PathLike[str], sample_rate: int | None, codec: str) -> bytes:
    """Decode ``path``, mix to mono, resample to ``sample_rate`` Hz (``None``: keep), encode.

    Args:
        path: an audio file soundfile can read.
        sample_rate: target rate in Hz, or ``None`` to keep the file's rate.
        codec: ``"flac"`` (FLAC, 16 bit) or ``"pcm16"`` (WAV, 16-bit PCM).

    Returns:
        The encoded bytes.

    Raises:
        ValueError: the file cannot be decoded or has no audio frames (the message names it).
    """
    try:
        return _reencoded(Path(path), sample_rate, codec)
    except _Unusable as error:
        raise ValueError(f"cannot re-encode: {error.detail}") from error


def _reencoded(file: Path, sample_rate: int | None, codec: str) -> bytes:
    signal, rate = _decode(file)
    if signal.shape[0] == 0:
        raise _Unusable("no audio frames", f"{file}: the audio is empty (0 frames)")
    return _encode(signal, rate, sample_rate, codec)


def _decode(file: Path) -> tuple[np.ndarray, int]:
    """All frames of ``file``, float32 ``[n, channels]``, and its rate."""
    try:
        return sf.read(_opened(file), dtype="float32", always_2d=True)
    except Exception as error:  # libsndfile raises LibsndfileError/RuntimeError/TypeError by file type
        raise _undecodable(file, "cannot decode", error) from error


def _undecodable(file: Path, what: str, error: Exception) -> _Unusable:
    """Why ``file`` could not be opened or read: the OS's reason when it is not there, else the decoder's (for a
    corrupt MP3 libsndfile says "File does not exist or is not a regular file": `library_reason` says what it is)."""
    if isinstance(file, Path) and not file.is_file():  # (a remote file's bytes are already read)
        return _Unusable("unreadable file", f"{file}: {what}: the file is gone or not a regular file")
    return _Unusable("undecodable", f"{file}: {what}: {library_reason(error)}")


# -- segments ------------------------------------------------------------------------------------------


def cut_segment(entry: Entry, sample_rate: int | None, codec: str | None) -> bytes:
    """The frames of ``entry.span`` of its recording, encoded as a clip of their own (see the module docstring).

    Raises:
        InputRowError: the segment does not fit the recording (naming the manifest line).
    """
    try:
        info = sf.info(_opened(entry.file))
    except Exception as error:
        raise _undecodable(entry.file, "cannot open", error) from error
    if info.format in EXACT_SEEK_FORMATS and info.subtype in EXACT_SEEK_SUBTYPES and info.frames > 0:
        first, stop = _frames(entry, info.samplerate, info.frames)
        try:
            with sf.SoundFile(_opened(entry.file)) as handle:
                handle.seek(first)
                # float64 holds every PCM sample (up to 32 bit) and float exactly: written back unchanged.
                frames = handle.read(stop - first, dtype="float64", always_2d=True)
        except Exception as error:
            raise _undecodable(entry.file, "cannot read the segment", error) from error
        if len(frames) != stop - first:
            raise _Unusable("undecodable", f"{entry.file}: truncated: the segment's frames do not all decode")
        container, subtype, rate = info.format, info.subtype, info.samplerate
    else:
        signal, rate = _decoded_once(entry.file)
        first, stop = _frames(entry, rate, len(signal))
        frames = signal[first:stop]
        container, subtype = "FLAC", info.subtype if info.subtype in _FLAC_SUBTYPES else "PCM_16"
        frames = np.clip(frames, -1.0, 1.0) if subtype == "PCM_16" else frames
    if codec is not None:
        return _encode(frames, rate, sample_rate, codec)
    buf = io.BytesIO()
    sf.write(buf, frames, rate, format=container, subtype=subtype)
    return buf.getvalue()


def _frames(entry: Entry, rate: int, frames: int) -> tuple[int, int]:
    try:
        return span_frames(entry.span, rate, frames)
    except DecodeError as error:
        raise InputRowError(f"{entry.where}: {error.reason} of {entry.file} ({frames / rate:.3f} s long); fix the "
                            "segment's times or drop the row") from None


_LAST = threading.local()


def _decoded_once(file: Path) -> tuple[np.ndarray, int]:
    """The whole recording, decoded once per thread for its consecutive segments (formats that cannot seek
    exactly). Holds one decoded recording per pack thread (float32: 4 bytes x channels x frames)."""
    stamp = (str(file), None if isinstance(file, _Fetched) else file.stat().st_mtime_ns)
    if getattr(_LAST, "stamp", None) != stamp:
        _LAST.stamp, _LAST.value = None, None  # release the previous recording before decoding the next
        _LAST.value = _decode(file)
        _LAST.stamp = stamp
    return _LAST.value


def forget_decoded() -> None:
    """Drop this thread's decoded recording (pack calls it when done: with one worker that is the caller's thread)."""
    _LAST.stamp, _LAST.value = None, None
