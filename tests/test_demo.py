"""`audioloader demo` end to end (subprocess, --quick) and the synthetic dataset generator behind it."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
import soundfile as sf

from audioloader.shards import ShardDataset
from audioloader.tools import synthetic

ROOT = Path(__file__).resolve().parents[1]


def run_demo(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "audioloader", "demo", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, run_demo("--quick", "--cache", cache, "--no-progress")


@pytest.fixture(scope="module")
def on_quick_data(quick_run):
    """The demo's runs on the quick run's dataset, only read: ``{name: future of its CompletedProcess}``, started
    together and run as many at once as there are cores (each a subprocess that mostly keeps one core busy)."""
    quick = quick_run[0] / "demo-v1-quick"
    runs = {  # name: (arguments, check)
        "both folders": (("--data", quick, "--steps", 4, "--batch-size", 4, "--verify-batches", 2, "--no-progress"),
                         True),
        "train folder": (("--data", quick / "train", "--steps", 2, "--batch-size", 4, "--verify-batches", 1,
                          "--no-progress"), True),
        "one file": (("--data", quick / "train" / "shard-00000.arrow", "--steps", 2), False),
    }
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        yield {name: pool.submit(run_demo, *args, check=check) for name, (args, check) in runs.items()}


def test_demo_quick_trains_resumes_and_evaluates(quick_run):
    cache, proc = quick_run
    out = proc.stdout
    # made the dataset in the cache folder, split into train and eval shard folders
    assert (cache / "demo-v1-quick" / "train" / "dataset.json").is_file()
    assert (cache / "demo-v1-quick" / "eval" / "dataset.json").is_file()
    assert "120 train + 40 eval clips" in out
    # training progress with loss and throughput
    steps = re.findall(r"step +(\d+)/60 +loss ([\d.]+) .* (\d+) samples/s", out)
    assert steps and int(steps[-1][0]) == 60
    assert float(steps[-1][1]) < float(steps[0][1])  # the loss went down
    # checkpoint half way, fresh loader, bit-identical batches
    assert "checkpoint at step 30" in out
    assert "resume: 3 batches identical" in out
    # evaluation: every eval clip exactly once, accuracy far above chance (10 %)
    match = re.search(r"accuracy: ([\d.]+)% \((\d+)/(\d+) eval clips", out)
    assert match, out
    assert int(match.group(3)) == 40
    assert float(match.group(1)) >= 50.0
    # the first command a newcomer runs uses the current API: no deprecation warnings
    assert "FutureWarning" not in proc.stderr, proc.stderr


@pytest.mark.slow  # 28 s; test_demo_quick_trains_resumes_and_evaluates covers the demo by default
def test_demo_reuses_a_complete_dataset_and_trains_on_user_data(quick_run, on_quick_data):
    cache, _ = quick_run
    # --data with train/ and eval/ sub-folders (the cache's layout), a few steps
    proc = on_quick_data["both folders"].result()
    assert "demo-v1-quick/train and" in proc.stdout
    assert "resume: 2 batches identical" in proc.stdout
    assert re.search(r"accuracy: [\d.]+% \(\d+/40 eval clips", proc.stdout)
    assert synthetic.is_complete(cache / "demo-v1-quick" / "train")


def test_demo_holds_out_shard_files_and_rejects_a_single_file(on_quick_data):
    proc = on_quick_data["train folder"].result()  # --data train/
    assert "3 shard files for training, the last 1 held out for eval" in proc.stdout
    assert "resume: 1 batches identical" in proc.stdout

    proc = on_quick_data["one file"].result()  # --data train/shard-00000.arrow
    assert proc.returncode == 1
    assert "nothing to hold out for evaluation" in proc.stderr


# -- the synthetic dataset --------------------------------------------------------------------------


def _rows(folder: Path) -> list[dict]:
    rows = []
    for shard in sorted(folder.glob("shard-*.arrow")):
        with pa.memory_map(str(shard)) as source:
            rows.extend(pa.ipc.open_file(source).read_all().to_pylist())
    return rows


def test_synthetic_dataset_is_deterministic_and_varied(tmp_path):
    a = synthetic.make_classification_dataset(tmp_path / "a", 4, seed=3, num_shards=3, workers=1)
    b = synthetic.make_classification_dataset(tmp_path / "b", 4, seed=3, num_shards=3, workers=3)
    shards = sorted(p.name for p in a.glob("shard-*.arrow"))
    assert shards == ["shard-00000.arrow", "shard-00001.arrow", "shard-00002.arrow"]
    for name in shards:  # the bytes depend on the seed only, not on the threads
        assert (a / name).read_bytes() == (b / name).read_bytes()

    rows = _rows(a)
    assert len(rows) == 4 * len(synthetic.CLASS_NAMES) >= 8 * 4
    assert sorted(r["label"] for r in rows) == sorted(list(range(len(synthetic.CLASS_NAMES))) * 4)
    assert [r["label"] for r in rows] != sorted(r["label"] for r in rows)  # classes mixed across shards
    ds = ShardDataset(a)
    assert ds.label_names == list(synthetic.CLASS_NAMES)
    for row in rows:
        info = sf.info(io.BytesIO(row["audio"]))
        assert info.samplerate == row["sample_rate"] in synthetic.DEFAULT_SAMPLE_RATES
        assert info.channels == row["channels"]
        assert info.frames / info.samplerate == pytest.approx(row["duration"])
        assert 1.0 <= row["duration"] <= 8.0
        assert row["path"].startswith(synthetic.CLASS_NAMES[row["label"]] + "/")
        assert row["path"].endswith((".wav", ".flac")) and info.format == ("WAV" if row["path"].endswith(".wav")
                                                                            else "FLAC")
    assert {r["path"].rsplit(".", 1)[1] for r in rows} == {"wav", "flac"}
    assert len({r["sample_rate"] for r in rows}) >= 4
    durations = [r["duration"] for r in rows]
    assert min(durations) < 2.0 and max(durations) > 5.0

    other = synthetic.make_classification_dataset(tmp_path / "c", 4, seed=3, num_shards=3, first_clip=100)
    assert {r["audio"] for r in _rows(other)}.isdisjoint({r["audio"] for r in rows})


def test_synthetic_manifest_marks_complete_datasets(tmp_path):
    folder = synthetic.make_classification_dataset(tmp_path / "d", 2, seed=0, num_shards=2, num_classes=3,
                                                   max_seconds=2.0)
    assert synthetic.is_complete(folder, clips_per_class=2, seed=0, num_classes=3)
    assert not synthetic.is_complete(folder, clips_per_class=3)
    assert synthetic.read_description(folder)["rows"] == 6
    with pytest.raises(ValueError, match="already holds a dataset"):
        synthetic.make_classification_dataset(folder, 2, seed=0)
    shard = folder / "shard-00001.arrow"
    shard.write_bytes(shard.read_bytes()[:-10])  # a truncated shard is not complete
    assert not synthetic.is_complete(folder)
    synthetic.make_classification_dataset(folder, 2, seed=0, num_shards=2, num_classes=3, max_seconds=2.0,
                                          overwrite=True)
    assert synthetic.is_complete(folder, clips_per_class=2)
    synthetic.remove_dataset(folder)
    assert not folder.exists()


@pytest.mark.parametrize("kwargs, name", [({"clips_per_class": 0}, "clips_per_class"),
                                          ({"num_classes": 11}, "num_classes"),
                                          ({"sample_rates": (8000,)}, "sample_rates"),
                                          ({"codecs": ("mp3",)}, "codecs"),
                                          ({"min_seconds": 3.0, "max_seconds": 2.0}, "min_seconds")])
def test_synthetic_rejects_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        synthetic.make_classification_dataset(tmp_path, **{"clips_per_class": 1, **kwargs})
