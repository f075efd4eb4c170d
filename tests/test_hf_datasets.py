"""Hugging Face `datasets` output read as-is: save_to_disk (IPC stream shards) and to_parquet."""

from __future__ import annotations

import shutil

import pytest

from audioloader.nodes.arrow_shard_reader import ArrowShardReader
from audioloader.shards import ShardDataset

from .helpers import clip_bytes

datasets = pytest.importorskip("datasets")

NAMES = ["dog", "cat", "bird", "frog"]
ROWS = 23
SHORT = {"seconds": 0.02}


@pytest.fixture(scope="module")
def hf_dataset():
    features = datasets.Features({
        "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
        "label": datasets.ClassLabel(names=NAMES),
    })
    data = {"audio": [{"bytes": clip_bytes(i, **SHORT), "path": f"clip{i}.wav"} for i in range(ROWS)],
            "label": [i % len(NAMES) for i in range(ROWS)]}
    # Encoding through Audio() itself needs torchcodec; Audio(decode=False) over the
    # same struct is what a real audio dataset stores.
    return datasets.Dataset.from_dict(data, features=features).cast_column("audio", datasets.Audio(decode=False))


@pytest.fixture(scope="module")
def saved(hf_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    hf_dataset.save_to_disk(str(root / "disk"), num_shards=3)
    hf_dataset.to_parquet(str(root / "data.parquet"))
    return root


def check_every_row_once(source, world_size: int = 2) -> None:
    seen = {}
    for rank in range(world_size):
        for sample in ArrowShardReader.of(source, rank=rank, world_size=world_size, shuffle=False, split_rows=4):
            assert sample.key.index not in seen and sample.problem is None
            seen[sample.key.index] = (bytes(sample.audio), sample.label)
    assert seen == {i: (clip_bytes(i, **SHORT), i % len(NAMES)) for i in range(ROWS)}


def test_save_to_disk_folder_is_read_without_conversion(saved):
    ds = ShardDataset(saved / "disk")
    assert len(ds.files) == 3 and {f.format for f in ds.files} == {"ipc_stream"}
    assert ds.num_rows == ROWS and ds.label_names == NAMES
    check_every_row_once(saved / "disk")


def test_to_parquet_file_is_read_without_conversion(saved):
    ds = ShardDataset(saved / "data.parquet")
    assert ds.files[0].format == "parquet" and ds.label_names == NAMES
    check_every_row_once(saved / "data.parquet")


def test_cache_files_next_to_a_saved_dataset_are_ignored(saved, tmp_path):
    # Dataset.map on a loaded dataset writes cache-*.arrow into the same folder;
    # state.json says which files are the dataset.
    disk = tmp_path / "disk"
    shutil.copytree(saved / "disk", disk)
    loaded = datasets.load_from_disk(str(disk))
    loaded.map(lambda row: {"label": 0}, cache_file_name=str(disk / "cache-test.arrow"))
    assert (disk / "cache-test.arrow").exists()
    ds = ShardDataset(disk)
    assert len(ds.files) == 3 and ds.num_rows == ROWS
    assert [r.label for r in ds.read_rows(range(ROWS))] == [i % len(NAMES) for i in range(ROWS)]
