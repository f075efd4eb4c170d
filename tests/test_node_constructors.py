"""Nodes take their groups: every public node's constructor takes at most 8 parameters (source, its settled
group(s), stats and the like), the settings one by one go to its factory ``Node.of(...)``, and a constructor given
them one by one is refused with a ``TypeError`` naming that factory."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from torchdata.nodes import BaseNode, IterableWrapper

import audioloader as al
import audioloader.nodes as nodes
from audioloader.nodes import (
    ArrowShardReader,
    Batcher,
    BatchLayout,
    BucketLimits,
    BufferLimits,
    DecodeConfig,
    DecodeSpectrogram,
    DurationBucketer,
    MapPool,
    ParallelMap,
    ReadPlan,
    ShuffleBuffer,
)
from audioloader.shards import ShardDataset

from .helpers import make_shards

MAX_PARAMETERS = 8


def public_nodes() -> dict[str, type]:
    """Every public `BaseNode` class defined in a module of `audioloader.nodes`."""
    found = {}
    for module in pkgutil.iter_modules(nodes.__path__):
        if module.name.startswith("_"):
            continue
        for name, value in vars(importlib.import_module(f"audioloader.nodes.{module.name}")).items():
            if (inspect.isclass(value) and issubclass(value, BaseNode) and not name.startswith("_")
                    and value.__module__.startswith("audioloader.nodes.")):
                found[name] = value
    return found


def test_every_public_node_constructor_takes_at_most_eight_parameters():
    found = public_nodes()
    assert {"ArrowShardReader", "ShuffleBuffer", "DurationBucketer", "DecodeSpectrogram", "Batcher", "ParallelMap",
            "WeightedMix"} <= set(found)
    too_many = {name: len(inspect.signature(cls.__init__).parameters) - 1 for name, cls in found.items()}
    too_many = {name: count for name, count in too_many.items() if count > MAX_PARAMETERS}
    assert not too_many, f"node constructors over {MAX_PARAMETERS} parameters (self aside): {too_many}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("constructors")
    make_shards(root, [6, 5], batch_rows=3, seconds=0.02)
    return root


def test_a_constructor_given_its_fields_one_by_one_names_its_factory(folder):
    dataset = ShardDataset(folder)
    rows = IterableWrapper([])
    refused = {
        "ArrowShardReader": lambda: ArrowShardReader(folder, seed=3),
        "ShuffleBuffer": lambda: ShuffleBuffer(rows, capacity=8, min_size=4),
        "DurationBucketer": lambda: DurationBucketer(rows, max_duration=1.0),
        "DecodeSpectrogram": lambda: DecodeSpectrogram(rows, al.MelSpectrogramConfig(), seed=0, num_workers=0),
        "Batcher": lambda: Batcher(rows, batch_size=4),
        "ParallelMap": lambda: ParallelMap(rows, int, num_workers=0),
    }
    for name, build in refused.items():
        with pytest.raises(TypeError, match=rf"{name}\(\.\.\.\) takes .*use {name}\.of\(\.\.\.\)"):
            build()
    # A field in the group's place (a capacity, a feature config, a source without its plan) is refused the same way.
    for name, build in {"ArrowShardReader": lambda: ArrowShardReader(dataset),
                        "ShuffleBuffer": lambda: ShuffleBuffer(rows, 8),
                        "DecodeSpectrogram": lambda: DecodeSpectrogram(rows, al.MelSpectrogramConfig()),
                        "Batcher": lambda: Batcher(rows, 4)}.items():
        with pytest.raises(TypeError, match=rf"use {name}\.of\(\.\.\.\)"):
            build()


def test_each_factory_builds_the_groups_the_constructor_takes(folder):
    dataset = ShardDataset(folder)
    reader = ArrowShardReader.of(dataset, seed=4, shuffle=False)
    planned = ArrowShardReader(dataset, ReadPlan.of(dataset, seed=4, shuffle=False))
    assert [r.key for r in reader] == [r.key for r in planned]
    assert ShuffleBuffer.of(reader, 8, 4, one_pass=True).limits == BufferLimits(8, 4, one_pass=True)
    assert DurationBucketer.of(reader, max_duration=1.0, boundaries=[0.5]).limits == BucketLimits(1.0, (0.5,))
    assert Batcher.of(reader, 4, True, columns=["uid"]).layout == BatchLayout(4, True, columns=("uid",))
    decode = DecodeSpectrogram.of(reader, al.MelSpectrogramConfig(), seed=2, train=False, num_workers=0,
                                  on_error="raise")
    assert decode.config == DecodeConfig(al.MelSpectrogramConfig(), 2, False, on_error=al.OnError("raise"))
    assert decode.workers == al.Workers(num_workers=0, kind="thread")
    assert ParallelMap.of(reader, int, num_workers=0, chunk_size=3).pool == MapPool(0, chunk_size=3)
