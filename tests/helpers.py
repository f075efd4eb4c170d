"""Small audio and shard builders for the tests (numpy + soundfile + pyarrow only)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf


def tone(seconds: float, sample_rate: int, freq: float = 440.0, channels: int = 1,
         amplitude: float = 0.5, seed: int = 0) -> np.ndarray:
    """A float32 sine plus a little noise, shape [frames] (mono) or [frames, channels]."""
    n = round(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    rng = np.random.default_rng(seed)
    columns = [amplitude * np.sin(2 * np.pi * freq * (c + 1) * t) + 0.01 * rng.standard_normal(n)
               for c in range(channels)]
    signal = np.stack(columns, axis=1).astype(np.float32)
    return signal[:, 0] if channels == 1 else signal


def encode(signal: np.ndarray, sample_rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    """Encode with soundfile: fmt in WAV, FLAC, OGG, MP3; subtype e.g. PCM_16, FLOAT, VORBIS, MPEG_LAYER_III."""
    if subtype is None:
        subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}[fmt]
    buf = io.BytesIO()
    sf.write(buf, signal, sample_rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def clip_bytes(i: int, seconds: float = 0.5, sample_rate: int = 16000, fmt: str = "WAV") -> bytes:
    """A short distinct clip for row ``i`` (frequency depends on i)."""
    return encode(tone(seconds, sample_rate, freq=200.0 + 37.0 * i, seed=i), sample_rate, fmt)


def audio_table(start: int, n: int, *, struct_audio: bool = False, seconds: float = 0.5,
                sample_rate: int = 16000) -> pa.Table:
    """Rows ``start..start+n``: audio (WAV bytes), label = i % 3, ``uid`` = i, ``name`` = f"clip{i}"."""
    audio = [clip_bytes(i, seconds, sample_rate) for i in range(start, start + n)]
    if struct_audio:
        rows = [{"bytes": b, "path": f"clip{i}.wav"} for i, b in zip(range(start, start + n), audio, strict=True)]
        audio_col = pa.array(rows, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    else:
        audio_col = pa.array(audio, type=pa.binary())
    ids = list(range(start, start + n))
    return pa.table({
        "audio": audio_col,
        "label": pa.array([i % 3 for i in ids], type=pa.int64()),
        "uid": pa.array(ids, type=pa.int64()),
        "name": pa.array([f"clip{i}" for i in ids], type=pa.string()),
    })


def write_ipc_file(path: Path, table: pa.Table, batch_rows: int = 4) -> Path:
    """Arrow IPC *file* format with record batches of ``batch_rows`` rows."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path


def write_ipc_stream(path: Path, table: pa.Table, batch_rows: int = 4) -> Path:
    """Arrow IPC *stream* format (what Hugging Face ``save_to_disk`` writes)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path


def write_parquet(path: Path, table: pa.Table, row_group_rows: int = 4) -> Path:
    import pyarrow.parquet as pq

    pq.write_table(table, str(path), row_group_size=row_group_rows)
    return path


def write_orc(path: Path, table: pa.Table, stripe_rows: int = 4) -> Path:
    """ORC with stripes of ``stripe_rows`` rows (the writer closes a stripe after each batch past its tiny size)."""
    import pyarrow.orc as orc

    orc.write_table(table, str(path), stripe_size=1, batch_size=stripe_rows)
    return path


def make_shards(folder: Path, rows_per_file: list[int], fmt: str = "ipc_file", batch_rows: int = 4,
                **table_kwargs) -> list[Path]:
    """Write consecutive rows into several files named ``part-00000.<ext>`` ...; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = {"ipc_file": write_ipc_file, "ipc_stream": write_ipc_stream, "parquet": write_parquet,
              "orc": write_orc}[fmt]
    ext = {"parquet": "parquet", "orc": "orc"}.get(fmt, "arrow")
    paths, start = [], 0
    for i, n in enumerate(rows_per_file):
        paths.append(writer(folder / f"part-{i:05d}.{ext}", audio_table(start, n, **table_kwargs), batch_rows))
        start += n
    return paths
