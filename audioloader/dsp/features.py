"""Features with plain torch: log-mel equal to ``torchaudio.transforms.MelSpectrogram``,
Kaldi fbank equal to ``torchaudio.compliance.kaldi.fbank``.

Log-mel:

torchaudio is the reference definition (tests compare against it) but is not
imported here: its last release pins one torch version. The pieces follow
torchaudio 2.11 step by step, in the same dtype (float32) and the same order of
operations, so the filterbank is bit-identical and the spectrogram agrees to
float32 rounding:

* window: periodic Hann of ``n_fft`` samples;
* STFT: ``torch.stft(center=True, pad_mode="reflect", onesided=True)``, power 2;
* mel filterbank: HTK mel scale, triangles between ``n_mels + 2`` points equally
  spaced in mel from ``f_min`` to ``f_max``, no area normalisation; bins at
  ``linspace(0, sample_rate // 2, n_freqs)`` as in torchaudio (integer Nyquist);
* optional ``log(mel + log_offset)`` (natural log).

Everything is computed with torch ops that release the GIL, so several decode
threads run it in parallel.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch

from .config import FbankConfig, MelSpectrogramConfig, WaveformConfig


def hz_to_mel(freq: float) -> float:
    """HTK mel scale: ``2595 * log10(1 + f / 700)`` (``freq`` in Hz)."""
    return 2595.0 * math.log10(1.0 + freq / 700.0)


def mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    """Inverse of `hz_to_mel`, elementwise on a tensor (Hz)."""
    return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)


def f_max_of(config: MelSpectrogramConfig) -> float:
    """The upper band edge in Hz; ``None`` means ``sample_rate // 2`` as in torchaudio."""
    return float(config.f_max) if config.f_max is not None else float(config.sample_rate // 2)


def _filterbank(sample_rate: int, n_freqs: int, n_mels: int, f_min: float, f_max: float) -> torch.Tensor:
    """Triangular HTK filterbank, float32 ``[n_freqs, n_mels]`` (torchaudio's ``melscale_fbanks``)."""
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2)
    f_pts = mel_to_hz(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)  # [n_freqs, n_mels + 2]
    down_slopes = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up_slopes = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down_slopes, up_slopes))


@functools.lru_cache(maxsize=32)
def mel_filterbank(config: MelSpectrogramConfig) -> torch.Tensor:
    """The config's filterbank, float32 ``[n_mels, n_freqs]`` (transposed for ``fb @ power``).

    Built once per config (cached); treat it as read-only.
    """
    fb = _filterbank(config.sample_rate, config.n_freqs, config.n_mels, float(config.f_min), f_max_of(config))
    return fb.T.contiguous()


