"""Schema evolution: files of one source that differ compatibly are read with one unified schema."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import audioloader as al
from tests.helpers import (
    assert_resumes_exactly,
    audio_table,
    loader_factory,
    write_ipc_file,
    write_orc,
    write_parquet,
)

ROWS = [6, 5, 7]
TOTAL = sum(ROWS)


def evolved_table(file: int, start: int, n: int) -> pa.Table:
    """File 0: uid int32, no speaker; file 1: uid int64 and a new speaker column; file 2: large_binary audio,
    large_string speaker."""
    table = audio_table(start, n, seconds=0.3).drop_columns(["name"])
    if file == 0:
        return table.set_column(2, "uid", table.column("uid").cast(pa.int32()))
    speakers = pa.array([f"s{(start + k) % 2}" for k in range(n)])
    table = table.append_column("speaker", speakers)
    if file == 2:
        table = table.cast(pa.schema([("audio", pa.large_binary()), ("label", pa.int64()), ("uid", pa.int64()),
                                      ("speaker", pa.large_string())]))
    return table


@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evolved")
    start = 0
    writers = [write_parquet, write_ipc_file, write_ipc_file]
    for i, (n, writer) in enumerate(zip(ROWS, writers, strict=True)):
        writer(folder / f"part-{i}.{'parquet' if i == 0 else 'arrow'}", evolved_table(i, start, n), 4)
        start += n
    return folder


loader_for = loader_factory(batch_size=4, seed=2, workers=al.Workers(num_workers=2, kind="thread"),
                            columns=("uid", "speaker"),
                            train_options={"shuffle": al.Shuffle(buffer_size=6, min_size=3)})


def test_the_unified_schema_widens_and_adds_columns(evolved):
    schema = al.ShardDataset(evolved, columns=("uid", "speaker")).schema
    assert schema.names == ["audio", "label", "uid", "speaker"]
    assert [str(t) for t in schema.types] == ["large_binary", "int64", "int64", "large_string"]
    assert schema.field("speaker").nullable  # the first file lacks it


def test_eval_reads_every_row_once_with_nulls_for_missing_columns(evolved):
    with loader_for(evolved, train=False) as loader:
        batches = list(loader)
    indices = [i for b in batches for i in b["index"][b["valid"]].tolist()]
    assert Counter(indices) == Counter(range(TOTAL))
    speakers, uids = {}, {}
    for b in batches:
        for k, index in enumerate(b["index"].tolist()):
            if b["valid"][k]:
                speakers[index], uids[index] = b["speaker"][k], b["uid"][k].item()
    assert uids == {i: i for i in range(TOTAL)} and batches[0]["uid"].dtype.is_floating_point is False
    assert [speakers[i] for i in range(TOTAL)] == [None] * ROWS[0] + [f"s{i % 2}" for i in range(ROWS[0], TOTAL)]


def test_a_filter_on_an_added_column_treats_missing_values_as_null(evolved):
    with loader_for(al.Source(evolved, filter=pc.field("speaker") == "s1"), train=False) as loader:
        indices = sorted(i for b in loader for i in b["index"][b["valid"]].tolist())
    assert indices == [i for i in range(ROWS[0], TOTAL) if i % 2]
    with loader_for(al.Source(evolved, filter=pc.field("speaker").is_null()), train=False) as loader:
        indices = sorted(i for b in loader for i in b["index"][b["valid"]].tolist())
    assert indices == list(range(ROWS[0]))


def test_train_resumes_exactly_across_evolved_files(evolved):
    assert_resumes_exactly(lambda **options: loader_for(evolved, **options), 12, (3, 8))


def test_a_label_column_added_later_makes_older_rows_bad_rows(tmp_path):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 4, seconds=0.3).drop_columns(["label"]))
    write_ipc_file(tmp_path / "b.arrow", audio_table(4, 4, seconds=0.3))
    with loader_for(tmp_path, train=False, columns=("uid",), on_error=al.OnError(max_fraction=0.6)) as loader:
        indices = sorted(i for b in loader for i in b["index"][b["valid"]].tolist())
        stats = loader.stats()
    assert indices == [4, 5, 6, 7]
    assert stats["counters"]["bad_rows"] == 4
    assert {(r["row"], r["reason"]) for r in stats["bad_rows"]} == {(k, "label is null") for k in range(4)}


def test_a_filter_column_missing_from_an_orc_file_reads_as_null(tmp_path):
    write_orc(tmp_path / "a.orc", audio_table(0, 9, seconds=0.02).drop_columns(["name"]), stripe_rows=4)
    write_orc(tmp_path / "b.orc", audio_table(9, 5, seconds=0.02), stripe_rows=4)
    dataset = al.ShardDataset(tmp_path, filter=pc.field("name").is_null() | (pc.field("name") == "clip12"))
    assert dataset.kept_indices().tolist() == [*range(9), 12]


def test_a_column_missing_everywhere_is_an_error_naming_the_files(evolved):
    with pytest.raises(al.SchemaError, match=r"extra column 'gender' not found in any of the 3 shard files "
                                             r"\(first: .*part-0\.parquet\); available columns: 'audio', 'label', "
                                             r"'uid', 'speaker'\. Fix columns="):
        al.ShardDataset(evolved, columns=("gender",))


def test_incompatible_types_name_both_files(tmp_path):
    write_ipc_file(tmp_path / "a.arrow", audio_table(0, 3, seconds=0.02))
    odd = audio_table(3, 3, seconds=0.02)
    write_ipc_file(tmp_path / "b.arrow", odd.set_column(2, "uid", odd.column("uid").cast(pa.string())))
    both = r"column 'uid' has type int64 in .*a\.arrow but string in .*b\.arrow"
    with pytest.raises(al.SchemaError, match=both):
        al.ShardDataset(tmp_path, columns=("uid",))
    with pytest.raises(al.SchemaError, match=both):
        al.ShardDataset(tmp_path, filter=pc.field("uid") == 1)  # used by the filter
    assert al.ShardDataset(tmp_path).num_rows == 6  # unused: no error, as before
    lossy = audio_table(3, 3, seconds=0.02)
    write_ipc_file(tmp_path / "b.arrow", lossy.set_column(2, "uid", lossy.column("uid").cast(pa.float64())))
    with pytest.raises(al.SchemaError, match=r"column 'uid' has type int64 in .*a\.arrow but double in .*b\.arrow"):
        al.ShardDataset(tmp_path, columns=("uid",))  # int64 -> double would lose integers above 2**53
