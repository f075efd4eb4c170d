"""Encoded-audio headers read by hand: WAV and FLAC durations, and zero-copy 16-bit PCM WAV samples.

These parsers need no libsndfile handle, so they cost microseconds: a WAV's fmt and data
chunks, a FLAC's STREAMINFO block. Anything they do not recognise returns None and
the caller goes through soundfile (`audioloader.dsp.audio`), which also reports errors.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

# WAV format codes (the fmt chunk's first field) for the PCM16 fast path.
_WAVE_FORMAT_PCM = 1
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE


def pcm16_wav(data: Any) -> tuple[np.ndarray, int] | None:
    """``(int16 frames [n, channels], sample_rate)`` of a plain 16-bit PCM WAV, zero-copy; else None.

    Shards packed for speed (``audioloader pack --codec pcm16 --sample-rate R``)
    hold exactly this. Walking the RIFF chunks and viewing the samples with
    numpy costs ~50 us per 10 s clip against ~300 us for opening it with
    libsndfile (a copy into the memfd, handle set-up, seek and read, much of it
    holding the GIL). Anything else (other codecs or bit depths, a truncated
    file, RF64) returns None and goes through soundfile, which also reports errors.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        return None
    if view.nbytes < 44 or view[0:4] != b"RIFF" or view[8:12] != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= view.nbytes:
        tag, size = bytes(view[pos:pos + 4]), struct.unpack_from("<I", view, pos + 4)[0]
        body = pos + 8
        if tag == b"fmt " and size >= 16:
            code, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", view, body)
            if code == _WAVE_FORMAT_EXTENSIBLE and size >= 40:
                code = struct.unpack_from("<H", view, body + 24)[0]  # the sub-format GUID starts with the code
            fmt = (code, channels, rate, align, bits)
        elif tag == b"data":
            if fmt is None or fmt[0] != _WAVE_FORMAT_PCM or fmt[4] != 16 or fmt[1] < 1 or fmt[3] != 2 * fmt[1]:
                return None
            if body + size > view.nbytes or size < fmt[3]:
                return None  # truncated or empty: soundfile reports it
            frames = size // fmt[3]
            pcm = np.frombuffer(view, dtype="<i2", count=frames * fmt[1], offset=body)
            return pcm.reshape(frames, fmt[1]), fmt[2]
        pos = body + size + (size & 1)
    return None


def wav_seconds(view: memoryview) -> float | None:
    """Seconds of a RIFF/WAVE file from its fmt and data chunks, or None."""
    pos, rate, align = 12, None, None
    while pos + 8 <= view.nbytes:
        tag, size = bytes(view[pos:pos + 4]), struct.unpack_from("<I", view, pos + 4)[0]
        if tag == b"fmt " and size >= 16:
            _, _, rate, _, align, _ = struct.unpack_from("<HHIIHH", view, pos + 8)
        elif tag == b"data":
            if not rate or not align:
                return None
            size = min(size, view.nbytes - pos - 8)  # a truncated file: what is there
            return (size // align) / rate
        pos += 8 + size + (size & 1)
    return None


def flac_seconds(view: memoryview) -> float | None:
    """Seconds of a FLAC stream from its STREAMINFO block, or None (unknown total)."""
    if view.nbytes < 42 or view[4] & 0x7F != 0:  # the first metadata block must be STREAMINFO
        return None
    info = bytes(view[8 + 10:8 + 18])  # sample rate (20 bits), channels, bits, total samples (36 bits)
    packed = int.from_bytes(info, "big")
    rate = packed >> 44
    total = packed & ((1 << 36) - 1)
    return total / rate if rate and total else None
