"""audioloader pack from manifests and dataset layouts: CSV, TSV, JSONL, audiofolder, LibriSpeech, Common Voice;
typed columns, optional labels, the summary of what was skipped, and segments of long recordings cut on packing."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
import torch

import audioloader as al
from audioloader.dsp import audio
from audioloader.tools import cli
from audioloader.tools.layouts import detect_format
from audioloader.tools.pack import collect_inputs, pack, pack_dataset
from tests.helpers import encode, tone
from tests.test_pack import read_rows


def table_of(shards) -> pa.Table:
    return pa.concat_tables(pa.ipc.open_file(str(p)).read_all() for p in shards)


def schema_of(shards) -> pa.Schema:
    return pa.ipc.open_file(str(shards[0])).schema


def write_clip(path, seconds=0.3, rate=16000, fmt="WAV", subtype=None, freq=300.0, channels=1):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(tone(seconds, rate, freq=freq, channels=channels), rate, fmt, subtype))
    return path


@pytest.fixture
def clips(tmp_path):
    """data/clips/{0..3}.wav of 0.3-0.6 s, and an absolute-path file outside data/."""
    for i in range(4):
        write_clip(tmp_path / "data" / "clips" / f"{i}.wav", seconds=0.3 + 0.1 * i, freq=200.0 + 50 * i)
    write_clip(tmp_path / "elsewhere.flac", seconds=0.25, fmt="FLAC")
    return tmp_path


MANIFEST_ROWS = [  # path, text, speaker, language, snr, age
    ("clips/2.wav", "forty two", "7", "en", "12.5", "30"),
    ("clips/0.wav", "42", "3", "de", "3", ""),
    ("clips/1.wav", "hello, world", "7", "en", "", "41"),
]


def write_manifest(folder, kind, rows=MANIFEST_ROWS, extra_row=None):
    header = ["path", "text", "speaker", "language", "snr", "age"]
    rows = list(rows) + ([extra_row] if extra_row else [])
    if kind == "jsonl":
        path = folder / "list.jsonl"
        lines = []
        for row in rows:
            doc = dict(zip(header, row, strict=True))
            doc["speaker"] = int(doc["speaker"])
            doc["snr"] = float(doc["snr"]) if doc["snr"] else None
            doc["age"] = int(doc["age"]) if doc["age"] else None
            lines.append(json.dumps(doc))
        path.write_text("\n".join(lines) + "\n")
        return path
    sep = "\t" if kind == "tsv" else ","
    path = folder / f"list.{kind}"
    quote = (lambda v: f'"{v}"' if "," in v else v) if kind == "csv" else (lambda v: v)
    path.write_text("\n".join(sep.join(quote(v) for v in row) for row in [header, *rows]) + "\n")
    return path


# ---------------------------------------------------------------------------------------- manifests


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl"])
def test_a_manifest_with_any_columns_becomes_typed_columns(clips, kind):
    absolute = clips / "elsewhere.flac"
    manifest = write_manifest(clips / "data", kind, extra_row=(str(absolute), "far away", "9", "fr", "1.5", "7"))
    summary = pack_dataset(manifest, clips / "out", progress=False)
    table = table_of(summary.shards)
    assert summary.input_format == kind
    assert table.column_names == ["audio", "path", "duration", "text", "speaker", "language", "snr", "age"]
    assert summary.columns == table.column_names and summary.label_names is None
    schema = table.schema
    assert schema.field("text").type == pa.string()  # "42" stays a transcript
    assert schema.field("speaker").type == pa.int64()
    assert schema.field("snr").type == pa.float64() and schema.field("age").type == pa.int64()
    rows = table.to_pylist()
    # The manifest's order; paths as written, relative to the manifest's folder, or absolute.
    assert [r["path"] for r in rows] == ["clips/2.wav", "clips/0.wav", "clips/1.wav", absolute.as_posix()]
    assert [r["text"] for r in rows] == ["forty two", "42", "hello, world", "far away"]
    assert [r["speaker"] for r in rows] == [7, 3, 7, 9]
    assert [r["snr"] for r in rows] == [12.5, 3.0, None, 1.5] and [r["age"] for r in rows] == [30, None, 41, 7]
    assert rows[0]["audio"] == (clips / "data" / "clips" / "2.wav").read_bytes()  # untouched
    assert [r["duration"] for r in rows] == pytest.approx([0.5, 0.3, 0.4, 0.25])
    assert not (clips / "out" / "labels.json").exists()  # no label column, no labels
    assert summary.rows == 4 and summary.seconds == pytest.approx(1.45) and summary.skipped == {}


def test_csv_tsv_and_jsonl_of_the_same_rows_give_the_same_shards(clips):
    tables = []
    for kind in ("csv", "tsv", "jsonl"):
        shards = pack(write_manifest(clips / "data", kind), clips / f"out-{kind}", progress=False)
        tables.append(table_of(shards).replace_schema_metadata(None))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])


def test_jsonl_values_keep_their_json_types(tmp_path):
    write_clip(tmp_path / "a.wav")
    lines = [{"audio_filepath": "a.wav", "text": "one", "words": ["o", "ne"], "score": 1, "meta": {"k": 1},
              "mixed": 3},
             {"audio_filepath": "a.wav", "text": "two", "words": [], "score": 2.5, "meta": None, "mixed": "x"}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    table = table_of(pack(tmp_path / "m.jsonl", tmp_path / "out", progress=False))
    assert table.schema.field("words").type == pa.list_(pa.string())
    assert table.schema.field("score").type == pa.float64()
    assert table.column("meta").to_pylist() == [{"k": 1}, None]
    assert table.column("mixed").to_pylist() == ["3", "x"]  # mixed JSON types: kept as JSON text
    assert table.column("path").to_pylist() == ["a.wav", "a.wav"]  # NeMo's audio_filepath is the path


def test_a_label_column_gives_labeled_shards(clips):
    manifest = clips / "data" / "l.csv"
    manifest.write_text("path,label,text\nclips/0.wav,zebra,a\nclips/1.wav,ant,b\nclips/2.wav,zebra,c\n")
    summary = pack_dataset(manifest, clips / "out", progress=False)
    table = table_of(summary.shards)
    assert table.column_names == ["audio", "label", "path", "duration", "text"]
    assert table.column("label").to_pylist() == [1, 0, 1]
    assert json.loads((clips / "out" / "labels.json").read_text()) == {"ant": 0, "zebra": 1}
    assert summary.label_names == ["ant", "zebra"] and "labels: 2 classes" in summary.text()


def test_the_format_is_detected_and_can_be_forced(clips):
    data = clips / "data"
    assert detect_format(write_manifest(data, "csv")) == "csv"
    assert detect_format(write_manifest(data, "tsv")) == "tsv"
    assert detect_format(write_manifest(data, "jsonl")) == "jsonl"
    odd = data / "list.txt"  # no telling extension: the content decides
    odd.write_text((data / "list.tsv").read_text())
    assert detect_format(odd) == "tsv"
    odd.write_text((data / "list.jsonl").read_text())
    assert detect_format(odd) == "jsonl"
    odd.write_text((data / "list.csv").read_text())
    assert detect_format(odd) == "csv"
    assert collect_inputs(odd, "csv").format == "csv"
    with pytest.raises(ValueError, match=r"input_format='librispeech' reads a folder, but SRC .*list.txt"):
        collect_inputs(odd, "librispeech")
    with pytest.raises(ValueError, match=r"input_format='xml': must be one of folders, csv"):
        collect_inputs(odd, "xml")


def test_missing_files_and_empty_transcripts_are_skipped_counted_and_named(clips):
    manifest = clips / "data" / "m.csv"
    manifest.write_text("path,text\nclips/0.wav,a\nclips/nope.wav,b\nclips/1.wav,\nclips/gone.wav,c\n"
                        "clips/2.wav,d\n")
    summary = pack_dataset(manifest, clips / "out", progress=False)
    assert [r["text"] for r in read_rows(summary.shards)] == ["a", "d"]
    assert summary.skipped == {"missing file": 2, "empty transcript": 1}
    assert summary.examples["empty transcript"] == ["m.csv, line 4"]
    assert [e.split(":")[0] for e in summary.examples["missing file"]] == ["m.csv, line 3", "m.csv, line 5"]
    text = summary.text()
    assert "wrote 1 shard(s), 2 rows" in text and "columns: audio, path, duration, text" in text
    assert "skipped 3 row(s):" in text and "missing file: 2 (m.csv, line 3: " in text
    assert "empty transcript: 1 (m.csv, line 4)" in text


def test_unusable_audio_is_skipped_per_reason(clips):
    data = clips / "data"
    (data / "clips" / "empty.wav").write_bytes(encode(np.zeros(0, np.float32), 16000))
    (data / "clips" / "broken.flac").write_bytes(b"fLaC but nothing else")
    (data / "m.tsv").write_text("path\ttext\nclips/empty.wav\ta\nclips/0.wav\tb\nclips/broken.flac\tc\n")
    summary = pack_dataset(data / "m.tsv", clips / "out", progress=False)
    assert summary.rows == 1 and summary.skipped == {"no audio frames": 1, "undecodable": 1}
    assert summary.examples["no audio frames"][0].startswith("m.tsv, line 2: ")
    assert "broken.flac" in summary.examples["undecodable"][0]


def test_a_manifest_whose_files_are_all_missing_says_where_paths_are_resolved(tmp_path):
    (tmp_path / "lists").mkdir()
    manifest = tmp_path / "lists" / "m.csv"
    manifest.write_text("path\nclips/a.wav\nclips/b.wav\n")
    with pytest.raises(ValueError, match=r"no row left to pack \(missing file: 2 .*resolved against the "
                                         r"manifest's folder .*lists"):
        pack(manifest, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [
    ("name,text\na.wav,x\n", r"m.csv, line 1: no column names the audio files.*Name it one of path, file_name"),
    ("path,start\na.wav,1\n", r"line 1: a 'start' column but no 'end'"),
    ("path,offset\na.wav,1\n", r"line 1: an 'offset' column but no 'duration'"),
    ("path,start,end\na.wav,0.5,0.5\n", r"m.csv, line 2: end=0.5 s is not after start=0.5 s; fix the times"),
    ("path,start,end\na.wav,0.1,0.2\na.wav,-1,0.2\n", r"m.csv, line 3: start=-1.0 s is negative"),
    ("path,start,end\na.wav,0.1,0.2\na.wav,soon,0.2\n", r"m.csv, line 3: start='soon' is not a number of seconds"),
    ("path,start,end\na.wav,0.1,\n", r"m.csv, line 2: 'end' is empty; a segment needs both"),
    ("path,offset,duration\na.wav,0.1,0\n", r"m.csv, line 2: duration=0.0 s is not positive"),
    ("path,text\na.wav,x\nb.wav\n", r"m.csv, line 3: 1 value\(s\)"),
])
def test_manifest_errors_name_the_line_and_the_fix(tmp_path, text, message):
    write_clip(tmp_path / "a.wav", seconds=1.0)
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        pack(tmp_path / "m.csv", tmp_path / "out", progress=False)


# ---------------------------------------------------------------------------------------- layouts


def make_librispeech(root):
    """speaker/chapter/*.flac with transcripts; one line without audio, one empty, one flac without a line."""
    utterances = {("103", "1240"): ["CHAPTER ONE", "MISSUS RACHEL LYNDE", None], ("1089", "134686"): ["HE HOPED", ""]}
    for (speaker, chapter), texts in utterances.items():
        folder = root / "train-clean-100" / speaker / chapter
        folder.mkdir(parents=True)
        lines = []
        for k, text in enumerate(texts):
            utt = f"{speaker}-{chapter}-{k:04d}"
            if text is None:  # audio without a transcript line
                write_clip(folder / f"{utt}.flac", fmt="FLAC")
                continue
            lines.append(f"{utt} {text}".rstrip())
            if k != 1 or speaker != "103":  # 103-1240-0001 has a line but no audio
                write_clip(folder / f"{utt}.flac", seconds=0.2 + 0.1 * k, fmt="FLAC", freq=150.0 + 20 * k)
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    return root


def test_librispeech_tree_gives_transcripts_and_speakers_not_labels(tmp_path):
    src = make_librispeech(tmp_path / "LibriSpeech")
    assert detect_format(src) == "librispeech"
    summary = pack_dataset(src, tmp_path / "out", progress=False)
    table = table_of(summary.shards)
    assert summary.input_format == "librispeech" and summary.label_names is None
    assert table.column_names == ["audio", "path", "duration", "text", "speaker", "chapter"]  # no label column
    assert table.schema.field("speaker").type == pa.int64()
    rows = table.to_pylist()
    assert [(r["path"], r["text"], r["speaker"], r["chapter"]) for r in rows] == [
        ("train-clean-100/103/1240/103-1240-0000.flac", "CHAPTER ONE", 103, 1240),
        ("train-clean-100/1089/134686/1089-134686-0000.flac", "HE HOPED", 1089, 134686)]
    assert summary.skipped == {"missing file": 1, "empty transcript": 1, "no transcript line": 1}
    assert "103-1240.trans.txt, line 2: 103-1240-0001.flac" in summary.examples["missing file"][0]
    assert summary.examples["no transcript line"] == ["train-clean-100/103/1240/103-1240-0002.flac"]
    assert not (tmp_path / "out" / "labels.json").exists()
    # Read as class folders only when asked: then the speakers are the classes.
    assert collect_inputs(src / "train-clean-100", "folders").label_names == ["103", "1089"]


def make_common_voice(root):
    clips = root / "clips"
    clips.mkdir(parents=True)
    header = "client_id\tpath\tsentence_id\tsentence\tsentence_domain\tup_votes\tdown_votes\tage\tgender\taccents" \
             "\tvariant\tlocale\tsegment"
    rows = [("ab12", "common_voice_en_1.mp3", "s1", 'He said "hi".', "", "2", "0", "twenties", "male", "", "", "en",
             ""),
            ("cd34", "common_voice_en_2.mp3", "s2", "", "", "3", "1", "", "", "", "", "en", ""),
            ("ab12", "common_voice_en_3.mp3", "s3", "Numbers 42", "", "2", "1", "thirties", "", "", "", "en", "")]
    for i, row in enumerate(rows):
        write_clip(clips / row[1], seconds=0.5 + 0.1 * i, rate=24000, fmt="MP3", freq=300.0 + 40 * i)
    (root / "train.tsv").write_text("\n".join([header, *("\t".join(r) for r in rows)]) + "\n")
    (root / "validated.tsv").write_text(header + "\n")
    return root


def test_common_voice_tsv_gives_text_speaker_and_its_columns(tmp_path):
    src = make_common_voice(tmp_path / "cv-corpus" / "en")
    assert detect_format(src / "train.tsv") == "commonvoice"
    summary = pack_dataset(src / "train.tsv", tmp_path / "out", progress=False)
    table = table_of(summary.shards)
    assert table.column_names == ["audio", "path", "duration", "speaker", "sentence_id", "text", "sentence_domain",
                                  "up_votes", "down_votes", "age", "gender", "accents", "variant", "locale",
                                  "segment"]
    rows = table.to_pylist()
    assert [(r["path"], r["text"], r["speaker"], r["up_votes"], r["age"]) for r in rows] == [
        ("clips/common_voice_en_1.mp3", 'He said "hi".', "ab12", 2, "twenties"),
        ("clips/common_voice_en_3.mp3", "Numbers 42", "ab12", 2, "thirties")]
    assert table.schema.field("up_votes").type == pa.int64() and rows[0]["gender"] == "male"
    assert rows[1]["gender"] is None  # an empty value is null
    assert rows[0]["audio"] == (src / "clips" / "common_voice_en_1.mp3").read_bytes()
    assert rows[0]["duration"] == pytest.approx(0.5, abs=0.06)  # MP3: libsndfile's estimate
    assert summary.skipped == {"empty transcript": 1}
    with pytest.raises(ValueError, match=r"a Common Voice folder: give one of its TSV files \(train.tsv, "
                                         r"validated.tsv\)"):
        pack(src, tmp_path / "out2", progress=False)


def test_hugging_face_audiofolder_with_metadata_per_split(tmp_path):
    src = tmp_path / "ds"
    for split, names in (("train", ["a", "b"]), ("test", ["c"])):
        for name in names:
            write_clip(src / split / "audio" / f"{name}.wav")
    (src / "train" / "metadata.csv").write_text("file_name,transcription,label\naudio/a.wav,first,dog\n"
                                                "audio/b.wav,second,cat\n")
    (src / "test" / "metadata.jsonl").write_text(json.dumps({"file_name": "audio/c.wav", "transcription": "third",
                                                             "label": "bird"}) + "\n")
    assert detect_format(src) == "audiofolder"
    summary = pack_dataset(src, tmp_path / "out", progress=False)
    rows = read_rows(summary.shards)
    assert [(r["path"], r["transcription"]) for r in rows] == [
        ("test/audio/c.wav", "third"), ("train/audio/a.wav", "first"), ("train/audio/b.wav", "second")]
    assert summary.label_names == ["bird", "cat", "dog"] and [r["label"] for r in rows] == [0, 2, 1]
    one = tmp_path / "one"
    write_clip(one / "x.wav")
    (one / "metadata.csv").write_text("file_name,text\nx.wav,hello\n")
    assert read_rows(pack(one, tmp_path / "out-one", progress=False))[0]["text"] == "hello"


def test_class_folders_still_give_labels(tmp_path):
    for cls in ("dog", "cat"):
        write_clip(tmp_path / "src" / cls / "a.wav")
    summary = pack_dataset(tmp_path / "src", tmp_path / "out", progress=False)
    assert summary.input_format == "folders" and summary.label_names == ["cat", "dog"]
    assert summary.columns == ["audio", "label", "path", "duration"]


def test_the_command_line_prints_the_summary(tmp_path, capsys):
    src = make_librispeech(tmp_path / "LibriSpeech")
    assert cli.main(["pack", str(src), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 shard(s), 2 rows" in out and "(input: librispeech)" in out
    assert "columns: audio, path, duration, text, speaker, chapter" in out
    assert "skipped 3 row(s):" in out and "no transcript line: 1" in out
    assert cli.main(["pack", str(src / "train-clean-100"), str(tmp_path / "out2"), "--input-format", "folders",
                     "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((tmp_path / "out2" / "labels.json").read_text()) == {"103": 0, "1089": 1}  # as asked


# ---------------------------------------------------------------------------------------- segments


RECORDINGS = [("long.flac", 20.0, 22050, 2, "FLAC", "PCM_24"), ("long.wav", 15.0, 16000, 1, "WAV", "PCM_16")]
SEGMENTS = [("long.flac", 0.5, 2.25), ("long.wav", 1.0, 4.5), ("long.flac", 2.25, 6.0), ("long.flac", 5.0, 9.75),
            ("long.wav", 10.0, 15.0), ("long.flac", 12.3456, 19.99)]


@pytest.fixture
def recordings(tmp_path):
    for name, seconds, rate, channels, fmt, subtype in RECORDINGS:
        write_clip(tmp_path / "rec" / name, seconds, rate, fmt, subtype, freq=170.0, channels=channels)
    lines = ["path,start,end,text"] + [f"{p},{s},{e},seg {i}" for i, (p, s, e) in enumerate(SEGMENTS)]
    (tmp_path / "rec" / "segments.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "rec"


def soundfile_window(path, start, end, dtype="float64"):
    info = sf.info(str(path))
    return sf.read(str(path), start=round(start * info.samplerate), stop=round(end * info.samplerate),
                   dtype=dtype, always_2d=True)[0], info


def test_segments_are_cut_sample_exact_and_stored_once_each(recordings, tmp_path):
    summary = pack_dataset(recordings / "segments.csv", tmp_path / "out", progress=False)
    rows = read_rows(summary.shards)
    assert [(r["path"], r["start"], r["end"], r["text"]) for r in rows] == [
        (p, s, e, f"seg {i}") for i, (p, s, e) in enumerate(SEGMENTS)]
    for row in rows:
        expected, info = soundfile_window(recordings / row["path"], row["start"], row["end"])
        stored, rate = sf.read(io.BytesIO(row["audio"]), dtype="float64", always_2d=True)
        stored_info = sf.info(io.BytesIO(row["audio"]))
        assert (stored_info.format, stored_info.subtype, rate) == (info.format, info.subtype, info.samplerate)
        np.testing.assert_array_equal(stored, expected)  # the recording's samples, bit for bit
        assert row["duration"] == pytest.approx(len(expected) / rate)  # the segment's duration, for bucketing
    # Each segment costs its own length, not its recording's.
    recording_bytes = {name: (recordings / name).stat().st_size for name, *_ in RECORDINGS}
    assert summary.audio_bytes < 0.75 * sum(recording_bytes[p] for p, _, _ in SEGMENTS)
    assert json.loads(schema_of(summary.shards).metadata[b"audioloader"])["segments"] == "cut"


def test_a_speech_loader_over_packed_segments_gets_each_window(recordings, tmp_path):
    shards = pack(recordings / "segments.csv", tmp_path / "out", progress=False)
    with al.AudioLoader(al.Source(shards, label_column=None), train=False,
                        features=al.WaveformConfig(sample_rate=16000), columns=["text"],
                        length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=9.0, num_buckets=1),
                        workers=al.Workers(num_workers=2)) as loader:
        batches = list(loader)
    got = {int(i): w[:n].numpy() for b in batches
           for i, w, n, ok in zip(b["index"], b["waveform"], b["lengths"], b["valid"], strict=True) if ok}
    assert sorted(got) == list(range(len(SEGMENTS)))
    for index, (path, start, end) in enumerate(SEGMENTS):
        frames, info = soundfile_window(recordings / path, start, end, dtype="float32")
        expected = audio.resample(audio.mixdown(frames), info.samplerate, 16000)  # the loader's soxr settings
        np.testing.assert_array_equal(got[index], expected)
    seconds = [e - s for _, s, e in SEGMENTS]
    for b in batches:  # bucketed by the segments' durations
        picked = b["index"][b["valid"]].tolist()
        assert sum(seconds[i] for i in picked) <= 9.0 + 1e-6 or len(picked) == 1
    assert max(int(b["valid"].sum()) for b in batches) >= 2
    assert all(isinstance(b["lengths"], torch.Tensor) for b in batches)


def test_offset_duration_segments_of_a_lossy_recording_become_flac(tmp_path):
    write_clip(tmp_path / "talk.mp3", seconds=6.0, rate=16000, fmt="MP3", freq=220.0)
    lines = [{"audio_filepath": "talk.mp3", "offset": 0.5, "duration": 1.5, "text": "a"},
             {"audio_filepath": "talk.mp3", "offset": 3.0, "duration": 2.0, "text": "b"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = read_rows(pack(tmp_path / "m.jsonl", tmp_path / "out", workers=2, progress=False))
    whole, rate = sf.read(str(tmp_path / "talk.mp3"), dtype="float32")
    for row in rows:
        info = sf.info(io.BytesIO(row["audio"]))
        assert (info.format, info.subtype) == ("FLAC", "PCM_16")
        stored, _ = sf.read(io.BytesIO(row["audio"]), dtype="float32")
        first = round(row["offset"] * rate)
        expected = whole[first:first + round(row["duration"] * rate)]
        np.testing.assert_allclose(stored, expected, atol=1 / 32768 + 1e-6)  # 16-bit quantisation
        assert row["duration"] == pytest.approx(len(expected) / rate)


def test_segments_re_encoded_at_a_sample_rate(recordings, tmp_path):
    rows = read_rows(pack(recordings / "segments.csv", tmp_path / "out", sample_rate=8000, codec="pcm16",
                          progress=False))
    for row in rows:
        frames, info = soundfile_window(recordings / row["path"], row["start"], row["end"], dtype="float32")
        stored, rate = sf.read(io.BytesIO(row["audio"]), dtype="float32")
        assert rate == 8000 and stored.ndim == 1
        expected = np.clip(audio.resample(frames.mean(axis=1), info.samplerate, 8000), -1, 1)
        np.testing.assert_allclose(stored, expected, atol=1 / 32768 + 1e-6)


def test_a_segment_past_its_recording_names_the_line_and_the_fix(recordings, tmp_path):
    (recordings / "bad.csv").write_text("path,start,end\nlong.wav,1.0,2.0\nlong.wav,14.0,15.5\n")
    with pytest.raises(ValueError, match=r"bad.csv, line 3: segment ends at 15.5 s, after the end of the audio "
                                         r"\(15.000 s\) of .*long.wav .*fix the segment's times or drop the row"):
        pack(recordings / "bad.csv", tmp_path / "out", progress=False)
    (recordings / "late.csv").write_text("path,start,end\nlong.wav,15.2,16.0\n")
    with pytest.raises(ValueError, match=r"late.csv, line 2: segment starts at 15.2 s, not before the end"):
        pack(recordings / "late.csv", tmp_path / "out", progress=False)
    # An end a few milliseconds past the audio (rounded manifest times) is its end.
    (recordings / "rounded.csv").write_text("path,start,end\nlong.wav,14.0,15.004\n")
    rows = read_rows(pack(recordings / "rounded.csv", tmp_path / "out", overwrite=True, progress=False))
    assert rows[0]["duration"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------- column names


@pytest.mark.parametrize("start, end", [("Start", "End"), ("START", "END"), ("start", "End")])
def test_segment_columns_are_read_whatever_their_case(recordings, tmp_path, start, end):
    """`Start,End` cut segments as `start,end` do (they were carried as plain columns, the recordings packed whole)."""
    lines = [f"Path,Text,{start},{end}"] + [f"{p},seg {i},{s},{e}" for i, (p, s, e) in enumerate(SEGMENTS)]
    (recordings / "cased.csv").write_text("\n".join(lines) + "\n")
    summary = pack_dataset(recordings / "cased.csv", tmp_path / "out", progress=False)
    rows = read_rows(summary.shards)
    assert summary.columns == ["audio", "path", "duration", "text", "start", "end"]  # stored in lower case
    assert [(r["path"], r["start"], r["end"], r["text"]) for r in rows] == [
        (p, s, e, f"seg {i}") for i, (p, s, e) in enumerate(SEGMENTS)]
    assert summary.seconds == pytest.approx(sum(e - s for _, s, e in SEGMENTS), abs=1e-3)


def test_label_and_text_columns_are_read_whatever_their_case(clips):
    manifest = clips / "data" / "l.csv"
    manifest.write_text("PATH,Label,TEXT\nclips/0.wav,zebra,a\nclips/1.wav,ant,\nclips/2.wav,zebra,c\n")
    summary = pack_dataset(manifest, clips / "out", progress=False)
    assert summary.columns == ["audio", "label", "path", "duration", "text"]
    assert summary.label_names == ["ant", "zebra"] and summary.skipped == {"empty transcript": 1}


@pytest.mark.parametrize("header, message", [
    ("path,Start,start", r"columns 'Start', 'start' differ only in case.*keep one of them"),
    ("path,begin,end", r"an 'end' column but no 'start'.*is 'begin' the start\? Rename it 'start'"),
    ("path,start,stop", r"a 'start' column but no 'end'.*is 'stop' the end\? Rename it 'end'"),
    ("path,Begin,Stop", r"column\(s\) 'Begin', 'Stop' look like segment times.*rename them 'start' and 'end'.*"
                        r"names that do not look like times to carry them as plain columns"),
    ("path,onset,offset", r"'onset' and 'offset' look like each segment's start and end.*rename them 'start' and "
                          r"'end'"),
    ("path,start_time,end_time", r"'start_time', 'end_time' look like segment times"),
    ("path,start,duration", r"a 'start' column but no 'end'.*if 'duration' is each segment's length, rename 'start' "
                            r"to 'offset'"),
])
def test_columns_that_look_like_segment_times_are_refused_by_name(tmp_path, header, message):
    """Never silently a plain column: a near-miss of a segment column stops pack, naming it and the fix."""
    write_clip(tmp_path / "a.wav", seconds=2.0)
    (tmp_path / "m.csv").write_text(f"{header}\na.wav,0.5,1.5\n")
    with pytest.raises(ValueError, match=message):
        pack(tmp_path / "m.csv", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
