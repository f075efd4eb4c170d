"""Feature configuration: what the spectrogram looks like."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MelSpectrogramConfig:
    """Log-mel spectrogram parameters, equal in meaning to ``torchaudio.transforms.MelSpectrogram``.

    Attributes:
        sample_rate: Hz; audio is resampled to this rate (soxr).
        clip_seconds: length of the crop in seconds; shorter clips are zero-padded.
        n_fft: FFT size in samples (also the Hann window length).
        hop_length: samples between frames.
        n_mels: mel bands (HTK scale, no filter normalisation).
        f_min, f_max: band edges in Hz; ``f_max=None`` means ``sample_rate / 2``.
        log: take ``log(mel + log_offset)`` (natural log) when true, else return power.
        log_offset: the small offset added before the log.

    The output of one sample is float32 ``[n_mels, n_frames]`` with
    ``n_frames = 1 + clip_samples // hop_length`` (501 for the defaults).
    """

    sample_rate: int = 32000
    clip_seconds: float = 5.0
    n_fft: int = 1024
    hop_length: int = 320
    n_mels: int = 128
    f_min: float = 0.0
    f_max: float | None = None
    log: bool = True
    log_offset: float = 1e-6

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"MelSpectrogramConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("sample_rate", "n_fft", "hop_length", "n_mels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise bad(name, "must be a positive integer")
        if not (isinstance(self.clip_seconds, (int, float)) and math.isfinite(self.clip_seconds)
                and self.clip_seconds > 0):
            raise bad("clip_seconds", "must be a positive number of seconds")
        if self.clip_samples < self.n_fft:
            raise bad("clip_seconds", f"the clip has {self.clip_samples} samples, shorter than one frame "
                      f"(n_fft={self.n_fft}); use a longer clip or a smaller n_fft")
        if self.n_mels > self.n_freqs:
            raise bad("n_mels", f"more mel bands than FFT bins (n_fft={self.n_fft} gives {self.n_freqs}); "
                      "lower n_mels or raise n_fft")
        nyquist = self.sample_rate / 2
        if not (0 <= self.f_min < nyquist):
            raise bad("f_min", f"must be in [0, sample_rate / 2 = {nyquist})")
        if self.f_max is not None and not (self.f_min < self.f_max <= nyquist):
            raise bad("f_max", f"must be in (f_min={self.f_min}, sample_rate / 2 = {nyquist}] or None")
        if not (self.log_offset > 0):
            raise bad("log_offset", "must be > 0 (log of zero power is -inf)")

    @property
    def clip_samples(self) -> int:
        """Crop length in samples at ``sample_rate``."""
        return round(self.clip_seconds * self.sample_rate)

    @property
    def n_freqs(self) -> int:
        """FFT bins: ``n_fft // 2 + 1``."""
        return self.n_fft // 2 + 1

    @property
    def n_frames(self) -> int:
        """Frames per spectrogram: ``1 + clip_samples // hop_length`` (centered STFT)."""
        return 1 + self.clip_samples // self.hop_length

    @property
    def f_max_hz(self) -> float:
        """``f_max``, with ``None`` resolved to ``sample_rate // 2`` (as torchaudio does)."""
        return float(self.f_max) if self.f_max is not None else float(self.sample_rate // 2)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for checkpoint fingerprints and logs)."""
        return dataclasses.asdict(self)
