"""What several test modules share: small audio and shard builders, loaders with small defaults, and the checks
that compare batches and resume runs. (Fixtures are in conftest.py.)"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf
import torch
from torchdata.nodes import BaseNode

import audioloader as al
from audioloader.nodes import ArrowShardReader, Prefetcher
from audioloader.samples import Key

#: Small log-mel features (8 kHz, 0.25 s crops, 16 mels): cheap to compute, every code path the same.
SMALL = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)

#: Rows per file of the ``ipc_shards`` fixture (conftest.py).
IPC_ROWS = [13, 9, 18]

#: Sample rate of the augmentation sources and of the speech corpus.
RATE = 16000

# -- audio and shards ----------------------------------------------------------------------------------------


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


# -- bad audio -----------------------------------------------------------------------------------------------


def upload_shards(s3, folder: Path, prefix: str, rows_per_file: list[int], fmt: str = "ipc_file",
                  batch_rows: int = 4, seconds: float = 0.4) -> tuple[Path, str]:
    """`make_shards` into ``folder``, the files then uploaded to ``prefix`` (``bucket/folder``) of ``s3`` (an
    `tests.s3_server.S3Server`): ``(folder, prefix)``, the same rows local and remote."""
    make_shards(folder, rows_per_file, fmt, batch_rows=batch_rows, seconds=seconds)
    s3.upload(folder, prefix)
    return folder, prefix


def flip_audio_bytes(path, row: int, count: int = 64) -> None:
    """Flip ``count`` bytes inside row ``row``'s audio samples of an IPC shard, in place: same size, same footer."""
    audio = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column("audio")[row].as_py()
    data = bytearray(path.read_bytes())
    start = data.find(audio) + len(audio) // 2  # past the WAV header, in the samples
    data[start:start + count] = bytes(b ^ 0xFF for b in data[start:start + count])
    path.write_bytes(bytes(data))


#: `class_tree`'s classes, each a folder of FILES_PER_CLASS clips (15 files; the first of "cat" is broken: skipped as
#: undecodable).
CLASSES = ["bird", "cat", "dog"]
FILES_PER_CLASS = 5


def class_tree(root: Path) -> Path:
    """``root/<class>/NN.wav`` (``audioloader pack``'s class folders): FILES_PER_CLASS short tones a class at 8-16 kHz,
    the first of "cat" not audio."""
    for i, cls in enumerate(CLASSES):
        (root / cls).mkdir(parents=True)
        for j in range(FILES_PER_CLASS):
            rate = (8000, 11025, 16000)[(i + j) % 3]
            data = encode(tone(0.05 + 0.01 * j, rate, freq=150 + 40 * i + 7 * j, seed=j), rate)
            (root / cls / f"{j:02d}.wav").write_bytes(b"not audio" if (cls, j) == ("cat", 0) else data)
    return root


