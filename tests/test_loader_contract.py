"""Promises of the loader that used to fail silently (issue 39): an infinite evaluation loader loops over passes,
a state loaded while an iterator is live is not ignored, bad rows are reported without asking, and a checkpoint
refusal leads with its real cause."""

from __future__ import annotations

import pytest

import audioloader as al
from tests.helpers import SMALL, assert_resumes_exactly, assert_same_batches, loader_for, make_shards, take


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract")
    make_shards(folder, [13, 9, 7])  # 29 rows: not a multiple of the batch or the world size
    return folder


def _indices(batch):
    return [int(i) for i, ok in zip(batch["index"], batch["valid"], strict=True) if ok]


def test_an_infinite_eval_loader_loops_over_identical_passes_with_equal_batch_counts(shards):
    """train=False, infinite=True used to stop after one pass; it is a validation stream: every pass is the eval
    pass (every row once over the ranks, the same batch count on every rank, padding marked invalid)."""
    ranks = [loader_for(shards, train=False, infinite=True, storage=al.Storage(rank=r, world_size=2))
             for r in range(2)]
    per_pass = ranks[0].num_batches
    assert per_pass == ranks[1].num_batches
    streams = [take(loader, 3 * per_pass) for loader in ranks]  # three passes, and more to come
    for p in range(3):
        passes = [stream[p * per_pass:(p + 1) * per_pass] for stream in streams]
        seen = sorted(i for batches in passes for batch in batches for i in _indices(batch))
        assert seen == list(range(29))  # each pass: every row exactly once over the ranks
        for rank, batches in enumerate(passes):
            assert_same_batches(batches, streams[rank][:per_pass])  # the same pass each time
    with pytest.raises(TypeError, match=rf"is undefined \(a pass is loader.num_batches={per_pass} batches\)"):
        len(ranks[0])
    assert_same_batches(take(ranks[0], 2), streams[0][:2])  # a new iter() goes on: the fourth pass
    for loader in ranks:
        loader.shutdown()


def test_an_infinite_eval_loader_resumes_mid_pass_and_goes_on_to_the_next(shards):
    def build():
        return loader_for(shards, train=False, infinite=True, workers=al.Workers(0))

    with build() as loader:
        per_pass = loader.num_batches
    # Cut into the second pass, resumed through the end of the third.
    assert_resumes_exactly(build, 2 * per_pass + 3, [per_pass + 1], continued=True)


@pytest.mark.parametrize("how", [{"total": 4}, {"total": 4, "continued": True}, {"total": None}])
def test_the_shared_resume_check_fails_when_a_resume_drops_its_state(shards, how):
    """tests.helpers.assert_resumes_exactly, which most resume tests call, fails a loader that ignores the state."""
    class Forgetful(al.AudioLoader):
        def load_state_dict(self, state):  # a resume that starts over
            pass

    def build(**kw):
        return Forgetful(shards, batch_size=4, seed=2, features=SMALL, workers=al.Workers(0), infinite=False, **kw)

    with pytest.raises(AssertionError):
        assert_resumes_exactly(build, cuts=[2], **how)


@pytest.mark.parametrize("train", [True, False])
def test_load_state_dict_applies_to_the_live_iterator(shards, train):
    """The live iterator used to ignore a loaded state (batch 4 after a state taken at batch 2): its next batch is
    the one after the state, as from a new iter()."""
    loader = loader_for(shards, train=train, batch_size=4)
    reference = take(loader_for(shards, train=train, batch_size=4), 6)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.state_dict()
    more = [next(it), next(it)]
    assert_same_batches(first + more, reference[:4])
    loader.load_state_dict(state)
    assert_same_batches([next(it), next(it), next(it)], reference[2:5])  # batch 2, not batch 4
    loader.shutdown()


