"""ShuffleBuffer and Batcher over simple in-memory sources."""

from __future__ import annotations

import io
import random

import pytest
import torch
from torchdata.nodes import IterableWrapper

from audioloader.nodes.batcher import Batcher
from audioloader.nodes.shuffle_buffer import ShuffleBuffer
from audioloader.samples import Key, Sample
from tests.helpers import CountingSource, Item


def restore_items(keys):
    return [Item(k) for k in keys]


def drain(node, limit=10**6):
    out = []
    for _ in range(limit):
        try:
            out.append(next(node))
        except StopIteration:
            break
    return out


def indices(items):
    return [item.key.index for item in items]


def test_buffer_emits_a_permutation_of_its_source():
    buf = ShuffleBuffer.of(CountingSource(500), capacity=64, min_size=32, seed=3)
    out = indices(drain(buf))
    assert sorted(out) == list(range(500))
    assert out != list(range(500))


def test_buffer_holds_min_size_before_first_emit():
    source = CountingSource(100)
    buf = ShuffleBuffer.of(source, capacity=50, min_size=40, seed=0)
    buf.reset()
    next(buf)
    # min fill 40, then one replacement pull and one growth pull before the first emit
    assert source.pos == 42
    assert len(buf) == 41


def test_buffer_drains_when_source_smaller_than_min_size():
    buf = ShuffleBuffer.of(CountingSource(10), capacity=100, min_size=80, seed=0)
    assert sorted(indices(drain(buf))) == list(range(10))


def test_buffer_grows_one_per_emit_up_to_capacity():
    source = CountingSource(1000)
    buf = ShuffleBuffer.of(source, capacity=20, min_size=0, seed=0)
    buf.reset()
    sizes = []
    for _ in range(30):
        next(buf)
        sizes.append(len(buf))
    assert sizes[:19] == list(range(1, 20))
    assert set(sizes[19:]) == {19}


def test_buffer_order_depends_on_seed_and_rank_only():
    def run(seed, rank):
        return indices(drain(ShuffleBuffer.of(CountingSource(300), 50, 10, seed=seed, rank=rank)))

    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(2, 0)
    assert run(1, 0) != run(1, 1)


@pytest.mark.parametrize("with_restore", [True, False])
def test_buffer_resumes_exactly_at_every_position(with_restore):
    restore = restore_items if with_restore else None
    ref = indices(drain(ShuffleBuffer.of(CountingSource(120), 30, 20, seed=7, restore=restore)))
    for cut in range(0, 121, 7):
        buf = ShuffleBuffer.of(CountingSource(120), 30, 20, seed=7, restore=restore)
        buf.reset()
        head = indices(drain(buf, limit=cut))
        state = buf.state_dict()
        resumed = ShuffleBuffer.of(CountingSource(120), 30, 20, seed=7, restore=restore)
        resumed.reset(state)
        assert head + indices(drain(resumed)) == ref, f"cut at {cut}"


def test_buffer_state_holds_keys_not_items_and_is_small():
    buf = ShuffleBuffer.of(CountingSource(30000), capacity=10000, min_size=10000, seed=0, restore=restore_items)
    buf.reset()
    next(buf)
    state = buf.state_dict()
    assert "items" not in state
    assert len(state["indices"]) == len(state["passes"]) == len(buf)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() < 128 * 1024
    buffer.seek(0)
    assert torch.load(buffer) == state  # weights_only=True loads it


def test_buffer_restore_with_wrong_keys_is_an_error():
    buf = ShuffleBuffer.of(CountingSource(50), 10, 5, seed=0, restore=restore_items)
    buf.reset()
    next(buf)
    state = buf.state_dict()
    def wrong_restore(keys):
        return [Item(Key(k.index + 1, 0)) for k in keys]

    bad = ShuffleBuffer.of(CountingSource(50), 10, 5, seed=0, restore=wrong_restore)
    with pytest.raises(RuntimeError, match="data changed"):
        bad.reset(state)


@pytest.mark.parametrize(("capacity", "min_size"), [(0, 0), (10, 11), (10, -1)])
def test_buffer_rejects_bad_sizes(capacity, min_size):
    with pytest.raises(ValueError, match=r"capacity|min_size"):
        ShuffleBuffer.of(CountingSource(1), capacity, min_size)


