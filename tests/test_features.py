"""audioloader.dsp.features: log-mel and Kaldi fbank equal to torchaudio, shapes, caching, config validation."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from audioloader.dsp.config import FbankConfig, MelSpectrogramConfig, WaveformConfig
from audioloader.dsp.features import compute_features, features_batch, hann_window, kaldi_fbank, log_mel, mel_filterbank

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


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_power_spectrogram_is_bit_identical_to_torch_centred_stft(name):
    """The reflection done by hand (issue 37) feeds the transform exactly what ``center=True`` would."""
    from audioloader.dsp.features import power_spectrogram

    config = CONFIGS[name]
    x = torch.from_numpy(waveform(config))
    spec = torch.stft(x, config.n_fft, hop_length=config.hop_length, win_length=config.n_fft,
                      window=hann_window(config.n_fft), center=True, pad_mode="reflect", onesided=True,
                      return_complex=True)
    assert torch.equal(power_spectrogram(x, config), spec.real.square() + spec.imag.square())
    short = x[:config.n_fft // 2]  # too short to reflect: torch's own error, as before
    with pytest.raises(RuntimeError):
        power_spectrogram(short, config)


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
    code = ("import sys, audioloader.dsp.audio, audioloader.dsp.features, audioloader.nodes.decode_spectrogram; "
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


# ---------------------------------------------------------------------------------------------- Kaldi fbank

FBANK_CONFIGS = {
    "defaults": FbankConfig(),
    "40-bins-energy": FbankConfig(num_mel_bins=40, use_energy=True),
    "hamming-no-snip": FbankConfig(window_type="hamming", snip_edges=False),
    "plain": FbankConfig(preemphasis_coefficient=0.0, remove_dc_offset=False, round_to_power_of_two=False),
    "energy-last-windowed": FbankConfig(use_energy=True, htk_compat=True, raw_energy=False, energy_floor=0.0),
    "8k-blackman-cmn": FbankConfig(sample_rate=8000, low_freq=64.0, high_freq=-400.0, window_type="blackman",
                                   subtract_mean=True),
    "linear-magnitude": FbankConfig(use_power=False, use_log_fbank=False, window_type="rectangular"),
    "int16-range": FbankConfig(input_scale=32768.0),
}


def kaldi_reference(config: FbankConfig, x: torch.Tensor) -> torch.Tensor:
    torchaudio = pytest.importorskip("torchaudio")
    arguments = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                 if f.name not in ("sample_rate", "input_scale")}
    return torchaudio.compliance.kaldi.fbank((x * config.input_scale).unsqueeze(0),
                                             sample_frequency=config.sample_rate, **arguments)


@pytest.mark.parametrize("name", sorted(FBANK_CONFIGS))
@pytest.mark.parametrize("samples", [16000, 12345, 400, 401, 3000])
def test_fbank_equals_torchaudio_kaldi(name, samples):
    config = FBANK_CONFIGS[name]
    x = ((torch.rand(samples, generator=torch.Generator().manual_seed(samples)) - 0.5) * 0.6)
    ours, ref = kaldi_fbank(x, config), kaldi_reference(config, x)
    assert ours.dtype == torch.float32
    assert ours.shape == ref.shape == config.feature_shape(config.num_frames(samples))
    if ref.numel():
        # rtol 1e-4: one low-energy bin in 6000 differs by 2e-5 relative (pre-emphasis and window rounded in
        # another order than torchaudio's); the absolute tolerance stays at float32 level.
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


def test_fbank_of_a_clip_shorter_than_one_frame_is_empty():
    config = FbankConfig()
    assert kaldi_fbank(torch.zeros(config.window_size - 1), config).shape == (0, 80)
    assert config.num_frames(config.window_size - 1) == 0 and config.min_samples() == config.window_size


def test_fbank_dither_is_the_generators_noise():
    config = FbankConfig(dither=1.0)
    x = torch.zeros(4000)
    a = kaldi_fbank(x, config, torch.Generator().manual_seed(7))
    b = kaldi_fbank(x, config, torch.Generator().manual_seed(7))
    c = kaldi_fbank(x, config, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.std()) > 0  # the noise lifts silence off the epsilon floor


def test_features_of_every_kind_have_their_shape_and_key():
    x = np.random.default_rng(0).uniform(-0.5, 0.5, 16000).astype(np.float32)
    for config, shape in ((MelSpectrogramConfig(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80),
                           (80, 101)), (FbankConfig(), (98, 80)), (WaveformConfig(), (16000,))):
        out = compute_features(x, config)
        assert tuple(out.shape) == shape == config.feature_shape(config.num_frames(16000))
        assert out.shape[config.time_axis] == config.num_frames(16000)
    assert [c.batch_key for c in (MelSpectrogramConfig(), FbankConfig(), WaveformConfig())] == \
        ["spectrogram", "fbank", "waveform"]


def test_batched_features_equal_per_clip_features():
    x = torch.from_numpy(np.random.default_rng(1).uniform(-0.5, 0.5, (3, 8000)).astype(np.float32))
    for config in (MelSpectrogramConfig(sample_rate=16000, clip_seconds=0.5, n_fft=400, hop_length=160, n_mels=40),
                   FbankConfig(num_mel_bins=40, subtract_mean=True)):
        batch = features_batch(x, config)
        for i in range(3):
            torch.testing.assert_close(batch[i], compute_features(x[i].numpy(), config), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_mel_bins": 3}, "num_mel_bins"), ({"frame_length": 0.05}, "frame_length"),
    ({"frame_shift": 0.0}, "frame_shift"), ({"window_type": "kaiser"}, "window_type"),
    ({"low_freq": 9000.0}, "low_freq"), ({"dither": -1.0}, "dither"), ({"input_scale": 0}, "input_scale"),
    ({"preemphasis_coefficient": 1.5}, "preemphasis_coefficient"), ({"sample_rate": 0}, "sample_rate"),
])
def test_fbank_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"FbankConfig\.{field}"):
        FbankConfig(**kwargs)


def test_waveform_config_validation():
    with pytest.raises(ValueError, match=r"WaveformConfig\.sample_rate"):
        WaveformConfig(sample_rate=-1)
