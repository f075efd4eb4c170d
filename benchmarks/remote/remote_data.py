"""Data and environments for bench_remote.py: the datasets (generated once, cached) and the peers' venv.

Datasets, each as Arrow IPC files and as Parquet (the same rows, record batches
and row groups of the same size), columns ``audio`` (encoded bytes) and ``label``:

- ``speech``: short speech-like rows, 1.0-1.5 s of 16 kHz mono FLAC (about 25 KB a
  row; the synthetic harmonic+noise content of `audioloader.tools.bench.dataset`), in 4
  files with record batches / row groups of 50 rows;
- ``standard``: the standard bench dataset (`audioloader.tools.bench.dataset`: 10 s of
  44.1 kHz FLAC a row, about 530 KB), record batches / row groups of 64 rows;
- ``many``: ``files`` small IPC files of 2 speech rows each (construction cost).

For the peers, the same rows are written as one object per clip (the plain s3fs
way) here, and in LitData's and MosaicML Streaming's formats by
benchmarks/remote/remote_peers.py in the peers' venv.

The peers' venv (``<cache>/peers-venv-v1``) is made once with ``pip install
litdata mosaicml-streaming s3fs "numpy<2.2" torch==<this torch>``. It sees this
environment's packages through a ``.pth`` file (torch, torchaudio, soundfile,
soxr, pyarrow are not downloaded again); its own site-packages come first, so its
numpy 2.1 and the peers' pins win there, and this environment is not changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import ROOT, module_command

#: Bump when the generated content changes, so old caches are not reused.
DATA_VERSION = 1
VENV = "peers-venv-v1"
PEER_PACKAGES = ["litdata", "mosaicml-streaming", "s3fs", "numpy<2.2"]
SPEECH_RATE = 16000



def _shards(folder: Path) -> list[Path]:
    """The IPC shards of a folder, in order (names starting with "_", such as pack's metadata index, are not)."""
    return sorted(p for p in folder.glob("*.arrow") if not p.name.startswith("_"))

def _bench_dataset_module():
    from audioloader.tools.bench import dataset

    return dataset


def _publish(build: Callable[[Path], None], final: Path, log: Callable[[str], None], what: str) -> Path:
    """Build into a temporary sibling folder, then rename it into place (a half-built folder is never reused)."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    log(f"writing {what} to {final} (once; cached)")
    try:
        build(tmp)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_both(table: pa.Table, folder: Path, name: str, rows_per_batch: int) -> None:
    """``folder/ipc/<name>.arrow`` (record batches of ``rows_per_batch``) and ``folder/parquet/<name>.parquet``."""
    (folder / "ipc").mkdir(parents=True, exist_ok=True)
    (folder / "parquet").mkdir(parents=True, exist_ok=True)
    with pa.ipc.new_file(folder / "ipc" / f"{name}.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=rows_per_batch)
    pq.write_table(table, folder / "parquet" / f"{name}.parquet", row_group_size=rows_per_batch)


def speech_clips(start: int, rows: int) -> pa.Table:
    """Rows ``start .. start+rows`` of the speech set: ``audio`` (FLAC bytes, 1.0-1.5 s at 16 kHz), ``label``."""
    dataset = _bench_dataset_module()
    audio, labels = [], []
    for i in range(start, start + rows):
        seconds = round(float(np.random.default_rng([7, i]).uniform(1.0, 1.5)), 3)
        spec = dataset.DatasetSpec(clips=1, seconds=seconds, sample_rate=SPEECH_RATE, seed=7)
        audio.append(dataset.encode_clip(dataset.synth_clip(i, spec), SPEECH_RATE, "flac"))
        labels.append(i % 10)
    return pa.table({"audio": pa.array(audio, pa.binary()), "label": pa.array(labels, pa.int64())})


def speech_dataset(cache: Path, rows: int, log: Callable[[str], None]) -> Path:
    """``<cache>/speech-n<rows>-v1/{ipc,parquet}``: ``rows`` speech rows in 4 files, batches of 50 rows."""
    def build(tmp: Path) -> None:
        files = 4
        per_file = -(-rows // files)
        for f in range(files):
            start = f * per_file
            count = min(per_file, rows - start)
            if count > 0:
                _write_both(speech_clips(start, count), tmp, f"part-{f:05d}", 50)

    return _publish(build, cache / f"speech-n{rows}-v{DATA_VERSION}", log, f"{rows} speech rows")


def standard_dataset(cache: Path, clips: int, log: Callable[[str], None]) -> Path:
    """The standard bench dataset's IPC shards (``ipc``, a link) and the same rows as Parquet (``parquet``)."""
    dataset = _bench_dataset_module()
    shards = dataset.standard_dataset(dataset.DatasetSpec(clips=clips), cache / "standard", log=log)

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "ipc").symlink_to(shards.resolve(), target_is_directory=True)
        (tmp / "parquet").mkdir()
        for path in _shards(shards):
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            pq.write_table(table, tmp / "parquet" / f"{path.stem}.parquet", row_group_size=64)

    return _publish(build, cache / f"standard-n{clips}-v{DATA_VERSION}", log, f"standard dataset ({clips} clips)")


