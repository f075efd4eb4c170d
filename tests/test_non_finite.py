"""Non-finite audio (NaN / inf samples in a float WAV) is a bad row: skipped, counted, reported, or raised."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

import audioloader as al
from tests.helpers import encode, tone, write_ipc_file

SMALL = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)


def float_wav(signal: np.ndarray) -> bytes:
    return encode(signal.astype(np.float32), 8000, "WAV", "FLOAT")


def poisoned_rows() -> tuple[list[bytes], dict[int, str]]:
    """12 rows of 1 s float WAVs; rows 3, 5 and 8 are poisoned in the (centre) crop, row 10 outside it."""
    rows = [float_wav(tone(1.0, 8000, freq=200.0 + 30 * i, seed=i)) for i in range(12)]
    nan = tone(1.0, 8000, seed=3)
    nan[:] = np.nan
    inf = tone(1.0, 8000, seed=5)
    inf[:] = np.inf
    ten_nan = tone(1.0, 8000, seed=8)
    ten_nan[3990:4000] = np.nan  # inside the centre crop [3000, 5000)
    outside = tone(1.0, 8000, seed=10)
    outside[:100] = np.nan  # never part of the centre crop
    rows[3], rows[5], rows[8], rows[10] = float_wav(nan), float_wav(inf), float_wav(ten_nan), float_wav(outside)
    return rows, {3: "2000 non-finite", 5: "2000 non-finite", 8: "10 non-finite"}


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nonfinite")
    rows, _ = poisoned_rows()
    table = pa.table({"audio": pa.array(rows, pa.binary()), "label": pa.array(range(12), pa.int64())})
    write_ipc_file(folder / "part-0.arrow", table, batch_rows=4)
    return folder


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_non_finite_rows_are_skipped_counted_and_reported(poisoned, worker_type):
    _, expected = poisoned_rows()
    with al.AudioLoader(poisoned, batch_size=4, train=False, features=SMALL,
                        workers=al.Workers(num_workers=2, kind=worker_type)) as loader:
        batches = list(loader)
        stats = loader.stats()
    valid = torch.cat([b["index"][b["valid"]] for b in batches])
    assert sorted(valid.tolist()) == [i for i in range(12) if i not in expected]
    assert all(torch.isfinite(b["spectrogram"]).all() for b in batches)
    assert stats["counters"]["bad_rows"] == 3
    reports = {r["index"]: r for r in stats["bad_rows"]}
    assert sorted(reports) == sorted(expected)
    for index, words in expected.items():
        report = reports[index]
        assert report["file"].endswith("part-0.arrow") and report["row"] == index and report["pass"] == 0
        assert words in report["reason"] and "NaN or inf" in report["reason"]


def test_non_finite_in_the_random_crop_of_training(poisoned):
    # Whole-NaN and whole-inf rows are bad whatever the crop; they never reach a batch in training either.
    with al.AudioLoader(poisoned, batch_size=4, features=SMALL, workers=al.Workers(num_workers=1),
                        shuffle=al.Shuffle(buffer_size=4, min_size=0), on_error=al.OnError(max_fraction=1.0)) as loader:
        it = iter(loader)
        seen = torch.cat([next(it)["index"] for _ in range(6)])  # two passes' worth
        assert not {3, 5} & set(seen.tolist())
        assert loader.stats()["counters"]["bad_rows"] >= 4


def test_on_error_raise_names_the_file_and_row(poisoned):
    with al.AudioLoader(poisoned, batch_size=4, train=False, features=SMALL, workers=al.Workers(num_workers=1),
                        on_error="raise") as loader, pytest.raises(al.DecodeError) as info:
        list(loader)
    assert info.value.row == 3 and info.value.file.endswith("part-0.arrow")
    assert "non-finite" in str(info.value) and "row 3" in str(info.value)


def test_error_budget_counts_non_finite_rows(poisoned):
    with al.AudioLoader(poisoned, batch_size=4, train=False, features=SMALL, workers=al.Workers(num_workers=1),
                        on_error=al.OnError(max_fraction=0.1)) as loader:
        loader.decoder.error_budget_min_rows = 5
        with pytest.raises(al.ErrorBudgetExceeded, match="non-finite"):
            list(loader)
