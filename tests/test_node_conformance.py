"""Every node of `audioloader.nodes` keeps torchdata's contract: reset, exact state round trips, pickling.

One registry (`CASES`) says how to build each node of ``audioloader.nodes.__all__``
over a small source (variants where a node has several modes: threads and
processes, train and eval order); one set of checks runs over all of them:

- ``reset()`` in the middle of a stream, then iterating, gives what a fresh node
  gives (for nodes that start their next pass on a reset, what a fresh node gives
  in its next pass);
- the state round trip: ``state_dict()`` after ``k`` items (through ``torch.save``
  and ``torch.load(weights_only=True)``, as a checkpoint travels), a fresh node,
  ``reset(state)``: the items that follow equal the rest of the uninterrupted run,
  and a finite stream ends where it ended, for several ``k`` including 0 and the end;
- pickling: an unstarted node pickles and its copy yields the same stream, except
  where a node holds a process pool (locks, pipes: it is rebuilt, never shipped).
  Started nodes do not pickle (open readers, threads); what travels between
  processes is the loader, which pickles as its arguments and position
  (test_workers, test_mixing);
- what a state holds: every node type but the reader and the mix answers the classmethod ``rows_held(state)``,
  and following it, type by type, from a real state reaches the reader at a position it accepts (the walk of
  `audioloader.elastic`, which builds no node).

A new node in ``__all__`` without a case here fails `test_every_node_has_a_case`.
"""

from __future__ import annotations

import pickle
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchdata.nodes import BaseNode

import audioloader as al
from audioloader import elastic, nodes
from audioloader.nodes import (
    ArrowShardReader,
    BatchAugment,
    Batcher,
    BatchFeatures,
    BatchLayout,
    BucketLimits,
    BufferLimits,
    CatchFailures,
    DecodeConfig,
    DecodeSpectrogram,
    DurationBucketer,
    MapPool,
    ParallelMap,
    Prefetcher,
    ReadPlan,
    ShuffleBuffer,
    WeightedMix,
)
from audioloader.nodes.held import RowsHeld
from audioloader.shards import ShardDataset
from tests.helpers import SMALL, encode, layers_of, roundtrip, tone, write_ipc_file

#: Durations of the rows (s), cycled: shorter and longer than SMALL's 0.25 s crop, for the bucketer's buckets.
SECONDS = [0.2, 0.35, 0.5, 0.8, 0.3]
ROWS = [14, 9]  # 23 rows in two files, record batches of 4


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("conformance")
    start = 0
    for f, n in enumerate(ROWS):
        ids = range(start, start + n)
        audio = [encode(tone(SECONDS[i % len(SECONDS)], 16000, freq=200.0 + 31 * i, seed=i), 16000) for i in ids]
        table = pa.table({"audio": pa.array(audio, pa.binary()), "label": pa.array([i % 3 for i in ids], pa.int64()),
                          "uid": pa.array(list(ids), pa.int64())})
        write_ipc_file(folder / f"part-{f}.arrow", table, batch_rows=4)
        start += n
    return folder


# -- the registry ------------------------------------------------------------------------------------------


# Each node is built as `chain.build_chain` builds it: its source and its settled group(s).


def eval_reader(folder: Path) -> ArrowShardReader:
    """Rows in a fixed order, one pass; a reset starts the same pass again."""
    dataset = ShardDataset(folder, split_rows=4, columns=["uid"])
    return ArrowShardReader(dataset, ReadPlan.of(dataset, seed=3, shuffle=False))


INLINE = al.Workers(num_workers=0, kind="thread")


def decoded(folder: Path, workers: al.Workers = INLINE, fetch=None, **config) -> DecodeSpectrogram:
    return DecodeSpectrogram(eval_reader(folder), DecodeConfig(SMALL, **{"seed": 1, "train": True, **config}),
                             workers, fetch=fetch)


def batches(folder: Path, **layout) -> Batcher:
    return Batcher(decoded(folder), BatchLayout(5, columns=["uid"], tensor_columns=["uid"], **layout))


def audio_size(raw) -> tuple[int, int, int]:
    """A job for ParallelMap (module level: worker processes import it)."""
    return raw.key.index, raw.key.pass_index, len(raw.audio)


def shuffle_buffer(folder: Path) -> ShuffleBuffer:
    reader = eval_reader(folder)
    return ShuffleBuffer(reader, BufferLimits(8, 4), seed=2, restore=reader.fetch)


def bucketer(folder: Path) -> DurationBucketer:
    reader = eval_reader(folder)
    return DurationBucketer(reader, BucketLimits(1.2, (0.32, 0.6)), restore=reader.fetch)


