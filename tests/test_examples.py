"""Smoke tests: every example in examples/ runs as a script at a tiny size and says what it should.

The scripts run in the background from the module's start, as many at once as there are cores (each is a
subprocess that mostly keeps one core busy), so the module takes about half the time of one run after another on a
2-core machine; each test checks its own script's output."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

#: Each test's run: the script and its arguments.
RUNS = {
    "test_train_classifier": ("train_classifier.py", "--steps", 6, "--batch-size", 8, "--clips-per-class", 3,
                              "--workers", 1),
    "test_resume_in_a_new_process_is_bit_identical": ("resume.py", "--clips-per-class", 2, "--stop", 2, "--batches",
                                                      2, "--batch-size", 4),
    "test_mix_and_augment_trains_and_resumes_bit_exactly": ("mix_and_augment.py", "--steps", 12, "--batch-size", 8),
    "test_compose_nodes_both_orders_and_resume": ("compose_nodes.py", "--clips-per-class", 2, "--batches", 4,
                                                  "--batch-size", 4),
    "test_hf_dataset_save_to_disk_and_parquet": ("hf_dataset.py", "--clips-per-class", 2, "--batch-size", 4),
    "test_hf_dataset_without_labels": ("hf_dataset.py", "--clips-per-class", 2, "--batch-size", 4, "--label-column",
                                       "none"),
    "test_speech_batches_resume_mid_pass_and_evaluate_each_utterance_once": ("speech_batches.py", "--utterances", 24,
                                                                             "--max-duration", 20, "--batches", 3),
    "test_pack_speech_reads_every_input_kind_and_trains": ("pack_speech.py", "--batches", 3),
    "test_hf_trainer_whisper_resumes_exactly": ("hf_trainer_whisper.py", "--quick"),
}
#: The scripts that need Hugging Face ``datasets`` (their tests are skipped without it).
NEEDS_DATASETS = {"hf_dataset.py", "speech_batches.py"}
#: The scripts that need Hugging Face ``transformers`` (their tests are skipped without it).
NEEDS_TRANSFORMERS = {"hf_trainer_whisper.py"}


def run_example(name: str, *args) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="module")
def outputs(request):
    """``{test name: future of its run's stdout}`` (`RUNS`), for this module's tests that were selected, all started
    at once and run as many at a time as there are cores (at most 4)."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    missing = (set() if importlib.util.find_spec("datasets") else NEEDS_DATASETS) | (
        set() if importlib.util.find_spec("transformers") else NEEDS_TRANSFORMERS)
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        yield {test: pool.submit(run_example, *run) for test, run in RUNS.items()
               if test in selected and run[0] not in missing}


@pytest.fixture
def example(outputs, request):
    """``example()``: the stdout of this test's run (`RUNS`), once it has finished; its AssertionError if it failed."""
    return lambda: outputs[request.node.originalname].result()


def test_train_classifier(example):
    out = example()
    assert re.search(r"step +6 +loss [\d.]+ +\d+ samples/s", out), out
    assert re.search(r"eval accuracy: [\d.]+%", out), out


def test_resume_in_a_new_process_is_bit_identical(example):
    out = example()
    for mode in ("train", "eval"):
        assert f"{mode}: resumed in a new process; 2 batches identical" in out, out
        assert f"{mode}: loading into a loader with another batch size raises CheckpointMismatchError" in out
    assert "resume: all batches identical" in out


def test_mix_and_augment_trains_and_resumes_bit_exactly(example):
    out = example()
    assert re.search(r"checkpoint after step \d+", out), out
    assert re.search(r"resumed batches identical to the uninterrupted run: True \(\d+ batches\)", out), out
    assert "resumed model ends with the same weights: True" in out, out
    for name in ("studio", "field", "rare"):
        assert re.search(rf"{name} +0\.\d\d +0\.\d\d +\d+", out), out
    assert re.search(r"shuffle: [\d.]+ splits per batch \(full shuffle [\d.]+\)", out), out


def test_compose_nodes_both_orders_and_resume(example):
    out = example()
    assert "decode then shuffle: 4 batches" in out and "shuffle then decode: 4 batches" in out
    assert "spectrogram (4, 64, 126) torch.float32" in out
    assert "both orders yield identical batches: True" in out
    assert "resumed hand-built chain matches the uninterrupted one: True" in out


def test_hf_dataset_save_to_disk_and_parquet(example):
    pytest.importorskip("datasets")
    out = example()
    assert re.search(r"save_to_disk: .*ipc_stream, 10 rows, audio column type struct<bytes: binary", out), out
    assert re.search(r"to_parquet: .*parquet, 10 rows", out), out
    assert "classes ['tone', 'chirp', 'band_noise', 'click_train', 'am_tone']" in out
    assert "save_to_disk and to_parquet give identical eval batches: True" in out


def test_hf_dataset_without_labels(example):
    """``--label-column none`` reads the same dataset as unlabeled audio: batches without a label."""
    pytest.importorskip("datasets")
    out = example()
    assert re.search(r"save_to_disk: .*10 rows, .*unlabeled", out), out
    assert "labels" not in out and "'label'" not in out, out
    assert re.search(r"eval: 3 batches, spectrogram \(4, 64, 126\), keys \['index', 'spectrogram', 'valid'\]", out), out
    assert "save_to_disk and to_parquet give identical eval batches: True" in out


def test_speech_batches_resume_mid_pass_and_evaluate_each_utterance_once(example):
    pytest.importorskip("datasets")
    out = example()
    steps = re.findall(r"train step \d+: fbank \((\d+), (\d+), 80\), ([\d.]+) s of speech, padding efficiency "
                       r"([\d.]+), first text '[a-z ]+'", out)
    assert len(steps) == 3, out
    assert all(float(seconds) <= 20.0 for _, _, seconds, _ in steps), out  # max_duration holds
    assert "resumed mid-pass: next 3 batches identical: True" in out, out
    assert "eval: 24 utterances in" in out and "each exactly once: True" in out, out


def test_pack_speech_reads_every_input_kind_and_trains(example):
    out = example()
    for kind, rows in (("librispeech", 6), ("commonvoice", 3), ("csv", 3), ("jsonl", 3), ("audiofolder", 2),
                       ("csv", 12)):
        assert re.search(rf"wrote 1 shard\(s\), {rows} rows, .*\(input: {kind}\)", out), out
    assert "empty transcript: 1 (train.tsv, line 4)" in out, out
    assert "columns: audio, path, duration, start, end, text" in out, out
    assert re.search(r"batch 0: fbank \(\d+, \d+, 80\) \(\d+ utterances", out), out
    # Several utterances a batch: 32 duration buckets over 11 s of audio gave one a batch (issue 29).
    sizes = [int(n) for n in re.findall(r"^batch \d+: fbank .*\((\d+) utterances", out, re.MULTILINE)]
    assert len(sizes) == 3 and min(sizes) >= 2, out


def test_hf_trainer_whisper_resumes_exactly(example):
    pytest.importorskip("transformers")
    out = example()
    assert len(re.findall(r"evaluation losses: \d+\.\d+, \d+\.\d+$", out, re.MULTILINE)) == 2, out
    assert "resumed from checkpoint-2: 8 batches, identical to the uninterrupted run: True" in out, out
    assert "final weights identical: True" in out, out
