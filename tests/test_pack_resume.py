"""audioloader pack at scale: killed at any point and run again, split into parts, indexed after the last part.

A pack is killed with SIGKILL from inside (``AUDIOLOADER_PACK_TEST_KILL="EVENT:N"``: the N-th row written, shard
published, or journal written), so the kill lands at an exact point without any sleep."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from audioloader.tools import cli
from audioloader.tools import pack as pack_module
from audioloader.tools.pack import pack_dataset
from tests.helpers import encode, tone

ROOT = Path(__file__).resolve().parent.parent


def shard_paths(out: Path) -> list[Path]:
    """The shards of a folder in name order: the order a loader reads them."""
    return sorted(p for p in out.iterdir() if p.name.startswith("shard-") and p.suffix in (".arrow", ".parquet"))


def rows_of(out: Path) -> list[dict]:
    tables = [pa.ipc.open_file(str(p)).read_all() if p.suffix == ".arrow" else pq.read_table(str(p))
              for p in shard_paths(out)]
    return pa.concat_tables(tables).to_pylist()


def content_hash(rows: list[dict]) -> str:
    """A hash of the rows, in order: every column's value."""
    digest = hashlib.sha256()
    for row in rows:
        for name in sorted(row):
            value = row[name]
            digest.update(name.encode() + (value if isinstance(value, bytes) else repr(value).encode()))
    return digest.hexdigest()


