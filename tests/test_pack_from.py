"""``audioloader pack --from webdataset|nemo|shar|files`` (issue 35): the packed shards hold the rows, columns and
encoded bytes that reading the container in place gives; compressed tars, unreadable in place, are packed."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

import audioloader as al
from tests.test_formats import ROWS, write_tar, write_tars
from tests.test_tarred_sets import NEMO_ROWS, SHAR_ROWS, write_nemo, write_shar

ROOT = Path(__file__).resolve().parents[1]


def run_pack(*args) -> str:
    proc = subprocess.run([sys.executable, "-m", "audioloader", "pack", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def rows(source, n: int, label_column=None) -> list[tuple]:
    dataset = al.ShardDataset(source, label_column=None)
    dataset = dataset.with_columns([c for c in dataset.schema.names if c != "audio"])
    return [(bytes(r.audio), r.extras) for r in dataset.read_rows(range(n))]


def test_webdataset_packs_to_the_rows_read_in_place(tmp_path):
    src = write_tars(tmp_path / "wds")
    out = run_pack("--from", "webdataset", src, tmp_path / "out", "--shard-mb", "0.2")
    assert "input: webdataset" in out and "columns: audio, label, __key__, text, uid, name" in out
    packed = sorted((tmp_path / "out").glob("shard-*.arrow"))
    assert len(packed) > 1 and (tmp_path / "out" / "_audioloader_manifest.arrow").is_file()
    assert rows(str(tmp_path / "out"), sum(ROWS)) == rows(str(src), sum(ROWS))
    assert al.ShardDataset(str(tmp_path / "out")).schema.field("label").type == "int64"


def test_compressed_tars_are_detected_and_packed(tmp_path):
    (tmp_path / "gz").mkdir()
    write_tar(tmp_path / "gz" / "a.tar.gz", 0, 5, gz=True)
    write_tar(tmp_path / "plain.tar", 0, 5)
    run_pack(tmp_path / "gz", tmp_path / "out")  # detected: a folder of tars
    assert rows(str(tmp_path / "out"), 5) == rows(str(tmp_path / "plain.tar"), 5)
    assert gzip.decompress((tmp_path / "gz" / "a.tar.gz").read_bytes())  # the source is left as it was


def test_nemo_and_shar_pack_to_their_rows(tmp_path):
    nemo = write_nemo(tmp_path / "nemo")
    manifest, pattern = nemo / "tarred_audio_manifest.json", nemo / "audio_{0..2}.tar"
    run_pack("--from", "nemo", manifest, tmp_path / "nemo-out", "--tars", pattern)
    assert rows(str(tmp_path / "nemo-out"), sum(NEMO_ROWS)) == rows(al.NemoTarred(str(manifest), str(pattern)),
                                                                   sum(NEMO_ROWS))
    shar = write_shar(tmp_path / "shar")
    out = run_pack(shar, tmp_path / "shar-out", "--format", "parquet")  # detected by its cuts
    assert "input: shar" in out and sorted(p.suffix for p in (tmp_path / "shar-out").glob("shard-*")) == [".parquet"]
    assert rows(str(tmp_path / "shar-out"), sum(SHAR_ROWS)) == rows(al.LhotseShar(str(shar)), sum(SHAR_ROWS))


def test_nemo_without_its_tars_is_refused_naming_the_option(tmp_path):
    nemo = write_nemo(tmp_path / "nemo")
    proc = subprocess.run([sys.executable, "-m", "audioloader", "pack", "--from", "nemo",
                           str(nemo / "tarred_audio_manifest.json"), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--tars PATTERN" in proc.stderr


@pytest.mark.parametrize("listed", [False, True])
def test_audio_files_pack_to_a_row_each(tmp_path, listed):
    from tests.helpers import clip_bytes

    (tmp_path / "clips").mkdir()
    for i in range(4):
        (tmp_path / "clips" / f"c{i}.wav").write_bytes(clip_bytes(i, 0.2))
    src = tmp_path / "clips"
    if listed:
        (tmp_path / "list.jsonl").write_text("".join(f'{{"path": "clips/c{i}.wav", "text": "t{i}"}}\n'
                                                     for i in range(4)))
        src = tmp_path / "list.jsonl"
    run_pack("--from", "files", src, tmp_path / "out")
    packed = rows(str(tmp_path / "out"), 4)
    assert [audio for audio, _ in packed] == [clip_bytes(i, 0.2) for i in range(4)]
    assert [extras.get("text") for _, extras in packed] == ([f"t{i}" for i in range(4)] if listed else [None] * 4)
