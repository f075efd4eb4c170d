"""The `audioloader` command line, run as `python -m audioloader` in a subprocess (and in-process for dispatch)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pyarrow as pa
import pytest

from audioloader.tools import cli
from audioloader.tools.pack import pack_dataset
from tests.helpers import encode, tone

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "audioloader", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for i, cls in enumerate(["dog", "cat", "bird"]):
        (root / cls).mkdir(parents=True)
        for j in range(2):
            rate = [16000, 22050, 44100][j + i % 2]
            (root / cls / f"{j}.wav").write_bytes(encode(tone(0.1 * (j + 1), rate, freq=200 + 90 * i), rate))
    return root


def test_help_lists_commands():
    proc = run_cli("--help")
    for command in ("pack", "inspect", "index", "demo", "bench"):
        assert command in proc.stdout
    # pack reads far more than class folders and CSVs now: the one-line help says what.
    assert "class-folder tree or a CSV" not in proc.stdout
    for kind in ("manifests", "audiofolder", "LibriSpeech", "Common Voice"):
        assert kind in " ".join(proc.stdout.split()), proc.stdout
    proc = run_cli("pack", "--help")
    for option in ("--shard-size", "--shard-mb", "--format", "--rows-per-batch", "--sample-rate", "--codec",
                   "--workers", "--quiet"):
        assert option in proc.stdout
    # What pack writes besides the shards, and why a glob must name the shards (issue 29).
    text = " ".join(proc.stdout.split())
    assert "_audioloader_manifest.arrow" in text and "pyarrow.dataset and Spark" in text and "shard-*.arrow" in text


def test_the_index_pack_writes_is_not_read_as_data(tmp_path, src):
    """pyarrow.dataset (as Spark) skips `_`-prefixed files (the index, pack's journal), and the glob docs/cli.md
    shows names only the shards."""
    import glob

    import pyarrow.dataset as ds

    files = sorted(src.rglob("*.wav"))
    (tmp_path / "m.csv").write_text("path\n" + "".join(f"{f}\n" for f in files))  # unlabeled: no labels.json
    summary = pack_dataset(tmp_path / "m.csv", tmp_path / "out", shard_rows=4, progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_audioloader_manifest.arrow", "_audioloader_pack.json", "shard-00000.arrow", "shard-00001.arrow"]
    assert ds.dataset(str(tmp_path / "out"), format="ipc").count_rows() == summary.rows == 6
    shards = sorted(glob.glob(str(tmp_path / "out" / "shard-*.arrow")))
    assert [Path(p) for p in shards] == summary.shards


def test_the_cli_page_documents_every_command_and_the_index_file():
    page = (ROOT / "docs" / "cli.md").read_text()
    table = page[:page.index("## audioloader pack")]
    for command in [*cli.COMMANDS, *cli.LAZY_COMMANDS]:
        assert f"| [`{command}`](#audioloader-{command}) |" in table, command
        assert f"\n## audioloader {command}\n" in page, command
    pack_section = page[page.index("## audioloader pack"):page.index("## audioloader inspect")]
    assert "_audioloader_manifest.arrow" in pack_section and "shard-*.arrow" in pack_section
    assert "pyarrow.dataset" in pack_section and "Spark" in pack_section


# Each --help, run as `python -m audioloader` would run it, in one fresh process: after each, torch must still be
# absent (once imported it would stay, so the first --help that imports it is the one named).
HELP_SCRIPT = """
import contextlib, io, json, runpy, sys

seen = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["audioloader", *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("audioloader", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
    seen.append({"argv": argv, "code": code, "out": out.getvalue(),
                 "torch": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchaudio"))})
print(json.dumps(seen))
"""

HELPS = {("--help",): ("pack", "inspect", "index", "demo", "bench"),
         ("pack", "--help"): ("--shard-size", "--codec"),
         ("inspect", "--help"): ("--json", "--sample"),
         ("index", "--help"): ("--portable",),
         ("demo", "--help"): ("--quick", "--data", "--cache"),
         ("bench", "--help"): ("--full", "--skip", "--cache-dir", "--clear-cache")}


def test_help_answers_without_importing_torch():
    proc = subprocess.run([sys.executable, "-c", HELP_SCRIPT, json.dumps([list(argv) for argv in HELPS])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert [tuple(r["argv"]) for r in seen] == list(HELPS)
    for r in seen:
        assert r["code"] == 0, r
        assert r["torch"] == [], f"audioloader {' '.join(r['argv'])} imported {r['torch'][:3]}"
        for word in HELPS[tuple(r["argv"])]:
            assert word in r["out"], (r["argv"], word)


def test_import_audioloader_does_not_import_torch():
    proc = subprocess.run([sys.executable, "-c", "import audioloader, sys; print('torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout == "False\n", proc.stderr


def test_version_is_the_installed_distributions():
    from importlib.metadata import PackageNotFoundError, version

    try:
        expected = version("audioloader-arrow")
    except PackageNotFoundError:  # a checkout that was never installed
        expected = "0+unknown"
    assert run_cli("--version").stdout == f"audioloader {expected}\n"


def test_demo_names_are_still_importable_from_demo():
    from audioloader.tools import demo, demo_train

    for name in ("DemoPlan", "SmallCNN", "prepare_synthetic_data", "run_demo"):
        assert getattr(demo, name) is getattr(demo_train, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        demo.no_such_name  # noqa: B018


def test_pack_command(tmp_path, src):
    out = tmp_path / "out"
    proc = run_cli("pack", src, out, "--shard-size", "4", "--rows-per-batch", "2", "--sample-rate", "8000",
                   "--codec", "pcm16", "--format", "parquet", "--workers", "3")
    assert "wrote 2 shard(s)" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["_audioloader_manifest.arrow", "_audioloader_pack.json",
                                                     "labels.json", "shard-00000.parquet", "shard-00001.parquet"]
    assert json.loads((out / "labels.json").read_text()) == {"bird": 0, "cat": 1, "dog": 2}
    # Progress goes nowhere when stderr is not a terminal.
    assert proc.stderr == ""


def test_pack_quiet_and_errors(tmp_path, src):
    proc = run_cli("pack", src, tmp_path / "out", "--quiet")
    assert proc.stdout == "" and proc.stderr == ""

    proc = run_cli("pack", tmp_path / "missing", tmp_path / "o2", check=False)
    assert proc.returncode == 1
    assert "audioloader pack: error:" in proc.stderr and "missing" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = run_cli("pack", src, tmp_path / "o3", "--codec", "mp3", check=False)
    assert proc.returncode == 2  # argparse usage error
    assert "invalid choice" in proc.stderr


def test_main_in_process(tmp_path, src, capsys):
    assert cli.main(["pack", str(src), str(tmp_path / "out"), "-q"]) == 0
    assert cli.main(["pack", str(src), str(tmp_path / "out"), "-q"]) == 0  # the same pack: finished, kept
    assert cli.main(["pack", str(src), str(tmp_path / "out"), "-q", "--shard-size", "2"]) == 1  # another pack
    assert "--overwrite" in capsys.readouterr().err
    assert pa.ipc.open_file(str(tmp_path / "out" / "shard-00000.arrow")).read_all().num_rows == 6


def test_pack_errors_name_options_as_the_command_line_spells_them(tmp_path, src, capsys):
    """On the command line a fix says `--overwrite`, `--input-format tsv`, `--shard-size 0`, never the Python
    keyword (`overwrite=True`); from Python the same error says the keyword."""
    assert cli.main(["pack", str(src), str(tmp_path / "out"), "-q"]) == 0
    cases = [(["pack", str(src), str(tmp_path / "out"), "-q", "--shard-size", "2"],
              "made with no --shard-size, this run has --shard-size 2: run again with the same arguments to continue "
              "it, or pass --overwrite to replace them", "overwrite="),
             (["pack", str(src), str(tmp_path / "o2"), "--shard-size", "0"], "--shard-size 0: must be a positive",
              "shard_rows="),
             (["pack", str(src), str(tmp_path / "o3"), "--workers", "0"], "--workers 0: must be a positive",
              "workers="),
             (["pack", str(src), str(tmp_path / "o4"), "--input-format", "csv"], "--input-format csv reads a file",
              "input_format=")]
    for argv, says, python_spelling in cases:
        capsys.readouterr()
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert says in err and python_spelling not in err, err
    with pytest.raises(ValueError, match=r"made with shard_rows=None, this run has shard_rows=2: .*pass "
                                         r"overwrite=True to replace them") as info:
        pack_dataset(src, tmp_path / "out", shard_rows=2, progress=False)
    assert "--overwrite" not in str(info.value)
    shards = str(tmp_path / "out")
    for argv, says, python_spelling in [
            (["inspect", shards, "--audio-column", "nope"], "one of them with --audio-column NAME", "audio_column="),
            (["inspect", shards, "--sample", "-1"], "--sample -1: must be", "sample="),
            (["inspect", shards, "--split-rows", "0"], "--split-rows 0: must be", "split_rows")]:
        capsys.readouterr()
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert says in err and python_spelling not in err, err


def test_a_common_voice_tsv_with_a_misspelt_column_names_it(tmp_path, capsys):
    """Detected as Common Voice by its other columns: the error names the missing `sentence` (and the near miss),
    not "no row left to pack (missing file ...)", and gives the command line's `--input-format tsv`."""
    clips = tmp_path / "cv" / "clips"
    clips.mkdir(parents=True)
    (clips / "a.mp3").write_bytes(encode(tone(0.5, 16000), 16000, "MP3"))
    (tmp_path / "cv" / "train.tsv").write_text("client_id\tpath\tsentense\tup_votes\tdown_votes\tlocale\n"
                                               "c1\ta.mp3\thello\t2\t0\ten\n")
    assert cli.main(["pack", str(tmp_path / "cv" / "train.tsv"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "lacks 'sentence': is it misspelt ('sentense' for 'sentence')? Rename it" in err, err
    assert "--input-format tsv" in err and "input_format=" not in err and "missing file" not in err, err


@pytest.mark.parametrize("options", [[], ["--sample-rate", "16000"]])
def test_a_corrupt_mp3_is_skipped_for_what_it_is(tmp_path, capsys, options):
    """Not "File does not exist or is not a regular file (possibly a pipe?)": libsndfile's words for an MP3 its
    decoder cannot parse, though the file is there."""
    good = encode(tone(0.5, 16000), 16000, "MP3")
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "good.mp3").write_bytes(good)
    (tmp_path / "clips" / "bad.mp3").write_bytes(good[:150])  # truncated in its first frame
    (tmp_path / "m.csv").write_text("path,text\nclips/good.mp3,a\nclips/bad.mp3,b\n")
    assert cli.main(["pack", str(tmp_path / "m.csv"), str(tmp_path / "out"), *options]) == 0
    out = capsys.readouterr().out
    assert "undecodable: 1 (m.csv, line 3: " in out and "bad.mp3" in out, out
    assert "does not exist" not in out and "corrupt or truncated audio" in out, out


@pytest.mark.parametrize("name", ["demo", "bench"])
def test_lazy_command_not_available(monkeypatch, capsys, name):
    # None in sys.modules makes the import fail exactly like a module that does not exist.
    monkeypatch.setitem(sys.modules, f"audioloader.tools.{name}", None)
    assert cli.main([name, "--anything"]) == 2
    assert "not available yet" in capsys.readouterr().err


def test_lazy_command_gets_argv_or_namespace(monkeypatch):
    seen = []
    plain = types.ModuleType("audioloader.tools.demo")
    plain.main = lambda args: seen.append(args)
    monkeypatch.setitem(sys.modules, "audioloader.tools.demo", plain)
    assert cli.main(["demo", "--steps", "3"]) == 0
    assert seen == [["--steps", "3"]]

    parsed = types.ModuleType("audioloader.tools.bench")
    parsed.add_arguments = lambda parser: parser.add_argument("--steps", type=int)
    parsed.main = lambda args: seen.append(args) or 7
    monkeypatch.setitem(sys.modules, "audioloader.tools.bench", parsed)
    assert cli.main(["bench", "--steps", "3"]) == 7
    assert seen[-1].steps == 3


def test_lazy_command_errors_are_reported(monkeypatch, capsys):
    failing = types.ModuleType("audioloader.tools.demo")

    def main(args):
        raise ValueError("bad data folder")

    failing.main = main
    monkeypatch.setitem(sys.modules, "audioloader.tools.demo", failing)
    assert cli.main(["demo"]) == 1
    assert "audioloader demo: error: bad data folder" in capsys.readouterr().err


# -- inspect -------------------------------------------------------------------------------------------


def test_inspect_text(tmp_path, src):
    out = tmp_path / "out"
    run_cli("pack", src, out, "--shard-size", "4", "-q")
    text = run_cli("inspect", out).stdout
    assert "files: 2 (ipc_file)" in text and "6 rows" in text
    assert "shard-00000.arrow" in text and "shard-00001.arrow" in text
    assert "audio: binary" in text and "label: int64" in text and "path: string" in text
    assert "splits: 2" in text
    assert "labels: column 'label', 3 classes, 6 labeled rows" in text
    for name in ("bird", "cat", "dog"):
        assert any(line.split()[1:3] == [name, "2"] for line in text.splitlines() if name in line)
    assert "sample: 6 of 6 rows" in text
    assert "sample rates: 16000 Hz ×2, 22050 Hz ×3, 44100 Hz ×1" in text
    assert "formats: WAV/PCM_16 ×6" in text


def test_inspect_json_parquet(tmp_path, src):
    out = tmp_path / "out"
    run_cli("pack", src, out, "--format", "parquet", "--rows-per-batch", "2", "-q")
    report = json.loads(run_cli("inspect", out, "--json", "--sample", "3").stdout)
    assert report["num_rows"] == 6 and report["num_files"] == 1
    assert report["files"][0]["format"] == "parquet" and report["files"][0]["batches"] == 3
    assert report["label_names"] == ["bird", "cat", "dog"]
    assert [(c["name"], c["count"]) for c in report["labels"]["classes"]] == [("bird", 2), ("cat", 2), ("dog", 2)]
    sample = report["sample"]
    assert [r["index"] for r in sample["rows"]] == [0, 2, 4]
    assert sample["summary"]["rows"] == 3 and sample["summary"]["unreadable"] == 0
    assert all(r["channels"] == 1 and r["format"] == "WAV" for r in sample["rows"])
    assert sample["rows"][0]["path"] == "bird/0.wav"
    assert sample["rows"][0]["duration_s"] == pytest.approx(0.1)


def test_inspect_function_unlabeled_bad_audio_and_odd_labels(tmp_path):
    from audioloader.shards.formats.writer import ShardWriter
    from audioloader.tools.inspect_shards import format_report, inspect

    good = encode(tone(0.25, 8000), 8000, "FLAC")
    with ShardWriter(tmp_path / "u.arrow", labeled=False) as w:
        w.write(good)
        w.write(b"garbage")
    report = inspect(tmp_path / "u.arrow")
    assert report["labels"] is None and report["labels_note"] == "no column 'label'"
    summary = report["sample"]["summary"]
    assert summary["unreadable"] == 1 and summary["sample_rates"] == {8000: 1}
    assert summary["duration_s"]["max"] == pytest.approx(0.25)
    text = format_report(report)
    assert "labels: none (no column 'label')" in text and "unreadable: 1" in text and "error:" in text

    with ShardWriter(tmp_path / "s.arrow", labeled=False, extra_columns={"cls": pa.string()}) as w:
        w.write(good, cls="dog")
    report = inspect(tmp_path / "s.arrow", label_column="cls", sample=0)
    assert report["labels"] is None and "not integer" in report["labels_note"]
    assert report["sample"]["rows"] == [] and "sample: none" in format_report(report)

    # Ids without names still count; null labels are reported.
    with ShardWriter(tmp_path / "n.arrow", label_names=["a", "b"]) as w:
        w.write(good, 1)
        w.write(good, None)
    report = inspect(tmp_path / "n.arrow")
    assert [(c["id"], c["name"], c["count"]) for c in report["labels"]["classes"]] == [(0, "a", 0), (1, "b", 1)]
    assert report["labels"]["nulls"] == 1


def test_inspect_errors(tmp_path):
    proc = run_cli("inspect", tmp_path / "nothing", check=False)
    assert proc.returncode == 1 and "audioloader inspect: error:" in proc.stderr and "nothing" in proc.stderr
    (tmp_path / "x.arrow").write_bytes(b"not arrow at all")
    proc = run_cli("inspect", tmp_path / "x.arrow", check=False)
    assert proc.returncode == 1 and "x.arrow" in proc.stderr and "Traceback" not in proc.stderr