def truncated_flac() -> bytes:
    """The first two thirds of a 1.3 s FLAC of a loud tone: a stream cut short."""
    data = encode(tone(1.3, 16000, freq=330.0, amplitude=0.9, seed=16001), 16000, "FLAC", "PCM_16")
    return data[: len(data) * 2 // 3]


def wav_with_format_tag(tag: int) -> bytes:
    """A valid PCM WAV whose fmt chunk claims codec ``tag`` (e.g. 0x00FF, AAC): unsupported."""
    data = bytearray(encode(tone(0.2, 16000), 16000, "WAV", "PCM_16"))
    pos = data.index(b"fmt ") + 8
    struct.pack_into("<H", data, pos, tag)
    return bytes(data)


#: Audio values that cannot be decoded: ``{kind: (value, words of the reason)}``.
BAD_AUDIO = {
    "null": (None, "audio is null"),
    "empty": (b"", "empty"),
    "random bytes": (np.random.default_rng(0).bytes(5000), "cannot open audio"),
    "truncated": (truncated_flac(), "truncated"),
    "zero samples": (encode(np.zeros(0, np.float32), 16000, "WAV", "PCM_16"), "no samples"),
    "unsupported codec": (wav_with_format_tag(0x00FF), "cannot open audio"),
    "not bytes": ("a string", "expected bytes"),
}


# -- augmentation sources and a speech corpus ------------------------------------------------------------------


def noise_clip(i: int, seconds: float) -> np.ndarray:
    return (0.3 * np.random.default_rng(100 + i).standard_normal(round(seconds * RATE))).astype(np.float32)


def impulse_response(i: int) -> np.ndarray:
    """A short decaying noise with a unit direct path: float32, 0.05 s."""
    t = np.arange(round(0.05 * RATE)) / RATE
    ir = np.random.default_rng(200 + i).standard_normal(len(t)) * np.exp(-t / 0.01) * 0.3
    ir[0] = 1.0
    return ir.astype(np.float32)


def write_audio(path: Path, clips: list, batch_rows: int = 4) -> Path:
    """An Arrow IPC shard with one ``audio`` column: each clip an array (FLOAT WAV) or raw bytes/None."""
    values = [encode(c, RATE, "WAV", "FLOAT") if isinstance(c, np.ndarray) else c for c in clips]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_ipc_file(path, pa.table({"audio": pa.array(values, pa.binary())}), batch_rows=batch_rows)
    return path


def durations(n: int = 48, seed: int = 0) -> list[float]:
    """Utterance lengths in seconds, uniform in [0.3, 3.0], rounded to ms."""
    return [round(float(s), 3) for s in np.random.default_rng(seed).uniform(0.3, 3.0, n)]


def corpus_table(seconds: list[float], *, duration_column: bool = False) -> pa.Table:
    """A Hugging Face-shaped speech corpus: audio struct {bytes, path}, text; WAV, FLAC, some at 22.05 kHz."""
    audio, texts = [], []
    for i, s in enumerate(seconds):
        rate = 22050 if i % 5 == 0 else RATE
        audio.append({"bytes": encode(tone(s, rate, freq=120.0 + 7 * i, seed=i), rate, "FLAC" if i % 2 else "WAV"),
                      "path": f"utt{i}.wav"})
        texts.append(f"utterance number {i}")
    columns = {"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
               "text": pa.array(texts), "speaker": pa.array([i % 4 for i in range(len(seconds))], pa.int64())}
    if duration_column:
        columns["duration"] = pa.array(seconds, pa.float64())
    return pa.table(columns)


# -- shards to filter: a duration and a split column -----------------------------------------------------------

FILTER_ROWS = [24, 16, 20]  # 60 rows; row k of a file: duration k / 4 s (ascending), split "test" for every third index
FILTER_DURATIONS = [k / 4 for n in FILTER_ROWS for k in range(n)]  # by global index


def filter_table(start: int, n: int) -> pa.Table:
    """Rows ``start..start+n`` of `audio_table` plus ``duration`` (`FILTER_DURATIONS`) and ``split``."""
    t = audio_table(start, n, seconds=0.3)
    t = t.append_column("duration", pa.array(FILTER_DURATIONS[start:start + n], pa.float64()))
    return t.append_column("split", pa.array(["train" if (start + k) % 3 else "test" for k in range(n)]))


def write_filter_shards(folder: Path, fmt: str) -> Path:
    """`FILTER_ROWS` rows in three files of ``fmt``, batches (row groups, stripes) of 4 rows; returns ``folder``."""
    import pyarrow.parquet as pq

    start = 0
    for i, n in enumerate(FILTER_ROWS):
        path = folder / f"part-{i}.{fmt if fmt in ('parquet', 'orc') else 'arrow'}"
        if fmt == "parquet":
            pq.write_table(filter_table(start, n), path, row_group_size=4)  # with statistics (pyarrow's default)
        else:
            writer = {"ipc_file": write_ipc_file, "ipc_stream": write_ipc_stream, "orc": write_orc}[fmt]
            writer(path, filter_table(start, n), 4)
        start += n
    return folder


# -- loaders and the checks on their batches -------------------------------------------------------------------


#: The option groups `overlay` merges field by field (others, features or a length policy, are replaced whole).
GROUPS = (al.Workers, al.Shuffle, al.Storage, al.OnError)


def overlay(options: dict, more: dict) -> dict:
    """``options`` updated with ``more``, where an option group (`al.Workers`, `al.Shuffle`, `al.Storage`,
    `al.OnError`) given in both is merged field by field: the fields ``more``'s group sets away from their default
    replace those of the earlier group, the others keep its values."""
    merged = dict(options)
    for name, value in more.items():
        earlier = merged.get(name)
        if isinstance(value, GROUPS) and type(earlier) is type(value):
            changed = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                       if getattr(value, f.name) != f.default}
            value = dataclasses.replace(earlier, **changed)
        merged[name] = value
    return merged


def loader_factory(*, train_options: dict | None = None, eval_options: dict | None = None,
                   **options) -> Callable[..., al.AudioLoader]:
    """``loader_for(source, **kwargs)``: an AudioLoader with `SMALL` features and 4-row splits, then ``options``,
    then ``train_options`` or ``eval_options`` (by ``train=``, default True), then ``kwargs``; option groups given
    at several of these levels are merged field by field (`overlay`), so ``loader_for(x, storage=al.Storage(rank=1,
    world_size=2))`` keeps the 4-row splits."""
    base = overlay({"features": SMALL, "storage": al.Storage(split_rows=4)}, options)

    def loader_for(source, **kwargs) -> al.AudioLoader:
        merged = overlay(base, (train_options if kwargs.get("train", True) else eval_options) or {})
        return al.AudioLoader(source, **overlay(merged, kwargs))

    return loader_for


