"""Checkpoints of the row-count shuffle buffer (before byte budgets), for tests/test_memory_budget.py.

The fixture ``tests/data/legacy_checkpoints.json.gz`` was made by this script with the
code of ``0ef66f1`` (``main`` before byte budgets), so the test resumes checkpoints
that code really wrote::

    git worktree add /tmp/old 0ef66f1
    PYTHONPATH=/tmp/old python tests/legacy_checkpoints.py tests/data/legacy_checkpoints.json.gz

Each case: a small corpus (WAV only, so its bytes do not depend on an encoder's
version), a loader with the presets of its mode (only the arguments in ``OPTIONS``),
its state after ``CUT`` batches, and the indices of the ``AFTER`` batches that followed.
The fingerprint's file entries (names, sizes, metadata digests) are left out of the
fixture: the test puts in those of the shards it writes, so a newer pyarrow writing
other footer bytes does not fail it.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

import audioloader as al
from tests.helpers import encode, tone, write_ipc_file, write_parquet

RATE = 8000
CUT, AFTER = 3, 4
FEATURES = al.FbankConfig(sample_rate=RATE, num_mel_bins=16)
CASES = {
    # The classification preset (10000 / 8000 rows): the old buffer held 8000 rows (hundreds of passes).
    "classification_ipc": {"format": "ipc", "rows": 40, "options": {"batch_size": 8}},
    # Speech: bucketing over Hugging Face-shaped Parquet (its raw rows were buffered though it reported False).
    "speech_parquet": {"format": "parquet", "rows": 60, "options": {"bucketing": 6.0}},
}
FILE_FIELDS = ("files", "file_identity")


def corpus(folder: Path, case: dict) -> Path:
    """The case's shards: WAV utterances of 0.3-1.5 s with a text and a duration column."""
    n = case["rows"]
    seconds = [round(float(s), 3) for s in np.random.default_rng(n).uniform(0.3, 1.5, n)]
    audio = [{"bytes": encode(tone(s, RATE, freq=150.0 + 11 * i, seed=i), RATE, "WAV"), "path": f"u{i}.wav"}
             for i, s in enumerate(seconds)]
    table = pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "label": pa.array([i % 4 for i in range(n)], pa.int64()),
                      "text": pa.array([f"utterance {i}" for i in range(n)]),
                      "duration": pa.array(seconds, pa.float64())})
    folder.mkdir(parents=True, exist_ok=True)
    if case["format"] == "ipc":
        write_ipc_file(folder / "a.arrow", table.slice(0, n // 2), batch_rows=5)
        write_ipc_file(folder / "b.arrow", table.slice(n // 2), batch_rows=5)
    else:
        write_parquet(folder / "a.parquet", table.slice(0, n // 2), row_group_rows=5)
        write_parquet(folder / "b.parquet", table.slice(n // 2), row_group_rows=5)
    return folder


def loader(folder: Path, case: dict) -> al.AudioLoader:
    options = dict(case["options"])
    kwargs = {"features": FEATURES, "seed": 5, "storage": al.Storage(split_rows=5),
              "workers": al.Workers(num_workers=0)}
    source = al.Source(folder)
    if "bucketing" in options:
        kwargs.update(length=al.LengthPolicy(crop=None), batching=al.Bucketing(max_duration=options.pop("bucketing")),
                      columns=["text"])
        source = al.Source(folder, label_column=None)
    else:
        kwargs.update(length=al.LengthPolicy(clip_seconds=0.25))
    kwargs.update(options)
    return al.AudioLoader(source, **kwargs)


def indices(batch: dict) -> list[int]:
    return batch["index"].tolist()


def make(path: Path) -> None:
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, case in CASES.items():
            folder = corpus(Path(scratch) / name, case)
            with loader(folder, case) as first:
                it = iter(first)
                for _ in range(CUT):
                    next(it)
                state = first.state_dict()
                after = [indices(next(it)) for _ in range(AFTER)]
            state["fingerprint"] = {k: v for k, v in state["fingerprint"].items() if k not in FILE_FIELDS}
            out[name] = {"state": state, "after": after}
    path.write_bytes(gzip.compress(json.dumps(out, sort_keys=True).encode(), mtime=0))


if __name__ == "__main__":
    make(Path(sys.argv[1]))