def _spend_csr_beta_warning() -> None:
    """Make torch's once-per-process "Sparse CSR tensor support is in beta state" warning fire here, silenced.

    torch warns once per process, from whichever thread first builds a CSR
    tensor; silencing it there with ``warnings.catch_warnings`` is not thread-safe
    (it swaps the process-wide filter list while other threads run), so it
    reached users from decode threads. At import the warning is spent once, in
    the importing thread; worker processes import this module too.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.zeros(1, 1).to_sparse_csr()


_spend_csr_beta_warning()


@functools.lru_cache(maxsize=32)
def sparse_mel_filterbank(config: MelSpectrogramConfig) -> torch.Tensor:
    """`mel_filterbank` as a sparse CSR tensor ``[n_mels, n_freqs]`` (cached; read-only).

    Each FFT bin lies in at most two triangles, so the dense ``[128, 513]``
    filterbank is ~99% zeros; the sparse product is 2x faster than the dense one
    (0.38 vs 0.75 ms per 5 s clip; COO: 0.60 ms) and gives the same sums up to
    float32 rounding (the order of additions differs).
    """
    return mel_filterbank(config).to_sparse_csr()


@functools.lru_cache(maxsize=32)
def hann_window(n_fft: int) -> torch.Tensor:
    """Periodic Hann window, float32 ``[n_fft]`` (cached; read-only)."""
    return torch.hann_window(n_fft, periodic=True)


def power_spectrogram(waveform: torch.Tensor, config: MelSpectrogramConfig) -> torch.Tensor:
    """``|STFT|^2`` of float32 ``[samples]``: float32 ``[n_freqs, 1 + samples // hop_length]``.

    The centring reflection is two flipped slices around the clip, then the STFT without ``center``: the same
    input to the same transform as ``center=True, pad_mode="reflect"`` (bit-identical, tested), without the
    generic 3-D reflection pad torch would run (measured: 0.06 against 0.22 ms for 5 s at 32 kHz; the power
    spectrogram 5-15 % faster).
    """
    half = config.n_fft // 2
    if waveform.dim() == 1 and len(waveform) > half:
        padded = torch.cat([waveform[1:half + 1].flip(0), waveform, waveform[-half - 1:-1].flip(0)])
        spec = torch.stft(padded, config.n_fft, hop_length=config.hop_length, win_length=config.n_fft,
                          window=hann_window(config.n_fft), center=False, normalized=False, onesided=True,
                          return_complex=True)
    else:  # torch's own padding, and its error for a clip too short to reflect
        spec = torch.stft(waveform, config.n_fft, hop_length=config.hop_length, win_length=config.n_fft,
                          window=hann_window(config.n_fft), center=True, pad_mode="reflect",
                          normalized=False, onesided=True, return_complex=True)
    # re^2 + im^2 rather than abs()^2: abs() computes a square root (hypot) per bin
    # only to square it again; this is about 4x faster and equal up to rounding.
    return spec.real.square().add_(spec.imag.square())


def log_mel(waveform: np.ndarray | torch.Tensor, config: MelSpectrogramConfig) -> torch.Tensor:
    """Mel spectrogram of one mono clip, log-compressed when ``config.log``.

    Args:
        waveform: float32 ``[samples]`` at ``config.sample_rate`` Hz (``clip_samples``
            long in the loader; any length > ``n_fft // 2`` works).
        config: the feature parameters.

    Returns:
        float32 tensor ``[n_mels, 1 + samples // hop_length]``: mel power (the
        squared STFT magnitude summed through the filters), or ``log(power + log_offset)``.
    """
    x = torch.from_numpy(waveform) if isinstance(waveform, np.ndarray) else waveform
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    mel = sparse_mel_filterbank(config) @ power_spectrogram(x, config)
    if config.log:
        mel.add_(config.log_offset).log_()
    return mel


def prepare_features(config: MelSpectrogramConfig) -> None:
    """Build the config's cached filterbanks now (in the calling thread), before workers use them."""
    sparse_mel_filterbank(config)
    hann_window(config.n_fft)


@functools.lru_cache(maxsize=32)
def _filterbank_on(config: MelSpectrogramConfig, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dense filterbank [n_mels, n_freqs], Hann window [n_fft])`` on ``device`` (cached; read-only)."""
    return mel_filterbank(config).to(device), hann_window(config.n_fft).to(device)


def log_mel_batch(waveforms: torch.Tensor, config: MelSpectrogramConfig) -> torch.Tensor:
    """`log_mel` of a batch in one call, on the waveforms' device (a GPU, or the CPU).

    Args:
        waveforms: float32 ``[batch, samples]`` at ``config.sample_rate`` Hz.
        config: the feature parameters.

    Returns:
        float32 ``[batch, n_mels, 1 + samples // hop_length]`` on the same device;
        equal to `log_mel` of each row up to float32 rounding (the filterbank
        product here is dense: on a GPU that is the fast way, and the order of
        additions differs from the sparse one).
    """
    fb, window = _filterbank_on(config, str(waveforms.device))
    spec = torch.stft(waveforms, config.n_fft, hop_length=config.hop_length, win_length=config.n_fft,
                      window=window, center=True, pad_mode="reflect", normalized=False, onesided=True,
                      return_complex=True)
    power = spec.real.square().add_(spec.imag.square())  # [batch, n_freqs, frames]
    mel = torch.matmul(fb, power)
    if config.log:
        mel.add_(config.log_offset).log_()
    return mel



# ---------------------------------------------------------------------------------------------- Kaldi fbank
#
# torchaudio.compliance.kaldi.fbank step by step, in float32 and the same order
# of operations (frames as strided views, DC removal, raw log energy,
# pre-emphasis with the first sample replicated, window, zero padding to the FFT
# size, |rfft|^2, Kaldi mel banks with a zero column for Nyquist, log with an
# epsilon floor), without VTLN (warp 1.0).

_EPSILON = float(torch.finfo(torch.float32).eps)


def _kaldi_mel(freq: torch.Tensor) -> torch.Tensor:
    return 1127.0 * (1.0 + freq / 700.0).log()


def _kaldi_mel_scalar(freq: float) -> float:
    return 1127.0 * math.log(1.0 + freq / 700.0)


@functools.lru_cache(maxsize=32)
def kaldi_mel_banks(config: FbankConfig) -> torch.Tensor:
    """Kaldi's triangular mel banks, float32 ``[n_fft // 2 + 1, num_mel_bins]`` (Nyquist column zero; cached)."""
    n_fft = config.padded_window_size
    nyquist = 0.5 * config.sample_rate
    high = config.high_freq if config.high_freq > 0 else config.high_freq + nyquist
    fft_bin_width = config.sample_rate / n_fft
    mel_low, mel_high = _kaldi_mel_scalar(config.low_freq), _kaldi_mel_scalar(high)
    delta = (mel_high - mel_low) / (config.num_mel_bins + 1)
    b = torch.arange(config.num_mel_bins).unsqueeze(1)
    left, center, right = mel_low + b * delta, mel_low + (b + 1.0) * delta, mel_low + (b + 2.0) * delta
    mel = _kaldi_mel(fft_bin_width * torch.arange(n_fft / 2)).unsqueeze(0)
    up, down = (mel - left) / (center - left), (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))  # [bins, n_fft / 2]
    return torch.nn.functional.pad(banks, (0, 1)).T.contiguous()


@functools.lru_cache(maxsize=32)
def kaldi_window(config: FbankConfig) -> torch.Tensor:
    """The frame window of ``config.window_type``, float32 ``[window_size]`` (cached)."""
    n, kind = config.window_size, config.window_type
    if kind == "hanning":
        return torch.hann_window(n, periodic=False)
    if kind == "hamming":
        return torch.hamming_window(n, periodic=False, alpha=0.54, beta=0.46)
    if kind == "povey":
        return torch.hann_window(n, periodic=False).pow(0.85)
    if kind == "rectangular":
        return torch.ones(n)
    a = 2 * math.pi / (n - 1)
    t = torch.arange(n, dtype=torch.float32)
    return config.blackman_coeff - 0.5 * torch.cos(a * t) + (0.5 - config.blackman_coeff) * torch.cos(2 * a * t)


@functools.lru_cache(maxsize=32)
def _fbank_tables(config: FbankConfig, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mel banks, window)`` on ``device`` (cached; read-only)."""
    return kaldi_mel_banks(config).to(device), kaldi_window(config).to(device)


def _frames(waveform: torch.Tensor, config: FbankConfig) -> torch.Tensor:
    """``[..., m, window_size]`` frames of ``[..., samples]`` (views where possible)."""
    size, shift = config.window_size, config.window_shift
    if not config.snip_edges:
        reversed_ = torch.flip(waveform, [-1])
        pad = size // 2 - shift // 2
        m = (waveform.shape[-1] + shift // 2) // shift
        if pad > 0:
            waveform = torch.cat((reversed_[..., -pad:], waveform, reversed_), dim=-1)
        else:
            waveform = torch.cat((waveform[..., -pad:], reversed_), dim=-1)
        return waveform.unfold(-1, size, shift)[..., :m, :]
    if waveform.shape[-1] < size:  # no whole frame
        return waveform.new_empty((*waveform.shape[:-1], 0, size))
    return waveform.unfold(-1, size, shift)


def kaldi_fbank(waveform: np.ndarray | torch.Tensor, config: FbankConfig,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Kaldi filterbanks of one mono clip, equal to ``torchaudio.compliance.kaldi.fbank``.

    Args:
        waveform: float32 ``[samples]`` (or a batch ``[..., samples]``) at ``config.sample_rate`` Hz,
            before ``input_scale``.
        config: the feature parameters.
        generator: the source of the dither noise (``config.dither > 0``); the
            decode stage seeds it from the row's key.

    Returns:
        float32 ``[frames, num_mel_bins (+1)]``; ``[0, bins]`` for a clip shorter than one frame.
    """
    x = torch.from_numpy(waveform) if isinstance(waveform, np.ndarray) else waveform
    x = x.to(torch.float32)
    if config.input_scale != 1.0:
        x = x * config.input_scale
    frames = _frames(x, config)
    if frames.shape[-2] == 0:
        return x.new_empty((*x.shape[:-1], 0, config.num_features))
    if config.dither != 0.0:
        frames = frames + torch.randn(frames.shape, generator=generator).to(frames.device) * config.dither
    if config.remove_dc_offset:
        frames = frames - frames.mean(dim=-1, keepdim=True)
    energy = _log_energy(frames, config) if config.use_energy and config.raw_energy else None
    mel_banks, window = _fbank_tables(config, str(frames.device))
    # Pre-emphasis, window and the FFT's zero padding written into one buffer (torchaudio
    # makes a copy for each); x[j] - k * x[j - 1], with x[-1] = x[0] as Kaldi does.
    size = config.window_size
    buffer = frames.new_zeros((*frames.shape[:-1], config.padded_window_size))
    k = config.preemphasis_coefficient
    if k != 0.0:
        torch.sub(frames[..., 1:], frames[..., :-1], alpha=k, out=buffer[..., 1:size])
        torch.mul(frames[..., :1], 1.0 - k, out=buffer[..., :1])
    else:
        buffer[..., :size] = frames
    buffer[..., :size] *= window
    if config.use_energy and energy is None:
        energy = _log_energy(buffer, config)
    spectrum = torch.fft.rfft(buffer)
    # re^2 + im^2, not abs()^2: no square root per bin (equal up to rounding).
    power = spectrum.real.square().add_(spectrum.imag.square())
    out = torch.matmul(power if config.use_power else power.sqrt_(), mel_banks)
    if config.use_log_fbank:
        out.clamp_(min=_EPSILON).log_()
    if config.use_energy:
        energy = energy.unsqueeze(-1)
        out = torch.cat((out, energy) if config.htk_compat else (energy, out), dim=-1)
    if config.subtract_mean:
        out = out - out.mean(dim=-2, keepdim=True)
    return out


def _log_energy(frames: torch.Tensor, config: FbankConfig) -> torch.Tensor:
    energy = torch.clamp(frames.pow(2).sum(-1), min=_EPSILON).log()
    if config.energy_floor == 0.0:
        return energy
    return torch.clamp(energy, min=math.log(config.energy_floor))


def compute_features(waveform: np.ndarray, config: MelSpectrogramConfig | FbankConfig | WaveformConfig,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """The features of one clip: ``[n_mels, frames]`` (log-mel), ``[frames, bins]`` (fbank) or ``[samples]``.

    ``waveform``: float32 ``[samples]`` at ``config.sample_rate`` Hz; ``generator``:
    the fbank's dither noise (seeded per row by the caller).
    """
    if isinstance(config, MelSpectrogramConfig):
        return log_mel(waveform, config)
    if isinstance(config, FbankConfig):
        return kaldi_fbank(waveform, config, generator)
    return torch.from_numpy(np.ascontiguousarray(waveform, dtype=np.float32))


def features_batch(waveforms: torch.Tensor,
                   config: MelSpectrogramConfig | FbankConfig | WaveformConfig) -> torch.Tensor:
    """The features of a batch of equal-length clips ``[B, samples]`` in one call, on their device.

    ``[B, n_mels, frames]`` (log-mel), ``[B, frames, bins]`` (fbank, no dither) or the waveforms.
    """
    if isinstance(config, MelSpectrogramConfig):
        return log_mel_batch(waveforms, config)
    if isinstance(config, FbankConfig):
        return kaldi_fbank(waveforms, config)
    return waveforms


def prepare(config: MelSpectrogramConfig | FbankConfig | WaveformConfig) -> None:
    """Build a config's cached tables now, in the calling thread, before workers use them."""
    if isinstance(config, MelSpectrogramConfig):
        prepare_features(config)
    elif isinstance(config, FbankConfig):
        kaldi_mel_banks(config)
        kaldi_window(config)
