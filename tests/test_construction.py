"""`AudioLoader`'s construction in one line: the options checked (a mix's too), the shards opened, every setting
final; the chain is built once, on first use (``iter()``, ``state_dict()``, ``len()``), so a checkpoint loaded
before iterating never builds a second one. Every error a user relies on still comes where it came: bad options
and missing files at construction, a checkpoint of another loader at ``load_state_dict`` (leaving the loader as
it was)."""

from __future__ import annotations

import pytest

import audioloader as al
from audioloader import audio_loader
from audioloader.chain import chain_layers

from .helpers import assert_same_batches, layers_of, loader_for, make_shards, mix_of, roundtrip, take

ROWS = [7, 13, 5, 9]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("construction")
    make_shards(root, ROWS, batch_rows=3)
    return root


@pytest.fixture
def builds(monkeypatch) -> list:
    """Every chain an `AudioLoader` builds (its `chain.build_chain`, wrapped), in order."""
    built, build = [], audio_loader.build_chain

    def counted(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(audio_loader, "build_chain", counted)
    return built


def test_construct_load_state_dict_iterate_builds_one_chain(folder, builds):
    with loader_for(folder) as first:
        take(first, 2)
        state = roundtrip(first.state_dict())
        expected = take(first, 3)
    builds.clear()
    with loader_for(folder) as resumed:
        assert builds == []  # construction builds nothing
        resumed.load_state_dict(state)
        assert builds == []  # nor does a checkpoint loaded before iterating
        assert resumed.state_dict()["loader"] == state["loader"]  # the loaded state, before any batch
        assert_same_batches(take(resumed, 3), expected)
        assert len(builds) == 1


@pytest.mark.parametrize("first_use", ["iter", "state_dict", "len", "reader", "stats"])
def test_the_chain_is_built_on_first_use_and_only_once(folder, builds, first_use):
    with loader_for(folder, train=False) as loader:
        assert builds == []
        use = {"iter": lambda: next(iter(loader)), "state_dict": loader.state_dict, "len": lambda: len(loader),
               "reader": lambda: loader.reader, "stats": loader.stats}[first_use]
        use()
        assert len(builds) == 1
        assert len(list(loader)) == len(loader)  # a new iter(): the next pass, whole
        loader.state_dict()
        assert len(builds) == 1


def test_a_checkpoint_taken_with_other_settings_builds_its_chain_once(folder, builds):
    """A checkpoint the loader settles other settings for (here: one taken before byte budgets, a legacy buffer)
    gets one chain, built with those settings; none is built for the construction's settings."""
    with loader_for(folder) as first:
        take(first, 2)
        state = roundtrip(first.state_dict())
    state["fingerprint"].pop("memory")  # as a checkpoint from before byte budgets records it
    builds.clear()
    with loader_for(folder) as resumed:
        resumed.load_state_dict(state)
        assert builds == [] and resumed.settings.shuffle.legacy
        next(iter(resumed))
        assert len(builds) == 1 and builds[0].buffer.max_bytes is None  # the legacy buffer: rows only


def test_an_elastic_resume_reads_the_old_states_without_a_chain_and_builds_the_resumed_one_once(folder, builds):
    """The old ranks' states are read by the node types of a chain of this loader's settings (`chain.chain_layers`:
    each type says what a state of its own holds), with no chain built; the resumed chain is built once, on first
    use, with this rank's start in its reader's plan and its batcher's layout, never changed after."""
    states = []
    for rank in range(2):
        with loader_for(folder, train=False, storage=al.Storage(rank=rank, world_size=2)) as old:
            take(old, 1)
            states.append(roundtrip(old.state_dict()))
    builds.clear()
    with loader_for(folder, train=False, storage=al.Storage(rank=0, world_size=3)) as resumed:
        resumed.load_state_dict(states)
        assert builds == []
        batches = list(resumed)
        assert len(builds) == 1
        chain = builds[0]
        assert chain.reader.plan.start is not None and chain.reader.plan is resumed.settings.reads[0]
        assert chain.batcher.layout.first_pass_batches == len(batches)


#: Loaders whose chains differ in shape: where the buffer sits, bucketing in training and evaluation, features on
#: a device, per-batch augmentations on either side of it, pinned memory (without CUDA: not pinned).
SHAPES = {
    "train": {},
    "eval": {"train": False},
    "buffer after decode": {"shuffle": al.Shuffle(before_decode=False)},
    "bucketing train": {"batching": al.Bucketing(max_duration=2.0), "length": al.LengthPolicy(crop=None)},
    "bucketing eval": {"batching": al.Bucketing(max_duration=2.0), "length": al.LengthPolicy(crop=None),
                       "train": False},
    "device": {"device": "cpu"},
    "mixup": {"augment": [al.Mixup()]},
    "mixup on device": {"augment": [al.SpecAugment(), al.Mixup()], "device": "cpu"},
    "pin memory": {"workers": al.Workers(pin_memory=True)},
}


@pytest.mark.filterwarnings("ignore:pin_memory=True but CUDA is not available")
@pytest.mark.parametrize("shape", SHAPES)
def test_the_layers_an_elastic_resume_reads_are_those_of_the_chain_built(folder, builds, shape):
    """`chain.chain_layers` (what an elastic resume reads the old states through) names the types of the nodes
    `build_chain` wires, root to reader, for every shape of chain."""
    with loader_for(folder, **SHAPES[shape]) as loader:
        loader.state_dict()  # builds the chain
        assert chain_layers(loader.settings) == tuple(layers_of(builds[0].root))


def test_option_errors_come_at_construction_before_any_file_is_opened(tmp_path, builds):
    missing = tmp_path / "no such folder"
    with pytest.raises(ValueError, match=r"batching=Bucketing\(\.\.\.\) forms batches of whole utterances"):
        al.AudioLoader(missing, batching=al.Bucketing(max_duration=5.0))
    # A mix's options are checked with the loader's, before any of its sources is opened.
    mix = mix_of(tmp_path, stop="cycle")
    with pytest.raises(ValueError, match=r"Mix\(stop='cycle'\) with train=False"):
        al.AudioLoader(mix, train=False)
    with pytest.raises(ValueError, match=r"Mix\(stop='cycle'\) never ends, but infinite=False"):
        al.AudioLoader(mix, infinite=False)
    with pytest.raises(ValueError, match=r"batching=Bucketing\(\.\.\.\) does not take a Mix yet"):
        al.AudioLoader(mix_of(tmp_path), length=al.LengthPolicy(crop=None, max_seconds=2.0),
                       batching=al.Bucketing(max_duration=5.0))
    unlabelled = mix_of(tmp_path, a=al.Source(str(tmp_path / "a"), label_column=None))
    with pytest.raises(ValueError, match="Mix sources disagree on labels"):
        al.AudioLoader(unlabelled)
    segments = mix_of(tmp_path, a=al.Source(str(tmp_path / "a"), segments=al.Segments(start="start", end="end")))
    with pytest.raises(ValueError, match=r"Mix source\(s\) \['a'\] have segments="):
        al.AudioLoader(segments)
    whole = mix_of(tmp_path, a=al.Source(str(tmp_path / "a"), length=al.LengthPolicy(crop=None, max_seconds=2.0)))
    with pytest.raises(ValueError, match="Mix sources mix fixed crops and whole utterances"):
        al.AudioLoader(whole)
    assert builds == []


def test_missing_files_fail_at_construction(tmp_path, builds):
    with pytest.raises(FileNotFoundError):
        al.AudioLoader(tmp_path / "no such folder")
    assert builds == []


def test_a_refused_checkpoint_fails_at_load_state_dict_and_leaves_the_loader_as_it_was(folder, builds):
    with loader_for(folder) as first:
        take(first, 2)
        state = roundtrip(first.state_dict())
        expected = take(first, 2)
    with loader_for(folder, seed=2) as other, pytest.raises(al.CheckpointMismatchError, match="seed"):
        other.load_state_dict(state)
    builds.clear()
    with loader_for(folder) as loader:
        settings = loader.settings
        with pytest.raises(al.CheckpointMismatchError, match="world_size"):
            loader.load_state_dict({**state, "fingerprint": {**state["fingerprint"], "world_size": 2}})
        assert loader.settings is settings and builds == []
        loader.load_state_dict(state)
        assert_same_batches(take(loader, 2), expected)
        assert len(builds) == 1
