"""Feature configurations: a small family of frozen dataclasses, one per kind of feature.

- `MelSpectrogramConfig`: log-mel, equal to ``torchaudio.transforms.MelSpectrogram``;
  one sample is ``[n_mels, frames]``; batch key ``"spectrogram"``.
- `FbankConfig`: Kaldi filterbanks, equal to ``torchaudio.compliance.kaldi.fbank``
  (what Kaldi-style speech recipes train on); one sample is ``[frames, bins]``;
  batch key ``"fbank"``.
- `WaveformConfig`: the resampled mono waveform itself; one sample is
  ``[samples]``; batch key ``"waveform"``.

Each has ``sample_rate`` (Hz: audio is resampled to it), ``batch_key``,
``time_axis`` (the axis of one sample that grows with its length) and
``num_frames(samples)``; all are computed in the decode workers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .. import checks
from ..checks import field_error


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
        for name in ("sample_rate", "n_fft", "hop_length", "n_mels"):
            checks.positive_integer(f"MelSpectrogramConfig.{name}", getattr(self, name))
        if not (isinstance(self.clip_seconds, (int, float)) and math.isfinite(self.clip_seconds)
                and self.clip_seconds > 0):
            raise field_error(self, "clip_seconds", "must be a positive number of seconds")
        if self.clip_samples < self.n_fft:
            raise field_error(self, "clip_seconds", f"the clip has {self.clip_samples} samples, shorter than one frame "
                              f"(n_fft={self.n_fft}); use a longer clip or a smaller n_fft")
        if self.n_mels > self.n_freqs:
            raise field_error(self, "n_mels",
                              f"more mel bands than FFT bins (n_fft={self.n_fft} gives {self.n_freqs}); "
                              "lower n_mels or raise n_fft")
        nyquist = self.sample_rate / 2
        if not (0 <= self.f_min < nyquist):
            raise field_error(self, "f_min", f"must be in [0, sample_rate / 2 = {nyquist})")
        if self.f_max is not None and not (self.f_min < self.f_max <= nyquist):
            raise field_error(self, "f_max", f"must be in (f_min={self.f_min}, sample_rate / 2 = {nyquist}] or None")
        if not (self.log_offset > 0):
            raise field_error(self, "log_offset", "must be > 0 (log of zero power is -inf)")

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

    #: Batch key of these features, and the axis of one sample that grows with its length.
    batch_key = "spectrogram"
    time_axis = 1

    def num_frames(self, samples: int) -> int:
        """Frames of a signal of ``samples`` samples (centered STFT): ``1 + samples // hop_length``."""
        return 1 + samples // self.hop_length

    def feature_shape(self, frames: int) -> tuple[int, ...]:
        """Shape of one sample of ``frames`` frames."""
        return (self.n_mels, frames)

    def min_samples(self) -> int:
        """Fewest samples these features can be computed from (the STFT's reflect padding needs > n_fft / 2)."""
        return self.n_fft // 2 + 1

    @property
    def f_max_hz(self) -> float:
        """``f_max``, with ``None`` resolved to ``sample_rate // 2`` (as torchaudio does)."""
        return float(self.f_max) if self.f_max is not None else float(self.sample_rate // 2)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for checkpoint fingerprints and logs)."""
        return dataclasses.asdict(self)


def _check_rate(config: Any) -> None:
    checks.positive_integer(f"{type(config).__name__}.sample_rate", config.sample_rate, unit="Hz")


FBANK_WINDOWS = ("povey", "hanning", "hamming", "rectangular", "blackman")


@dataclass(frozen=True)
class FbankConfig:
    """Kaldi filterbank features, equal to ``torchaudio.compliance.kaldi.fbank`` with the same arguments.

    The features Kaldi-style recipes (icefall, ESPnet, WeNet) train on: 25 ms
    frames every 10 ms, a Povey window, pre-emphasis, per-frame DC removal, an
    FFT padded to a power of two, triangular bins on Kaldi's mel scale, and the
    log of each bin's energy floored at float32 epsilon. Field names and
    defaults are torchaudio's (``sample_rate`` is its ``sample_frequency``),
    except ``num_mel_bins`` (80, the usual speech setting) and ``dither``
    (0: off; when on, its noise is a pure function of the seed and the row's key).

    Attributes:
        sample_rate: Hz; audio is resampled to it.
        num_mel_bins: filterbank bins.
        frame_length, frame_shift: frame length and hop in milliseconds.
        dither: amplitude of Gaussian noise added to every sample of a frame (0: none).
        preemphasis_coefficient, remove_dc_offset, window_type, round_to_power_of_two,
        blackman_coeff, snip_edges, low_freq, high_freq, use_energy, energy_floor,
        raw_energy, htk_compat, use_log_fbank, use_power, subtract_mean: as in Kaldi.
        input_scale: the waveform (floats in [-1, 1]) is multiplied by this first;
            32768 gives the 16-bit integer range that Kaldi and WeNet/ESPnet recipes feed.

    One sample is float32 ``[frames, num_mel_bins (+1 with use_energy)]``; with
    ``snip_edges`` ``frames = 1 + (samples - window) // shift`` (0 below one window).
    """

    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length: float = 25.0
    frame_shift: float = 10.0
    dither: float = 0.0
    preemphasis_coefficient: float = 0.97
    remove_dc_offset: bool = True
    window_type: str = "povey"
    round_to_power_of_two: bool = True
    blackman_coeff: float = 0.42
    snip_edges: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    use_energy: bool = False
    energy_floor: float = 1.0
    raw_energy: bool = True
    htk_compat: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    subtract_mean: bool = False
    input_scale: float = 1.0

    batch_key = "fbank"
    time_axis = 0

    def __post_init__(self) -> None:
        _check_rate(self)
        if isinstance(self.num_mel_bins, bool) or not isinstance(self.num_mel_bins, int) or self.num_mel_bins <= 3:
            raise field_error(self, "num_mel_bins", "must be an integer > 3")
        if not self.window_size >= 2:
            raise field_error(self, "frame_length", f"gives a window of {self.window_size} samples at "
                              f"{self.sample_rate} Hz; it needs at least 2")
        if self.window_shift <= 0:
            raise field_error(self, "frame_shift", f"gives a hop of {self.window_shift} samples; it must be > 0")
        if self.padded_window_size % 2:
            raise field_error(self, "frame_length", "the (padded) window must have an even number of samples: use "
                              "round_to_power_of_two=True or another frame_length")
        if self.window_type not in FBANK_WINDOWS:
            raise field_error(self, "window_type", f"must be one of {FBANK_WINDOWS}")
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            raise field_error(self, "preemphasis_coefficient", "must be in [0, 1]")
        nyquist = 0.5 * self.sample_rate
        high = self.high_freq if self.high_freq > 0 else self.high_freq + nyquist
        if not (0.0 <= self.low_freq < nyquist and 0.0 < high <= nyquist and self.low_freq < high):
            raise field_error(self, "low_freq", f"and high_freq={self.high_freq} must satisfy 0 <= low < high <= "
                              f"nyquist={nyquist} (high_freq <= 0 counts down from the Nyquist frequency)")
        for name in ("dither", "energy_floor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise field_error(self, name, "must be a number >= 0")
        if not (isinstance(self.input_scale, (int, float)) and math.isfinite(self.input_scale)
                and self.input_scale > 0):
            raise field_error(self, "input_scale", "must be a positive number")

    @property
    def window_size(self) -> int:
        """Samples per frame (``int(sample_rate * frame_length / 1000)``, as Kaldi)."""
        return int(self.sample_rate * self.frame_length * 0.001)

    @property
    def window_shift(self) -> int:
        """Samples between frames."""
        return int(self.sample_rate * self.frame_shift * 0.001)

    @property
    def padded_window_size(self) -> int:
        """FFT size: the window, rounded up to a power of two when ``round_to_power_of_two``."""
        n = self.window_size
        return 1 << (n - 1).bit_length() if self.round_to_power_of_two else n

    @property
    def num_features(self) -> int:
        """Values per frame: ``num_mel_bins``, plus one with ``use_energy``."""
        return self.num_mel_bins + int(self.use_energy)

    def num_frames(self, samples: int) -> int:
        if self.snip_edges:
            return 0 if samples < self.window_size else 1 + (samples - self.window_size) // self.window_shift
        return (samples + self.window_shift // 2) // self.window_shift

    def feature_shape(self, frames: int) -> tuple[int, ...]:
        return (frames, self.num_features)

    def min_samples(self) -> int:
        """Fewest samples that give one frame."""
        return self.window_size if self.snip_edges else max(1, self.window_shift - self.window_shift // 2)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class WaveformConfig:
    """The resampled mono waveform as the feature: float32 ``[samples]`` at ``sample_rate`` Hz.

    Values are in the codec's range (``[-1, 1]`` for PCM). For models that
    take raw audio (wav2vec 2.0, HuBERT, audio LMs), or to compute your own
    features on the GPU.
    """

    sample_rate: int = 16000

    batch_key = "waveform"
    time_axis = 0

    def __post_init__(self) -> None:
        _check_rate(self)

    def num_frames(self, samples: int) -> int:
        return samples

    def feature_shape(self, frames: int) -> tuple[int, ...]:
        return (frames,)

    def min_samples(self) -> int:
        return 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The feature configurations `AudioLoader` and the decode node accept.
FeatureConfig = MelSpectrogramConfig | FbankConfig | WaveformConfig
FEATURE_CONFIGS = (MelSpectrogramConfig, FbankConfig, WaveformConfig)


def check_features(features: Any, argument: str = "features") -> None:
    """Raise ``TypeError`` naming the argument unless ``features`` is one of `FEATURE_CONFIGS`."""
    if not isinstance(features, FEATURE_CONFIGS):
        names = ", ".join(cls.__name__ for cls in FEATURE_CONFIGS)
        raise TypeError(f"{argument} must be one of {names}; got {type(features).__name__}")


CROP_MODES = ("auto", "random", "center")
TOO_LONG_CHOICES = ("crop", "skip")


@dataclass(frozen=True)
class LengthPolicy:
    """How long one sample is: a fixed-length crop (classification) or the whole utterance (speech).

    Attributes:
        crop: ``"auto"`` (default): a random crop in training, the centre in evaluation;
            ``"random"`` or ``"center"`` in both; ``None``: whole utterances, of
            variable length (batches are padded and carry ``lengths`` and ``padding_mask``).
        clip_seconds: the crop length; ``None`` takes the features' ``clip_seconds``
            (`MelSpectrogramConfig` has one; for other features give it here). Clips
            shorter than the crop are zero-padded (at the end for a random crop,
            centred otherwise).
        max_seconds: whole utterances: the longest kept (``None``: no limit).
        too_long: whole utterances longer than ``max_seconds``: ``"crop"`` to
            ``max_seconds`` (a random window in training, the centre in evaluation)
            or ``"skip"`` the row (counted and reported in ``stats()``).
        min_seconds: rows shorter than this are skipped (counted and reported).

    The random choices (crop offsets) are pure functions of the seed and the row's key.
    """

    crop: str | None = "auto"
    clip_seconds: float | None = None
    max_seconds: float | None = None
    too_long: str = "crop"
    min_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.crop is not None and self.crop not in CROP_MODES:
            raise field_error(self, "crop", f"must be one of {CROP_MODES} or None (whole utterances)")
        if self.too_long not in TOO_LONG_CHOICES:
            raise field_error(self, "too_long", f"must be one of {TOO_LONG_CHOICES}")
        for name in ("clip_seconds", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise field_error(self, name, "must be a positive number of seconds or None")
        if not (isinstance(self.min_seconds, (int, float)) and math.isfinite(self.min_seconds)
                and self.min_seconds >= 0):
            raise field_error(self, "min_seconds", "must be a number of seconds >= 0")
        if self.crop is None and self.clip_seconds is not None:
            raise field_error(self, "clip_seconds", "is the length of a crop; with crop=None (whole utterances) use "
                              "max_seconds")
        if self.max_seconds is not None and self.min_seconds > self.max_seconds:
            raise field_error(self, "min_seconds", f"is above max_seconds={self.max_seconds}")

    @property
    def variable_length(self) -> bool:
        """True for whole utterances (``crop=None``)."""
        return self.crop is None

    def random_crop(self, train: bool) -> bool:
        """Whether crops (and the windows of too long utterances) are drawn at random."""
        return self.crop == "random" or (self.crop in ("auto", None) and train)

    def clip_samples(self, features: Any) -> int:
        """The crop length in samples at the features' rate (crop mode)."""
        seconds = self.clip_seconds if self.clip_seconds is not None else getattr(features, "clip_seconds", None)
        if seconds is None:
            raise ValueError(f"a fixed-length crop needs a length: give LengthPolicy(clip_seconds=...) (the "
                             f"{type(features).__name__} has none), or crop=None for whole utterances")
        return round(seconds * features.sample_rate)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Segments:
    """Rows that are segments of longer recordings: each row's sample is a window of its audio.

    The window comes from two numeric columns of the row, in seconds from the beginning
    of the row's audio: ``start`` and ``end`` (``[start, end)``), or ``start`` and
    ``duration`` (``[start, start + duration)``, as NeMo's ``offset``/``duration``
    manifests). A null start is the beginning of the audio, a null end its end.

    The sample is made from the source frames ``[round(start * rate), round(end * rate))``
    (the frames ``soundfile.read(start=..., stop=...)`` returns) as if they were a file of
    their own: mixed down, resampled, then cropped or kept whole by the `LengthPolicy`.
    WAV, FLAC and AIFF seek to the window and decode only it; other formats are decoded
    whole for each row (pack long recordings with ``audioloader pack``, which cuts them).
    Duration bucketing uses the window's length. A window outside the audio makes the
    row bad (skipped and reported, or raised with ``on_error="raise"``); an end up to
    10 ms past the audio is taken as its end.

    Attributes:
        start: the column of the window's start in seconds.
        end: the column of its end in seconds, or None with ``duration``.
        duration: the column of its length in seconds, instead of ``end``.
    """

    start: str = "start"
    end: str | None = "end"
    duration: str | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end", "duration"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise field_error(self, name, "must be a column name (str)" + ("" if name == "start" else " or None"))
        if self.start is None:
            raise field_error(self, "start", "must be a column name (str)")
        if (self.end is None) == (self.duration is None):
            raise field_error(self, "end", f"give one of end= and duration= (duration={self.duration!r}): the window "
                              "ends at the end column, or lasts the duration column")
        if len(set(self.columns)) != len(self.columns):
            raise field_error(self, "start", f"names one column twice ({list(self.columns)})")

    @property
    def columns(self) -> tuple[str, str]:
        """The two columns the window is read from."""
        return (self.start, self.end if self.end is not None else self.duration)

    def span(self, values: dict[str, Any]) -> tuple[float | None, float | None] | None:
        """``(start, end)`` seconds of a row with column ``values`` (None: the whole audio)."""
        start = values.get(self.start)
        if self.end is not None:
            end = values.get(self.end)
        else:
            length = values.get(self.duration)
            end = None if length is None else (start or 0.0) + length
        if start is None and end is None:
            return None
        return (None if start is None else float(start), None if end is None else float(end))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