def mix(folder: Path) -> WeightedMix:
    return WeightedMix({"a": eval_reader(folder), "b": eval_reader(folder)}, {"a": 0.7, "b": 0.3},
                       stop="all_exhausted", seed=4)


def augmented(folder: Path) -> BatchAugment:
    decode = decoded(folder, augment=[al.SpecAugment(max_freq_width=4, max_time_width=4), al.Mixup()],
                     compute_features=False)
    waves = Batcher(decode, BatchLayout(5, features_key="waveform"))
    return BatchAugment(BatchFeatures(waves, SMALL, "cpu"), decode.augment, SMALL.batch_key)


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], BaseNode]  # a fresh node over the rows in the folder
    limit: int = 40  # items compared (all of them when the stream is shorter: then its end is checked too)
    next_pass_on_reset: bool = False  # reset() after iterating starts the next pass (training readers, a mix)
    pickles: bool = True  # an unstarted node pickles, and its copy yields the same stream


CASES: dict[str, Case] = {
    "ArrowShardReader-eval": Case(eval_reader),
    "ArrowShardReader-train-interleave": Case(  # the hand-composed form: the fields one by one
        lambda f: ArrowShardReader.of(f, seed=3, shuffle=True, infinite=True, split_rows=4, interleave=2),
        limit=30, next_pass_on_reset=True),  # crosses the end of pass 0 (23 rows)
    "ShuffleBuffer": Case(shuffle_buffer),
    "DurationBucketer": Case(bucketer),
    "WeightedMix": Case(mix, next_pass_on_reset=True),
    "DecodeSpectrogram-inline": Case(decoded),
    "DecodeSpectrogram-threads": Case(lambda f: decoded(f, al.Workers(num_workers=2, kind="thread"))),
    "DecodeSpectrogram-processes": Case(lambda f: decoded(f, al.Workers(num_workers=2, kind="process"),
                                                          fetch=eval_reader(f).fetcher), pickles=False),
    "ParallelMap-inline": Case(lambda f: ParallelMap(eval_reader(f), audio_size, MapPool(0))),
    "ParallelMap-threads": Case(lambda f: ParallelMap(eval_reader(f), audio_size, MapPool(2, chunk_size=3))),
    "ParallelMap-processes": Case(lambda f: ParallelMap(eval_reader(f), audio_size,
                                                        MapPool(2, "process", chunk_size=3)), pickles=False),
    "Batcher": Case(batches),
    "Batcher-eval-padding": Case(lambda f: batches(f, num_batches=7, spectrogram_shape=(SMALL.n_mels, 16))),
    "BatchFeatures": Case(lambda f: BatchFeatures(
        Batcher(decoded(f, compute_features=False), BatchLayout(5, features_key="waveform")), SMALL, "cpu")),
    "BatchAugment": Case(augmented),
    "CatchFailures": Case(lambda f: CatchFailures(batches(f))),
    "Prefetcher": Case(lambda f: Prefetcher(batches(f), prefetch_factor=2)),
}


def test_every_node_has_a_case():
    covered = {name.split("-")[0] for name in CASES}
    assert covered == set(nodes.__all__), "add a Case for every node in audioloader.nodes.__all__"


# -- comparing streams -------------------------------------------------------------------------------------


def canon(x: Any) -> Any:
    """A comparable form of an item: tensors and buffers by dtype, shape and bytes, records field by field."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return "tensor", str(x.dtype), tuple(x.shape), x.contiguous().numpy().tobytes()
    if isinstance(x, np.ndarray):
        return "array", str(x.dtype), x.shape, x.tobytes()
    if isinstance(x, (pa.Buffer, bytes, memoryview)):
        return "bytes", bytes(x)
    if isinstance(x, dict):
        return "dict", tuple((k, canon(v)) for k, v in sorted(x.items()))
    if is_dataclass(x):
        return type(x).__name__, tuple(canon(getattr(x, f.name)) for f in fields(x))
    if isinstance(x, (list, tuple)):
        return type(x).__name__, tuple(canon(v) for v in x)
    return x


def take(node: BaseNode, n: int) -> list:
    """Up to ``n`` items (fewer when the stream ends)."""
    out = []
    for _ in range(n):
        try:
            out.append(canon(next(node)))
        except StopIteration:
            break
    return out


def stop(node: BaseNode) -> None:
    """Stop the workers and threads of ``node`` and of every node under it."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseNode) or id(current) in seen:
            continue
        seen.add(id(current))
        if callable(getattr(current, "shutdown", None)):
            current.shutdown()
        stack += [getattr(current, "source", None), *getattr(current, "nodes", ())]


