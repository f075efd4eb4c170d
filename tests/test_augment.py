"""Augmentations: each one's numeric effect, its draws (pure functions of seed and key), its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import audioloader as al
from audioloader.dsp import hashing
from audioloader.dsp.augment import Augmentations
from audioloader.dsp.augment_math import apply_masks, mixup_pairs
from audioloader.nodes.decode_spectrogram import SampleDecoder
from audioloader.samples import BadRow, Key, RawSample
from audioloader.shards.dataset.augment_rows import AugmentRows
from audioloader.stats import LoaderStats
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    corpus_table,
    durations,
    encode,
    impulse_response,
    make_shards,
    noise_clip,
    take,
    tone,
    write_audio,
    write_ipc_file,
)

RATE = 16000
WAVE = al.WaveformConfig(sample_rate=RATE)
CROP = al.LengthPolicy(clip_seconds=0.5)
MEL = al.MelSpectrogramConfig(sample_rate=RATE, clip_seconds=0.5, n_fft=400, hop_length=160, n_mels=40)
FBANK = al.FbankConfig(num_mel_bins=40)


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> Path:
    # One long noise (a window is cut) and shorter ones (repeated over the clip).
    return write_audio(tmp_path_factory.mktemp("noise") / "noise.arrow",
                       [noise_clip(0, 2.0), noise_clip(1, 0.2), noise_clip(2, 0.7), noise_clip(3, 1.1)])


@pytest.fixture(scope="module")
def rirs(tmp_path_factory) -> Path:
    return write_audio(tmp_path_factory.mktemp("rirs") / "rirs.arrow", [impulse_response(i) for i in range(3)])


def clip(i: int, seconds: float = 0.8) -> np.ndarray:
    return tone(seconds, RATE, freq=300.0 + 40 * i, seed=i)


def raw(i: int, seconds: float = 0.8, pass_index: int = 0, source: int = 0) -> RawSample:
    return RawSample(Key(i, pass_index, source), encode(clip(i, seconds), RATE, "WAV", "FLOAT"), i % 3, {},
                     "rows.arrow", i)


def decoder(augment=None, features=WAVE, length=CROP, train=True, compute_features=True) -> SampleDecoder:
    augment = None if augment is None else Augmentations(augment, 5, features, open_rows=AugmentRows,
                                                         per_batch_features=not compute_features)
    return SampleDecoder(features, seed=5, train=train, window=True, augment=augment, stats=LoaderStats(),
                         compute_features=compute_features, length=length)


def waves(augment, keys=range(12), **kwargs) -> list[tuple[np.ndarray, np.ndarray, Augmentations]]:
    """(clean, augmented, the bound list) waveforms of rows ``keys``: the same crop with and without ``augment``."""
    plain, augmented = decoder(**kwargs), decoder(augment, **kwargs)
    return [(plain(raw(i)).features.numpy(), augmented(raw(i)).features.numpy(), augmented.augment) for i in keys]


def power_db(x: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.square(x, dtype=np.float64)))


# ------------------------------------------------------------------------------------------- waveform


def test_gain_multiplies_by_the_drawn_decibels():
    gains = []
    for i, (clean, out, bound) in enumerate(waves([al.Gain(-9, 6)])):
        drawn = bound.draws(Key(i, 0))[0]["gain_db"]
        assert -9 <= drawn <= 6
        np.testing.assert_allclose(out, clean * np.float32(10 ** (drawn / 20)), rtol=1e-6)
        assert power_db(out) - power_db(clean) == pytest.approx(drawn, abs=1e-4)
        gains.append(drawn)
    assert len(set(gains)) == len(gains)  # one draw per key


def test_noise_is_added_at_the_drawn_snr(noise):
    snrs = []
    for i, (clean, out, bound) in enumerate(waves([al.AddNoise(noise, snr_db=(0, 20))])):
        drawn = bound.draws(Key(i, 0))[0]
        added = out.astype(np.float64) - clean
        assert power_db(clean) - power_db(added) == pytest.approx(drawn["snr_db"], abs=0.5)
        assert power_db(clean) - power_db(added) == pytest.approx(drawn["snr_db"], abs=0.01)  # float32 rounding
        snrs.append(drawn["snr_db"])
    assert min(snrs) >= 0 and max(snrs) <= 20 and np.std(snrs) > 2
    bound = Augmentations([al.AddNoise(noise)], 5, WAVE, open_rows=AugmentRows)
    assert {bound.draws(Key(i, 0))[0]["noise_row"] for i in range(40)} == set(range(4))


def test_noise_is_the_drawn_row_scaled(noise):
    # The added signal is exactly the drawn noise row (a window of it, or repeated), scaled.
    for i, (clean, out, bound) in enumerate(waves([al.AddNoise(noise, snr_db=(10, 10))], range(8))):
        row = bound.draws(Key(i, 0))[0]["noise_row"]
        source = noise_clip(row, [2.0, 0.2, 0.7, 1.1][row])
        added = out.astype(np.float64) - clean
        if len(source) <= len(clean):
            expected = np.resize(source, len(clean)).astype(np.float64)
        else:  # a window: find it
            start = int(np.argmax(np.correlate(source, added[:200], mode="valid")))
            expected = source[start:start + len(clean)].astype(np.float64)
        scale = np.dot(added, expected) / np.dot(expected, expected)
        np.testing.assert_allclose(added, scale * expected, atol=2e-5)


def test_silent_clip_gets_no_noise(noise):
    silent = RawSample(Key(0, 0), encode(np.zeros(RATE, np.float32), RATE, "WAV", "FLOAT"), 0, {}, "f", 0)
    out = decoder([al.AddNoise(noise)])(silent).features
    assert not out.any()


def test_probability_zero_changes_nothing(noise, rirs):
    augment = [al.SpeedPerturb(p=0.0), al.Gain(p=0.0), al.AddNoise(noise, p=0.0), al.Reverb(rirs, p=0.0)]
    for clean, out, _ in waves(augment, range(4)):
        np.testing.assert_array_equal(clean, out)


def test_probability_applies_to_about_that_fraction():
    outs = waves([al.Gain(3, 3, p=0.3)], range(400))
    applied = sum(not np.array_equal(clean, out) for clean, out, _ in outs)
    assert abs(applied - 120) < 3 * np.sqrt(400 * 0.3 * 0.7)


def test_unreadable_noise_row_makes_a_reported_bad_row(tmp_path):
    path = write_audio(tmp_path / "bad_noise.arrow", [b"not audio", None])
    out = decoder([al.AddNoise(path)])(raw(1))
    assert isinstance(out, BadRow) and not out.skipped
    assert "AddNoise" in out.reason and "row" in out.reason
    assert out.key == Key(1, 0) and out.file == "rows.arrow"


def test_reverb_equals_the_reference_convolution(rirs):
    for i, (clean, out, bound) in enumerate(waves([al.Reverb(rirs, normalize=False)], range(6))):
        ir = impulse_response(bound.draws(Key(i, 0))[0]["ir_row"])
        expected = np.convolve(clean.astype(np.float64), ir.astype(np.float64))[:len(clean)]
        np.testing.assert_allclose(out, expected, atol=2e-5 * np.abs(expected).max())


def test_reverb_normalize_keeps_the_level(rirs):
    for (clean, out, _), (_, unscaled, _) in zip(waves([al.Reverb(rirs)], range(4)),
                                                     waves([al.Reverb(rirs, normalize=False)], range(4)),
                                                     strict=True):
        assert power_db(out) == pytest.approx(power_db(clean), abs=1e-3)
        np.testing.assert_allclose(out / np.linalg.norm(out), unscaled / np.linalg.norm(unscaled), atol=1e-6)


def dominant_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x)), 1 << 18))
    return float(np.argmax(spectrum) * RATE / (1 << 18))


def test_speed_changes_length_and_pitch_by_the_factor():
    whole = al.LengthPolicy(crop=None)
    factors = {}
    for i, (clean, out, bound) in enumerate(waves([al.SpeedPerturb((0.8, 1.0, 1.25))], range(12), length=whole)):
        factor = bound.draws(Key(i, 0))[0]["speed"]
        factors[factor] = factors.get(factor, 0) + 1
        assert len(out) == round(len(clean) / factor)
        assert dominant_hz(out) == pytest.approx(dominant_hz(clean) * factor, rel=2e-3)
    assert set(factors) == {0.8, 1.0, 1.25}


def test_speed_keeps_the_crop_length():
    for i, (clean, out, bound) in enumerate(waves([al.SpeedPerturb((0.9, 1.1))], range(6))):
        factor = bound.draws(Key(i, 0))[0]["speed"]
        assert out.shape == clean.shape == (CROP.clip_samples(WAVE),)
        assert dominant_hz(out) == pytest.approx(dominant_hz(clean) * factor, rel=5e-3)


def test_user_function_beside_builtins_gets_the_seeded_rng():
    seen = []

    def record(wave, rng):
        seen.append(rng.integers(1 << 30))
        return wave

    decoder([al.Gain(0, 0), record])(raw(3))
    expected = hashing.generator(5, hashing.salt_at(hashing.SALT_AUGMENT, 1), 3, 0).integers(1 << 30)
    assert seen == [expected]
    seen.clear()
    decoder(record)(raw(3))  # alone, at position 0: exactly the rng of the old augment=fn
    assert seen == [hashing.generator(5, hashing.SALT_AUGMENT, 3, 0).integers(1 << 30)]


# ------------------------------------------------------------------------------------------- draws


def test_draws_are_pure_functions_of_seed_key_and_position(noise):
    bound = Augmentations([al.Gain(), al.Gain(), al.AddNoise(noise)], 5, WAVE, open_rows=AugmentRows)
    again = Augmentations([al.Gain(), al.Gain(), al.AddNoise(noise)], 5, WAVE, open_rows=AugmentRows)
    key = Key(7, 2)
    assert bound.draws(key) == again.draws(key)
    assert bound.draws(key)[0] != bound.draws(key)[1]  # two gains in one list draw independently
    assert bound.draws(key) != bound.draws(Key(7, 3))  # another pass: other draws
    assert bound.draws(key) != bound.draws(Key(7, 2, 1))  # another source: other draws
    assert Augmentations([al.Gain()], 6, WAVE).draws(key) != bound.draws(key)[:1]


@pytest.mark.parametrize(("augment", "message"), [
    ([al.Gain(), al.SpeedPerturb()], "SpeedPerturb.*before"),
    ([al.SpecAugment(), al.Gain()], r"augment\[1\] \(Gain\) comes after augment\[0\] \(SpecAugment\)"),
    ([al.Mixup(), al.SpecAugment()], "SpecAugment before"),
    ([al.Mixup(), al.Mixup()], "Mixup 2 times"),
    (["gain"], r"augment\[0\] is a str"),
])
def test_bad_lists_are_refused_naming_the_item(augment, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Augmentations(augment, 0, MEL)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: al.Gain(6, -6), "min_db"),
    (lambda: al.Gain(p=1.5), "p=1.5"),
    (lambda: al.AddNoise("x", snr_db=(20, 5)), "snr_db"),
    (lambda: al.SpeedPerturb(()), "factors"),
    (lambda: al.SpecAugment(fill="nan"), "fill"),
    (lambda: al.SpecAugment(time_masks=-1), "time_masks"),
    (lambda: al.Mixup(alpha=0), "alpha"),
])
def test_bad_settings_are_refused_naming_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_specaugment_needs_spectrogram_features():
    with pytest.raises(ValueError, match="WaveformConfig"):
        Augmentations([al.SpecAugment()], 0, WAVE)


# ------------------------------------------------------------------------------------------- SpecAugment


@pytest.mark.parametrize("features", [MEL, FBANK])
@pytest.mark.parametrize("fill", ["mean", "zero"])
def test_masks_fill_exactly_the_drawn_bands(features, fill):
    spec = al.SpecAugment(freq_masks=2, max_freq_width=8, time_masks=2, max_time_width=10, fill=fill)
    plain, masked = decoder(features=features), decoder([spec], features=features)
    time_axis = features.time_axis
    hit_any = False
    for i in range(10):
        clean, out = plain(raw(i)).features, masked(raw(i)).features
        frames, bins = clean.shape[time_axis], clean.shape[1 - time_axis]
        masks = masked.augment.draws(Key(i, 0), frames=frames)[0]["masks"]
        inside = np.zeros((bins, frames), bool)
        for start, width in masks[:2]:
            inside[start:start + width, :] = True
        for start, width in masks[2:]:
            inside[:, start:start + width] = True
        inside = torch.from_numpy(inside if time_axis == 1 else inside.T)
        value = clean.mean() if fill == "mean" else 0.0
        assert torch.equal(out[~inside], clean[~inside])
        assert torch.allclose(out[inside], torch.full_like(out[inside], float(value)))
        assert (masks[:, 1] <= [8, 8, 10, 10]).all()
        hit_any |= bool(inside.any())
    assert hit_any


def test_masks_on_a_padded_batch_leave_the_padding_alone():
    features = torch.ones(2, 3, 6)
    masks = torch.tensor([[[0, 1], [4, 2]], [[1, 1], [0, 0]]])  # one freq mask, one time mask each
    out = apply_masks(features * torch.arange(1, 3).view(2, 1, 1), masks, 1, time_axis=1, fill="zero",
                      lengths=torch.tensor([6, 3]))
    assert out[0, 0].tolist() == [0.0] * 6 and out[0, 1].tolist() == [1, 1, 1, 1, 0, 0]
    assert out[1, 1, :3].tolist() == [0.0] * 3 and out[1, 1, 3:].tolist() == [2.0] * 3  # padding untouched


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA device"))]


def on_cpu(batch: dict) -> dict:
    return {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in batch.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train", [True, False])
def test_masks_per_batch_on_a_device_equal_the_per_sample_path(tmp_path, train, device):
    make_shards(tmp_path, [10, 7], batch_rows=4, seconds=0.6)
    spec = [al.SpecAugment(max_freq_width=10, max_time_width=12)] + ([al.Mixup()] if train else [])
    kwargs = {"batch_size": 4, "features": MEL, "seed": 2, "storage": al.Storage(split_rows=4),
              "workers": al.Workers(num_workers=2), "train": train, "augment": spec}
    if train:
        kwargs.update(shuffle=al.Shuffle(buffer_size=8, min_size=4))
    unmasked = {**kwargs, "augment": None}
    loaders = [al.AudioLoader(tmp_path, **kwargs), al.AudioLoader(tmp_path, device=device, **kwargs),
               al.AudioLoader(tmp_path, **unmasked), al.AudioLoader(tmp_path, device=device, **unmasked)]
    a, b, clean_a, clean_b = [[on_cpu(batch) for batch in (take(loader, 4) if train else list(loader))]
                              for loader in loaders]
    for loader in loaders:
        loader.shutdown()
    assert len(a) == len(b)
    for x, y, x0, y0 in zip(a, b, clean_a, clean_b, strict=True):
        assert x.keys() == y.keys()
        assert torch.equal(x["index"], y["index"])
        assert torch.allclose(x["spectrogram"], y["spectrogram"], rtol=1e-4, atol=1e-4)
        if train:
            assert torch.equal(x["mixup_partner"], y["mixup_partner"])
            assert torch.equal(x["mixup_weights"], y["mixup_weights"])
        else:
            masked = x["spectrogram"] != x0["spectrogram"]  # the same cells masked on both paths
            assert masked.any() and torch.equal(masked, y["spectrogram"] != y0["spectrogram"])


def test_masks_on_whole_utterances_per_batch_equal_the_per_sample_path(tmp_path):
    write_ipc_file(tmp_path / "speech.arrow", corpus_table(durations(12)), batch_rows=4)
    kwargs = {"batch_size": 4, "features": FBANK, "seed": 2, "storage": al.Storage(split_rows=4),
              "workers": al.Workers(num_workers=2), "train": False, "length": al.LengthPolicy(crop=None),
              "augment": [al.SpeedPerturb(), al.SpecAugment(max_time_width=30)]}
    source = al.Source(tmp_path, label_column=None)
    with al.AudioLoader(source, **kwargs) as per_sample, al.AudioLoader(source, device="cpu", **kwargs) as batched:
        for x, y in zip(per_sample, batched, strict=True):
            assert torch.equal(x["lengths"], y["lengths"])
            assert torch.allclose(x["fbank"], y["fbank"], rtol=1e-4, atol=1e-3)


# ------------------------------------------------------------------------------------------- Mixup


@pytest.fixture(scope="module")
def shards(shard_folder) -> Path:
    return shard_folder([12, 9], batch_rows=4, seconds=0.6)


def mixup_loader(shards, augment, **kwargs) -> al.AudioLoader:
    options = {"batch_size": 6, "features": MEL, "seed": 4, "storage": al.Storage(split_rows=4),
               "workers": al.Workers(num_workers=2), "shuffle": al.Shuffle(buffer_size=8, min_size=4),
               "augment": augment}
    options.update(kwargs)
    return al.AudioLoader(shards, **options)


def test_mixup_batch_is_the_weighted_sum_of_the_unmixed_batch(shards):
    with mixup_loader(shards, [al.Gain(), al.Mixup(0.4)]) as mixed, mixup_loader(shards, [al.Gain()]) as plain:
        for x, y in zip(take(mixed, 4), take(plain, 4), strict=True):
            assert torch.equal(x["index"], y["index"]) and torch.equal(x["label"], y["label"])
            w, partner = x["mixup_weights"], x["mixup_partner"]
            assert torch.allclose(w.sum(dim=1), torch.ones(len(w)))
            assert ((w >= 0) & (w <= 1)).all() and len(set(w[:, 0].tolist())) == len(w)
            assert sorted(partner.tolist()) == list(range(len(partner)))  # a permutation...
            assert (partner != torch.arange(len(partner))).all()  # ...with no sample mixed with itself
            spec = y["spectrogram"]
            expected = w[:, 0, None, None] * spec + w[:, 1, None, None] * spec[partner]
            assert torch.allclose(x["spectrogram"], expected, atol=1e-5)
            assert torch.equal(x["mixup_labels"], torch.stack([y["label"], y["label"][partner]], dim=1))
            targets = al.mixup_targets(x, 3)
            assert torch.allclose(targets.sum(dim=1), torch.ones(len(w)))


def test_mixup_pairs_follow_the_pairing_numbers():
    assert mixup_pairs(torch.tensor([0.5, 0.1, 0.9, 0.3])).tolist() == [2, 3, 1, 0]
    assert mixup_pairs(torch.tensor([0.2])).tolist() == [0]


def test_mixup_is_refused_where_it_makes_no_sense(shards):
    with pytest.raises(ValueError, match="evaluation"):
        mixup_loader(shards, [al.Mixup()], train=False, shuffle=al.Shuffle())
    with pytest.raises(ValueError, match="whole utterances"):
        mixup_loader(shards, [al.Mixup()], length=al.LengthPolicy(crop=None), batch_size=2)


def test_every_augmentation_resumes_exactly(shards, noise, rirs):
    augment = [al.SpeedPerturb(), al.Gain(), al.AddNoise(noise), al.Reverb(rirs), al.SpecAugment(), al.Mixup()]
    assert_resumes_exactly(lambda **options: mixup_loader(shards, augment, **options), 7, (3,),
                           workers=al.Workers(num_workers=0))


def test_augmentations_are_part_of_the_fingerprint(shards, noise):
    with mixup_loader(shards, [al.AddNoise(noise, snr_db=(5, 10))]) as loader:
        take(loader, 1)
        state = loader.state_dict()
    with mixup_loader(shards, [al.AddNoise(noise, snr_db=(5, 11))]) as other, \
            pytest.raises(al.CheckpointMismatchError, match="augment"):
        other.load_state_dict(state)


def test_noise_file_identity_not_location_is_fingerprinted(shards, noise, tmp_path):
    moved = tmp_path / "elsewhere" / "noise.arrow"
    moved.parent.mkdir()
    moved.write_bytes(noise.read_bytes())
    with mixup_loader(shards, [al.AddNoise(noise)]) as a, mixup_loader(shards, [al.AddNoise(moved)]) as b:
        assert a.state_dict()["fingerprint"] == b.state_dict()["fingerprint"]
        assert_same_batches(take(a, 2), take(b, 2))


def test_crops_are_unchanged_by_augmentation_that_draws_nothing(shards):
    # The crop offsets are the loader's own draws: an augment list must not move them.
    with mixup_loader(shards, [al.Gain(0, 0)]) as a, mixup_loader(shards, None) as b:
        assert_same_batches(take(a, 3), take(b, 3))
