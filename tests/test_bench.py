"""Smoke tests of ``audioloader bench`` and the benchmark dataset: structure only, never speed."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from audioloader.tools import bench, cli
from audioloader.tools.bench import dataset

# A few 6 s clips (longer than the 5 s crop), batches of 2, no measurement window:
# every contender yields one or two batches and exits.
TINY = ["--clips", "4", "--seconds", "6", "--batch-size", "2", "--workers", "2", "--train-buffer", "4",
        "--train-min", "2", "--measure-seconds", "0", "--warmup-batches", "1", "--resume-buffers", "4"]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_bench(tmp_path: Path, capsys, *extra: str) -> tuple[int, dict, str]:
    out_file = tmp_path / "bench.json"
    status = cli.main(["bench", *TINY, "--cache-dir", str(tmp_path / "cache"), "--output", str(out_file), *extra])
    text = capsys.readouterr().out
    return status, json.loads(out_file.read_text()), text


def check_structure(out: dict, text: str, expect: set[str]) -> None:
    assert out["version"] == bench.RESULT_VERSION
    assert isinstance(out["machine"]["cores"], int) and out["machine"]["cores"] >= 1
    assert out["settings"]["clips"] == 4 and out["settings"]["batch_size"] == 2
    assert out["datasets"]["standard"]["bytes"] > 0
    assert set(out["contenders"]) == expect
    for name, r in out["contenders"].items():
        assert r["ok"], (name, r.get("error"), r.get("stderr"))
        assert _number(r["samples_per_s"]) and r["samples_per_s"] > 0, name
        assert isinstance(r["peak_rss_bytes"], int) and r["peak_rss_bytes"] > 0, name
        assert isinstance(r["peak_rss_anon_bytes"], int), name
        assert _number(r["wall_s"]) and r["exit_hang"] is False, name
        if not name.startswith("ceiling"):
            assert _number(r["first_batch_s"]) and r["first_batch_s"] > 0, name
            assert r["measured_batches"] >= 1, name
    # Ratios to the baseline and the ceiling are all there, as numbers.
    assert "audioloader-train-w2 / baseline-torchaudio" in out["ratios"]
    assert "audioloader-train-w2 / ceiling" in out["ratios"]
    assert "audioloader-eval-w2 first batch / baseline's" in out["ratios"]
    for key, value in out["ratios"].items():
        assert value is None or _number(value), key
    assert _number(out["ratios"]["audioloader-train-w2 / baseline-torchaudio"])
    assert _number(out["ratios"]["audioloader-train-w2 / ceiling"])
    # Every target is reported with its verdict.
    assert [t["name"] for t in out["targets"]] == list(bench.TARGETS)
    for t in out["targets"]:
        assert t["met"] in (True, False, None)
        assert t["value"] is None or _number(t["value"])
        assert t["op"] in ("<=", ">=") and _number(t["threshold"])
        assert t["name"] in text
    assert "targets:" in text and "samples/s" in text


@pytest.mark.slow  # 40 s; test_bench_json_flag_prints_json runs bench end to end by default
def test_bench_tiny(tmp_path, capsys):
    status, out, text = run_bench(tmp_path, capsys, "--skip", "soxr,packed")
    assert status == 0
    check_structure(out, text, {"audioloader-train-w2", "audioloader-eval-w2", "baseline-torchaudio", "ceiling"})
    verdicts = {t["name"]: t for t in out["targets"]}
    assert verdicts["throughput_vs_baseline"]["met"] in (True, False)  # measured, whatever the speed
    assert verdicts["packed_flac_vs_baseline"]["met"] is None  # skipped group: not measured, not "missed"
    # Checkpoint/resume at one buffer size, both compositions.
    assert set(out["resume"]) == {"decode-shuffle-b4", "shuffle-decode-b4"}
    for name, r in out["resume"].items():
        assert r["ok"], (name, r.get("error"))
        assert isinstance(r["checkpoint_bytes"], int) and r["checkpoint_bytes"] > 0
        assert _number(r["restore_first_batch_s"]) and _number(r["fresh_first_batch_s"])
        assert r["exact"] is True  # the resumed batch is the one the uninterrupted run yielded
    assert verdicts["checkpoint_bytes_10000"]["met"] is None  # buffer 10000 was not run
    # The peak PSS of the process tree, per process (too short a run here to catch the workers at the peak).
    train = out["contenders"]["audioloader-train-w2"]
    each = train["peak_pss_by_process_bytes"]
    assert len(each["main"]) == 1 and sum(each["main"]) + sum(each["children"]) == train["peak_pss_bytes"]
    assert "peak PSS by process" in text and "audioloader-train-w2: " in text


@pytest.mark.slow
def test_bench_tiny_everything(tmp_path, capsys):
    status, out, text = run_bench(tmp_path, capsys, "--experiments")
    assert status == 0
    variants = {"audioloader-train-w2+trim_every=0", "audioloader-train-w2+trim_every=64",
                "audioloader-train-w2+shuffle_before_decode=False",
                "audioloader-train-w2+shuffle_before_decode=True", "audioloader-eval-w2+buffer=1000"}
    check_structure(out, text, {
        "audioloader-train-w2", "audioloader-eval-w2", "baseline-torchaudio", "baseline-soxr", "ceiling",
        "audioloader-train-packed-flac-w2", "ceiling-packed-flac",
        "audioloader-train-packed-pcm16-w2", "ceiling-packed-pcm16", *variants})
    assert set(out["datasets"]) == {"standard", "packed_flac", "packed_pcm16"}
    for key in ("packed_flac_vs_baseline", "packed_pcm16_vs_baseline"):
        assert next(t for t in out["targets"] if t["name"] == key)["met"] in (True, False)
    for name in variants:  # each variant is compared with its plain self
        assert _number(out["ratios"][f"{name} / {name.split('+')[0]}"]), name
    assert "variants (--experiments)" in text


def test_bench_json_flag_prints_json(tmp_path, capsys):
    status = cli.main(["bench", *TINY, "--cache-dir", str(tmp_path / "cache"), "--json",
                       "--skip", "eval,baseline,soxr,packed,resume"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert set(out["contenders"]) == {"audioloader-train-w2", "ceiling"}
    assert out["ratios"]["audioloader-train-w2 / baseline-torchaudio"] is None  # no baseline: no ratio


@pytest.mark.slow  # 25 s: a wheel built and installed
def test_bench_runs_from_an_installed_package_outside_a_checkout(tmp_path):
    # From another folder the checkout's benchmarks/ is not importable: the command must not need it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "audioloader", "bench", *TINY, "--cache-dir", str(tmp_path / "c"),
                           "--skip", "eval,soxr,packed,resume"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "baseline-torchaudio" in done.stdout and "targets:" in done.stdout
    probe = subprocess.run([sys.executable, "-c", "import benchmarks"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0  # the checkout's benchmarks/ really was out of reach


def test_bench_caches_in_the_user_cache_folder_and_says_how_to_get_torchaudio(tmp_path, capsys, monkeypatch):
    # A user's machine: no AUDIOLOADER_CACHE, an XDG cache folder, a working directory of their own, no torchaudio.
    monkeypatch.delenv("AUDIOLOADER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torchaudio", None)  # makes `import torchaudio` fail
    cache = tmp_path / "xdg" / "audioloader" / "bench"
    status = cli.main(["bench", *TINY, "--skip", "eval,soxr,packed,resume"])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    assert not (tmp_path / ".cache").exists()  # never the working directory
    spec = dataset.DatasetSpec(clips=4, seconds=6.0)
    assert (cache / spec.key / "shards").is_dir()
    # The baseline is not measured, and the report says why and how to get it, in one line.
    hint = 'pip install "audioloader-arrow[bench]"'
    assert [line for line in out.splitlines() if hint in line] == [
        f"  note: {bench.torchaudio_note()}"]
    assert "baseline-torchaudio" not in out.split("targets:")[0]
    # The last line: where the cache is, how big, how to free it.
    folders, size = dataset.cache_usage(cache)
    assert folders == 1 and size > 4 * 6 * 44100  # 24 s of FLAC at least 1 byte per sample, plus shards
    assert out.splitlines()[-1] == (
        f"cache: {cache} holds 1 benchmark dataset(s), {size / 2**20:.0f} MiB, reused by the next run; "
        f"free it with: audioloader bench --clear-cache (or rm -rf {cache})")

    # --clear-cache removes the datasets only, never something else that happens to be in the folder.
    (cache / "notes.txt").write_text("mine")
    assert cli.main(["bench", "--clear-cache"]) == 0
    assert capsys.readouterr().out == f"cache: removed 1 benchmark dataset(s), {size / 2**20:.0f} MiB, from {cache}\n"
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]
    (cache / "notes.txt").unlink()
    assert cli.main(["bench", "--clear-cache"]) == 0  # an empty folder goes too
    assert not cache.exists()
    capsys.readouterr()


def test_torchaudio_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchaudio", None)
    assert bench.torchaudio_note() == ("the user baseline (baseline-torchaudio, baseline-soxr) is not measured: it "
                                       "needs torchaudio, which is not installed; get it with: "
                                       'pip install "audioloader-arrow[bench]"')
    monkeypatch.setitem(sys.modules, "torchaudio", types.ModuleType("torchaudio"))
    assert bench.torchaudio_note() is None


class _BrokenTorchaudio:
    """A finder for a torchaudio that is installed but whose native library does not load with this torch."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchaudio":
            raise OSError("/venv/lib/torchaudio/lib/libtorchaudio.so: undefined symbol: "
                          "torch_exception_get_what_without_backtrace")
        return None