@pytest.fixture
def fresh(rows):
    """``fresh(case)``: a new node of the case, stopped at the end of the test."""
    made: list[BaseNode] = []

    def make(case: Case) -> BaseNode:
        made.append(case.build(rows))
        return made[-1]

    yield make
    for node in made:
        stop(node)


def reference_run(case: Case, fresh) -> tuple[list, list, bool]:
    """The uninterrupted run: its items, the state after each of them (index k: after k items), whether it ended."""
    node = fresh(case)
    node.reset()
    items, states = [], [roundtrip(node.state_dict())]
    for _ in range(case.limit):
        got = take(node, 1)
        if not got:
            break
        items += got
        states.append(roundtrip(node.state_dict()))
    ended = len(items) < case.limit
    stop(node)
    return items, states, ended


def cuts(name: str, total: int) -> list[int]:
    """0, 1, the end and the item before it, and three more (the same on every run)."""
    rng = random.Random(zlib.crc32(name.encode()))
    return sorted({0, min(1, total), max(total - 1, 0), total, *rng.sample(range(total + 1), min(3, total + 1))})


# -- the checks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_the_state_round_trip_resumes_exactly(name, fresh):
    case = CASES[name]
    items, states, ended = reference_run(case, fresh)
    assert len(items) >= 5, "a case must yield a few items"
    for k in cuts(name, len(items)):
        resumed = fresh(case)
        resumed.reset(states[k])
        rest = take(resumed, len(items) - k + (1 if ended else 0))  # one more: a finite stream must end too
        assert rest == items[k:], f"{name}: resumed after {k} of {len(items)} items, the rest differs"
        stop(resumed)


@pytest.mark.parametrize("name", CASES)
def test_reset_in_the_middle_starts_afresh(name, fresh):
    case = CASES[name]
    reference = fresh(case)
    reference.reset()
    if case.next_pass_on_reset:  # what a fresh node gives after a reset: its next pass
        take(reference, 1)
        reference.reset()
    expected = take(reference, case.limit)
    node = fresh(case)
    node.reset()
    take(node, 3)
    node.reset()
    assert take(node, case.limit) == expected, f"{name}: reset after 3 items"
    if not case.next_pass_on_reset:  # (where each reset starts the next pass, once is enough)
        node.reset()
        assert take(node, case.limit) == expected, f"{name}: reset at the end of the stream"


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.pickles])
def test_unstarted_nodes_pickle(name, fresh):
    case = CASES[name]
    copy = pickle.loads(pickle.dumps(fresh(case)))
    copy.reset()
    original = fresh(case)
    original.reset()
    assert take(copy, case.limit) == take(original, case.limit)
    stop(copy)


#: Nodes an elastic resume walks through: all but the reader (where the walk ends: its state is a position) and the
#: mix (a mixed run resumes on the world size it was saved with).
NOT_WALKED = {"ArrowShardReader", "WeightedMix"}


def test_every_node_says_what_its_state_holds():
    assert {name for name in nodes.__all__ if hasattr(getattr(nodes, name), "rows_held")} \
        == set(nodes.__all__) - NOT_WALKED


@pytest.mark.parametrize("name", CASES)
def test_the_walk_of_a_state_reaches_the_reader(name, fresh):
    """`elastic`'s walk over a real state, by the node types alone (no node is asked): each type names the state
    of its source in its own, down to the reader (whose state is a position it accepts); the keys held are
    `Key` s. A mix refuses, naming itself."""
    node = fresh(CASES[name])
    node.reset()
    take(node, 5)
    state = roundtrip(node.state_dict())
    stop(node)
    if name.split("-")[0] in NOT_WALKED - {"ArrowShardReader"}:
        with pytest.raises(al.CheckpointMismatchError, match=type(node).__name__):
            elastic._left_of([type(node), ArrowShardReader], state)
        return
    layers = layers_of(node)
    current_state = state
    for layer in layers[:-1]:
        held = layer.rows_held(current_state)
        assert isinstance(held, RowsHeld), name
        assert all(isinstance(key, al.Key) for key in [*held.held, *(held.emitted or ())]), name
        current_state = held.source_state
    reader = node
    while not isinstance(reader, ArrowShardReader):
        reader = reader.source
    reader.position_of(current_state)  # raises unless the state fits the reader
    left = elastic._left_of(layers, state)
    assert left.reader_state == dict(current_state)
