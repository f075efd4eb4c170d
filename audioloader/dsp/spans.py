"""Segments of a row's audio: which source frames a ``(start, end)`` window in seconds is.

A row may be one segment of a longer recording (``start``/``end`` columns, see
`audioloader.dsp.config.Segments`): its sample is then made from those frames
alone, as if they were a file of their own (`audioloader.dsp.audio.load_clip`).
"""

from __future__ import annotations

import math

from ..errors import DecodeError

#: A segment of a row's audio: ``(start, end)`` in seconds from its beginning; None: the beginning / the end.
Span = tuple[float | None, float | None]

#: A segment may end up to this many seconds after its audio (manifests round times, often
#: to 10 ms): it then ends with the audio. Further is an error.
SEGMENT_END_TOLERANCE_S = 0.01


def _bad_span(reason: str) -> DecodeError:
    return DecodeError(reason, reason=reason)


def span_frames(span: Span, rate: int, frames: int) -> tuple[int, int]:
    """Source frames ``[first, stop)`` of the segment ``span`` of audio of ``frames`` frames at ``rate`` Hz.

    ``first = round(start * rate)`` and ``stop = round(end * rate)`` (``start`` None: 0,
    ``end`` None: ``frames``): the frames ``soundfile.read(start=first, stop=stop)`` returns.
    An end at most `SEGMENT_END_TOLERANCE_S` after the audio is taken as its end.

    Raises:
        DecodeError: the segment is empty, not finite, or lies outside the audio (its reason says which).
    """
    start, end = span
    for name, value in (("start", start), ("end", end)):
        if value is not None and not math.isfinite(value):
            raise _bad_span(f"segment {name} {value!r} is not a finite number of seconds")
    if start is not None and end is not None and end <= start:
        raise _bad_span(f"segment end {end} s is not after its start {start} s")
    first = 0 if start is None else round(start * rate)
    stop = frames if end is None else round(end * rate)
    seconds = frames / rate
    if first < 0:
        raise _bad_span(f"segment start {start} s is negative")
    if first >= frames:
        raise _bad_span(f"segment starts at {start} s, not before the end of the audio ({seconds:.3f} s)")
    if stop - frames > round(SEGMENT_END_TOLERANCE_S * rate):
        raise _bad_span(f"segment ends at {end} s, after the end of the audio ({seconds:.3f} s)")
    stop = min(stop, frames)
    if stop <= first:
        raise _bad_span(f"segment [{start}, {end}) s holds no sample at {rate} Hz")
    return first, stop