def test_load_state_dict_of_other_settings_applies_to_the_live_iterator(tmp_path):
    """A state whose settings rebuild the chain (a checkpoint from before byte budgets: tests/legacy_checkpoints.py)
    is applied to the live iterator the same way; it is not told it was superseded."""
    import gzip
    import json
    from pathlib import Path

    from tests import legacy_checkpoints as legacy

    case = legacy.CASES["classification_ipc"]
    saved = json.loads(gzip.decompress((Path(__file__).parent / "data" / "legacy_checkpoints.json.gz").read_bytes()))
    folder = legacy.corpus(tmp_path / "legacy", case)
    with legacy.loader(folder, case) as loader:
        it = iter(loader)
        next(it)
        state = saved["classification_ipc"]["state"]
        state["fingerprint"].update({k: loader._fingerprint[k] for k in legacy.FILE_FIELDS})
        loader.load_state_dict(state)
        assert [legacy.indices(next(it)) for _ in range(legacy.AFTER)] == saved["classification_ipc"]["after"]


def _bad_row_warnings(record):
    return [str(w.message) for w in record if "could not be decoded" in str(w.message)]


@pytest.fixture(scope="module")
def with_bad_rows(tmp_path_factory):
    """35 rows, rows 7 and 20 not audio."""
    from tests.helpers import noise_clip, write_audio

    clips = [b"not audio" if i in (7, 20) else noise_clip(i, 0.3) for i in range(35)]
    return write_audio(tmp_path_factory.mktemp("bad") / "rows.arrow", clips, batch_rows=5)


def test_bad_rows_skipped_in_evaluation_are_reported_without_asking(with_bad_rows):
    """2 of 35 rows skipped used to print nothing: a warning at the first, then a count at the end of each pass."""
    loader = loader_for(al.Source(with_bad_rows, label_column=None), train=False, batch_size=4,
                        on_error=al.OnError(max_fraction=0.1))
    with pytest.warns(UserWarning) as record:
        assert sum(int(b["valid"].sum()) for b in loader) == 33
    first, summary = _bad_row_warnings(record)
    # Both point at the line that asked for the batch, not into audioloader.
    assert {w.filename for w in record if "could not be decoded" in str(w.message)} == {__file__}
    assert "row 7 of " in first and "stats()['bad_rows']" in first and "shown once" in first
    assert "pass 0 ended with 2 row(s) skipped" in summary and "(2 in all so far)" in summary
    with pytest.warns(UserWarning) as record:  # the next pass: the count again, not the first warning
        list(loader)
    assert [m.split(" row(s)")[0] for m in _bad_row_warnings(record)] == ["audioloader: pass 0 ended with 2"]
    assert loader.stats()["counters"]["bad_rows"] == 4
    loader.shutdown()


def test_bad_rows_skipped_in_training_are_counted_at_the_end_of_each_pass(with_bad_rows):
    loader = loader_for(al.Source(with_bad_rows, label_column=None), batch_size=4,
                        on_error=al.OnError(max_fraction=0.1))
    with pytest.warns(UserWarning) as record:
        take(loader, 25)  # about three passes of 33 good rows
    messages = _bad_row_warnings(record)
    assert "audioloader skipped a row" in messages[0]
    assert [m.split(" row(s)")[0] for m in messages[1:3]] == ["audioloader: pass 0 ended with 2",
                                                               "audioloader: pass 1 ended with 2"]
    loader.shutdown()


def test_a_checkpoint_of_another_dataset_leads_with_the_files(tmp_path):
    """It used to list six batching.boundaries[i] lines (derived from the data, not settable) before files[0]."""
    options = dict(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=3.0), batch_size=4,
                   workers=al.Workers(0))
    make_shards(tmp_path / "a", [24, 24], seconds=0.4)
    make_shards(tmp_path / "b", [24, 24], seconds=0.9)
    with loader_for(tmp_path / "a", **options) as first:
        take(first, 2)
        state = first.state_dict()
    with loader_for(tmp_path / "b", **options) as other, pytest.raises(al.CheckpointMismatchError) as refused:
        other.load_state_dict(state)
    message = str(refused.value)
    lines = message.splitlines()
    assert lines[0].startswith("this state dict was saved by an AudioLoader reading other shard files")
    assert lines[1].startswith("  files[0]: checkpoint has")
    assert "batching.boundaries[" not in message  # named once, after the cause
    assert lines[-1].startswith("  (also batching.boundaries") and "derived from the data" in lines[-1]
