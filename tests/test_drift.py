"""Drift is loud: a shard rewritten with the same name, size and rows is detected on resume, naming the file."""

from __future__ import annotations

import os
import shutil

import pytest

import audioloader as al
from tests.helpers import audio_table, loader_factory, make_shards, write_ipc_file

ROWS = [12, 12, 12]


loader_for = loader_factory(batch_size=4, seed=5, workers=al.Workers(num_workers=1),
                            shuffle=al.Shuffle(buffer_size=10, min_size=8))


def checkpoint(source, batches: int = 4, **kwargs) -> dict:
    """The state after ``batches`` batches: the buffer then holds rows (decode chunks are 8 rows)."""
    with loader_for(source, **kwargs) as loader:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        return loader.state_dict()


def rewrite_same_size(path, start: int, keep_mtime: bool) -> None:
    """Rewrite ``path`` with other audio of the same byte size and rows (the clips' frequencies are shifted)."""
    before = os.stat(path)
    table = audio_table(start + 1000, ROWS[0], seconds=0.4)
    table = table.set_column(1, "label", audio_table(start, ROWS[0], seconds=0.4).column("label"))
    table = table.set_column(2, "uid", audio_table(start, ROWS[0], seconds=0.4).column("uid"))
    table = table.set_column(3, "name", audio_table(start, ROWS[0], seconds=0.4).column("name"))
    write_ipc_file(path, table, batch_rows=4)
    assert os.stat(path).st_size == before.st_size
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.fixture
def shards(tmp_path):
    make_shards(tmp_path / "data", ROWS, "ipc_file", batch_rows=4, seconds=0.4)
    return tmp_path / "data"


@pytest.mark.parametrize("before_decode", [True, False])
def test_same_size_rewrite_in_place_names_the_file(shards, before_decode):
    state = checkpoint(shards, shuffle=al.Shuffle(before_decode=before_decode))
    rewrite_same_size(shards / "part-00001.arrow", ROWS[0], keep_mtime=False)
    with loader_for(shards, shuffle=al.Shuffle(before_decode=before_decode)) as resumed, \
            pytest.raises(al.CheckpointMismatchError) as info:
        resumed.load_state_dict(state)
    message = str(info.value)
    assert str(shards / "part-00001.arrow") in message and "rewritten in place" in message
    assert "part-00000" not in message and "part-00002" not in message


@pytest.mark.parametrize("before_decode", [True, False])
def test_rows_read_back_on_restore_are_verified(shards, before_decode):
    # Same name, size, rows, footer and even modification time: only the buffered rows' checksums can tell.
    state = checkpoint(shards, shuffle=al.Shuffle(before_decode=before_decode))
    for i in range(len(ROWS)):
        rewrite_same_size(shards / f"part-{i:05d}.arrow", sum(ROWS[:i]), keep_mtime=True)
    with loader_for(shards, shuffle=al.Shuffle(before_decode=before_decode)) as resumed:
        resumed.load_state_dict(state)  # the fingerprint cannot see it
        with pytest.raises(al.CheckpointMismatchError) as info:
            next(iter(resumed))
    message = str(info.value)
    assert "checksum" in message and "shards changed" in message
    assert str(shards / "part-0000") in message and " row " in message


def test_data_moved_elsewhere_still_resumes(shards, tmp_path):
    state = checkpoint(shards)
    with loader_for(shards) as loader:
        it = iter(loader)
        expected = [next(it)["index"].tolist() for _ in range(7)][4:]
    moved = tmp_path / "moved"
    shutil.copytree(shards, moved, copy_function=shutil.copyfile)  # a copy gets new modification times
    with loader_for(moved) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        assert [next(it)["index"].tolist() for _ in range(3)] == expected


@pytest.mark.parametrize("fmt", ["ipc_file", "ipc_stream", "parquet", "orc"])
def test_metadata_digest_follows_content_not_location(tmp_path, fmt):
    make_shards(tmp_path / "a", [10], fmt, batch_rows=4, seconds=0.1)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    make_shards(tmp_path / "b", [10], fmt, batch_rows=5, seconds=0.1)  # same rows, other batches / row groups
    digest = {name: al.ShardDataset(tmp_path / name).identity()["digests"][0] for name in ("a", "copy", "b")}
    assert digest["a"] == digest["copy"] and digest["a"] != digest["b"]


