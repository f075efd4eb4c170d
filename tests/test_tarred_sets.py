"""NeMo tarred sets and Lhotse Shar read in place (issue 35): the manifest's fields as columns, audio from the tars,
exactly-once evaluation on world sizes 1 and 3 and exact resume, locally and from S3 (moto); durations for
bucketing without reading audio."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

import audioloader as al
from tests.helpers import assert_resumes_exactly, clip_bytes, loader_factory

NEMO_ROWS = [5, 7, 4]
SHAR_ROWS = [6, 5]
FAST = al.Retry(attempts=4, initial_delay=0.01, max_delay=0.05, timeout=2.0)
loader_for = loader_factory(batch_size=4, seed=1, workers=al.Workers(num_workers=2, kind="thread"),
                            storage=al.Storage(retry=FAST),
                            train_options={"shuffle": al.Shuffle(buffer_size=8, min_size=4)})


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def seconds(i: int) -> float:
    return 0.2 + 0.05 * (i % 4)


def write_nemo(folder: Path, rows=NEMO_ROWS) -> Path:
    """NeMo tarred set: ``audio_K.tar`` with ``uttN.wav`` members, ``tarred_audio_manifest.json`` (written in
    the tars' order, as NeMo's converter does)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines, i = [], 0
    for shard, n in enumerate(rows):
        with tarfile.open(folder / f"audio_{shard}.tar", "w") as tar:
            for _ in range(n):
                add_member(tar, f"utt{i:04d}.wav", clip_bytes(i, seconds(i)))
                lines.append({"audio_filepath": f"utt{i:04d}.wav", "duration": seconds(i), "text": f"words {i}",
                              "shard_id": shard})
                i += 1
    (folder / "tarred_audio_manifest.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def write_shar(folder: Path, rows=SHAR_ROWS) -> Path:
    """Lhotse Shar: ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar`` (``<cut id>.flac`` + ``.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    for shard, n in enumerate(rows):
        cuts = []
        with tarfile.open(folder / f"recording.{shard:06d}.tar", "w") as tar:
            for _ in range(n):
                cut_id = f"rec-{i:04d}.seg"  # a dot in the id: the key is the name less its audio extension
                add_member(tar, f"{cut_id}.flac", clip_bytes(i, seconds(i), fmt="FLAC"))
                add_member(tar, f"{cut_id}.json", json.dumps({"id": cut_id}).encode())
                cuts.append({"id": cut_id, "start": 0.0, "duration": seconds(i), "channel": 0,
                             "supervisions": [{"id": f"s{i}", "text": f"hello {i}", "speaker": f"spk{i % 2}"}],
                             "custom": {"topic": i % 3}, "recording": {"id": cut_id, "sources": []}})
                i += 1
        (folder / f"cuts.{shard:06d}.jsonl.gz").write_bytes(
            gzip.compress("".join(json.dumps(c) + "\n" for c in cuts).encode()))
    (folder / "features.000000.tar").write_bytes(b"")  # another field's tars are not read
    return folder


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    return {"nemo": write_nemo(root / "nemo"), "shar": write_shar(root / "shar")}


@pytest.fixture(scope="module")
def s3_sets(s3, sets) -> dict[str, str]:
    s3.upload(sets["nemo"], "sets/nemo")
    s3.upload(sets["shar"], "sets/shar")
    return {"nemo": "sets/nemo", "shar": "sets/shar"}


def source(kind: str, where: str, sets, s3=None) -> al.Source:
    if kind == "nemo":
        base = str(sets["nemo"]) if where == "local" else s3.url("sets/nemo")
        if where == "local":
            data = al.NemoTarred(f"{base}/tarred_audio_manifest.json", f"{base}/audio_{{0..2}}.tar")
        else:  # a URL's query (the test server's endpoint) follows the path
            path, _, query = base.partition("?")
            data = al.NemoTarred(f"{path}/tarred_audio_manifest.json?{query}", f"{path}/audio_{{0..2}}.tar?{query}")
    else:
        data = al.LhotseShar(str(sets["shar"]) if where == "local" else s3.url("sets/shar"))
    return al.Source(data, label_column=None)


TOTAL = {"nemo": sum(NEMO_ROWS), "shar": sum(SHAR_ROWS)}


def test_nemo_fields_are_columns_and_rows_map_to_their_tar(sets):
    dataset = al.ShardDataset(source("nemo", "local", sets).data, label_column=None,
                              columns=["text", "duration", "shard_id", "audio_filepath"])
    rows = dataset.read_rows([0, 5, 15])
    assert [(r.extras["audio_filepath"], r.extras["shard_id"], r.extras["text"]) for r in rows] == [
        ("utt0000.wav", 0, "words 0"), ("utt0005.wav", 1, "words 5"), ("utt0015.wav", 2, "words 15")]
    assert [bytes(r.audio) for r in rows] == [clip_bytes(i, seconds(i)) for i in (0, 5, 15)]
    assert [r.file.rsplit("/", 1)[-1] for r in rows] == ["audio_0.tar", "audio_1.tar", "audio_2.tar"]


def test_shar_cut_fields_are_columns(sets):
    dataset = al.ShardDataset(source("shar", "local", sets).data, label_column=None,
                              columns=["id", "text", "speaker", "topic", "duration"])
    rows = dataset.read_rows([0, 7])
    assert [r.extras for r in rows] == [
        {"id": "rec-0000.seg", "text": "hello 0", "speaker": "spk0", "topic": 0, "duration": seconds(0)},
        {"id": "rec-0007.seg", "text": "hello 7", "speaker": "spk1", "topic": 1, "duration": seconds(7)}]
    assert [bytes(r.audio) for r in rows] == [clip_bytes(i, seconds(i), fmt="FLAC") for i in (0, 7)]


@pytest.mark.parametrize("kind", ["nemo", "shar"])
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_evaluation_reads_each_row_once(request, sets, kind, where, world_size):
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    if s3 is not None:
        request.getfixturevalue("s3_sets")
    seen = []
    for rank in range(world_size):
        with loader_for(source(kind, where, sets, s3), train=False,
                        storage=al.Storage(rank=rank, world_size=world_size)) as loader:
            seen += [i for b in loader for i in b["index"][b["valid"]].tolist()]  # padded rows are not valid
    assert Counter(seen) == Counter(range(TOTAL[kind]))


@pytest.mark.parametrize("kind", ["nemo", "shar"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_training_resumes_exactly(request, sets, kind, where):
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    if s3 is not None:
        request.getfixturevalue("s3_sets")
    assert_resumes_exactly(lambda **kw: loader_for(source(kind, where, sets, s3), **kw), 5, [2])


def test_durations_for_bucketing_read_no_audio(s3, proxy, sets, s3_sets):
    dataset = al.ShardDataset(source("nemo", "s3", sets, s3).data, label_column=None, retry=FAST)
    proxy.clear()
    assert dataset.read_column("duration", range(TOTAL["nemo"])) == [seconds(i) for i in range(TOTAL["nemo"])]
    assert proxy.requests == []
    with loader_for(source("nemo", "local", sets), train=False,
                    length=al.LengthPolicy(crop=None, max_seconds=2.0),
                    batching=al.Bucketing(max_duration=1.0, duration_column="duration")) as loader:
        assert Counter(i for b in loader for i in b["index"].tolist()) == Counter(range(TOTAL["nemo"]))


def test_rows_are_numbered_in_each_tars_member_order(tmp_path, sets):
    folder = write_nemo(tmp_path / "nemo")
    manifest = folder / "tarred_audio_manifest.json"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(lines[::-1]) + "\n")  # NeMo reads members in any order of the manifest
    shuffled = al.ShardDataset(al.NemoTarred(str(manifest), str(folder / "audio_{0..2}.tar")), label_column=None,
                               columns=["text"])
    reference = al.ShardDataset(source("nemo", "local", sets).data, label_column=None, columns=["text"])
    every = range(TOTAL["nemo"])
    assert [(r.extras, bytes(r.audio)) for r in shuffled.read_rows(every)] == \
        [(r.extras, bytes(r.audio)) for r in reference.read_rows(every)]


def test_a_shard_id_past_the_tars_is_refused(tmp_path):
    folder = write_nemo(tmp_path / "nemo")
    with pytest.raises(al.ShardReadError, match=r"shard_id 2 names no tar: tars= gives 2"):
        al.ShardDataset(al.NemoTarred(str(folder / "tarred_audio_manifest.json"), str(folder / "audio_{0..1}.tar")),
                        label_column=None)
