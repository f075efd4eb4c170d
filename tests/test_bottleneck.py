"""`stats()["bottleneck"]`: which stage bounds the run, from the counters the loader keeps."""

from __future__ import annotations

import pytest

import audioloader as al
from audioloader.stats import BOTTLENECKS, LoaderStats, bottleneck, bottleneck_line

EMPTY = {"counters": {}, "seconds": {}}


def _after(*, wait: float, busy: float, read: float = 0.0, batches: int = 10, samples: int = 640) -> dict:
    return {"counters": {"batches": batches, "samples": samples},
            "seconds": {"wait": wait, "decode": busy * 0.5, "resample": busy * 0.2, "mel": busy * 0.3,
                        "read": read}}


@pytest.mark.parametrize(("wait", "busy", "read", "stage"), [
    (0.5, 3.0, 0.0, "consumer"),  # the consumer waited 5 % of 10 s: the training step bounds
    (6.0, 17.0, 0.0, "decode_workers"),  # 2 workers busy 85 % of their 20 s
    (6.0, 8.0, 7.0, "storage"),  # workers half idle, the reader busy 70 %
    (6.0, 8.0, 1.0, "main_process"),  # workers half idle, the reader too, and still the consumer waits
])
def test_the_verdict_names_the_stage_that_bounds(wait, busy, read, stage):
    verdict = bottleneck(EMPTY, _after(wait=wait, busy=busy, read=read), 10.0, num_workers=2)
    assert verdict["stage"] == stage
    assert verdict["samples_per_s"] == pytest.approx(64.0)
    assert verdict["consumer_wait"] == pytest.approx(wait / 10)
    assert verdict["workers_busy"] == pytest.approx(busy / 20)
    assert verdict["storage_busy"] == pytest.approx(read / 10)
    assert stage.split("_")[0] in bottleneck_line(verdict)


def test_a_window_without_a_batch_has_no_verdict():
    verdict = bottleneck(EMPTY, _after(wait=5.0, busy=1.0, batches=0, samples=0), 10.0, num_workers=2)
    assert verdict["stage"] is None
    assert "not known yet" in bottleneck_line(verdict)


def test_the_window_is_the_time_since_the_previous_verdict():
    stats = LoaderStats()
    stats.describe_workers({"kind": "process", "num_workers": 2})
    first = stats.bottleneck()
    assert first["stage"] is None  # nothing happened yet
    stats.count("batches")
    stats.count("samples", 64)
    stats.add_seconds("wait", 1e6)  # far more than the window: the consumer waited all of it
    stats.add_seconds("decode", 1e9)
    stats._window = (stats._window[0] - 2.0, stats._window[1])  # the window began 2 s ago
    verdict = stats.bottleneck()
    assert verdict["stage"] == "decode_workers" and verdict["num_workers"] == 2
    assert verdict["window_s"] >= 2.0
    # Asked again at once: the window is too short, the same verdict comes back.
    assert stats.bottleneck() == verdict


def test_a_loader_reports_its_bottleneck_in_stats_and_every_n_batches(ipc_shards):
    features = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=0.3, n_fft=400, hop_length=160, n_mels=40)
    loader = al.AudioLoader(ipc_shards, batch_size=4, train=False, features=features,
                            length=al.LengthPolicy(clip_seconds=0.3), workers=al.Workers(kind="thread", num_workers=1))
    lines: list[str] = []
    loader.report_bottleneck(every=3, to=lines.append)
    batches = sum(1 for _ in loader)
    assert batches == 10
    assert len(lines) == 3 and all(line.startswith("audioloader: ") for line in lines)
    verdict = loader.stats()["bottleneck"]
    assert set(verdict) >= {"stage", "reason", "samples_per_s", "consumer_wait", "workers_busy", "storage_busy"}
    assert verdict["stage"] in (*BOTTLENECKS, None)
    with pytest.raises(ValueError, match="every"):
        loader.report_bottleneck(every=-1)
    loader.shutdown()