def test_rows_held_by_the_duration_bucketer_are_verified(shards):
    # Whole utterances batched by duration: rows wait in the bucketer's buckets, and its checkpoint
    # holds their checksums (taken when each row was read).
    options = dict(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=2.0, num_buckets=2),
                   shuffle=al.Shuffle(buffer_size=1, min_size=0))
    state = checkpoint(shards, batches=2, **options)
    for i in range(len(ROWS)):
        rewrite_same_size(shards / f"part-{i:05d}.arrow", sum(ROWS[:i]), keep_mtime=True)
    with loader_for(shards, **options) as resumed:
        resumed.load_state_dict(state)
        with pytest.raises(al.CheckpointMismatchError, match="held in the duration bucketer"):
            next(iter(resumed))


# -- beyond checkpoint.LISTED_FILES files a fingerprint holds hashes, not file lists ---------------------------


def batches_after(state, source, count: int = 3) -> list:
    with loader_for(source) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        return [next(it)["index"].tolist() for _ in range(count)]


def test_a_checkpoint_of_many_files_holds_hashes_and_resumes_exactly(shards, monkeypatch):
    monkeypatch.setattr(al.checkpoint, "LISTED_FILES", 2)
    with loader_for(shards) as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        expected = [next(it)["index"].tolist() for _ in range(3)]
    fingerprint = state["fingerprint"]
    assert fingerprint["files"]["count"] == 3 and fingerprint["files"]["rows"] == sum(ROWS)
    assert "digests" not in fingerprint["file_identity"] and fingerprint["file_identity"]["count"] == 3
    assert batches_after(state, shards) == expected


def test_a_rewrite_among_many_files_is_refused_without_a_list_to_name_it(shards, monkeypatch):
    monkeypatch.setattr(al.checkpoint, "LISTED_FILES", 2)
    state = checkpoint(shards)
    rewrite_same_size(shards / "part-00001.arrow", ROWS[0], keep_mtime=False)  # same footer, a new mtime
    with loader_for(shards) as resumed, pytest.raises(al.CheckpointMismatchError) as info:
        resumed.load_state_dict(state)
    assert "some of the 3 files: their modification times differ" in str(info.value)
    assert "records hashes, not each file" in str(info.value)


def test_a_checkpoint_listing_its_files_loads_into_a_loader_that_hashes_them(shards, monkeypatch):
    state = checkpoint(shards)  # taken with every file listed (as before LISTED_FILES, or below it)
    with loader_for(shards) as loader:
        it = iter(loader)
        expected = [next(it)["index"].tolist() for _ in range(7)][4:]
    monkeypatch.setattr(al.checkpoint, "LISTED_FILES", 2)
    assert batches_after(state, shards) == expected
    rewrite_same_size(shards / "part-00001.arrow", ROWS[0], keep_mtime=False)
    with loader_for(shards) as resumed, pytest.raises(al.CheckpointMismatchError) as info:
        resumed.load_state_dict(state)  # the checkpoint lists its files: the changed one is named
    assert str(shards / "part-00001.arrow") in str(info.value) and "part-00000" not in str(info.value)


def test_the_common_folder_of_many_paths_is_their_folders_common_prefix():
    """`checkpoint._common_folder` cuts the paths' own common prefix back to a "/" (one C call at a million paths);
    that is the rule as written before, folder by folder, for any paths (URLs, nested, bare names)."""
    import os
    import random

    def by_folders(paths):
        prefix = os.path.commonprefix([path.rsplit("/", 1)[0] + "/" for path in paths])  # noqa: RUF071
        return prefix[: prefix.rfind("/") + 1]

    rng = random.Random(7)
    parts = ["a", "ab", "b", "x.arrow", "s3:", "", "data", "d/e"]
    for _ in range(3000):
        paths = ["/".join(rng.choice(parts) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 5))]
        assert al.checkpoint._common_folder(paths) == by_folders(paths), paths
