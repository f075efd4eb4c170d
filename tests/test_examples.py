"""Smoke tests: every example in examples/ runs as a script at a tiny size and says what it should."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout


def test_train_classifier():
    out = run_example("train_classifier.py", "--steps", 6, "--batch-size", 8, "--clips-per-class", 3,
                      "--workers", 1)
    assert re.search(r"step +6 +loss [\d.]+ +\d+ samples/s", out), out
    assert re.search(r"eval accuracy: [\d.]+%", out), out


def test_resume_in_a_new_process_is_bit_identical():
    out = run_example("resume.py", "--clips-per-class", 2, "--stop", 2, "--batches", 2, "--batch-size", 4)
    for mode in ("train", "eval"):
        assert f"{mode}: resumed in a new process; 2 batches identical" in out, out
        assert f"{mode}: loading into a loader with another batch size raises CheckpointMismatchError" in out
    assert "resume: all batches identical" in out


def test_mix_and_augment_trains_and_resumes_bit_exactly():
    out = run_example("mix_and_augment.py", "--steps", 12, "--batch-size", 8)
    assert re.search(r"checkpoint after step \d+", out), out
    assert re.search(r"resumed batches identical to the uninterrupted run: True \(\d+ batches\)", out), out
    assert "resumed model ends with the same weights: True" in out, out
    for name in ("studio", "field", "rare"):
        assert re.search(rf"{name} +0\.\d\d +0\.\d\d +\d+", out), out
    assert re.search(r"shuffle: [\d.]+ splits per batch \(full shuffle [\d.]+\)", out), out


def test_compose_nodes_both_orders_and_resume():
    out = run_example("compose_nodes.py", "--clips-per-class", 2, "--batches", 4, "--batch-size", 4)
    assert "decode then shuffle: 4 batches" in out and "shuffle then decode: 4 batches" in out
    assert "spectrogram (4, 64, 126) torch.float32" in out
    assert "both orders yield identical batches: True" in out
    assert "resumed hand-built chain matches the uninterrupted one: True" in out


def test_hf_dataset_save_to_disk_and_parquet():
    pytest.importorskip("datasets")
    out = run_example("hf_dataset.py", "--clips-per-class", 2, "--batch-size", 4)
    assert re.search(r"save_to_disk: .*ipc_stream, 10 rows, audio column type struct<bytes: binary", out), out
    assert re.search(r"to_parquet: .*parquet, 10 rows", out), out
    assert "classes ['tone', 'chirp', 'band_noise', 'click_train', 'am_tone']" in out
    assert "save_to_disk and to_parquet give identical eval batches: True" in out



def test_speech_batches_resume_mid_pass_and_evaluate_each_utterance_once():
    pytest.importorskip("datasets")
    out = run_example("speech_batches.py", "--utterances", 24, "--max-duration", 20, "--batches", 3)
    steps = re.findall(r"train step \d+: fbank \((\d+), (\d+), 80\), ([\d.]+) s of speech, padding efficiency "
                       r"([\d.]+), first text '[a-z ]+'", out)
    assert len(steps) == 3, out
    assert all(float(seconds) <= 20.0 for _, _, seconds, _ in steps), out  # max_duration holds
    assert "resumed mid-pass: next 3 batches identical: True" in out, out
    assert "eval: 24 utterances in" in out and "each exactly once: True" in out, out

# -- the code in the documentation ------------------------------------------------------------------

DOCS = ROOT / "docs"

#: Per page: text replacements that shrink a snippet to a smoke-test size without changing what it shows.
SHRINK = {
    "getting_started.md": [("step == 100_000", "step == 3"), ("step % 1000 == 0", "step % 2 == 0"),
                           ("shuffle_buffer_size=2000, shuffle_min_size=1000",
                            "shuffle_buffer_size=40, shuffle_min_size=20"),
                           ("    ...  # the training step", "    break  # the training step")],
}


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("page", ["getting_started.md", "api.md", "faq.md", "mixing.md", "lakehouse.md"])
def test_documentation_snippets_run(page, tmp_path, monkeypatch):
    """Every ```python block of a page runs, in order, in one namespace, on small synthetic shards.

    Signatures that are not meant to run are in ```py blocks.
    """
    from audioloader.tools.synthetic import make_classification_dataset

    make_classification_dataset(tmp_path / "shards", 3, num_classes=2, num_shards=2, max_seconds=6.0)
    make_classification_dataset(tmp_path / "eval_shards", 2, num_classes=2, num_shards=1, first_clip=50)
    if page in ("getting_started.md", "api.md"):  # speech: a packed LibriSpeech tree, rows holding windows
        from audioloader.tools.pack import pack
        from tests.test_ingest import make_librispeech
        from tests.test_segments import segment_rows, write_segments

        pack(make_librispeech(tmp_path / "LibriSpeech") / "train-clean-100", tmp_path / "speech_shards" / "librispeech",
             progress=False)
        write_segments(tmp_path / "recordings", segment_rows()[:6])
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOCS / page)
    assert blocks
    namespace: dict = {"__name__": "__docs__"}
    if page == "faq.md":  # its snippets continue a training loop: give them a loader
        import audioloader as al

        namespace["loader"] = al.AudioLoader("shards/", batch_size=4, train=False)
        next(iter(namespace["loader"]))
    for i, code in enumerate(blocks):
        for old, new in SHRINK.get(page, []):
            code = code.replace(old, new)
        try:
            exec(compile(code, f"{page} python block {i + 1}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{page}, python block {i + 1} failed:\n{code}") from error
    for value in namespace.values():
        if hasattr(value, "shutdown") and callable(value.shutdown) and not isinstance(value, type):
            value.shutdown()


def test_pack_speech_reads_every_input_kind_and_trains():
    out = run_example("pack_speech.py", "--batches", 1)
    for kind, rows in (("librispeech", 6), ("commonvoice", 3), ("csv", 3), ("jsonl", 3), ("audiofolder", 2),
                       ("csv", 12)):
        assert re.search(rf"wrote 1 shard\(s\), {rows} rows, .*\(input: {kind}\)", out), out
    assert "empty transcript: 1 (train.tsv, line 4)" in out, out
    assert "columns: audio, path, duration, start, end, text" in out, out
    assert re.search(r"batch 0: fbank \(\d+, \d+, 80\) \(\d+ utterances", out), out
