"""Mixing sources: proportions, stop criteria, exactly once in eval, exact resume, determinism, checkpoints."""

from __future__ import annotations

import itertools
import pickle
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import audioloader as al
from audioloader.nodes import ArrowShardReader, WeightedMix
from tests.helpers import MIX_ROWS as ROWS
from tests.helpers import MIX_WEIGHTS as WEIGHTS
from tests.helpers import (
    assert_resumes_exactly,
    assert_same_batches,
    audio_table,
    mix_loader,
    mix_of,
    roundtrip,
    state_holding,
    take,
    write_ipc_file,
)


def every_augmentation(root: Path) -> list:
    return [al.SpeedPerturb(), al.Gain(), al.AddNoise(str(root / "noise")), al.Reverb(str(root / "rirs")),
            flip, al.SpecAugment(max_freq_width=4, max_time_width=4), al.Mixup()]


def flip(wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A module-level user function (importable in worker processes) beside the built-in augmentations."""
    return wave[::-1] * np.float32(rng.uniform(0.5, 1.0))


def readers(root: Path, **kwargs) -> dict[str, ArrowShardReader]:
    return {name: ArrowShardReader.of(root / name, seed=s, split_rows=4, **kwargs) for s, name in enumerate(ROWS)}


def keys_of(node) -> list[al.Key]:
    return [item.key for item in node]


# ------------------------------------------------------------------------------------------- the mix node


def test_realised_proportions_over_10000_draws_are_within_3_sd(mix_root):
    node = WeightedMix(readers(mix_root), WEIGHTS, stop="cycle", seed=3)
    counts = Counter(item.key.source for item in itertools.islice(node, 10000))
    for s, weight in enumerate(WEIGHTS.values()):
        assert abs(counts[s] - 10000 * weight) < 3 * np.sqrt(10000 * weight * (1 - weight)), counts


def test_cycling_sources_read_every_row_once_per_pass(mix_root):
    node = WeightedMix(readers(mix_root), WEIGHTS, stop="cycle", seed=3)
    keys = [item.key for item in itertools.islice(node, 600)]
    for s, files in enumerate(ROWS.values()):
        rows = sum(files)
        passes: dict[int, list[int]] = {}
        for key in keys:
            if key.source == s:
                passes.setdefault(key.pass_index, []).append(key.index)
        complete = sorted(passes)[:-1]  # the last pass may be under way
        assert len(complete) >= 2
        for p in complete:
            assert sorted(passes[p]) == list(range(rows)), (s, p)
        assert passes[complete[0]] != passes[complete[1]]  # a new split order every pass


def test_all_exhausted_reads_every_row_once_then_stops(mix_root):
    keys = keys_of(WeightedMix(readers(mix_root), WEIGHTS, stop="all_exhausted", seed=3))
    assert sorted((k.source, k.index) for k in keys) == [(s, i) for s, files in enumerate(ROWS.values())
                                                         for i in range(sum(files))]
    assert {k.pass_index for k in keys} == {0}
    c_positions = [i for i, k in enumerate(keys) if k.source == 2]
    assert c_positions[-1] < len(keys) - 10  # c ran out first; the others went on without it


def test_first_exhausted_stops_when_one_source_runs_out(mix_root):
    keys = keys_of(WeightedMix(readers(mix_root), WEIGHTS, stop="first_exhausted", seed=3))
    per_source = Counter(k.source for k in keys)
    assert per_source[2] == 6  # c gave all its rows...
    assert per_source[0] < 22 and per_source[1] < 20  # ...and the mix ended there


def test_an_infinite_mix_starts_the_next_epoch_at_every_source_s_next_pass(mix_root):
    node = WeightedMix(readers(mix_root), WEIGHTS, stop="all_exhausted", infinite=True, seed=3)
    keys = [item.key for item in itertools.islice(node, 48 + 48)]
    assert {k.pass_index for k in keys[:48]} == {0} and {k.pass_index for k in keys[48:]} == {1}
    assert sorted((k.source, k.index) for k in keys[48:]) == sorted((k.source, k.index) for k in keys[:48])


def test_mix_node_resumes_exactly_after_an_exhaustion(mix_root):
    for stop in ("cycle", "all_exhausted", "first_exhausted"):
        reference = [item.key for item in itertools.islice(
            WeightedMix(readers(mix_root), WEIGHTS, stop=stop, infinite=True, seed=3), 120)]
        for cut in (5, 29, 47, 48, 77):
            first = WeightedMix(readers(mix_root), WEIGHTS, stop=stop, infinite=True, seed=3)
            head = [next(first).key for _ in range(cut)]
            again = WeightedMix(readers(mix_root), WEIGHTS, stop=stop, infinite=True, seed=3)
            again.reset(roundtrip(first.state_dict()))
            assert head + [next(again).key for _ in range(120 - cut)] == reference, (stop, cut)


# ------------------------------------------------------------------------------------------- the loader


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_reads_every_row_of_every_source_exactly_once_across_ranks(mix_root, world_size):
    seen, lengths = [], set()
    for rank in range(world_size):
        with mix_loader(mix_root, train=False, storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            batches = list(loader)
            lengths.add((len(batches), len(loader)))
            for b in batches:
                seen += zip(b["source"][b["valid"]].tolist(), b["index"][b["valid"]].tolist(), strict=True)
    assert sorted(seen) == [(s, i) for s, files in enumerate(ROWS.values()) for i in range(sum(files))]
    assert len(lengths) == 1 and len({n for pair in lengths for n in pair}) == 1  # every rank: len() batches


def test_batches_carry_the_source_and_stats_count_per_source(mix_root):
    with mix_loader(mix_root, train=False, columns=("uid",)) as loader:
        batches = list(loader)
        stats = loader.stats()
        assert loader.source_names == ("a", "b", "c")
    counts = Counter(torch.cat([b["source"][b["valid"]] for b in batches]).tolist())
    for s, name in enumerate(ROWS):
        assert stats["sources"][name]["samples"] == counts[s] == sum(ROWS[name])
        assert stats["sources"][name]["weight"] == pytest.approx(WEIGHTS[name])
        assert stats["sources"][name]["share"] == pytest.approx(counts[s] / 48)
    for b in batches:  # the uid column is per source: 100 * source + index
        valid = b["valid"]
        assert (b["uid"][valid] == 100 * b["source"][valid] + b["index"][valid]).all()


def test_training_proportions_in_stats_follow_the_weights(mix_root):
    with mix_loader(mix_root, batch_size=50) as loader:
        take(loader, 20)
        sources = loader.stats()["sources"]
    n = sum(s["samples"] for s in sources.values())
    assert n >= 1000
    for name, weight in WEIGHTS.items():
        assert abs(sources[name]["samples"] - n * weight) < 3 * np.sqrt(n * weight * (1 - weight))
    assert sources["c"]["passes"] > sources["a"]["passes"]  # the small source cycles more often


RESUME_CASES = [("cycle", True), ("cycle", False), ("all_exhausted", True), ("first_exhausted", False)]


@pytest.mark.parametrize(("stop", "shuffle_before_decode"), RESUME_CASES)
def test_resume_is_exact_at_random_cut_points_with_one_source_exhausting(mix_root, stop, shuffle_before_decode):
    kwargs = {"shuffle": al.Shuffle(before_decode=shuffle_before_decode),
              "augment": [al.Gain(), al.AddNoise(str(mix_root / "noise")), al.SpecAugment(max_time_width=4)]}
    total = 10
    with mix_loader(mix_root, mix_of(mix_root, stop), **kwargs) as loader:
        reference = take(loader, total)
        assert loader.stats()["sources"]["c"]["passes"] >= 2  # c ran out (and started again) in the window
    assert_resumes_exactly(lambda **options: mix_loader(mix_root, mix_of(mix_root, stop), **kwargs, **options),
                           total, sorted(random.Random(stop).sample(range(1, total), 4)), reference=reference)


WORKERS = [(0, "thread"), (1, "thread"), (4, "thread"), (1, "process"), (4, "process")]


@pytest.mark.parametrize("shuffle_before_decode", [True, False])
def test_same_batches_for_any_workers_with_a_mix_and_every_augmentation(mix_root, shuffle_before_decode):
    results = []
    for num_workers, kind in WORKERS:
        workers = al.Workers(num_workers=num_workers, kind=kind)
        with mix_loader(mix_root, augment=every_augmentation(mix_root), workers=workers,
                        shuffle=al.Shuffle(before_decode=shuffle_before_decode)) as loader:
            results.append(take(loader, 5))
    for other in results[1:]:
        assert_same_batches(other, results[0])
    assert "mixup_weights" in results[0][0] and "source" in results[0][0]


def test_a_mix_checkpoint_refuses_another_world_size(mix_root):
    with mix_loader(mix_root, storage=al.Storage(rank=0, world_size=2)) as loader:
        take(loader, 1)
        state = loader.state_dict()
    with mix_loader(mix_root, storage=al.Storage(rank=0, world_size=3)) as other, \
            pytest.raises(al.CheckpointMismatchError) as info:
        other.load_state_dict(state)
    assert "world_size" in info.value.fields and "mix" in info.value.fields
    assert "world_size" in str(info.value)


def test_a_mix_loader_pickles_with_its_position(mix_root):
    augment = [al.Gain(), al.AddNoise(str(mix_root / "noise")), al.Mixup()]
    with mix_loader(mix_root, augment=augment) as loader:
        reference = take(loader, 5)
    with mix_loader(mix_root, augment=augment) as loader:
        head = take(loader, 2)
        copy = pickle.loads(pickle.dumps(loader))  # arguments (the Mix, the list) and position
    with copy:
        assert_same_batches(head + take(copy, 3), reference)


@pytest.mark.parametrize("change", ["weights", "order", "stop"])
def test_a_mix_checkpoint_names_a_changed_mix(mix_root, change):
    with mix_loader(mix_root) as loader:
        take(loader, 1)
        state = loader.state_dict()
    entries = {name: (str(mix_root / name), WEIGHTS[name]) for name in ROWS}
    other_mix = {"weights": al.Mix({**entries, "c": (str(mix_root / "c"), 0.4)}),
                 "order": al.Mix(dict(reversed(entries.items()))),
                 "stop": al.Mix(entries, stop="all_exhausted")}[change]
    with mix_loader(mix_root, other_mix) as other, pytest.raises(al.CheckpointMismatchError, match="mix"):
        other.load_state_dict(state)


def test_single_source_checkpoints_have_exactly_the_old_fields(mix_root):
    # Mixing adds nothing to a single source's checkpoint. (Content identity does: "file_identity" in the
    # fingerprint and the buffered rows' "checksums"; byte budgets: "memory", the preset's "interleave" and the
    # buffer's "pass" and "full"; checkpoints without them still load.)
    old_fingerprint = {"files", "seed", "rank", "world_size", "features", "batch_size", "shuffle_buffer_size",
                       "shuffle_min_size", "train", "infinite", "drop_last", "shuffle_before_decode", "split_rows",
                       "audio_column", "label_column", "columns", "file_identity", "memory", "interleave"}
    for shuffle_before_decode in (True, False):
        with mix_loader(mix_root, str(mix_root / "a"), shuffle=al.Shuffle(before_decode=shuffle_before_decode),
                        augment=flip) as loader:
            take(loader, 2)
            state = loader.state_dict()
        assert set(state["fingerprint"]) == old_fingerprint
        buffer = state_holding(state, "draws")
        # ("fenced": only while the first row of the next pass waits for the buffer to empty.)
        assert set(buffer) - {"fenced"} == {"source", "draws", "exhausted", "primed", "indices", "passes",
                                            "checksums", "pass", "full"}


def test_sources_with_their_own_columns_and_length_policy(mix_root, tmp_path):
    table = audio_table(300, 10, seconds=0.4).rename_columns(["wav", "y", "uid", "name"])
    write_ipc_file(tmp_path / "other.arrow", table, batch_rows=4)
    centre = al.LengthPolicy(crop="center")
    mix = mix_of(mix_root, b=al.Source(str(mix_root / "b"), length=centre),
                 c=al.Source(str(tmp_path), audio_column="wav", label_column="y"))
    with mix_loader(mix_root, mix, train=False, columns=("uid",)) as loader:
        batches = list(loader)
    with mix_loader(mix_root, str(mix_root / "b"), train=False) as b_alone:  # eval: centre crops
        expected = {i: spec for batch in b_alone for i, spec in zip(batch["index"].tolist(), batch["spectrogram"],
                                                                    strict=True)}
    got = {(s, i): spec for b in batches for s, i, spec in zip(b["source"].tolist(), b["index"].tolist(),
                                                               b["spectrogram"], strict=True)}
    for i, spec in expected.items():
        assert torch.equal(got[(1, i)], spec)
    assert sorted(i for s, i in got if s == 2) == list(range(10))
    uids = torch.cat([b["uid"][b["source"] == 2] for b in batches])
    assert sorted(uids.tolist()) == list(range(300, 310))


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda root: al.Mix({}), TypeError, "non-empty dict"),
    (lambda root: al.Mix({"a": str(root / "a")}), TypeError, r"\(source, weight\) pair"),
    (lambda root: al.Mix({"a": (str(root / "a"), 0)}), ValueError, "weight=0"),
    (lambda root: al.Mix({"a": (str(root / "a"), 1.0)}, stop="forever"), ValueError, "stop='forever'"),
    (lambda root: mix_loader(root, train=False, infinite=False, mix=mix_of(root, "cycle")), ValueError,
     "exactly once"),
    (lambda root: mix_loader(root, infinite=False, mix=mix_of(root, "cycle")), ValueError, "never ends"),
    (lambda root: mix_loader(root, mix_of(root, c=al.Source(str(root / "c"), label_column=None))), ValueError,
     "disagree on labels"),
    (lambda root: mix_loader(root, mix_of(root, c=al.Source(str(root / "c"), length=al.LengthPolicy(clip_seconds=1)))),
     ValueError, "crop to different lengths"),
    (lambda root: mix_loader(root, batching=al.Bucketing(max_duration=2.0), length=al.LengthPolicy(crop=None)),
     ValueError, "Bucketing"),
    (lambda root: mix_loader(root, mix_of(root, c=al.Source(str(root / "nowhere")))), al.SourceNotFoundError,
     "nowhere"),
])
def test_bad_mixes_are_refused_with_the_fix(mix_root, make, error, message):
    with pytest.raises(error, match=message) as info:
        make(mix_root)
    if error is al.SourceNotFoundError:
        assert "Mix source 'c'" in "".join(getattr(info.value, "__notes__", []))


def test_a_column_of_two_types_is_refused(mix_root, tmp_path):
    table = audio_table(0, 6, seconds=0.4)
    table = table.set_column(2, "uid", pa.array([str(u) for u in table.column("uid").to_pylist()]))
    write_ipc_file(tmp_path / "strings.arrow", table, batch_rows=3)
    with pytest.raises(ValueError, match="column 'uid'"):
        mix_loader(mix_root, mix_of(mix_root, c=str(tmp_path)), columns=("uid",))


def test_torchdata_stop_criteria_names_are_accepted(mix_root):
    from torchdata.nodes import StopCriteria

    assert al.Mix({"a": (str(mix_root / "a"), 1.0)}, stop=StopCriteria.ALL_DATASETS_EXHAUSTED).stop == "all_exhausted"
    assert al.Mix({"a": (str(mix_root / "a"), 1.0)}, stop=StopCriteria.CYCLE_FOREVER).stop == "cycle"
