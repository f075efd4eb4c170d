"""ShardDataset: discovery, format sniffing, metadata, splits, schema errors and reads."""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from audioloader.errors import SchemaError, ShardReadError
from audioloader.shards import ShardDataset, SourceNotFoundError, Split, subdivide

from .helpers import (
    audio_table,
    clip_bytes,
    make_shards,
    write_ipc_file,
    write_ipc_stream,
    write_orc,
    write_parquet,
)

FORMATS = ["ipc_file", "ipc_stream", "parquet", "orc"]
WRITERS = {"ipc_file": write_ipc_file, "ipc_stream": write_ipc_stream, "parquet": write_parquet, "orc": write_orc}
EXTENSIONS = {"ipc_file": ".arrow", "ipc_stream": ".arrow", "parquet": ".parquet", "orc": ".orc"}
SHORT = {"seconds": 0.02}  # tiny clips keep the tests fast


def all_rows(ds: ShardDataset) -> list[dict]:
    """Every row in (file, row) order through read_split, as plain dicts."""
    out = []
    for split in ds.splits:
        for batch in ds.read_split(split):
            cols = ds.columns_of(batch)
            for i in range(batch.num_rows):
                out.append({"audio": None if cols.audio[i] is None else bytes(cols.audio[i]),
                            "label": None if cols.labels is None else cols.labels[i],
                            **{name: values[i] for name, values in cols.extras}})
    return out


# ----------------------------------------------------------------------------- formats and metadata


@pytest.mark.parametrize("fmt", FORMATS)
def test_metadata_and_rows_per_format(tmp_path, fmt):
    make_shards(tmp_path, [7, 0, 13, 5], fmt=fmt, batch_rows=3, **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid", "name"], split_rows=4)
    assert [f.format for f in ds.files] == [fmt] * 4
    assert [f.num_rows for f in ds.files] == [7, 0, 13, 5]
    assert [f.index_offset for f in ds.files] == [0, 7, 7, 20]
    assert ds.files[2].batch_rows == (3, 3, 3, 3, 1)
    assert ds.num_rows == 25 and ds.files[0].size == (tmp_path / "part-00000").with_suffix(
        EXTENSIONS[fmt]).stat().st_size
    rows = all_rows(ds)
    assert [r["uid"] for r in rows] == list(range(25))
    assert [r["label"] for r in rows] == [i % 3 for i in range(25)]
    assert rows[11]["audio"] == clip_bytes(11, **SHORT) and rows[11]["name"] == "clip11"


@pytest.mark.parametrize("fmt", FORMATS)
def test_struct_audio_column_like_hugging_face(tmp_path, fmt):
    make_shards(tmp_path, [5, 6], fmt=fmt, batch_rows=4, struct_audio=True, **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid"])
    assert pa.types.is_struct(ds.schema.field("audio").type)
    assert [r["audio"] for r in all_rows(ds)] == [clip_bytes(i, **SHORT) for i in range(11)]


def test_struct_audio_slices_keep_their_offset(tmp_path):
    # One 10-row batch cut into splits: the struct's child must follow the slice offset.
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 10, struct_audio=True, **SHORT), batch_rows=10)
    ds = ShardDataset(tmp_path, columns=["uid"], split_rows=3)
    assert len(ds.splits) == 4  # 10 > 2 * 3: the batch is divided into row ranges
    rows = all_rows(ds)
    assert [r["uid"] for r in rows] == list(range(10))
    assert [r["audio"] for r in rows] == [clip_bytes(i, **SHORT) for i in range(10)]


def test_local_ipc_audio_is_a_zero_copy_view(tmp_path):
    path = write_ipc_file(tmp_path / "a.arrow", audio_table(0, 4, **SHORT))
    ds = ShardDataset(path)
    audio = ds.columns_of(next(ds.read_split(ds.splits[0]))).audio[1]
    start, size = ds.units.handle(0).mapped_range  # the memory map the dataset opened in this thread
    assert isinstance(audio, pa.Buffer) and start <= audio.address < start + size
    assert bytes(audio) == clip_bytes(1, **SHORT)


@pytest.mark.parametrize(("writer", "name", "expected"), [
    ("parquet", "looks_like.arrow", "parquet"),
    ("ipc_stream", "data.parquet", "ipc_stream"),
    ("ipc_file", "no_extension", "ipc_file"),
    ("orc", "data.parquet", "orc"),
])
def test_format_is_detected_from_content(tmp_path, writer, name, expected):
    WRITERS[writer](tmp_path / name, audio_table(0, 6, **SHORT), 4)
    ds = ShardDataset(tmp_path / name)
    assert ds.files[0].format == expected and ds.num_rows == 6
    assert [r["label"] for r in all_rows(ds)] == [i % 3 for i in range(6)]


