"""`audioloader doctor`: the rate model, the report's arithmetic, and the command on real shards."""

from __future__ import annotations

import json

import pytest

from audioloader.tools import cli, doctor


def test_predicted_rate_is_the_lowest_of_the_three_bounds():
    # 10 ms a sample in a worker, 0.1 ms in the consumer: 2 workers on 8 cores are bound by the workers ...
    assert doctor.predicted_rate(2, 8, 10.0, 0.1) == pytest.approx(200.0)
    # ... 8 workers on 2 cores by the cores, which the consumer's share takes from too ...
    assert doctor.predicted_rate(8, 2, 10.0, 0.1) == pytest.approx(2 / 0.0101)
    # ... and 100 workers on 100 cores by the consumer's one thread.
    assert doctor.predicted_rate(100, 100, 10.0, 1.0) == pytest.approx(1000.0)


def _measured(remote=False, mel=3.0):
    return {"cpu_ms": 4.0, "stage_ms": {"read": 0.1, "decode": 0.9, "resample": 0.0, "augment": 0.0, "mel": mel},
            "features_stage": "mel", "remote": remote, "requests_per_sample": 0.25,
            "dataset_bytes": 8_000_000_000, "dataset_rows": 100_000}


def test_diagnose_cores_for_a_target_and_for_a_training_step():
    workers = {"num_workers": 2, "worker_cpu_ms": 5.0, "main_cpu_ms": 0.1, "samples_per_s": 300.0,
               "samples": 64, "cores_obtained": 1.6}
    report = doctor.diagnose(_measured(), workers, cores=2, num_workers=2, batch_size=64, target=2000, step_ms=None,
                             world_size=1, prefix_limit=5500)
    assert report["samples_per_s_per_core"] == pytest.approx(200.0)
    assert report["cores_needed"] == pytest.approx(2000 * 5.1 / 1e3)
    assert report["workers_needed"] == 10
    assert report["worker_overhead"] == pytest.approx(5.0 / 4.0)
    assert report["consumer_keeps_up"]
    # A 32 ms step at batch 64 is 2000 samples/s: the same answer.
    by_step = doctor.diagnose(_measured(), workers, cores=2, num_workers=2, batch_size=64, target=None, step_ms=32,
                              world_size=1, prefix_limit=5500)
    assert by_step["target_samples_per_s"] == pytest.approx(2000)
    assert by_step["cores_needed"] == pytest.approx(report["cores_needed"])


def test_diagnose_gpu_features_pay_by_their_share():
    heavy = doctor.diagnose(_measured(mel=3.0), None, cores=4, num_workers=4, batch_size=64, target=None,
                            step_ms=None, world_size=1, prefix_limit=5500)
    assert heavy["features_share"] == pytest.approx(0.75)
    assert heavy["gpu_features_pay"] and heavy["gpu_features_speedup"] == pytest.approx(4.0)
    light = doctor.diagnose(_measured(mel=0.4), None, cores=4, num_workers=4, batch_size=64, target=None,
                            step_ms=None, world_size=1, prefix_limit=5500)
    assert not light["gpu_features_pay"]


def test_diagnose_remote_requests_against_the_prefix_limit_and_the_cache_a_pass_needs():
    report = doctor.diagnose(_measured(remote=True), None, cores=4, num_workers=4, batch_size=64, target=2000,
                             step_ms=None, world_size=16, prefix_limit=5500)
    remote = report["remote"]
    assert remote["requests_per_s_per_machine"] == pytest.approx(500.0)  # 2000 samples/s x 0.25 requests
    assert remote["requests_per_s_all_machines"] == pytest.approx(8000.0)
    assert remote["over_prefix_limit"]
    assert remote["cache_bytes_per_pass_per_machine"] == 500_000_000
    assert "over it" in doctor.format_report(report)


def test_doctor_command_measures_real_shards_in_process_and_in_workers(shard_folder, capsys):
    """Also where the workers are a fork server's children (a process with other threads running)."""
    import threading

    folder = shard_folder([24, 24], seconds=1.0)
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)  # a second Python thread: the fork server starts workers
    other.start()
    status = cli.main(["doctor", str(folder), "--num-workers", "1", "--rows", "12", "--batches", "3",
                       "--batch-size", "4", "--sample-rate", "16000", "--clip-seconds", "0.5", "--n-mels", "40",
                       "--n-fft", "400", "--hop-length", "160", "--step-ms", "10", "--json"])
    idle.set()
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    stage = report["in_process"]["stage_ms"]
    assert stage["decode"] > 0 and stage["mel"] > 0
    workers = report["in_workers"]
    assert workers["num_workers"] == 1 and workers["samples"] >= 12
    # The same per-sample work measured two ways (CPU of this process, CPU of the worker from /proc) agrees
    # within the ticks of /proc (10 ms) and the worker's own costs (receiving rows, writing results).
    assert 0.25 < workers["worker_cpu_ms"] / report["in_process"]["cpu_ms_per_sample"] < 4
    assert report["predicted_samples_per_s"] == pytest.approx(doctor.predicted_rate(
        1, report["cores"], workers["worker_cpu_ms"], workers["main_cpu_ms"]))
    assert report["target_samples_per_s"] == pytest.approx(400.0)  # 4 samples every 10 ms
    assert "remote" not in report


def test_doctor_command_rejects_bad_arguments(shard_folder, capsys):
    assert cli.main(["doctor", str(shard_folder([4])), "--rows", "0", "--no-workers"]) == 1
    assert "--rows 0: must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["doctor", str(shard_folder([4])), "--target", "-5/s"])


def test_doctor_on_a_remote_source_counts_requests_and_the_cache_a_pass_needs(s3, tmp_path, capsys):
    from tests.helpers import upload_shards

    folder, prefix = upload_shards(s3, tmp_path / "shards", "bench/doctor", [12, 12])
    status = cli.main(["doctor", s3.url(prefix), "--no-workers", "--rows", "8", "--sample-rate", "16000",
                       "--clip-seconds", "0.3", "--n-mels", "40", "--n-fft", "400", "--hop-length", "160",
                       "--target", "100/s", "--world-size", "4", "--prefix-limit", "10", "--json"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    remote = report["remote"]
    assert remote["requests_per_sample"] > 0  # the rows came over the wire
    assert remote["requests_per_s_all_machines"] == pytest.approx(4 * 100 * remote["requests_per_sample"])
    assert remote["over_prefix_limit"] == (remote["requests_per_s_all_machines"] > 10)
    size = sum(p.stat().st_size for p in folder.glob("*.arrow"))
    assert remote["cache_bytes_per_pass_per_machine"] == -(-size // 4)
