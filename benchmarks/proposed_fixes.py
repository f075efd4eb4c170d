"""Fixes the benchmark suggests for other modules, applied as run-time patches so their effect can be measured.

``audioloader bench --experiments`` runs extra contenders with these applied
(``"patches": [...]`` in a contender spec) next to the unpatched ones, so the
gain of each proposal is a ratio measured in the same run. Nothing here is
used by the library itself; each function's docstring is the change to make
in the real module (see docs/benchmarks.md, "Findings").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import warnings
from typing import Any

#: Decodes between two ``malloc_trim`` calls (env ``AUDIOLOADER_BENCH_TRIM_EVERY`` overrides, for tuning).
TRIM_EVERY = int(os.environ.get("AUDIOLOADER_BENCH_TRIM_EVERY", "64"))


def fast_mel() -> None:
    """``audioloader/features.py``: a cheaper power spectrum and a sparse mel filterbank.

    1. ``power_spectrogram``: ``spec.abs().pow_(2.0)`` computes a square root
       (``hypot``) per bin and then squares it; ``spec.real.square().add_(spec.imag.square())``
       gives the same power in about a quarter of the time (0.75 -> 0.19 ms per
       5 s clip, one thread).
    2. ``log_mel``: the HTK filterbank ``[128, 513]`` has about 2 non-zeros per
       column (each FFT bin is in at most two triangles), so a CSR copy of it
       (``mel_filterbank(config).to_sparse_csr()``, cached beside the dense one)
       multiplies in about a third of the time of the dense ``torch.matmul``
       (0.70 -> 0.20 ms). (Building a CSR tensor warns "Sparse CSR tensor support
       is in beta state" once; silence it with ``warnings.catch_warnings``.)

    The result differs from torchaudio's by float32 rounding (largest difference
    in the log-mel about 5e-7; the dense version agrees exactly).
    """
    import numpy as np
    import torch

    from audioloader import features
    from audioloader.nodes import decode_spectrogram

    @functools.lru_cache(maxsize=32)
    def sparse_filterbank(config: Any) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return features.mel_filterbank(config).to_sparse_csr()

    def log_mel(waveform: Any, config: Any) -> torch.Tensor:
        x = torch.from_numpy(waveform) if isinstance(waveform, np.ndarray) else waveform
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        spec = torch.stft(x, config.n_fft, hop_length=config.hop_length, win_length=config.n_fft,
                          window=features.hann_window(config.n_fft), center=True, pad_mode="reflect",
                          normalized=False, onesided=True, return_complex=True)
        power = spec.real.square().add_(spec.imag.square())
        mel = sparse_filterbank(config) @ power
        if config.log:
            mel.add_(config.log_offset).log_()
        return mel

    decode_spectrogram.log_mel = log_mel


def malloc_trim() -> None:
    """``audioloader/nodes/decode_spectrogram.py``: give freed heap memory back to the OS every 64 decodes.

    With glibc, the decoded spectrograms (256 KB each, long-lived in the
    shuffle buffer) end up between the decode threads' short-lived buffers
    (1-2 MB each: decoded PCM, resampled audio, STFT) on the heap, because
    glibc's *dynamic* mmap threshold rises to the size of those temporaries
    after the first ones are freed. Holes between live spectrograms are never
    returned, so the process holds about 6.5x the buffer's payload (1200
    spectrograms held: 1.9 GB of anonymous memory for 0.29 GB of data).
    ``malloc_trim(0)`` returns the free pages inside the heap (glibc >= 2.8
    ``madvise``s them). Called every 64 decodes (from the decode threads, so it
    also runs while a buffer fills or is restored, when no batch is emitted)::

        # audioloader/nodes/decode_spectrogram.py
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform.startswith("linux") else None
        _TRIM_EVERY = 64
        _decodes = itertools.count(1)   # next() of itertools.count is atomic under the GIL

        # at the end of DecodeSpectrogram.decode():
        if _LIBC is not None and next(_decodes) % _TRIM_EVERY == 0:
            _LIBC.malloc_trim(0)

    (Other options measured: ``MALLOC_MMAP_THRESHOLD_=131072`` fixes the memory
    but turns every large temporary into a fresh mmap, decode about 35 %
    slower; copying each spectrogram into its own anonymous mmap only halves
    the overhead.)
    """
    import itertools
    import sys

    name = ctypes.util.find_library("c")
    if name is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(name)
    from audioloader.nodes.decode_spectrogram import DecodeSpectrogram

    original = DecodeSpectrogram.decode
    counter = itertools.count(1)

    def decode_and_trim(self, raw):
        sample = original(self, raw)
        if next(counter) % TRIM_EVERY == 0:
            libc.malloc_trim(0)
        return sample

    DecodeSpectrogram.decode = decode_and_trim


def parse_pcm16_wav(data: Any) -> tuple[Any, int, int] | None:
    """``(int16 frames [n, channels], sample_rate, channels)`` of a plain PCM16 WAV, zero-copy; else None.

    Walks the RIFF chunks for ``fmt `` (PCM, or WAVE_FORMAT_EXTENSIBLE with the
    PCM sub-format; 16 bits) and ``data``. Anything else (other codecs, other
    bit depths, a truncated file, RF64) returns None and takes soundfile's path.
    """
    import struct

    import numpy as np

    view = memoryview(data).cast("B")
    if view.nbytes < 44 or bytes(view[0:4]) != b"RIFF" or bytes(view[8:12]) != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= view.nbytes:
        tag, size = bytes(view[pos:pos + 4]), struct.unpack_from("<I", view, pos + 4)[0]
        body = pos + 8
        if tag == b"fmt " and size >= 16:
            code, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", view, body)
            if code == 0xFFFE and size >= 40:
                code = struct.unpack_from("<H", view, body + 24)[0]  # sub-format GUID starts with the code
            fmt = (code, channels, rate, align, bits)
        elif tag == b"data":
            if fmt is None or fmt[0] != 1 or fmt[4] != 16 or fmt[1] < 1 or fmt[3] != 2 * fmt[1]:
                return None
            if body + size > view.nbytes:
                return None  # truncated: let soundfile report it
            frames = size // fmt[3]
            pcm = np.frombuffer(view, dtype="<i2", count=frames * fmt[1], offset=body)
            return pcm.reshape(frames, fmt[1]), fmt[2], fmt[1]
        pos = body + size + (size & 1)
    return None


def wav_fast_path() -> None:
    """``audioloader/audio.py``: read PCM16 WAV at the target rate with numpy, without libsndfile.

    Shards packed for speed (``pack(..., codec="pcm16", sample_rate=32000)``)
    hold plain 16-bit WAV at the target rate: decoding is only int16 -> float32.
    Yet `load_clip` opens each clip with soundfile (a copy of the whole clip
    into the thread's memfd, then ``SoundFile`` construction, seek, read, most of
    it Python holding the GIL): about 325 us per 10 s clip, against 46 us for
    parsing the RIFF header and slicing the window straight out of the Arrow
    buffer with ``np.frombuffer`` (`parse_pcm16_wav`). Same floats, bit for
    bit (soundfile also scales int16 by 1/32768). In `load_clip`, before
    ``_open``::

        parsed = parse_pcm16_wav(data)           # None unless plain PCM16 WAV
        if parsed is not None and parsed[1] == target_rate and len(parsed[0]):
            pcm, _, channels = parsed
            offset = crop_offset(len(pcm), clip_samples, train=train, draw=draw)
            part = pcm[offset:offset + clip_samples].astype(np.float32) * np.float32(1 / 32768)
            mono = part[:, 0] if channels == 1 else part.mean(axis=1, dtype=np.float32)
            return fit(mono, clip_samples, 0, train=train)
    """
    import numpy as np

    from audioloader import audio
    from audioloader.nodes import decode_spectrogram

    original = decode_spectrogram.load_clip

    def load_clip(data, target_rate, clip_samples, *, train, draw, window=True, timer=None):
        parsed = parse_pcm16_wav(data) if data is not None else None
        if parsed is None or parsed[1] != target_rate or len(parsed[0]) == 0:
            return original(data, target_rate, clip_samples, train=train, draw=draw, window=window, timer=timer)
        pcm, _, channels = parsed
        offset = audio.crop_offset(len(pcm), clip_samples, train=train, draw=draw)
        part = pcm[offset:offset + clip_samples]
        scaled = part.astype(np.float32) * np.float32(1 / 32768)
        mono = scaled[:, 0] if channels == 1 else scaled.mean(axis=1, dtype=np.float32)
        return audio.fit(mono, clip_samples, 0, train=train)

    decode_spectrogram.load_clip = load_clip


PATCHES = {"fast_mel": fast_mel, "malloc_trim": malloc_trim, "wav_fast_path": wav_fast_path}


def apply(names: list[str]) -> None:
    """Apply the named patches (see `PATCHES`) in this process."""
    for name in names:
        if name not in PATCHES:
            raise ValueError(f"unknown patch {name!r}; known: {', '.join(PATCHES)}")
        PATCHES[name]()
