"""audioloader pack on a local Ray cluster (2 CPUs): the parts as Ray tasks give the single pack's rows, from Python
and from the command line; without --ray, Ray is never imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from audioloader.tools import cli
from audioloader.tools.pack import pack_dataset
from tests.test_pack_resume import ROOT, content_hash, rows_of, shard_paths

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_pack_gives_the_single_packs_rows(cluster, src, tmp_path):
    from audioloader.integrations import ray as al_ray

    options = dict(shard_rows=3, sample_rate=8000, progress=False)
    single = pack_dataset(src, tmp_path / "single", **options)
    summary = al_ray.pack(src, tmp_path / "ray", parts=3, **options)
    assert content_hash(rows_of(tmp_path / "ray")) == content_hash(rows_of(tmp_path / "single"))
    assert summary.shards == shard_paths(tmp_path / "ray") and summary.indexed
    assert (summary.rows, summary.skipped, summary.columns) == (single.rows, single.skipped, single.columns)
    assert (tmp_path / "ray" / "_audioloader_manifest.arrow").exists()
    assert summary.text().startswith(f"wrote {len(summary.shards)} shard(s), {single.rows} rows")


@pytest.mark.slow  # with the cluster's start, the module takes about 45 s on the shared 2-core machine
def test_the_command_line_runs_on_ray_and_continues_a_finished_pack(cluster, src, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["pack", str(src), str(out), "--ray", "--parts", "2", "--shard-size", "4"]) == 0
    first = capsys.readouterr().out
    assert "wrote" in first and "skipped 1 row(s)" in first
    names = [p.name for p in shard_paths(out)]
    assert names[0] == "shard-p0000of0002-00000.arrow" and any("p0001of0002" in n for n in names)
    assert cli.main(["pack", str(src), str(out), "--ray", "--parts", "2", "--shard-size", "4"]) == 0
    assert f"continued: {len(names)} shard(s)" in capsys.readouterr().out
    assert cli.main(["pack", str(src), str(out), "--ray", "--part", "0/2"]) == 1
    assert "--parts N" in capsys.readouterr().err


def test_pack_without_ray_never_imports_ray(src, tmp_path):
    code = ("import sys, audioloader; from audioloader.tools import cli; "
            f"assert cli.main(['pack', {str(src)!r}, {str(tmp_path / 'out')!r}, '-q', '--part', '0/2']) == 0; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
                   timeout=120)
    assert Path(tmp_path / "out" / "_audioloader_pack-p0000of0002.json").exists()