#: The common test loader: batches of 8, seed 1, two workers, a 12-row shuffle buffer (min 6) in training.
loader_for = loader_factory(batch_size=8, seed=1, workers=al.Workers(num_workers=2),
                            train_options={"shuffle": al.Shuffle(buffer_size=12, min_size=6)})


def state_holding(state, key: str) -> dict | None:
    """The first nested dict of a loader's ``state`` that holds ``key`` (depth first), or None."""
    if isinstance(state, dict):
        if key in state:
            return state
        for value in state.values():
            found = state_holding(value, key)
            if found is not None:
                return found
    return None


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for name in x:
            if isinstance(x[name], torch.Tensor):
                assert torch.equal(x[name], y[name]), name
            else:
                assert x[name] == y[name], name


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # weights_only=True: the state is plain data


def assert_resumes_exactly(build, total, cuts, reference=None, *, continued=False, **resumed_options):
    """Batches cut after each of ``cuts`` and resumed (through torch.save) equal the first ``total`` of one run.

    ``build(**options)`` makes a loader; ``resumed_options`` (e.g. another num_workers) go to the resumed one.
    ``total``: a number of batches, or None for the whole pass (a loader that ends: eval, ``infinite=False``), the
    resumed loader then run to its end.
    ``reference``: the first ``total`` batches of a run the caller already took (and checked), instead of a new run.
    ``continued``: the reference is the cut run itself going on past its ``state_dict()`` (on the same iterator), so a
    state taken mid-iteration must neither disturb the run nor differ from it; needs a ``total``.
    """
    if continued and total is None:
        raise ValueError("continued=True needs a number of batches (total)")
    if reference is None and not continued:
        with build() as loader:
            reference = list(loader) if total is None else take(loader, total)
    for cut in cuts:
        with build() as first:
            it = iter(first)
            head = [next(it) for _ in range(cut)]
            state = roundtrip(first.state_dict())
            if continued:
                reference = head + [next(it) for _ in range(total - cut)]
        with build(**resumed_options) as resumed:
            resumed.load_state_dict(state)
            tail = list(resumed) if total is None else take(resumed, total - cut)
            assert_same_batches(head + tail, reference)


# -- a mix of sources ------------------------------------------------------------------------------------------

MIX_ROWS = {"a": [13, 9], "b": [20], "c": [6]}  # c is small: it runs out first
MIX_WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}


def make_sources(root: Path) -> Path:
    """Sources a, b, c (`MIX_ROWS`, other clips in each), a noise and an impulse-response source under ``root``."""
    for s, (name, files) in enumerate(MIX_ROWS.items()):
        start = 100 * s  # other clips in every source
        for f, n in enumerate(files):
            (root / name).mkdir(exist_ok=True)
            write_ipc_file(root / name / f"part-{f}.arrow", audio_table(start, n, seconds=0.4), batch_rows=4)
            start += n
    write_audio(root / "noise" / "noise.arrow", [noise_clip(i, 0.5) for i in range(3)])
    write_audio(root / "rirs" / "rirs.arrow", [impulse_response(i) for i in range(2)])
    return root


def mix_of(root: Path, stop=None, **sources) -> al.Mix:
    return al.Mix({name: (sources.get(name, str(root / name)), MIX_WEIGHTS[name]) for name in MIX_ROWS}, stop=stop)


def mix_loader(root: Path, mix: al.Mix | None = None, **kwargs) -> al.AudioLoader:
    """`loader_for` over ``mix`` (default: `mix_of` the sources under ``root``)."""
    return loader_for(mix if mix is not None else mix_of(root), **kwargs)


# -- in-memory nodes -------------------------------------------------------------------------------------------


@dataclass
class Item:
    key: Key


class CountingSource(BaseNode):
    """Yields Item(Key(i, 0)) for i < n; records how many items were pulled."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.pos = 0

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self.pos = initial_state["pos"] if initial_state else 0

    def next(self):
        if self.pos >= self.n:
            raise StopIteration
        self.pos += 1
        return Item(Key(self.pos - 1, 0))

    def get_state(self):
        return {"pos": self.pos}


def layers_of(node: BaseNode) -> list[type[BaseNode]]:
    """The types of a built chain's nodes, ``node`` first, each pulling from the next, down to the reader (its
    prefetcher's one-thread wrapper is the prefetcher's own, not a layer)."""
    layers = [type(node)]
    while not isinstance(node, ArrowShardReader):
        node = node.source.source if isinstance(node, Prefetcher) else node.source
        layers.append(type(node))
    return layers