def run_pack(src, out, *args, kill: str | None = None, check: bool = True, tmpdir: Path | None = None
             ) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {}))
    env.pop("AUDIOLOADER_PACK_TEST_KILL", None)
    if kill is not None:
        env["AUDIOLOADER_PACK_TEST_KILL"] = kill
    proc = subprocess.run([sys.executable, "-m", "audioloader", "pack", str(src), str(out), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


ARGS = ("--shard-size", "3", "--rows-per-batch", "2", "--sample-rate", "8000", "--workers", "2", "-q")


@pytest.fixture
def clean(src, tmp_path):
    """A clean run's shards: {name: bytes}."""
    run_pack(src, tmp_path / "clean", *ARGS)
    return {p.name: p.read_bytes() for p in shard_paths(tmp_path / "clean")}


@pytest.mark.parametrize("kill", ["row:1", "row:8", "shard:2", "journal:2", "journal:5"])
def test_killed_at_any_point_the_rerun_gives_the_clean_runs_shards(src, tmp_path, clean, kill):
    out = tmp_path / "out"
    proc = run_pack(src, out, *ARGS, kill=kill, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "_audioloader_manifest.arrow").exists()  # not finished: no index yet
    if kill == "journal:2":
        assert cli.main(["index", str(out)]) == 1  # nor does `audioloader index` write one
    run_pack(src, out, *ARGS)
    assert {p.name: p.read_bytes() for p in shard_paths(out)} == clean  # same shards, byte for byte
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # the killed writer's file is gone
    assert json.loads((out / "_audioloader_pack.json").read_text())["done"]
    assert (out / "_audioloader_manifest.arrow").exists()


def test_an_interrupted_pack_keeps_its_finished_shards_and_the_rerun_reads_only_the_rest(src, tmp_path, monkeypatch):
    clean = pack_dataset(src, tmp_path / "clean", shard_rows=3, progress=False, workers=1)
    out = tmp_path / "out"
    loaded = []
    real_load = pack_module.load_entry

    def load(entry, *options):
        loaded.append(entry.rel)
        if len(loaded) == 11:
            raise KeyboardInterrupt
        return real_load(entry, *options)

    monkeypatch.setattr(pack_module, "load_entry", load)
    with pytest.raises(KeyboardInterrupt):
        pack_dataset(src, out, shard_rows=3, progress=False, workers=1)
    journal = json.loads((out / "_audioloader_pack.json").read_text())
    finished = [s["name"] for s in journal["shards"]]
    # 9 rows were written (and the broken file skipped); the third shard was still open: not published.
    assert finished == [p.name for p in shard_paths(out)] == ["shard-00000.arrow", "shard-00001.arrow"]
    assert journal["shards"][-1]["end"] == 7 and journal["skips"]["counts"] == {"undecodable": 1}
    loaded.clear()
    summary = pack_dataset(src, out, shard_rows=3, progress=False, workers=1)
    assert loaded == [f"cat/{j:02d}.wav" for j in (2, 3, 4)] + [f"dog/{j:02d}.wav" for j in range(5)]
    assert summary.resumed == 2 and "continued: 2 shard(s)" in summary.text()
    assert [p.name for p in summary.shards] == [p.name for p in clean.shards]
    assert [p.read_bytes() for p in summary.shards] == [p.read_bytes() for p in clean.shards]
    assert (summary.rows, summary.skipped, summary.examples) == (clean.rows, clean.skipped, clean.examples)
    assert summary.seconds == pytest.approx(clean.seconds)


def test_a_finished_pack_run_again_is_kept(src, tmp_path, monkeypatch):
    first = pack_dataset(src, tmp_path / "out", shard_rows=4, progress=False)
    monkeypatch.setattr(pack_module, "load_entry", lambda *a: pytest.fail("a finished pack read a file again"))
    again = pack_dataset(src, tmp_path / "out", shard_rows=4, progress=False)
    assert again.shards == first.shards and again.rows == first.rows and again.skipped == first.skipped


def test_other_arguments_or_another_input_over_an_unfinished_pack_are_refused_by_name(src, tmp_path):
    out = tmp_path / "out"
    run_pack(src, out, *ARGS, kill="journal:1", check=False)
    other = [a if a != "8000" else "16000" for a in ARGS]
    proc = run_pack(src, out, *other, check=False)
    assert proc.returncode == 1
    assert "made with --sample-rate 8000, this run has --sample-rate 16000" in proc.stderr
    assert "--overwrite" in proc.stderr
    (src / "dog" / "99.wav").write_bytes(encode(tone(0.05, 8000), 8000))
    proc = run_pack(src, out, *ARGS, check=False)
    assert proc.returncode == 1 and "an input of 15 rows" in proc.stderr and "16 rows" in proc.stderr
    run_pack(src, out, *other, "--overwrite")  # --overwrite: start over with the new arguments
    assert len(rows_of(out)) == 15
    journal = json.loads((out / "_audioloader_pack.json").read_text())
    assert journal["settings"]["sample_rate"] == 16000 and journal["done"]


# -- parts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle_seed", [None, 5])
def test_all_parts_in_any_order_give_the_single_packs_rows_in_its_order(src, tmp_path, count, shuffle_seed):
    options = dict(shard_rows=2, progress=False, shuffle_seed=shuffle_seed, fmt="parquet")
    single = pack_dataset(src, tmp_path / "single", **options)
    out = tmp_path / "parts"
    summaries = [pack_dataset(src, out, part=f"{k}/{count}", **options) for k in reversed(range(count))]
    assert [s.indexed for s in summaries] == [False] * (count - 1) + [True]  # the last to finish indexes
    assert content_hash(rows_of(out)) == content_hash(rows_of(tmp_path / "single"))
    assert sum(s.rows for s in summaries) == single.rows
    skipped = {}
    for s in summaries:
        for reason, n in s.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    assert skipped == single.skipped  # each row left out is counted once, by its part
    assert all(p.name.startswith("shard-p") and f"of{count:04d}-" in p.name for p in shard_paths(out))
    assert json.loads((out / "labels.json").read_text()) == {"bird": 0, "cat": 1, "dog": 2}

    import audioloader as al

    names = [f.path for f in al.ShardDataset(str(out)).files]  # the loader reads the parts in name order
    assert [Path(n).name for n in names] == [p.name for p in shard_paths(out)]


def test_index_waits_for_every_part_and_names_the_missing_ones(src, tmp_path, capsys):
    out = tmp_path / "out"
    for k in (0, 2):
        pack_dataset(src, out, shard_rows=3, part=f"{k}/4", progress=False)
    assert cli.main(["index", str(out)]) == 1
    assert "2 of the 4 parts of the `audioloader pack` into it are not finished: --part 1/4, 3/4." in \
        capsys.readouterr().err
    assert not (out / "_audioloader_manifest.arrow").exists()
    for k in (3, 1):
        pack_dataset(src, out, shard_rows=3, part=f"{k}/4", progress=False)
    assert (out / "_audioloader_manifest.arrow").exists()
    assert cli.main(["index", str(out)]) == 0


def test_a_killed_part_resumes_without_touching_the_other_parts(src, tmp_path):
    out, clean = tmp_path / "out", tmp_path / "clean"
    options = dict(shard_rows=3, rows_per_batch=2, sample_rate=8000, progress=False)
    for k in range(2):
        pack_dataset(src, clean, part=f"{k}/2", **options)
    pack_dataset(src, out, part="1/2", **options)
    done = {p.name: p.stat().st_mtime_ns for p in shard_paths(out)}
    assert run_pack(src, out, *ARGS, "--part", "0/2", kill="row:4", check=False).returncode == -signal.SIGKILL
    run_pack(src, out, *ARGS, "--part", "0/2")
    assert {p.name: p.stat().st_mtime_ns for p in shard_paths(out) if "p0001" in p.name} == done
    assert {p.name: p.read_bytes() for p in shard_paths(out)} == {p.name: p.read_bytes() for p in shard_paths(clean)}


def test_parts_of_another_split_or_a_whole_pack_are_refused(src, tmp_path):
    out = tmp_path / "out"
    pack_dataset(src, out, part="0/2", progress=False)
    with pytest.raises(ValueError, match=r"already holds shards of another pack than a split into 3 parts"):
        pack_dataset(src, out, part="0/3", progress=False)
    with pytest.raises(ValueError, match=r"another pack than a whole pack \(shard-p0000of0002-00000"):
        pack_dataset(src, out, progress=False)
    pack_dataset(src, out, progress=False, overwrite=True)
    assert [p.name for p in shard_paths(out)] == ["shard-00000.arrow"]


@pytest.mark.parametrize("part", ["2/2", "-1/2", "1", "a/b", "0/0"])
def test_a_bad_part_is_refused(src, tmp_path, part):
    with pytest.raises(ValueError, match=r"part=.*K/N with 0 <= K < N"):
        pack_dataset(src, tmp_path / "out", part=part, progress=False)
