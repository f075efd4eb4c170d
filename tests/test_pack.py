"""audioloader.tools.pack: class folders and CSV in, shards out; re-encoding; errors that name the input.

Manifest formats, layouts, segments and the summary: tests/test_ingest.py."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import soxr

from audioloader.tools.pack import collect_inputs, pack, pack_dataset
from tests.helpers import encode, tone

# class -> [(relative path inside the class folder, format, sample rate, channels)]
TREE = {
    "dog": [("a.wav", "WAV", 16000, 1), ("sub/b.flac", "FLAC", 22050, 2)],
    "cat": [("c.ogg", "OGG", 44100, 1), ("d.WAV", "WAV", 44100, 2)],
    "bird": [("e.mp3", "MP3", 32000, 1)],
}


def make_tree(root, tree=TREE, seconds=0.2):
    """Writes the class-folder tree; returns {relative posix path: bytes}."""
    files = {}
    for i, (cls, entries) in enumerate(sorted(tree.items())):
        for j, (rel, fmt, rate, channels) in enumerate(entries):
            data = encode(tone(seconds, rate, freq=300.0 + 50 * (3 * i + j), channels=channels, seed=i), rate, fmt)
            path = root / cls / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            files[f"{cls}/{rel}"] = data
    return files


def read_rows(paths):
    tables = []
    for p in paths:
        if p.suffix == ".arrow":
            tables.append(pa.ipc.open_file(str(p)).read_all())
        else:
            tables.append(pq.read_table(str(p)))
    return pa.concat_tables(tables).to_pylist() if tables else []


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    files = make_tree(src)
    # Things the scan must skip: hidden files/folders, macOS resource forks, non-audio files.
    (src / "dog" / ".hidden.wav").write_bytes(b"not audio")
    (src / "dog" / "._a.wav").write_bytes(b"not audio")
    (src / "cat" / "notes.txt").write_text("hello")
    (src / ".cache").mkdir()
    (src / ".cache" / "x.wav").write_bytes(b"not audio")
    return src, files


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_pack_class_folders_stores_original_bytes(tmp_path, tree, fmt):
    src, files = tree
    shards = pack(src, tmp_path / "out", fmt=fmt, progress=False)
    ext = "arrow" if fmt == "ipc_file" else "parquet"
    assert [p.name for p in shards] == [f"shard-00000.{ext}"]
    rows = read_rows(shards)
    assert [r["path"] for r in rows] == sorted(files)
    for r in rows:
        assert r["audio"] == files[r["path"]]  # untouched, byte for byte
        assert r["duration"] == pytest.approx(sf.info(io.BytesIO(r["audio"])).duration)  # for bucketing
    names = ["bird", "cat", "dog"]  # sorted sub-folder names
    assert [names[r["label"]] for r in rows] == [p.split("/")[0] for p in sorted(files)]
    assert json.loads((tmp_path / "out" / "labels.json").read_text()) == {"bird": 0, "cat": 1, "dog": 2}
    schema = pa.ipc.open_file(str(shards[0])).schema if fmt == "ipc_file" else pq.read_schema(str(shards[0]))
    assert json.loads(schema.metadata[b"audioloader"]) == {"labels": names, "version": 1}


def test_pack_is_deterministic(tmp_path, tree):
    src, _ = tree
    a = pack(src, tmp_path / "a", shard_rows=2, progress=False, workers=1)
    b = pack(src, tmp_path / "b", shard_rows=2, progress=False, workers=3)
    assert [p.name for p in a] == [p.name for p in b]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_shard_size_splits_rows_and_batches(tmp_path, tree):
    src, files = tree
    shards = pack(src, tmp_path / "out", shard_rows=2, rows_per_batch=1, progress=False)
    assert [p.name for p in shards] == ["shard-00000.arrow", "shard-00001.arrow", "shard-00002.arrow"]
    counts = [pa.ipc.open_file(str(p)).num_record_batches for p in shards]
    assert counts == [2, 2, 1]
    assert [r["path"] for r in read_rows(shards)] == sorted(files)


def test_shard_mb_cuts_by_size(tmp_path, tree):
    src, files = tree
    biggest = max(len(b) for b in files.values())
    shards = pack(src, tmp_path / "out", shard_mb=biggest / 2**20, progress=False)
    assert len(shards) >= 3  # no two of the larger files fit together
    for p in shards:
        table = pa.ipc.open_file(str(p)).read_all()
        audio = sum(len(b) for b in table.column("audio").to_pylist())
        assert table.num_rows == 1 or audio <= biggest
    assert [r["path"] for r in read_rows(shards)] == sorted(files)


def test_shuffle_seed_is_a_deterministic_permutation(tmp_path, tree):
    src, files = tree
    a = read_rows(pack(src, tmp_path / "a", shuffle_seed=3, progress=False))
    b = read_rows(pack(src, tmp_path / "b", shuffle_seed=3, progress=False))
    assert [r["path"] for r in a] == [r["path"] for r in b]
    assert sorted(r["path"] for r in a) == sorted(files)


def test_overwrite(tmp_path, tree):
    src, _ = tree
    out = tmp_path / "out"
    pack(src, out, shard_rows=1, progress=False)
    (out / "README.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"already holds shards of a pack made with shard_rows=1, this run has "
                                         r"shard_rows=None"):
        pack(src, out, progress=False)
    shards = pack(src, out, overwrite=True, progress=False)
    # The five one-row shards of the first run are gone; other files are left alone.
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "_audioloader_manifest.arrow",
                                                     "_audioloader_pack.json", "labels.json", "shard-00000.arrow"]
    assert shards == [out / "shard-00000.arrow"]


def test_pack_csv_names_and_relative_paths(tmp_path):
    audio = tmp_path / "data" / "clips"
    audio.mkdir(parents=True)
    blobs = {}
    for i in range(4):
        blobs[f"clips/{i}.wav"] = encode(tone(0.1, 8000, freq=200 + 100 * i), 8000, "WAV")
        (audio / f"{i}.wav").write_bytes(blobs[f"clips/{i}.wav"])
    absolute = tmp_path / "elsewhere.flac"
    absolute.write_bytes(encode(tone(0.1, 8000), 8000, "FLAC"))
    csv_path = tmp_path / "data" / "list.csv"
    csv_path.write_text("label,path\nzebra,clips/2.wav\nant,clips/0.wav\n\n"
                        f"zebra,clips/1.wav\nmoth,clips/3.wav\nant,{absolute}\n")
    shards = pack(csv_path, tmp_path / "out", progress=False)
    rows = read_rows(shards)
    # The CSV's row order is kept; names get ids in sorted order.
    assert [r["path"] for r in rows] == ["clips/2.wav", "clips/0.wav", "clips/1.wav", "clips/3.wav",
                                         absolute.as_posix()]
    assert [r["label"] for r in rows] == [2, 0, 2, 1, 0]
    assert rows[0]["audio"] == blobs["clips/2.wav"]
    assert rows[4]["audio"] == absolute.read_bytes()
    assert json.loads((tmp_path / "out" / "labels.json").read_text()) == {"ant": 0, "moth": 1, "zebra": 2}


def test_pack_csv_integer_labels(tmp_path):
    (tmp_path / "a.wav").write_bytes(encode(tone(0.1, 8000), 8000))
    csv_path = tmp_path / "l.csv"
    csv_path.write_text("path,label,comment\na.wav,3,x\na.wav,0,y\n")
    rows = read_rows(pack(csv_path, tmp_path / "out", progress=False))
    assert [r["label"] for r in rows] == [3, 0]
    assert json.loads((tmp_path / "out" / "labels.json").read_text()) == {"0": 0, "1": 1, "2": 2, "3": 3}


@pytest.mark.parametrize("codec, container", [("flac", "FLAC"), ("pcm16", "WAV")])
def test_reencode_resamples_to_mono(tmp_path, codec, container):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    stereo = tone(0.5, 44100, freq=440.0, channels=2)
    (src / "x" / "s.wav").write_bytes(encode(stereo, 44100, "WAV", "FLOAT"))
    mono = tone(0.3, 22050, freq=300.0)
    (src / "x" / "m.flac").write_bytes(encode(mono, 22050, "FLAC", "PCM_24"))

    rows = read_rows(pack(src, tmp_path / "out", sample_rate=16000, codec=codec, progress=False))
    expected = {"x/s.wav": soxr.resample(stereo.mean(axis=1), 44100, 16000),
                "x/m.flac": soxr.resample(mono, 22050, 16000)}
    for r in rows:
        info = sf.info(io.BytesIO(r["audio"]))
        assert (info.format, info.subtype, info.samplerate, info.channels) == (container, "PCM_16", 16000, 1)
        decoded, rate = sf.read(io.BytesIO(r["audio"]), dtype="float32")
        assert rate == 16000
        np.testing.assert_allclose(decoded, expected[r["path"]], atol=2e-4)  # 16-bit quantization


def test_reencode_keeps_rate_without_sample_rate(tmp_path):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "s.wav").write_bytes(encode(tone(0.2, 22050, channels=2), 22050))
    rows = read_rows(pack(src, tmp_path / "out", codec="flac", progress=False))
    info = sf.info(io.BytesIO(rows[0]["audio"]))
    assert (info.format, info.samplerate, info.channels) == ("FLAC", 22050, 1)


def test_reencode_order_does_not_depend_on_workers(tmp_path):
    src = tmp_path / "src"
    for i in range(12):
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 3}" / f"{i:02d}.wav").write_bytes(encode(tone(0.05, 22050, freq=100 + 40 * i), 22050))
    a = pack(src, tmp_path / "a", sample_rate=8000, workers=1, rows_per_batch=5, progress=False)
    b = pack(src, tmp_path / "b", sample_rate=8000, workers=4, rows_per_batch=5, progress=False)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


@pytest.mark.parametrize("codec", [None, "flac"])
def test_undecodable_audio_is_skipped_and_named_in_the_summary(tmp_path, tree, codec):
    src, files = tree
    (src / "cat" / "broken.wav").write_bytes(b"RIFF this is not a wav file")
    summary = pack_dataset(src, tmp_path / "out", codec=codec, shard_rows=1, progress=False)
    assert [r["path"] for r in read_rows(summary.shards)] == sorted(files)  # every good file, in order
    assert summary.rows == len(files) and summary.skipped == {"undecodable": 1}
    assert "cat/broken.wav" in summary.examples["undecodable"][0]
    assert "undecodable: 1 (" in summary.text() and "broken.wav" in summary.text()


def test_a_failure_removes_the_shards_already_written(tmp_path):
    recording = tmp_path / "long.wav"
    recording.write_bytes(encode(tone(1.0, 8000), 8000))
    manifest = tmp_path / "segments.csv"
    manifest.write_text("path,start,end\nlong.wav,0.0,0.5\nlong.wav,0.5,3.0\n")  # line 3 ends after the file
    with pytest.raises(ValueError, match=r"segments.csv, line 3: .*after the end of the audio"):
        pack(manifest, tmp_path / "out", shard_rows=1, workers=1, progress=False)
    # Shards written before the failure are removed: no half dataset is left (and no empty OUT pack made).
    assert not (tmp_path / "out").exists()


def test_errors_name_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        pack(tmp_path / "nope", tmp_path / "out", progress=False)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no class sub-folders"):
        pack(empty, tmp_path / "out", progress=False)

    (empty / "dog").mkdir()
    (empty / "dog" / "x.txt").write_text("x")
    with pytest.raises(ValueError, match=r"no audio files.*\['dog'\]"):
        pack(empty, tmp_path / "out", progress=False)

    (empty / "stray.wav").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"stray\.wav.*sub-folder"):
        pack(empty, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # inputs are checked before anything is written


@pytest.mark.parametrize("text, message", [
    ("", "empty CSV"),
    ("cls,label\na.wav,1\n", r"line 1: no column names the audio files.*\['cls', 'label'\]"),
    ("path,label\n", "no rows"),
    ("path,label\na.wav,dog\na.wav\n", "line 3: 1 value"),
    ("path,label\na.wav,dog\n,dog\n", "line 3: empty 'path'"),
    ("path,label\na.wav,\n", "line 2: empty 'label'"),
    ("path,label\nmissing.wav,cat\n", r"no row left to pack \(missing file: 1 \(e.g. list.csv, line 2: .*missing.wav"),
    ("path,label\na.wav,1\na.wav,-2\n", "line 3: label '-2' is negative"),
])
def test_csv_errors_name_the_line(tmp_path, text, message):
    (tmp_path / "a.wav").write_bytes(encode(tone(0.05, 8000), 8000))
    csv_path = tmp_path / "list.csv"
    csv_path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        collect_inputs(csv_path)
    assert "list.csv" in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"fmt": "arrow"}, "fmt="),
    ({"shard_rows": 0}, "shard_rows="),
    ({"shard_mb": -1}, "shard_mb="),
    ({"rows_per_batch": 0}, "rows_per_batch="),
    ({"sample_rate": 0}, "sample_rate="),
    ({"codec": "mp3"}, "codec="),
    ({"workers": 0}, "workers="),
])
def test_bad_arguments(tmp_path, tree, kwargs, message):
    src, _ = tree
    with pytest.raises(ValueError, match=message):
        pack(src, tmp_path / "out", progress=False, **kwargs)


def test_out_is_a_file(tmp_path, tree):
    src, _ = tree
    (tmp_path / "out").write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        pack(src, tmp_path / "out", progress=False)


def test_out_inside_src(tmp_path, tree):
    src, _ = tree
    with pytest.raises(ValueError, match="inside SRC"):
        pack(src, src / "out", progress=False)


def test_symlinked_class_folder_is_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.wav").write_bytes(encode(tone(0.05, 8000), 8000))
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(real, src / "dog")
    rows = read_rows(pack(src, tmp_path / "out", progress=False))
    assert [r["path"] for r in rows] == ["dog/a.wav"]