def make_samples(n, *, label=True, extras=True):
    out = []
    for i in range(n):
        spec = torch.full((4, 6), float(i))
        ex = {"uid": i * 10, "name": f"s{i}"} if extras else {}
        out.append(Sample(Key(i, 0), spec, i % 3 if label else None, ex, "f", i))
    return out


def test_batcher_collates_dict_of_tensors():
    batcher = Batcher.of(IterableWrapper(make_samples(10)), batch_size=4)
    batches = drain(batcher)
    assert [b["spectrogram"].shape for b in batches] == [(4, 4, 6), (4, 4, 6), (2, 4, 6)]
    first = batches[0]
    assert first["spectrogram"].dtype == torch.float32
    assert first["label"].tolist() == [0, 1, 2, 0] and first["label"].dtype == torch.int64
    assert first["index"].tolist() == [0, 1, 2, 3] and first["index"].dtype == torch.int64
    assert first["uid"].tolist() == [0, 10, 20, 30]
    assert first["name"] == ["s0", "s1", "s2", "s3"]
    assert "valid" not in first


def test_batcher_drop_last():
    assert len(drain(Batcher.of(IterableWrapper(make_samples(10)), 4, drop_last=True))) == 2


def test_batcher_without_labels_has_no_label_key():
    batch = next(iter(Batcher.of(IterableWrapper(make_samples(3, label=False)), 2)))
    assert "label" not in batch


def test_batcher_pads_to_num_batches_with_invalid_entries():
    batcher = Batcher.of(IterableWrapper(make_samples(5)), 4, num_batches=4, spectrogram_shape=(4, 6),
                      columns=["uid", "name"], tensor_columns=["uid"])
    batches = drain(batcher)
    assert len(batches) == 4
    assert [b["valid"].tolist() for b in batches] == [[True] * 4, [True], [False] * 4, [False] * 4]
    assert batches[2]["index"].tolist() == [-1] * 4
    assert batches[2]["label"].tolist() == [-1] * 4
    assert batches[2]["spectrogram"].abs().sum() == 0
    assert batches[2]["uid"].tolist() == [0] * 4
    assert batches[2]["name"] == [None] * 4


def test_batcher_num_batches_truncates():
    batcher = Batcher.of(IterableWrapper(make_samples(20)), 4, num_batches=2, spectrogram_shape=(4, 6))
    assert len(drain(batcher)) == 2


def test_batcher_resume_mid_stream():
    samples = make_samples(23)
    ref = [b["index"].tolist() for b in drain(Batcher.of(IterableWrapper(samples), 5))]
    for cut in range(len(ref) + 1):
        batcher = Batcher.of(IterableWrapper(samples), 5)
        batcher.reset()
        head = [b["index"].tolist() for b in drain(batcher, cut)]
        state = batcher.state_dict()
        again = Batcher.of(IterableWrapper(samples), 5)
        again.reset(state)
        assert head + [b["index"].tolist() for b in drain(again)] == ref


def test_batcher_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        Batcher.of(IterableWrapper([]), 0)
    with pytest.raises(ValueError, match="spectrogram_shape"):
        Batcher.of(IterableWrapper([]), 2, num_batches=3)


def test_buffer_resume_random_cuts_with_passes():
    """Keys carry the pass; restore rebuilds them exactly."""
    rng = random.Random(0)

    class PassSource(CountingSource):
        def next(self):
            if self.pos >= self.n:
                raise StopIteration
            self.pos += 1
            return Item(Key((self.pos - 1) % 17, (self.pos - 1) // 17))

    ref = [tuple(i.key) for i in drain(ShuffleBuffer.of(PassSource(100), 25, 10, seed=5, restore=restore_items))]
    for cut in rng.sample(range(100), 10):
        buf = ShuffleBuffer.of(PassSource(100), 25, 10, seed=5, restore=restore_items)
        buf.reset()
        head = [tuple(i.key) for i in drain(buf, cut)]
        again = ShuffleBuffer.of(PassSource(100), 25, 10, seed=5, restore=restore_items)
        again.reset(buf.state_dict())
        assert head + [tuple(i.key) for i in drain(again)] == ref