def test_legacy_stream_without_continuation_marker(tmp_path):
    table = audio_table(0, 9, **SHORT)
    options = pa.ipc.IpcWriteOptions(use_legacy_format=True)
    with pa.OSFile(str(tmp_path / "old.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        for batch in table.to_batches(max_chunksize=4):
            writer.write_batch(batch)
    ds = ShardDataset(tmp_path, columns=["uid"])
    assert ds.files[0].format == "ipc_stream" and ds.files[0].batch_rows == (4, 4, 1)
    assert [r["uid"] for r in all_rows(ds)] == list(range(9))


# ----------------------------------------------------------------------------- discovery


def test_folder_takes_shard_files_recursively_sorted_and_ignores_others(tmp_path):
    make_shards(tmp_path / "b", [2], **SHORT)
    make_shards(tmp_path / "a", [3], fmt="parquet", **SHORT)
    (tmp_path / "dataset_info.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a shard")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".hidden.arrow").write_text("junk")
    ds = ShardDataset(tmp_path)
    assert [f.path for f in ds.files] == [str(tmp_path / "a" / "part-00000.parquet"),
                                          str(tmp_path / "b" / "part-00000.arrow")]


def test_glob_list_and_file_url_sources(tmp_path):
    paths = make_shards(tmp_path, [2, 3, 4], **SHORT)
    assert ShardDataset(str(tmp_path / "part-*.arrow")).num_rows == 9
    # A list is merged, de-duplicated and sorted by path.
    ds = ShardDataset([paths[2], str(paths[0]), tmp_path / "part-0000[02].arrow"])
    assert [f.path for f in ds.files] == [str(paths[0]), str(paths[2])]
    assert ShardDataset(paths[1].as_uri()).files[0].path == str(paths[1])


def _memory_filesystem(local_dir, target: str):
    """Copy local shards into fsspec's in-memory filesystem (a stand-in for S3/GCS)."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    if memory.exists(target):
        memory.rm(target, recursive=True)
    for path in sorted(local_dir.iterdir()):
        memory.pipe(f"{target}/{path.name}", path.read_bytes())
    return memory


@pytest.mark.parametrize("fmt", FORMATS)
def test_remote_url_reads_like_local(tmp_path, fmt):
    make_shards(tmp_path, [5, 7], fmt=fmt, batch_rows=3, **SHORT)
    _memory_filesystem(tmp_path, f"/shards-{fmt}")
    local = ShardDataset(tmp_path, columns=["uid"], split_rows=3)
    remote = ShardDataset(f"memory://shards-{fmt}", columns=["uid"], split_rows=3)
    assert [f.path for f in remote.files] == [f"memory://shards-{fmt}/{p.name}" for p in sorted(tmp_path.iterdir())]
    assert [(f.format, f.batch_rows, f.size) for f in remote.files] == \
           [(f.format, f.batch_rows, f.size) for f in local.files]
    assert remote.splits == local.splits
    assert all_rows(remote) == all_rows(local)
    assert [r.extras["uid"] for r in remote.read_rows([11, 0, 6])] == [11, 0, 6]


def test_user_filesystem_and_remote_glob(tmp_path):
    make_shards(tmp_path / "data", [4, 4], fmt="ipc_stream", **SHORT)
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    ds = ShardDataset("data/part-*.arrow", filesystem=fs, columns=["uid"])
    assert [f.path for f in ds.files] == ["data/part-00000.arrow", "data/part-00001.arrow"]
    assert [r["uid"] for r in all_rows(ds)] == list(range(8))


# ----------------------------------------------------------------------------- splits and reads


def test_splits_merge_batches_and_divide_large_ipc_batches(tmp_path):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 30, **SHORT), batch_rows=3)  # 10 batches of 3
    write_ipc_file(tmp_path / "b.arrow", audio_table(30, 25, **SHORT), batch_rows=25)  # one big batch
    ds = ShardDataset(tmp_path, split_rows=7)
    a = [(s.start, s.stop) for s in ds.splits if s.file_id == 0]
    b = [(s.start, s.stop) for s in ds.splits if s.file_id == 1]
    assert a == [(0, 6), (6, 12), (12, 18), (18, 24), (24, 30)]  # merged while <= 7 rows
    assert b == [(0, 6), (6, 12), (12, 18), (18, 25)]  # 25 > 2 * 7: divided evenly
    assert [s.split_id for s in ds.splits] == list(range(9))


def test_parquet_row_groups_are_not_divided(tmp_path):
    write_parquet(tmp_path / "a.parquet", audio_table(0, 40, **SHORT), row_group_rows=20)
    ds = ShardDataset(tmp_path, split_rows=4)
    assert [(s.start, s.stop) for s in ds.splits] == [(0, 20), (20, 40)]


def test_subdivide_halves_the_largest_until_enough():
    splits = [Split(0, 0, 0, 10), Split(1, 1, 0, 3)]
    out = subdivide(splits, 4)
    assert [(s.file_id, s.start, s.stop) for s in out] == [(0, 0, 2), (0, 2, 5), (0, 5, 10), (1, 0, 3)]
    assert [s.split_id for s in out] == [0, 1, 2, 3]
    assert len(subdivide([Split(0, 0, 0, 2)], 5)) == 2  # cannot go below one row per split


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_split_from_a_row_skips_earlier_batches(tmp_path, fmt, monkeypatch):
    make_shards(tmp_path, [20], fmt=fmt, batch_rows=4, **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid"], split_rows=20)
    read_units = []
    original = ds.units.read_unit
    monkeypatch.setattr(ds.units, "read_unit", lambda f, u: read_units.append(u) or original(f, u))
    batches = list(ds.read_split(ds.splits[0], start_row=9))
    assert [uid for b in batches for uid in b.column("uid").to_pylist()] == list(range(9, 20))
    assert read_units == [2, 3, 4]
    assert set(batches[0].schema.names) == {"audio", "label", "uid"}  # only the used columns
    assert list(ds.read_split(ds.splits[0], start_row=20)) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_rows_matches_sequential_reads(tmp_path, fmt):
    make_shards(tmp_path, [6, 9], fmt=fmt, batch_rows=4, **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid", "name"])
    sequential = all_rows(ds)
    indices = [14, 0, 7, 7, 3, 9]
    rows = ds.read_rows(indices)
    assert [r.index for r in rows] == indices
    assert [(r.file, r.row) for r in rows][:2] == [(ds.files[1].path, 8), (ds.files[0].path, 0)]
    for i, row in zip(indices, rows, strict=True):
        assert bytes(row.audio) == sequential[i]["audio"]
        assert (row.label, row.extras) == (sequential[i]["label"], {"uid": i, "name": f"clip{i}"})


def test_read_rows_from_many_threads(tmp_path):
    make_shards(tmp_path, [30, 30], fmt="ipc_stream", batch_rows=5, **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid"])
    results, errors = {}, []

    def work(t: int) -> None:
        try:
            indices = np.random.default_rng(t).permutation(60).tolist()
            results[t] = ([r.extras["uid"] for r in ds.read_rows(indices)], indices)
        except Exception as error:  # collected for the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and all(got == want for got, want in results.values())


def test_locate(tmp_path):
    make_shards(tmp_path, [3, 0, 4], **SHORT)
    ds = ShardDataset(tmp_path)
    assert [ds.locate(i) for i in (0, 2, 3, 6)] == [(0, 0), (0, 2), (2, 0), (2, 3)]
    assert ds.locate(np.int64(4)) == (2, 1)
    for bad in (7, -1):
        with pytest.raises(IndexError, match=r"out of range: the source has 7 rows \(indices 0\.\.6\)"):
            ds.locate(bad)


def test_null_audio_and_labels_are_reported_as_problems(tmp_path):
    table = pa.table({"audio": pa.array([b"x", None, b"z", b"w"], pa.binary()),
                      "label": pa.array([0, 1, None, None], pa.int64())})
    write_parquet(tmp_path / "a.parquet", table)
    ds = ShardDataset(tmp_path)
    cols = ds.columns_of(next(ds.read_split(ds.splits[0])))
    assert cols.problems == [None, "audio is null", "label is null", "label is null"]
    assert cols.audio[1] is None and cols.labels[2] is None
    unlabeled = ShardDataset(tmp_path, label_column=None)
    assert unlabeled.columns_of(next(unlabeled.read_split(unlabeled.splits[0]))).labels is None


def test_label_names_from_our_metadata_and_fingerprint(tmp_path):
    table = audio_table(0, 3, **SHORT)
    table = table.replace_schema_metadata({b"audioloader": json.dumps({"labels": ["dog", "cat", "bird"]})})
    write_ipc_file(tmp_path / "a.arrow", table)
    ds = ShardDataset(tmp_path, columns=["uid"])
    assert ds.label_names == ["dog", "cat", "bird"]
    fp = ds.fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    assert fp["files"] == [[str(tmp_path / "a.arrow"), ds.files[0].size, 3]]
    assert fp["columns"] == {"audio": "audio", "label": "label", "extras": ["uid"]}
    assert ShardDataset(tmp_path, label_column=None).label_names == ["dog", "cat", "bird"]
    write_ipc_file(tmp_path / "plain.arrow", audio_table(3, 2, **SHORT))
    assert ShardDataset(tmp_path / "plain.arrow").label_names is None


def test_dataset_pickles_without_open_handles(tmp_path):
    import pickle

    make_shards(tmp_path, [4], **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid"])
    ds.read_rows([1])
    clone = pickle.loads(pickle.dumps(ds))
    assert [r.extras["uid"] for r in clone.read_rows([3, 2])] == [3, 2]
    assert clone.rows.units is clone.units  # a copy's rows are read through its own units: one set of handles


def test_with_columns_reads_its_columns_and_leaves_the_original_as_it_was(tmp_path):
    make_shards(tmp_path, [4], **SHORT)
    ds = ShardDataset(tmp_path, columns=["uid"])
    assert ds.read_rows([1])[0].extras == {"uid": 1}  # this thread's handle of file 0 reads audio, label, uid
    narrow = ds.with_columns([])
    assert narrow.units is not ds.units and narrow.rows.units is narrow.units
    assert narrow.read_rows([2])[0].extras == {} and narrow.columns_of(next(narrow.read_split(narrow.splits[0]))
                                                                        ).extras == []
    assert ds.read_rows([2])[0].extras == {"uid": 2}


# ----------------------------------------------------------------------------- errors


def test_no_files_match(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(SourceNotFoundError, match=r"no shard files match the source; searched folder '.*' and its "
                                                  r"subfolders for \*\.arrow/\*\.ipc.*name a file directly"):
        ShardDataset(tmp_path)
    assert issubclass(SourceNotFoundError, ShardReadError) and issubclass(SourceNotFoundError, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match=r"searched glob .*\*\.arrow.*0 matches"):
        ShardDataset(str(tmp_path / "*.arrow"))
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        ShardDataset(tmp_path / "missing.arrow")
    with pytest.raises(ValueError, match="empty list"):
        ShardDataset([])


def test_not_an_arrow_file(tmp_path):
    bad = tmp_path / "fake.arrow"
    bad.write_bytes(b"RIFF....WAVEfmt this is a wav file, not a shard" * 4)
    with pytest.raises(ShardReadError, match=r"fake\.arrow is not an Arrow IPC, Parquet or ORC file.*Accepted formats"):
        ShardDataset(tmp_path)
    bad.write_bytes(b"")
    with pytest.raises(ShardReadError, match=r"fake\.arrow.*an empty file"):
        ShardDataset(bad)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_files_name_the_file(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / "cut.bin", audio_table(0, 8, **SHORT), 4)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ShardReadError, match=r"cut\.bin"):
        ShardDataset(path)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"audio_column": "wav"}, r"a\.arrow: audio column 'wav' not found; available columns: 'audio', 'label', "
                              r"'uid', 'name'\. Name one of them with al\.Source\(\.\.\., audio_column=\.\.\.\)"),
    ({"label_column": "genre"}, r"label column 'genre' not found; available columns: .*"
                                r"Name one of them with al\.Source\(\.\.\., label_column=\.\.\.\), or read unlabeled "
                                r"data with al\.Source\(\.\.\., label_column=None\)"),
    ({"columns": ["speaker"]}, r"a\.arrow: extra column 'speaker' not found; available columns:.*Fix columns="),
    ({"audio_column": "name"}, r"a\.arrow: audio column 'name' has type string; expected binary or large_binary"
                               r".*struct<bytes: binary, path: string>"),
    ({"label_column": "name"}, r"a\.arrow: label column 'name' has type string; expected an integer type"),
])
def test_schema_errors_name_file_column_and_fix(tmp_path, kwargs, pattern):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 3, **SHORT))
    with pytest.raises(SchemaError, match=pattern):
        ShardDataset(tmp_path, **kwargs)


def test_float_label_and_struct_without_bytes_are_rejected(tmp_path):
    no_bytes = pa.table({"audio": pa.array([{"path": "a.wav"}], pa.struct([("path", pa.string())]))})
    write_parquet(tmp_path / "a.parquet", no_bytes)
    with pytest.raises(SchemaError, match=r"a\.parquet: audio column 'audio' has type struct<path: string>"):
        ShardDataset(tmp_path / "a.parquet", label_column=None)
    float_label = pa.table({"audio": pa.array([b"x"], pa.binary()), "label": pa.array([1.0], pa.float32())})
    write_parquet(tmp_path / "b.parquet", float_label)
    with pytest.raises(SchemaError, match=r"b\.parquet: label column 'label' has type float"):
        ShardDataset(tmp_path / "b.parquet")


def test_files_that_disagree_are_both_named(tmp_path):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 3, **SHORT))
    write_ipc_file(tmp_path / "b.arrow", audio_table(3, 3, **SHORT).cast(pa.schema([
        ("audio", pa.binary()), ("label", pa.int64()), ("uid", pa.string()), ("name", pa.string())])))
    with pytest.raises(SchemaError, match=r"column 'uid' has type int64 in .*a\.arrow but string in "
                                          r".*b\.arrow"):
        ShardDataset(tmp_path, columns=["uid"])


def test_empty_source(tmp_path):
    make_shards(tmp_path, [0, 0], **SHORT)
    with pytest.raises(ValueError, match=r"the source has no rows: 2 file\(s\), all empty"):
        ShardDataset(tmp_path)


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    ({"split_rows": 0}, ValueError, "split_rows must be a positive int"),
    ({"columns": "uid"}, TypeError, r"use columns=\['uid'\]"),
    ({"columns": ["label"]}, ValueError, "repeats the audio/label column 'label'"),
    ({"audio_column": None}, TypeError, "audio_column must be a column name"),
    ({"filesystem": "s3"}, TypeError, "filesystem must be a pyarrow.fs.FileSystem"),
])
def test_bad_arguments(tmp_path, kwargs, error, pattern):
    make_shards(tmp_path, [2], **SHORT)
    with pytest.raises(error, match=pattern):
        ShardDataset(tmp_path, **kwargs)


def test_dictionary_columns_in_a_stream_are_refused_clearly(tmp_path):
    table = audio_table(0, 4, **SHORT)
    table = table.set_column(3, "name", pa.compute.dictionary_encode(table.column("name")))
    write_ipc_stream(tmp_path / "d.arrow", table)
    with pytest.raises(ShardReadError, match=r"d\.arrow.*dictionary-encoded"):
        ShardDataset(tmp_path)


def test_parquet_file_reads_its_arrow_schema_metadata(tmp_path):
    table = audio_table(0, 2, **SHORT).replace_schema_metadata({b"audioloader": b'{"labels": ["a", "b", "c"]}'})
    pq.write_table(table, str(tmp_path / "a.parquet"))
    assert ShardDataset(tmp_path).label_names == ["a", "b", "c"]


# ------------------------------------------------------------------------------------ mapped pages


def mapped_kb(path) -> int:
    """Resident KiB of this process's memory maps of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            first = line.split(None, 6)
            if "-" in first[0] and len(first) >= 5 and ":" in first[3]:  # a mapping's header line
                inside = len(first) == 6 and first[5].strip() == str(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")
def test_rows_read_through_a_memory_map_leave_no_pages_mapped_after_a_release(tmp_path):
    # Every page a memory map touched stayed mapped, and counted in the process's memory, until the file was
    # closed: a decode worker held every row it had ever decoded (740 MB of a 1,300 MB process tree).
    path = write_ipc_file(tmp_path / "big.arrow", audio_table(0, 12, seconds=4.0), batch_rows=4)  # ~128 KB a row
    ds = ShardDataset(path)
    first = [bytes(row.audio) for row in ds.read_rows(range(12))]  # touches every byte of every row
    assert mapped_kb(path) > 1000
    ds.release_mapped_pages()
    assert mapped_kb(path) < 100
    again = [bytes(row.audio) for row in ds.read_rows(range(12))]  # the same bytes, read back from the page cache
    assert again == first
    other = threading.Thread(target=ds.release_mapped_pages)  # another thread's release leaves this thread's maps
    other.start()
    other.join()
    assert mapped_kb(path) > 1000
