"""Audio where it already lives (issue 35): WebDataset tar shards and plain audio files read in place, locally and
from S3 (moto), with every guarantee of Arrow shards: the same batches as the same clips packed, exactly-once
evaluation on any world size, exact resume, a manifest start without LIST, identity checks."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

import audioloader as al
from audioloader.shards.catalog.manifest import MANIFEST_NAME
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.formats import tar_format
from tests.helpers import assert_resumes_exactly, assert_same_batches, clip_bytes, loader_factory, make_shards, take

ROWS = [13, 9, 18]  # 40 samples in three tars
FAST = al.Retry(attempts=4, initial_delay=0.01, max_delay=0.05, timeout=2.0)
loader_for = loader_factory(batch_size=8, seed=1, workers=al.Workers(num_workers=2, kind="thread"),
                            storage=al.Storage(retry=FAST),
                            train_options={"shuffle": al.Shuffle(buffer_size=12, min_size=6)})


def write_tar(path: Path, start: int, n: int, seconds: float = 0.4, gz: bool = False) -> Path:
    """Samples ``start..start+n`` as WebDataset members: ``.wav`` (`clip_bytes`), ``.cls`` (i % 3), ``.json``
    (``uid``, ``name``) and ``.txt``, the same clips and labels as `tests.helpers.audio_table`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(start, start + n):
            members = {"wav": clip_bytes(i, seconds), "cls": f"{i % 3}\n".encode(),
                       "json": json.dumps({"uid": i, "name": f"clip{i}"}).encode(), "txt": f"words {i}".encode()}
            for extension, data in members.items():
                info = tarfile.TarInfo(f"part/clip{i:05d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(out.getvalue()) if gz else out.getvalue())
    return path


def write_tars(folder: Path, rows=ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, n in enumerate(rows):
        write_tar(folder / f"shard-{k:05d}.tar", sum(rows[:k]), n)
    return folder


@pytest.fixture(scope="module")
def small_units():
    """Tar units of 4 samples (as the Arrow shards' 4-row record batches): the same splits, so the same batches."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tar_format, "UNIT_SAMPLES", 4)
        yield


@pytest.fixture(scope="module")
def tars(tmp_path_factory, small_units) -> Path:
    return write_tars(tmp_path_factory.mktemp("wds"))


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """The same clips as `tars` in Arrow IPC files with 4-row record batches."""
    folder = tmp_path_factory.mktemp("ipc")
    make_shards(folder, ROWS, "ipc_file", batch_rows=4, seconds=0.4)
    return folder


@pytest.fixture(scope="module")
def s3_tars(s3, tars) -> str:
    """`tars` on S3 twice: ``wds/plain`` (no manifest) and ``wds/indexed`` (with its manifest)."""
    s3.upload(tars, "wds/plain")
    s3.upload(tars, "wds/indexed")
    write_folder_manifest(s3.url("wds/indexed", direct=True))
    return "wds"


def indices(batches) -> list[int]:
    """The rows of ``batches`` (padding, which evenly split evaluation adds, is not valid)."""
    return [i for b in batches for i in (b["index"][b["valid"]] if "valid" in b else b["index"]).tolist()]


# ----------------------------------------------------------------------------- columns


def test_a_sample_is_the_members_sharing_a_key(tars):
    dataset = al.ShardDataset(str(tars), columns=["uid", "name", "text", "__key__"])
    assert dataset.num_rows == sum(ROWS) and dataset.files.format(0) == "tar"
    assert dataset.schema.field("label").type == "int64" and dataset.schema.field("uid").type == "int64"
    rows = dataset.read_rows([0, 14, 39])
    assert [(r.index, r.label, r.extras) for r in rows] == [
        (i, i % 3, {"uid": i, "name": f"clip{i}", "text": f"words {i}", "__key__": f"part/clip{i:05d}"})
        for i in (0, 14, 39)]
    assert [bytes(r.audio) for r in rows] == [clip_bytes(i, 0.4) for i in (0, 14, 39)]


@pytest.mark.parametrize("train", [False, True])
def test_tar_batches_equal_the_same_clips_packed(tars, packed, train):
    with loader_for(str(tars), train=train, columns=["uid"]) as a, \
            loader_for(str(packed), train=train, columns=["uid"]) as b:
        assert_same_batches(take(a, 5), take(b, 5))


def test_a_compressed_tar_is_refused_naming_pack(tmp_path):
    write_tar(tmp_path / "a.tar.gz", 0, 3, gz=True)
    with pytest.raises(al.ShardReadError, match=r"a\.tar\.gz is compressed .*audioloader pack --from webdataset"):
        al.ShardDataset(str(tmp_path))


def test_a_sample_without_audio_is_a_counted_bad_row(tmp_path):
    path = write_tar(tmp_path / "a.tar", 0, 3)
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("part/lonely.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    with loader_for(str(tmp_path), train=False, batch_size=2, on_error=al.OnError(max_fraction=0.5)) as loader:
        batches = list(loader)
        stats = loader.stats()
    assert sorted(i for b in batches for i in b["index"][b["valid"]].tolist()) == [0, 1, 2]
    assert stats["counters"]["bad_rows"] == 1
    assert [(r["row"], "audio is null" in r["reason"]) for r in stats["bad_rows"]] == [(3, True)]


# ----------------------------------------------------------------------------- guarantees, local and S3


def source_of(where: str, tars: Path, s3) -> str:
    return str(tars) if where == "local" else s3.url("wds/indexed")


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_evaluation_reads_each_sample_once(request, tars, where, world_size):
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    if s3 is not None:
        request.getfixturevalue("s3_tars")
    seen = []
    for rank in range(world_size):
        with loader_for(source_of(where, tars, s3), train=False,
                        storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            seen += indices(loader)
    assert Counter(seen) == Counter(range(sum(ROWS)))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_training_resumes_exactly(request, tars, where):
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    if s3 is not None:
        request.getfixturevalue("s3_tars")
    source = source_of(where, tars, s3)
    assert_resumes_exactly(lambda **kw: loader_for(source, **kw), 8, [3])


def test_elastic_resume_from_two_ranks_to_three_reads_each_sample_once(tars):
    before, states = [], []
    for rank in range(2):
        with loader_for(str(tars), train=True, infinite=False, storage=al.Storage(rank=rank, world_size=2)) as loader:
            it = iter(loader)
            before += indices([next(it)])
            states.append(loader.state_dict())
    after = []
    for rank in range(3):
        with loader_for(str(tars), train=True, infinite=False, storage=al.Storage(rank=rank, world_size=3)) as loader:
            loader.load_state_dict(states)
            after += indices(loader)
    assert Counter(before + after) == Counter(range(sum(ROWS)))


def test_s3_batches_equal_local_with_and_without_a_manifest_or_a_cache(s3, tars, s3_tars, tmp_path):
    for train in (False, True):
        with loader_for(str(tars), train=train) as local:
            reference = take(local, 4)
        for prefix, cache in (("wds/plain", None), ("wds/indexed", None), ("wds/indexed", tmp_path / "cache")):
            with loader_for(s3.url(prefix), train=train, storage=al.Storage(cache_dir=cache)) as remote:
                assert (remote.reader.dataset.manifest is not None) == (prefix == "wds/indexed") or \
                    remote.reader.dataset.manifest.origin == "listing"
                assert_same_batches(take(remote, 4), reference)
    assert sorted(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size
                  > 100_000) == sorted(p.stat().st_size for p in tars.glob("*.tar")), "each tar cached whole"


def test_a_start_from_a_manifest_makes_no_list_and_one_request_a_unit(s3, proxy, tars):
    s3.upload(tars, "wds/start")  # a prefix of its own: no other test's reads still in flight
    write_folder_manifest(s3.url("wds/start", direct=True))
    proxy.clear()
    dataset = al.ShardDataset(s3.url("wds/start"), retry=FAST, split_rows=4)
    mine = [r for r in proxy.requests if "/wds/start" in r.path or r.path.strip("/") == "wds"]
    kinds = Counter((r.method, r.path.rsplit("/", 1)[-1]) for r in mine)
    assert kinds == {("HEAD", MANIFEST_NAME): 1, ("GET", MANIFEST_NAME): 1}, kinds
    proxy.clear()
    rows = dataset.read_rows(range(sum(ROWS)))
    assert [bytes(r.audio) for r in rows] == [clip_bytes(i, 0.4) for i in range(sum(ROWS))]
    requests = [r for r in proxy.requests if "/wds/start" in r.path or "/" not in r.path.strip("/")]
    assert all("/" in r.path.strip("/") for r in requests), "a LIST"
    # Per tar: one request confirming its identity (a HEAD), then its units (coalesced: they are adjacent).
    for k in range(len(ROWS)):
        mine = [(r.method, r.range) for r in requests if r.path.endswith(f"shard-{k:05d}.tar")]
        assert [m for m, _ in mine].count("HEAD") == 1 and 2 <= len(mine) <= 3, mine


def test_a_rewritten_tar_is_a_shard_changed_error(s3, tmp_path, small_units):
    folder = write_tars(tmp_path / "wds")
    s3.upload(folder, "wds/changed")
    write_folder_manifest(s3.url("wds/changed", direct=True))
    write_folder_manifest(str(folder))
    write_tar(folder / "shard-00001.tar", 100, ROWS[1])  # same size, other clips (and headers)
    with s3.filesystem().open_output_stream("wds/changed/shard-00001.tar") as out:
        out.write((folder / "shard-00001.tar").read_bytes())
    for source in (str(folder), s3.url("wds/changed")):
        dataset = al.ShardDataset(source, retry=FAST, split_rows=4)
        assert dataset.read_rows([0])[0].label == 0
        with pytest.raises(al.ShardChangedError, match=r"shard-00001\.tar"):
            dataset.read_rows([ROWS[0]])


# ----------------------------------------------------------------------------- plain audio files


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    for i in range(11):
        sub = folder / ("a" if i % 2 else "b")
        sub.mkdir(exist_ok=True)
        (sub / f"clip{i:03d}.wav").write_bytes(clip_bytes(i, 0.3))
    (folder / "notes.txt").write_text("not audio")
    return folder


def test_a_folder_of_audio_files_is_a_file_a_row(clips):
    dataset = al.ShardDataset(str(clips), label_column=None)
    assert dataset.num_rows == 11 and {dataset.files.format(i) for i in range(11)} == {"audio_file"}
    names = sorted(clips.rglob("*.wav"))
    rows = dataset.read_rows(range(11))
    assert [(r.file, bytes(r.audio)) for r in rows] == [(str(p), p.read_bytes()) for p in names]


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_audio_files_read_once_in_evaluation(request, clips, where, world_size):
    source = str(clips)
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        for sub in ("a", "b"):
            s3.upload(clips / sub, f"clips/{sub}")
        source = s3.url("clips")
    seen = []
    for rank in range(world_size):
        with loader_for(al.Source(source, label_column=None), train=False,
                        storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            seen += indices(loader)
    assert Counter(seen) == Counter(range(11))


def test_audio_files_resume_exactly_and_from_a_manifest(clips, s3):
    for sub in ("a", "b"):
        s3.upload(clips / sub, f"clips-indexed/{sub}")
    write_folder_manifest(s3.url("clips-indexed", direct=True))
    source = al.Source(s3.url("clips-indexed"), label_column=None)
    with loader_for(source, train=True) as remote, loader_for(al.Source(str(clips), label_column=None)) as local:
        assert remote.reader.dataset.manifest is not None
        assert_same_batches(take(remote, 2), take(local, 2))
    assert_resumes_exactly(lambda **kw: loader_for(source, batch_size=3, **kw), 5, [2])


# ----------------------------------------------------------------------------- audio files named by a manifest


@pytest.fixture(scope="module")
def listed(clips) -> Path:
    """A JSON-lines manifest beside `clips` naming 9 of them (relative paths), with ``text`` and ``speaker``."""
    names = sorted(p.relative_to(clips).as_posix() for p in clips.rglob("*.wav"))[:9]
    lines = [{"audio_filepath": name, "text": f"words {k}", "speaker": f"s{k % 2}"} for k, name in enumerate(names)]
    (clips / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return clips / "train.jsonl"


def test_a_manifests_fields_are_the_files_columns(clips, listed):
    dataset = al.ShardDataset(al.AudioFiles(str(listed)), label_column=None, columns=["text", "speaker"])
    rows = dataset.read_rows(range(9))
    expected = [json.loads(line) for line in listed.read_text().splitlines()]
    by_file = {str(clips / e["audio_filepath"]): e for e in expected}
    assert sorted(r.file for r in rows) == sorted(by_file)
    for r in rows:
        assert r.extras == {"text": by_file[r.file]["text"], "speaker": by_file[r.file]["speaker"]}
        assert bytes(r.audio) == Path(r.file).read_bytes()


def test_a_file_listed_twice_is_refused(tmp_path, clips):
    name = str(next(clips.rglob("*.wav")))
    (tmp_path / "twice.jsonl").write_text(json.dumps({"path": name}) + "\n" + json.dumps({"path": name}) + "\n")
    with pytest.raises(al.ShardReadError, match=r"rows 0 and 1 both name"):
        al.ShardDataset(al.AudioFiles(str(tmp_path / "twice.jsonl")), label_column=None)


@pytest.mark.parametrize("world_size", [1, 3])
def test_listed_files_on_s3_read_once_in_evaluation_and_resume(s3, clips, listed, world_size):
    s3.upload(clips, "listed")
    for sub in ("a", "b"):
        s3.upload(clips / sub, f"listed/{sub}")
    url, _, query = s3.url("listed").partition("?")
    source = al.Source(al.AudioFiles(f"{url}/train.jsonl?{query}"), label_column=None)
    seen = []
    for rank in range(world_size):
        with loader_for(source, train=False, storage=al.Storage(rank=rank, world_size=world_size),
                        columns=["text"]) as loader:
            seen += indices(loader)
    assert Counter(seen) == Counter(range(9))
    if world_size == 1:
        assert_resumes_exactly(lambda **kw: loader_for(source, batch_size=3, **kw), 3, [1])


def test_without_a_manifest_a_machine_scans_a_remote_tar_once(s3, proxy, tars, tmp_path, monkeypatch):
    """The ranks of a job on one machine: the first lists and scans the tars and publishes what it found (their
    units included, `manifest.py`'s ``unit_bytes``); the others start from that, reading no tar."""
    s3.upload(tars, "wds/once")
    monkeypatch.setenv("AUDIOLOADER_JOB_ID", "formats-once")
    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "machine"))
    first = al.ShardDataset(s3.url("wds/once"), retry=FAST, split_rows=4)
    assert first.manifest.origin == "listing"
    assert len([r for r in proxy.requests if "/wds/once/shard-" in r.path]) >= len(ROWS), "the tars are scanned"
    proxy.clear()
    second = al.ShardDataset(s3.url("wds/once"), retry=FAST, split_rows=4)
    assert second.manifest.origin == "machine" and list(second.splits) == list(first.splits)
    assert [r for r in proxy.requests if "/wds/once/shard-" in r.path] == []
    assert [bytes(r.audio) for r in second.read_rows([0, 39])] == [clip_bytes(0, 0.4), clip_bytes(39, 0.4)]