def test_torchaudio_that_does_not_load_is_a_note_not_a_traceback(monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.delitem(sys.modules, "torchaudio", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchaudio(), *sys.meta_path])
    note = bench.torchaudio_note()
    assert "is installed but does not load with torch" in note
    assert "undefined symbol: torch_exception_get_what_without_backtrace" in note
    assert note.endswith(f"pip install --no-deps torchaudio=={torch.__version__.split('+')[0]}")


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    from audioloader.shards.catalog import index
    from audioloader.shards.storage.machine_cache import cache_root

    monkeypatch.setenv("AUDIOLOADER_CACHE", str(tmp_path / "machine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "machine"  # the explicit setting wins
    assert dataset.default_cache_dir() == tmp_path / "machine" / "bench"
    monkeypatch.delenv("AUDIOLOADER_CACHE")
    assert dataset.default_cache_dir() == tmp_path / "xdg" / "audioloader" / "bench"
    assert index.cache_path("s3://b/x").parent == tmp_path / "xdg" / "audioloader" / "index"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for xdg in ("", "relative/cache"):  # unset, or not absolute: the XDG rule says ignore it
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert dataset.default_cache_dir() == tmp_path / "home" / ".cache" / "audioloader" / "bench"
    # The option's default and the help show the same folder.
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would wrap a long path
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.Settings.from_args(parser.parse_args([])).cache_dir == str(dataset.default_cache_dir())
    assert f"default {dataset.default_cache_dir()}:" in parser.format_help()


def test_bench_rejects_bad_options(tmp_path, capsys):
    assert cli.main(["bench", "--skip", "nonsense", "--cache-dir", str(tmp_path)]) == 1
    assert "nonsense" in capsys.readouterr().err
    assert cli.main(["bench", "--workers", "two", "--cache-dir", str(tmp_path)]) == 1
    assert "--workers" in capsys.readouterr().err


# -- the dataset generator ---------------------------------------------------------------------------------


def test_synth_clip_is_deterministic_and_not_silence():
    spec = dataset.DatasetSpec(clips=2, seconds=1.0)
    a, b = dataset.synth_clip(0, spec), dataset.synth_clip(0, spec)
    assert a.dtype == np.float32 and a.shape == (44100,)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, dataset.synth_clip(1, spec))
    assert 0.5 < np.max(np.abs(a)) <= 1.0 and np.std(a) > 0.01
    # FLAC must not compress it to nothing: realistic content costs real decode work.
    flac = dataset.encode_clip(a, 44100, "flac")
    assert len(flac) > 0.3 * 2 * 44100
    stereo = dataset.synth_clip(0, dataset.DatasetSpec(clips=1, seconds=0.5, channels=2))
    assert stereo.shape == (22050, 2)


def test_standard_dataset_is_cached_and_packed(tmp_path):
    spec = dataset.DatasetSpec(clips=5, seconds=0.5, rows_per_shard=2, codec="wav")
    shards = dataset.standard_dataset(spec, tmp_path, log=lambda msg: None)
    files = sorted(shards.glob("shard-*.arrow"))
    assert len(files) == 3  # 2 + 2 + 1 rows
    rows = sum(pa.ipc.open_file(pa.memory_map(str(f))).read_all().num_rows for f in files)
    assert rows == 5
    stamp = [f.stat().st_mtime_ns for f in files]
    again = dataset.standard_dataset(spec, tmp_path, log=lambda msg: pytest.fail(f"regenerated: {msg}"))
    assert again == shards and [f.stat().st_mtime_ns for f in files] == stamp
    packed = dataset.packed_dataset(spec, 16000, "pcm16", tmp_path, log=lambda msg: None)
    table = pa.ipc.open_file(pa.memory_map(str(sorted(packed.glob("shard-*.arrow"))[0]))).read_all()
    info = sf.info(io.BytesIO(table.column("audio")[0].as_py()))
    assert info.samplerate == 16000 and info.channels == 1 and info.subtype == "PCM_16"
    assert shards.parent.name == spec.key and (shards.parent / "spec.json").exists()


def test_dataset_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="codec"):
        dataset.DatasetSpec(codec="aac")
    with pytest.raises(ValueError, match="clips"):
        dataset.DatasetSpec(clips=0)


TREE = """
import os, sys, time
for _ in range(2):
    if os.fork() == 0:
        mine = b"c" * (30 << 20)  # 30 MiB of private pages in each child
        os.write(1, b"CHILD\\n")  # one write: the two children print at once
        time.sleep(60)
        os._exit(0)
big = b"m" * (60 << 20)  # and 60 MiB in the main process
os.write(1, b"MAIN\\n")
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_tree_sampler_gives_each_process_its_share_of_the_peak():
    import signal

    from audioloader.tools.bench.runner import TreeSampler

    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert sorted(proc.stdout.readline().strip() for _ in range(3)) == ["CHILD", "CHILD", "MAIN"]
        sampler = TreeSampler(proc.pid, pss_every=1)
        sampler.sample()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    each = sampler.peak_pss_by_process_kb
    assert each["main"][0] > 60 << 10 and len(each["children"]) == 2 and all(kb > 30 << 10 for kb in each["children"])
    assert each["main"][0] + sum(each["children"]) == sampler.peak_pss_kb
