"""ShardWriter: atomic shards, both formats readable by plain pyarrow, argument checks."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from audioloader.shards.formats.writer import METADATA_KEY, ShardWriter
from tests.helpers import clip_bytes


def _read(path, fmt):
    if fmt == "ipc_file":
        reader = pa.ipc.open_file(str(path))
        return reader.read_all(), reader.num_record_batches
    f = pq.ParquetFile(str(path))
    return f.read(), f.metadata.num_row_groups


def _dir_names(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("fmt, name", [("ipc_file", "s.arrow"), ("parquet", "s.parquet")])
def test_roundtrip_exact_bytes_labels_metadata(tmp_path, fmt, name):
    audio = [clip_bytes(i, seconds=0.05) for i in range(10)]
    with ShardWriter(tmp_path / name, fmt, label_names=["a", "b", "c"],
                     extra_columns={"path": pa.string(), "duration": pa.float64()}, rows_per_batch=4) as w:
        for i, data in enumerate(audio):
            w.write(audio=data, label=i % 3, path=f"c{i % 3}/{i}.wav", duration=0.05 * i)
    assert w.num_rows == 10
    assert _dir_names(tmp_path) == [name]  # no temp file left behind

    table, batches = _read(tmp_path / name, fmt)
    assert batches == 3  # 4 + 4 + 2 rows
    assert table.column_names == ["audio", "label", "path", "duration"]
    assert table.schema.field("audio").type == pa.binary()
    assert table.schema.field("label").type == pa.int64()
    assert table.column("audio").to_pylist() == audio
    assert table.column("label").to_pylist() == [i % 3 for i in range(10)]
    assert table.column("path").to_pylist() == [f"c{i % 3}/{i}.wav" for i in range(10)]
    assert table.column("duration").to_pylist() == pytest.approx([0.05 * i for i in range(10)])
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    assert meta == {"labels": ["a", "b", "c"], "version": 1}


def test_ipc_file_is_memory_mappable_zero_copy(tmp_path):
    data = clip_bytes(0, seconds=0.5)
    with ShardWriter(tmp_path / "s.arrow") as w:
        w.write(data, 0)
    with pa.memory_map(str(tmp_path / "s.arrow")) as source:
        before = pa.total_allocated_bytes()
        table = pa.ipc.open_file(source).read_all()
        # The audio values point into the mapped file: reading them allocates nothing.
        assert pa.total_allocated_bytes() - before < len(data)
        assert table.column("audio")[0].as_py() == data


def test_unlabeled_and_null_labels(tmp_path):
    with ShardWriter(tmp_path / "u.arrow", labeled=False) as w:
        w.write(b"x")
    table, _ = _read(tmp_path / "u.arrow", "ipc_file")
    assert table.column_names == ["audio"]
    assert json.loads(table.schema.metadata[METADATA_KEY]) == {"labels": None, "version": 1}

    with ShardWriter(tmp_path / "n.arrow") as w:
        w.write(b"x", None)
        w.write(b"y", np.int64(4))
    table, _ = _read(tmp_path / "n.arrow", "ipc_file")
    assert table.column("label").to_pylist() == [None, 4]


def test_batches_cut_by_bytes(tmp_path):
    with ShardWriter(tmp_path / "s.arrow", rows_per_batch=100, max_batch_bytes=250) as w:
        for _ in range(5):
            w.write(b"z" * 100, 0)
    reader = pa.ipc.open_file(str(tmp_path / "s.arrow"))
    assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == [3, 2]


@pytest.mark.parametrize("fmt", ["ipc_file", "parquet"])
def test_exception_inside_with_leaves_nothing(tmp_path, fmt):
    with pytest.raises(RuntimeError, match="boom"), ShardWriter(tmp_path / "s.out", fmt, rows_per_batch=2) as w:
        for i in range(5):
            w.write(clip_bytes(i, seconds=0.05), 0)
        raise RuntimeError("boom")
    assert _dir_names(tmp_path) == []


def test_failed_write_keeps_existing_shard(tmp_path):
    target = tmp_path / "s.arrow"
    with ShardWriter(target) as w:
        w.write(b"old", 0)
    with pytest.raises(ValueError, match="label"), ShardWriter(target, label_names=["a"]) as w:
        w.write(b"new", 0)
        w.write(b"bad", 5)  # out of range -> the with block fails
    assert _dir_names(tmp_path) == ["s.arrow"]
    assert _read(target, "ipc_file")[0].column("audio").to_pylist() == [b"old"]


def test_close_replaces_existing_shard(tmp_path):
    target = tmp_path / "s.arrow"
    for payload in (b"old", b"new"):
        with ShardWriter(target) as w:
            w.write(payload, 0)
    assert _read(target, "ipc_file")[0].column("audio").to_pylist() == [b"new"]


def test_empty_shard_is_valid(tmp_path):
    with ShardWriter(tmp_path / "e.arrow"):
        pass
    table, batches = _read(tmp_path / "e.arrow", "ipc_file")
    assert table.num_rows == 0 and batches == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "ipc_stream"}, "format="),
    ({"rows_per_batch": 0}, "rows_per_batch="),
    ({"rows_per_batch": True}, "rows_per_batch="),
    ({"max_batch_bytes": -1}, "max_batch_bytes="),
    ({"label_names": "abc"}, "label_names="),
    ({"label_names": ["a", "a"]}, "duplicate"),
    ({"label_names": ["a", 1]}, r"label_names\[1\]"),
    ({"label_names": ["a"], "labeled": False}, "labeled=False"),
    ({"extra_columns": {"label": pa.string()}}, "reserved"),
    ({"extra_columns": {"path": str}}, r"extra_columns\['path'\]"),
    ({"extra_columns": ["path"]}, "extra_columns="),
])
def test_bad_arguments_name_the_argument(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShardWriter(tmp_path / "s.arrow", **kwargs)
    assert _dir_names(tmp_path) == []


def test_bad_path(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ShardWriter(tmp_path / "missing" / "s.arrow")
    with pytest.raises(ValueError, match="is a folder"):
        ShardWriter(tmp_path)


@pytest.mark.parametrize("call, message", [
    (lambda w: w.write("text", 0), "audio must be"),
    (lambda w: w.write(b"x", 1.0), "label=1.0"),
    (lambda w: w.write(b"x", True), "label=True"),
    (lambda w: w.write(b"x", -1), ">= 0"),
    (lambda w: w.write(b"x", 2), "out of range"),
    (lambda w: w.write(b"x", 0, nme="typo"), "unknown column"),
])
def test_bad_rows(tmp_path, call, message):
    with pytest.raises(ValueError, match=message), \
            ShardWriter(tmp_path / "s.arrow", label_names=["a", "b"], extra_columns={"name": pa.string()}) as w:
        call(w)
    assert _dir_names(tmp_path) == []


def test_write_outside_with_is_an_error(tmp_path):
    w = ShardWriter(tmp_path / "s.arrow")
    with pytest.raises(RuntimeError, match="not open"):
        w.write(b"x", 0)
    w.open()
    w.write(bytearray(b"x"), 0)
    w.write(memoryview(b"y"), 0)
    w.write(pa.py_buffer(b"z"), 0)
    assert w.close() == tmp_path / "s.arrow"
    assert w.close() == tmp_path / "s.arrow"  # idempotent
    with pytest.raises(RuntimeError, match="not open"):
        w.write(b"x", 0)
    assert _read(tmp_path / "s.arrow", "ipc_file")[0].column("audio").to_pylist() == [b"x", b"y", b"z"]
