"""The peers of bench_remote.py: LitData, MosaicML Streaming and the plain s3fs way, each in a fresh process.

    <peers venv>/bin/python -m benchmarks.remote.remote_peers '<json spec>'      (from the repository's root)

Runs in the virtual environment the benchmark makes for the peers (their pins
clash with audioloader's: mosaicml-streaming wants numpy < 2.2); never imports
audioloader. Each peer reads its own format, written from the same rows as the
audioloader shards (``kind="prepare"``), from the same moto server through the
same shaping proxy, the way its documentation shows:

- ``litdata``: ``litdata.optimize(fn, inputs, output_dir, chunk_bytes="64MB")``, then a
  ``litdata.StreamingDataset`` subclass whose ``__getitem__`` decodes (their
  recommended way to transform), under ``litdata.StreamingDataLoader``.
- ``streaming``: ``streaming.MDSWriter(columns={"audio": "bytes", "label": "int"})``
  (default 64 MB shards), then a ``streaming.StreamingDataset`` subclass under
  ``torch.utils.data.DataLoader``.
- ``s3fs``: one object per clip, ``fsspec.open("s3://...").read()`` in a
  ``torch.utils.data.Dataset.__getitem__`` under a ``DataLoader(shuffle=...)``.

Every peer uses its defaults (cache, prefetch, download threads), a fresh cache
folder per run (so a run is cold, like the first epoch over a large dataset), and
the same number of DataLoader workers as audioloader's default (one per core).
The per-sample work is the same for all three (`features`): soundfile decode of
the whole clip, mono, soxr to the target rate, a 0.5 s (waveform) or 5 s (log-mel,
``torchaudio.transforms.MelSpectrogram``: audioloader's default features) crop.

Loopback specifics (real S3 is https, where neither arises): LitData's obstore
client refuses plain http unless ``_OBSTORE_CLIENT_OPTIONS["allow_http"]`` is set;
Streaming's forked DataLoader workers would share the boto3 client the parent
opened to read ``index.json`` (responses reach the wrong worker: a shard file gets
another's bytes, ``IndexError: Relative sample index 21 is not present in the
shard.00002.mds file``, seen here without it), so the parent's is dropped after
construction (``stream._downloader.clean_up()`` for each of ``dataset.streams``).
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.remote.protocol import FEATURES, emit, mark, measure_batches

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
_MEL: Any = None


def features(data: bytes, feature: str, train: bool) -> Any:
    """One clip's bytes -> float32 ``[8000]`` (0.5 s at 16 kHz) or log-mel ``[128, 501]`` (5 s at 32 kHz)."""
    import soundfile as sf
    import soxr

    global _MEL
    setting = FEATURES[feature]
    rate = setting["sample_rate"]
    wav, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = wav.mean(axis=1)
    x = soxr.resample(mono, sr, rate) if sr != rate else mono
    n = round(setting["clip_seconds"] * rate)
    if len(x) > n:
        start = int(np.random.default_rng().integers(0, len(x) - n + 1)) if train else (len(x) - n) // 2
        x = x[start:start + n]
    elif len(x) < n:
        x = np.pad(x, (0, n - len(x)))
    tensor = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if feature == "waveform":
        return tensor
    if _MEL is None:
        import torchaudio

        _MEL = torchaudio.transforms.MelSpectrogram(sample_rate=rate, n_fft=1024, hop_length=320, n_mels=128)
    return torch.log(_MEL(tensor) + 1e-6)


# -- writing each peer's format from the audioloader shards ---------------------------------------------------

_TABLES: dict[str, Any] = {}


def _table(path: str) -> Any:
    import pyarrow as pa

    if path not in _TABLES:
        _TABLES[path] = pa.ipc.open_file(pa.memory_map(path)).read_all()
    return _TABLES[path]


def _row(item: tuple[str, int]) -> dict[str, Any]:
    """Row ``item = (shard path, row)`` of an Arrow IPC shard as ``{"audio": bytes, "label": int}``."""
    path, row = item
    table = _table(path)
    return {"audio": table.column("audio")[row].as_py(), "label": int(table.column("label")[row].as_py())}


def prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``spec["format"]`` (``litdata`` or ``mds``) into ``spec["out"]`` from the rows of ``spec["shards"]``."""
    items = [(path, row) for path in spec["shards"] for row in range(_table(path).num_rows)]
    started = time.perf_counter()
    if spec["format"] == "litdata":
        import litdata

        litdata.optimize(fn=_row, inputs=items, output_dir=spec["out"], chunk_bytes="64MB", num_workers=1,
                         verbose=False)
    else:
        from streaming import MDSWriter

        with MDSWriter(out=spec["out"], columns={"audio": "bytes", "label": "int"}) as writer:
            for item in items:
                writer.write(_row(item))
    return {"rows": len(items), "seconds": time.perf_counter() - started}


# -- the peers ----------------------------------------------------------------------------------------------


def _litdata(spec: dict[str, Any]):
    import litdata
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # loopback is http; real S3 is https

    class AudioDataset(litdata.StreamingDataset):
        def __getitem__(self, index: Any) -> tuple[Any, int]:
            item = super().__getitem__(index)
            return features(item["audio"], spec["feature"], spec["train"]), item["label"]

    dataset = AudioDataset(spec["remote"], cache_dir=spec["cache_dir"], shuffle=spec["train"],
                           storage_options={"endpoint_url": spec["endpoint"], **CREDENTIALS})
    return litdata.StreamingDataLoader(dataset, batch_size=spec["batch_size"], num_workers=spec["workers"])


def _streaming(spec: dict[str, Any]):
    import streaming

    os.environ["S3_ENDPOINT_URL"] = spec["endpoint"]

    class AudioDataset(streaming.StreamingDataset):
        def __getitem__(self, index: int) -> tuple[Any, int]:
            item = super().__getitem__(index)
            return features(item["audio"], spec["feature"], spec["train"]), item["label"]

    dataset = AudioDataset(remote=spec["remote"], local=spec["cache_dir"], shuffle=spec["train"],
                           batch_size=spec["batch_size"])
    for stream in dataset.streams:  # forked workers must not share the boto3 client the parent read index.json with
        stream._downloader.clean_up()
    return torch.utils.data.DataLoader(dataset, batch_size=spec["batch_size"], num_workers=spec["workers"])


class S3Files(torch.utils.data.Dataset):
    """The plain way: a map-style dataset of one object per clip (``<index>-<label>.flac``), read with fsspec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import fsspec

        self.feature, self.train = spec["feature"], spec["train"]
        self.options = {"key": "testing", "secret": "testing", "endpoint_url": spec["endpoint"],
                        "client_kwargs": {"region_name": "us-east-1"}}
        fs = fsspec.filesystem("s3", **self.options)
        self.paths = sorted(fs.find(spec["remote"].removeprefix("s3://")))
        if not self.paths:
            raise FileNotFoundError(f"no objects under {spec['remote']}")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import fsspec

        with fsspec.open(f"s3://{self.paths[i]}", "rb", **self.options) as fh:
            data = fh.read()
        label = int(Path(self.paths[i]).stem.rsplit("-", 1)[1])
        return features(data, self.feature, self.train), label


def _s3fs(spec: dict[str, Any]):
    return torch.utils.data.DataLoader(S3Files(spec), batch_size=spec["batch_size"], shuffle=spec["train"],
                                       num_workers=spec["workers"])


PEERS = {"litdata": _litdata, "streaming": _streaming, "s3fs": _s3fs}


#: What each peer imports, done before any clock starts (construction times leave the imports out).
IMPORTS = {"litdata": ["litdata"], "streaming": ["streaming"], "s3fs": ["fsspec", "s3fs"]}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "prepare":
        return prepare(spec)
    import importlib

    started = time.perf_counter()
    for module in [*IMPORTS[spec["kind"]], "soundfile", "soxr", "torchaudio"]:
        importlib.import_module(module)
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    loader = PEERS[spec["kind"]](spec)
    construct_s = time.perf_counter() - started
    started += mark(spec, "constructed")
    result = measure_batches(iter(loader), started=started, measure_seconds=spec["measure_seconds"],
                             count=lambda batch: len(batch[1]), features=lambda batch: batch[0],
                             feature=spec["feature"])
    cache = Path(spec["cache_dir"])
    result.update(construct_s=construct_s, import_s=import_s, num_workers=spec["workers"],
                  cache_bytes=sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0)
    return result


if __name__ == "__main__":
    sys.exit(emit(run, sys.argv))
