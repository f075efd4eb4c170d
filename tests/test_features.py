"""audioloader.features: log-mel equal to torchaudio, shapes, caching, config validation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from audioloader.config import MelSpectrogramConfig
from audioloader.features import hann_window, log_mel, mel_filterbank

CONFIGS = {
    "defaults": MelSpectrogramConfig(),
    "16k-400-160-80": MelSpectrogramConfig(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80),
    "fmin-fmax": MelSpectrogramConfig(f_min=50.0, f_max=14000.0),
    "log-off": MelSpectrogramConfig(log=False),
    "22050-odd-length": MelSpectrogramConfig(sample_rate=22050, clip_seconds=0.77, n_fft=512, hop_length=256,
                                             n_mels=64, f_max=8000.0),
}


def waveform(config: MelSpectrogramConfig, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(config.clip_samples) / config.sample_rate
    x = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.2 * rng.standard_normal(config.clip_samples)
    x[: config.clip_samples // 10] = 0.0  # some silence: the log offset matters there
    return np.clip(x, -1, 1).astype(np.float32)


def reference(config: MelSpectrogramConfig, x: np.ndarray) -> torch.Tensor:
    torchaudio = pytest.importorskip("torchaudio")
    transform = torchaudio.transforms.MelSpectrogram(
        config.sample_rate, n_fft=config.n_fft, hop_length=config.hop_length, n_mels=config.n_mels,
        f_min=config.f_min, f_max=config.f_max)
    mel = transform(torch.from_numpy(x))
    return torch.log(mel + config.log_offset) if config.log else mel


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_equals_torchaudio(name):
    config = CONFIGS[name]
    x = waveform(config)
    ours = log_mel(x, config)
    ref = reference(config, x)
    assert ours.dtype == torch.float32
    assert ours.shape == ref.shape == (config.n_mels, config.n_frames)
    if config.log:
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    else:
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6 * ref.max().item())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_filterbank_equals_torchaudio(name):
    functional = pytest.importorskip("torchaudio.functional")
    config = CONFIGS[name]
    f_max = config.f_max if config.f_max is not None else float(config.sample_rate // 2)
    ref = functional.melscale_fbanks(config.n_freqs, config.f_min, f_max, config.n_mels, config.sample_rate,
                                     None, "htk")
    torch.testing.assert_close(mel_filterbank(config), ref.T, rtol=0, atol=1e-7)


def test_default_shape_and_cache():
    config = MelSpectrogramConfig()
    out = log_mel(waveform(config), config)
    assert out.shape == (128, 501) and out.dtype == torch.float32 and out.is_contiguous()
    assert mel_filterbank(config) is mel_filterbank(MelSpectrogramConfig())  # built once per config
    assert mel_filterbank(config).shape == (128, 513)
    assert hann_window(1024) is hann_window(1024)


def test_accepts_tensor_and_silence():
    config = CONFIGS["16k-400-160-80"]
    x = waveform(config)
    torch.testing.assert_close(log_mel(torch.from_numpy(x), config), log_mel(x, config))
    silent = log_mel(np.zeros(config.clip_samples, np.float32), config)
    torch.testing.assert_close(silent, torch.full_like(silent, float(np.log(np.float32(config.log_offset)))))


def test_library_does_not_import_torchaudio():
    code = ("import sys, audioloader.audio, audioloader.features, audioloader.nodes.decode_spectrogram; "
            "bad = [m for m in sys.modules if m.startswith('torchaudio')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kwargs,field", [
    ({"sample_rate": 0}, "sample_rate"),
    ({"n_fft": 0}, "n_fft"),
    ({"hop_length": -1}, "hop_length"),
    ({"n_mels": 1000}, "n_mels"),
    ({"clip_seconds": 0.0}, "clip_seconds"),
    ({"clip_seconds": 0.01}, "clip_seconds"),  # shorter than one FFT frame
    ({"f_min": -1.0}, "f_min"),
    ({"f_max": 20000.0}, "f_max"),  # above Nyquist of 32 kHz
    ({"f_min": 4000.0, "f_max": 3000.0}, "f_max"),
    ({"log_offset": 0.0}, "log_offset"),
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"MelSpectrogramConfig\.{field}="):
        MelSpectrogramConfig(**kwargs)
