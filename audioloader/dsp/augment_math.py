"""The arithmetic of the augmentations: pure functions on arrays and batches, no randomness of their own.

`audioloader.dsp.augment` draws every parameter from ``(seed, key)`` and calls these:
``add_at_snr`` and ``reverberate`` (noise and room), ``change_speed`` (speed perturbation),
``apply_masks`` (SpecAugment), ``mixup_pairs`` / ``mixup_batch`` / ``mixup_targets`` (Mixup).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import soxr
import torch

from .clip import RESAMPLE_QUALITY


def add_at_snr(wave: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """``wave + g * noise`` with ``g`` such that ``10 log10(P(wave) / P(g * noise)) == snr_db``.

    Both float32 ``[samples]``; ``P`` is the mean square (in float64). A silent
    ``wave`` or ``noise`` comes back unchanged.
    """
    signal_power = float(np.mean(np.square(wave, dtype=np.float64)))
    noise_power = float(np.mean(np.square(noise, dtype=np.float64)))
    if signal_power == 0.0 or noise_power == 0.0:
        return wave
    gain = math.sqrt(signal_power / (noise_power * 10.0 ** (snr_db / 10.0)))
    return (wave + np.float32(gain) * noise).astype(np.float32, copy=False)


def reverberate(wave: np.ndarray, ir: np.ndarray, *, normalize: bool = True) -> np.ndarray:
    """``convolve(wave, ir)[:len(wave)]`` (float32 ``[n]``), scaled to ``wave``'s RMS with ``normalize``.

    Overlap-add of FFT blocks about four times the response's length: half the
    time of one FFT over the whole clip (measured: 5 s at 32 kHz with a 0.5 s
    response, 3.9 vs 7.9 ms), the same result to float32 rounding.
    """
    n, m = len(wave), len(ir)
    nfft = 1 << (min(4 * m, n + m - 1) - 1).bit_length()
    step = nfft - m + 1  # input samples per block: each block's output spills m - 1 into the next
    starts = range(0, n, step)
    blocks = np.zeros((len(starts), nfft), np.float32)
    for k, start in enumerate(starts):
        part = wave[start:start + step]
        blocks[k, :len(part)] = part
    spills = np.fft.irfft(np.fft.rfft(blocks, axis=1) * np.fft.rfft(ir, nfft), nfft, axis=1)
    out = np.zeros(starts[-1] + nfft, np.float32)
    for k, start in enumerate(starts):
        out[start:start + nfft] += spills[k]
    out = out[:n]
    if normalize:
        before = float(np.mean(np.square(wave, dtype=np.float64)))
        after = float(np.mean(np.square(out, dtype=np.float64)))
        if after > 0:
            out = out * math.sqrt(before / after)
    return out.astype(np.float32)


def change_speed(wave: np.ndarray, factor: float, rate: int) -> np.ndarray:
    """Play float32 ``[n]`` ``factor`` times faster: ``round(n / factor)`` samples (soxr, as the decode path)."""
    if factor == 1.0:
        return wave
    return soxr.resample(wave, rate * factor, rate, quality=RESAMPLE_QUALITY)


def apply_masks(features: torch.Tensor, masks: torch.Tensor, freq_masks: int, time_axis: int, fill: str,
                lengths: torch.Tensor | None = None) -> torch.Tensor:
    """SpecAugment masks on a batch of features.

    Args:
        features: float32 ``[B, bins, frames]`` (``time_axis=1``, log-mel) or ``[B, frames, bins]`` (``0``, fbank).
        masks: int64 ``[B, M, 2]``: ``(start, width)``; the first ``freq_masks`` are along
            bins, the rest along frames.
        freq_masks: how many of the masks are frequency masks.
        time_axis: the time axis of one sample (``config.time_axis``).
        fill: ``"mean"`` (each sample's mean over its unpadded features, before masking) or ``"zero"``.
        lengths: int64 ``[B]`` frames per sample for a padded batch (None: all frames are real);
            padding stays untouched.

    Returns a new tensor of the same shape; the same arithmetic for one sample or a batch.
    """
    device = features.device
    masks = masks.to(device)
    t_dim, f_dim = 1 + time_axis, 2 - time_axis
    frames, bins = features.shape[t_dim], features.shape[f_dim]

    def band(size: int, part: torch.Tensor) -> torch.Tensor:  # [B, size]: inside any of the masks
        at = torch.arange(size, device=device)[None, None, :]
        start, width = part[..., 0:1], part[..., 1:2]
        return ((at >= start) & (at < start + width)).any(dim=1)

    in_freq, in_time = band(bins, masks[:, :freq_masks]), band(frames, masks[:, freq_masks:])
    real = (torch.arange(frames, device=device)[None, :] < lengths.to(device)[:, None] if lengths is not None
            else torch.ones((features.shape[0], frames), dtype=torch.bool, device=device))
    if f_dim == 1:
        masked = (in_freq[:, :, None] | in_time[:, None, :]) & real[:, None, :]
        real_full = real[:, None, :]
    else:
        masked = (in_time[:, :, None] | in_freq[:, None, :]) & real[:, :, None]
        real_full = real[:, :, None]
    if fill == "mean":
        count = real.sum(dim=1).clamp(min=1) * bins
        value = (features * real_full).sum(dim=(1, 2)) / count
    else:
        value = torch.zeros(features.shape[0], dtype=features.dtype, device=device)
    return torch.where(masked, value[:, None, None].to(features.dtype), features)


def mixup_pairs(pairing: torch.Tensor) -> torch.Tensor:
    """Partner positions int64 ``[B]``: samples ordered by pairing number, each paired with the next (a cycle)."""
    order = torch.argsort(pairing, stable=True)
    partner = torch.empty_like(order)
    partner[order] = torch.roll(order, -1)
    return partner


def mixup_batch(batch: dict[str, Any], params: torch.Tensor, features_key: str) -> dict[str, Any]:
    """Mix a batch's features in pairs: ``params`` float64 ``[B, 2]`` = (own weight, pairing number) per sample."""
    features = batch[features_key]
    weight = params[:, 0].to(device=features.device, dtype=features.dtype)
    partner = mixup_pairs(params[:, 1])
    partner_on = partner.to(features.device)
    shape = (-1, *([1] * (features.dim() - 1)))
    # lerp(x_partner, x, w) = w x + (1 - w) x_partner in one pass (5x faster than the two products and a sum)
    batch[features_key] = torch.lerp(features[partner_on], features, weight.view(shape))
    batch["mixup_weights"] = torch.stack([weight, 1 - weight], dim=1)
    batch["mixup_partner"] = partner_on
    if "label" in batch:
        label = batch["label"]
        batch["mixup_labels"] = torch.stack([label, label[partner.to(label.device)]], dim=1)
    return batch


def mixup_targets(batch: dict[str, Any], num_classes: int) -> torch.Tensor:
    """Soft targets float32 ``[B, num_classes]`` of a mixed batch: ``w`` on the own label, ``1 - w`` on the other."""
    labels, weights = batch["mixup_labels"], batch["mixup_weights"]
    targets = torch.zeros((labels.shape[0], num_classes), dtype=weights.dtype, device=weights.device)
    targets.scatter_add_(1, labels, weights)
    return targets