def many_files(cache: Path, files: int, log: Callable[[str], None]) -> Path:
    """``<cache>/many-<files>-v1/ipc``: ``files`` Arrow IPC files of 2 speech rows each."""
    def build(tmp: Path) -> None:
        (tmp / "ipc").mkdir(parents=True)
        table = speech_clips(0, 2 * min(files, 50))  # the same 100 rows over and over: content is not the point
        for f in range(files):
            part = table.slice(2 * (f % 50), 2)
            with pa.ipc.new_file(tmp / "ipc" / f"part-{f:05d}.arrow", part.schema) as writer:
                writer.write_table(part)

    return _publish(build, cache / f"many-{files}-v{DATA_VERSION}", log, f"{files} small files")


def clip_files(ipc: Path, out: Path) -> None:
    """One object per row for the plain s3fs way: ``out/<index:06d>-<label>.flac`` (the row's bytes as they are)."""
    out.mkdir(parents=True, exist_ok=True)
    index = 0
    for path in _shards(ipc):
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        for audio, label in zip(table.column("audio").to_pylist(), table.column("label").to_pylist(), strict=True):
            (out / f"{index:06d}-{label}.flac").write_bytes(audio)
            index += 1


def upload_tree(filesystem: Any, local: Path, prefix: str) -> int:
    """Copy every file under ``local`` (recursively) to ``prefix/<relative path>``; returns the bytes uploaded."""
    total = 0
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        data = path.read_bytes()
        with filesystem.open_output_stream(f"{prefix}/{path.relative_to(local).as_posix()}") as out:
            out.write(data)
        total += len(data)
    return total


# -- the peers' virtual environment ---------------------------------------------------------------------------


def peers_python(cache: Path, log: Callable[[str], None]) -> Path:
    """The peers' venv's python, made on first use (a couple of minutes: pip downloads LitData, Streaming, s3fs)."""
    venv = cache / VENV
    python = venv / "bin" / "python"
    ready = venv / ".ready.json"
    if ready.exists():
        return python
    import torch

    shutil.rmtree(venv, ignore_errors=True)
    started = time.perf_counter()
    log(f"making the peers' venv in {venv} (once): pip install {' '.join(PEER_PACKAGES)}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "_benchmark_parent.pth").write_text("".join(f"{p}\n" for p in ours))
    # torch pinned to this environment's: otherwise a peer's torchvision requirement pulls another torch.
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           *PEER_PACKAGES, torch_pin], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip install of the peers failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
         "['litdata', 'mosaicml-streaming', 's3fs', 'numpy', 'torch', 'obstore', 'boto3']}))"],
        check=True, capture_output=True, text=True).stdout
    ready.write_text(versions)
    log(f"peers' venv ready in {time.perf_counter() - started:.0f} s: {versions.strip()}")
    return python


def peer_versions(cache: Path) -> dict[str, str]:
    try:
        return json.loads((cache / VENV / ".ready.json").read_text())
    except (OSError, ValueError):
        return {}


def peer_format(python: Path, cache: Path, name: str, ipc: Path, fmt: str, log: Callable[[str], None]) -> Path:
    """``<cache>/<name>-<fmt>`` written by remote_peers.py ``prepare`` (``fmt``: ``litdata`` or ``mds``)."""
    def build(tmp: Path) -> None:
        spec = {"kind": "prepare", "format": fmt, "shards": [str(p) for p in _shards(ipc)],
                "out": str(tmp)}
        command = module_command("benchmarks.remote.remote_peers", json.dumps(spec), python=str(python))
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"writing {fmt} for {name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")

    return _publish(build, cache / f"{name}-{fmt}", log, f"{name} in {fmt}")


def files_dataset(cache: Path, name: str, ipc: Path, log: Callable[[str], None]) -> Path:
    """``<cache>/<name>-files``: one file per clip (`clip_files`), for the plain s3fs way."""
    return _publish(lambda tmp: clip_files(ipc, tmp), cache / f"{name}-files", log, f"{name}, one file a clip")
