"""``audioloader pack SRC OUT``: turn a folder of audio files (or a CSV list) into shards.

Inputs:

- a folder with one sub-folder per class (``SRC/dog/a.wav``, ``SRC/cat/x/b.flac``):
  the labels are the sorted sub-folder names; audio files are found recursively
  by extension (see ``AUDIO_EXTENSIONS``); hidden files and folders are skipped;
- a CSV file with a header containing ``path`` and ``label`` columns: ``label``
  is a class name, or an integer class id when *every* label is an integer;
  relative paths are relative to the CSV file's folder.

Output: ``OUT/shard-00000.arrow`` (or ``.parquet``), ... written with
``ShardWriter`` (columns ``audio``, ``label``, ``path``, ``duration``: seconds of
the stored audio, from its header, for batching by duration) plus ``OUT/labels.json``
(``{name: id}``). Rows are in sorted input order (or a seeded permutation of it),
so the same inputs give the same shards, byte for byte.

By default the original encoded bytes are stored untouched. With a
``sample_rate`` and/or ``codec`` the audio is decoded (soundfile), mixed to
mono, resampled (soxr) and re-encoded as FLAC or 16-bit PCM WAV, so loading
needs no resampling and a cheaper decode.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import random
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from audioloader.dsp.audio import probe_seconds
from audioloader.errors import DecodeError
from audioloader.shards.index import write_index
from audioloader.shards.writer import FORMATS, ShardWriter

__all__ = ["AUDIO_EXTENSIONS", "CODECS", "PackItem", "add_arguments", "collect_inputs", "pack", "reencode",
           "run"]

#: File name suffixes (lower case) treated as audio when scanning a class folder.
AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff",
                              ".aifc", ".au", ".snd", ".w64", ".rf64", ".caf"})
#: Re-encoding targets: lossless FLAC (16 bit) or WAV PCM16.
CODECS = ("flac", "pcm16")
_EXTENSION = {"ipc_file": "arrow", "parquet": "parquet"}
_SHARD_NAME = re.compile(r"^shard-\d{5,}\.(arrow|parquet)$")
_INT_LABEL = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class PackItem:
    """One input file.

    Attributes:
        file: where to read it (absolute, or relative to the working directory).
        rel: the path stored in the ``path`` column (relative to SRC or to the CSV's folder).
        label: class id.
    """

    file: Path
    rel: str
    label: int


# -- inputs --------------------------------------------------------------------------------------------


def _is_hidden(name: str) -> bool:
    # Also skips macOS "._x.wav" resource forks, which have an audio suffix but no audio.
    return name.startswith(".")


def _audio_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        found += [Path(root, f) for f in files
                  if not _is_hidden(f) and Path(f).suffix.lower() in AUDIO_EXTENSIONS]
    return found


def _from_class_folders(src: Path) -> tuple[list[PackItem], list[str]]:
    entries = sorted(p for p in src.iterdir() if not _is_hidden(p.name))
    classes = [p for p in entries if p.is_dir()]
    stray = [p for p in entries if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS]
    if stray:
        raise ValueError(f"{stray[0]}: audio file directly in SRC {str(src)!r}; put each file in a "
                         "sub-folder named after its class (SRC/<class>/file), or list files in a CSV")
    if not classes:
        raise ValueError(f"SRC {str(src)!r} has no class sub-folders; expected SRC/<class>/<audio files> "
                         "or a CSV file with a path,label header")
    names = [c.name for c in classes]
    items = []
    for label, folder in enumerate(classes):
        for f in _audio_files(folder):
            items.append(PackItem(file=f, rel=f.relative_to(src).as_posix(), label=label))
    if not items:
        raise ValueError(f"SRC {str(src)!r}: no audio files in its class sub-folders {names} "
                         f"(looked for {', '.join(sorted(AUDIO_EXTENSIONS))})")
    items.sort(key=lambda it: it.rel)
    return items, names


def _csv_rows(csv_path: Path) -> Iterator[tuple[int, str, str]]:
    """Yields ``(line number, path, label)``; raises naming the line for a malformed row."""
    with open(csv_path, newline="", encoding="utf-8-sig") as fh:  # -sig: tolerate an Excel BOM
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{csv_path}: empty CSV; expected a header line 'path,label'")
        columns = [h.strip() for h in header]
        missing = [c for c in ("path", "label") if c not in columns]
        if missing:
            raise ValueError(f"{csv_path}, line 1: header {columns} lacks column(s) {missing}; "
                             "expected a header line 'path,label'")
        ipath, ilabel = columns.index("path"), columns.index("label")
        for row in reader:
            line = reader.line_num
            if not row or all(not v.strip() for v in row):
                continue  # blank line
            if len(row) <= max(ipath, ilabel):
                raise ValueError(f"{csv_path}, line {line}: {len(row)} value(s) {row}, but the header has "
                                 f"{len(columns)} columns {columns}")
            path, label = row[ipath].strip(), row[ilabel].strip()
            if not path:
                raise ValueError(f"{csv_path}, line {line}: empty 'path'")
            if not label:
                raise ValueError(f"{csv_path}, line {line}: empty 'label' for {path!r}")
            yield line, path, label


def _from_csv(csv_path: Path) -> tuple[list[PackItem], list[str]]:
    rows = list(_csv_rows(csv_path))
    if not rows:
        raise ValueError(f"{csv_path}: no rows after the header")
    base = csv_path.parent
    if all(_INT_LABEL.match(label) for _, _, label in rows):
        # Integer ids are used as given; names are their decimal strings so that
        # len(label_names) is still the number of classes.
        ids = [int(label) for _, _, label in rows]
        for (line, _, label), i in zip(rows, ids, strict=True):
            if i < 0:
                raise ValueError(f"{csv_path}, line {line}: label {label!r} is negative; "
                                 "class ids must be >= 0")
        names = [str(i) for i in range(max(ids) + 1)]
    else:
        names = sorted({label for _, _, label in rows})
        index = {name: i for i, name in enumerate(names)}
        ids = [index[label] for _, _, label in rows]
    items = []
    for (line, path, _), label in zip(rows, ids, strict=True):
        file = Path(path) if Path(path).is_absolute() else base / path
        if not file.is_file():
            raise ValueError(f"{csv_path}, line {line}: audio file {str(file)!r} does not exist")
        items.append(PackItem(file=file, rel=Path(path).as_posix(), label=label))
    # The CSV's own row order is kept: it is already deterministic, and may be deliberate.
    return items, names


def collect_inputs(src: str | os.PathLike[str]) -> tuple[list[PackItem], list[str]]:
    """Find the input files of ``src`` (class-folder tree or CSV), sorted by stored path.

    Returns:
        ``(items, label_names)`` with ``label_names[i]`` the name of class id ``i``.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: no audio files, a stray file, a malformed CSV (the message names the file/line).
    """
    path = Path(src)
    if not path.exists():
        raise FileNotFoundError(f"SRC {str(path)!r} does not exist; give a class-folder tree or a CSV file")
    if path.is_dir():
        return _from_class_folders(path)
    if path.suffix.lower() in AUDIO_EXTENSIONS:
        raise ValueError(f"SRC {str(path)!r} is an audio file; give the folder of class sub-folders or a CSV")
    return _from_csv(path)


# -- re-encoding ---------------------------------------------------------------------------------------


def reencode(path: str | os.PathLike[str], sample_rate: int | None, codec: str) -> bytes:
    """Decode ``path``, mix to mono, resample to ``sample_rate`` Hz (``None``: keep), encode.

    Args:
        path: an audio file soundfile can read.
        sample_rate: target rate in Hz, or ``None`` to keep the file's rate.
        codec: ``"flac"`` (FLAC, 16 bit) or ``"pcm16"`` (WAV, 16-bit PCM).

    Returns:
        The encoded bytes.

    Raises:
        ValueError: the file cannot be decoded or has no audio frames (the message names it).
    """
    import numpy as np
    import soundfile as sf
    import soxr

    try:
        signal, rate = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises LibsndfileError/RuntimeError/TypeError by file type
        raise ValueError(f"{os.fspath(path)}: cannot decode audio to re-encode it: {e}") from e
    if signal.shape[0] == 0:
        raise ValueError(f"{os.fspath(path)}: no audio frames (empty file); remove it "
                         "or pack without re-encoding")
    mono = signal.mean(axis=1) if signal.shape[1] > 1 else signal[:, 0]
    if sample_rate is not None and rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate)
        rate = sample_rate
    # Resampling can overshoot full scale; integer PCM would wrap around, so clip.
    mono = np.clip(mono, -1.0, 1.0)
    buf = io.BytesIO()
    fmt = "FLAC" if codec == "flac" else "WAV"
    sf.write(buf, mono, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def _load(item: PackItem, sample_rate: int | None, codec: str | None) -> bytes:
    if codec is None:
        try:
            return item.file.read_bytes()
        except OSError as e:
            raise OSError(f"{item.file}: cannot read: {e.strerror or e}") from e
    return reencode(item.file, sample_rate, codec)


def _ordered_map(fn: Callable[[PackItem], bytes], items: Iterable[PackItem], workers: int
                 ) -> Iterator[tuple[PackItem, bytes]]:
    """``(item, fn(item))`` in input order, computed by ``workers`` threads with a bounded lookahead."""
    if workers == 1:
        for item in items:
            yield item, fn(item)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="audioloader-pack")
    # A bounded window keeps memory flat (at most this many encoded files in
    # flight) while the threads stay busy.
    window: deque[tuple[PackItem, Future[bytes]]] = deque()
    limit = 4 * workers
    try:
        for item in items:
            window.append((item, pool.submit(fn, item)))
            if len(window) >= limit:
                done, fut = window.popleft()
                yield done, fut.result()
        while window:
            done, fut = window.popleft()
            yield done, fut.result()
    finally:
        for _, fut in window:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


# -- writing -------------------------------------------------------------------------------------------


def _check_args(fmt: str, shard_rows: int | None, shard_mb: float | None, rows_per_batch: int,
                sample_rate: int | None, codec: str | None, workers: int) -> None:
    def positive_int(value: object) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value > 0

    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: must be one of {', '.join(FORMATS)}")
    if shard_rows is not None and not positive_int(shard_rows):
        raise ValueError(f"shard_rows={shard_rows!r}: must be a positive number of rows, or None")
    if shard_mb is not None and not (isinstance(shard_mb, (int, float)) and not isinstance(shard_mb, bool)
                                     and shard_mb > 0):
        raise ValueError(f"shard_mb={shard_mb!r}: must be a positive size in MiB, or None")
    if not positive_int(rows_per_batch):
        raise ValueError(f"rows_per_batch={rows_per_batch!r}: must be a positive integer")
    if sample_rate is not None and not positive_int(sample_rate):
        raise ValueError(f"sample_rate={sample_rate!r}: must be a positive integer in Hz, or None")
    if codec is not None and codec not in CODECS:
        raise ValueError(f"codec={codec!r}: must be one of {', '.join(CODECS)}, or None")
    if not positive_int(workers):
        raise ValueError(f"workers={workers!r}: must be a positive integer")


def _check_out_not_in_src(src: Path, out: Path) -> None:
    # A second run would otherwise scan OUT as one more (empty) class folder.
    if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"OUT {str(out)!r} is inside SRC {str(src)!r}; choose an output folder outside SRC")


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT {str(out)!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    old = sorted(p for p in out.iterdir() if _SHARD_NAME.match(p.name) or p.name == "labels.json")
    if old and not overwrite:
        raise ValueError(f"OUT {str(out)!r} already holds shards ({old[0].name}, ...); pass overwrite=True "
                         "(--overwrite) to replace them, or choose an empty folder")
    # Only our own files go: a stale shard-00007 from a bigger earlier run would
    # otherwise be read as part of this dataset.
    for p in old:
        p.unlink()


def _write_json_atomically(path: Path, doc: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], *, fmt: str = "ipc_file",
         shard_rows: int | None = None, shard_mb: float | None = 256.0, rows_per_batch: int = 64,
         sample_rate: int | None = None, codec: str | None = None, workers: int = 2,
         shuffle_seed: int | None = None, overwrite: bool = False, progress: bool = True) -> list[Path]:
    """Pack the audio files of ``src`` into shards in ``out``; returns the shard paths in order.

    Args:
        src: a folder with one sub-folder per class, or a CSV with a ``path,label`` header.
        out: output folder (created). Gets ``shard-00000.<arrow|parquet>``, ... and ``labels.json``.
        fmt: ``"ipc_file"`` (Arrow IPC file, default) or ``"parquet"``.
        shard_rows: at most this many rows per shard (``None``: no row limit).
        shard_mb: start a new shard before the audio of the current one would pass
            this many MiB (``None``: no size limit). Default 256. A shard is cut at
            whichever limit comes first; a single larger file still gets a shard.
        rows_per_batch: rows per record batch / row group (see ``ShardWriter``).
        sample_rate: re-encode at this rate in Hz (mono). Implies ``codec="flac"`` when no codec is given.
        codec: ``"flac"`` or ``"pcm16"``: re-encode (mono; at ``sample_rate`` or the file's own rate).
            With neither, the original bytes are stored untouched.
        workers: threads that read/re-encode files; the row order does not depend on it.
        shuffle_seed: ``None`` keeps sorted path order; an int stores a permutation of it
            seeded by this value (still deterministic), so shards mix the classes.
        overwrite: replace the shards and ``labels.json`` already in ``out`` (else that is an error).
        progress: show a tqdm progress bar (only when stderr is a terminal).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: bad arguments, bad input (naming the file or CSV line), or an undecodable
            file while re-encoding (naming it).
        OSError: a file cannot be read.

    On any error the shards this call already wrote are removed.
    """
    _check_args(fmt, shard_rows, shard_mb, rows_per_batch, sample_rate, codec, workers)
    if sample_rate is not None and codec is None:
        codec = "flac"
    _check_out_not_in_src(Path(src), Path(out))
    items, label_names = collect_inputs(src)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    out_dir = Path(out)
    _prepare_out(out_dir, overwrite)

    max_bytes = None if shard_mb is None else int(shard_mb * 2**20)
    written: list[Path] = []
    try:
        _write_shards(items, out_dir, written, fmt=fmt, label_names=label_names, shard_rows=shard_rows,
                      max_bytes=max_bytes, rows_per_batch=rows_per_batch, workers=workers,
                      load=lambda it: _load(it, sample_rate, codec), progress=progress)
        _write_json_atomically(out_dir / "labels.json", {name: i for i, name in enumerate(label_names)})
        if written:  # the folder's metadata index: a remote copy is constructed from it in a few requests
            write_index(out_dir, portable=True)
    except BaseException:
        for p in written:
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    return written


def _write_shards(items: list[PackItem], out_dir: Path, written: list[Path], *, fmt: str,
                  label_names: list[str], shard_rows: int | None, max_bytes: int | None,
                  rows_per_batch: int, workers: int, load: Callable[[PackItem], bytes],
                  progress: bool) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(items), unit="file", desc="pack", disable=not (progress and sys.stderr.isatty()))
    writer: ShardWriter | None = None
    rows = size = 0
    loaded = _ordered_map(load, items, workers)
    try:
        for item, data in loaded:
            full = writer is not None and (
                (shard_rows is not None and rows >= shard_rows)
                or (max_bytes is not None and size + len(data) > max_bytes))
            if full:
                written.append(writer.close())
                writer = None
            if writer is None:
                path = out_dir / f"shard-{len(written):05d}.{_EXTENSION[fmt]}"
                writer = ShardWriter(path, fmt, label_names=label_names, rows_per_batch=rows_per_batch,
                                     extra_columns={"path": pa.string(), "duration": pa.float64()})
                writer.open()
                rows = size = 0
            writer.write(data, item.label, path=item.rel, duration=_seconds(data))
            rows += 1
            size += len(data)
            bar.update()
        if writer is not None:
            written.append(writer.close())
            writer = None
    finally:
        loaded.close()  # stops the worker threads now, not when the generator is collected
        if writer is not None:
            writer.abort()
        bar.close()


def _seconds(data: bytes) -> float | None:
    """Duration of encoded audio from its header, or None (null) when it cannot be read."""
    try:
        return probe_seconds(data)
    except DecodeError:
        return None


# -- command line --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``audioloader pack`` on ``parser``."""
    parser.add_argument("src", metavar="SRC",
                        help="folder with one sub-folder per class, or a CSV file with a path,label header")
    parser.add_argument("out", metavar="OUT",
                        help="output folder for shard-NNNNN.arrow|parquet and labels.json")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, default="ipc_file",
                        help="shard format (default: ipc_file, the Arrow IPC file format, memory-mappable)")
    parser.add_argument("--shard-size", dest="shard_rows", type=int, default=None, metavar="ROWS",
                        help="at most ROWS rows per shard (default: no row limit)")
    parser.add_argument("--shard-mb", type=float, default=256.0, metavar="MIB",
                        help="cut a shard before its audio passes MIB MiB (default: 256; 0 = no size limit)")
    parser.add_argument("--rows-per-batch", type=int, default=64, metavar="ROWS",
                        help="rows per record batch / row group, the unit of reading (default: 64)")
    parser.add_argument("--sample-rate", type=int, default=None, metavar="HZ",
                        help="re-encode: decode, mix to mono, resample to HZ (soxr); implies --codec flac")
    parser.add_argument("--codec", choices=CODECS, default=None,
                        help="re-encode as FLAC or WAV PCM16, mono (default: store the original bytes)")
    parser.add_argument("--workers", type=int, default=2,
                        help="threads reading/re-encoding files (default: 2)")
    parser.add_argument("--shuffle-seed", type=int, default=None, metavar="SEED",
                        help="store the files in a permutation seeded by SEED (default: sorted path order)")
    parser.add_argument("--overwrite", action="store_true", help="replace shards already in OUT")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")


def run(args: argparse.Namespace) -> int:
    """Run ``audioloader pack`` with parsed ``args``; returns the exit status."""
    shards = pack(args.src, args.out, fmt=args.fmt, shard_rows=args.shard_rows,
                  shard_mb=args.shard_mb or None, rows_per_batch=args.rows_per_batch,
                  sample_rate=args.sample_rate, codec=args.codec, workers=args.workers,
                  shuffle_seed=args.shuffle_seed, overwrite=args.overwrite, progress=not args.quiet)
    if not args.quiet:
        total = sum(p.stat().st_size for p in shards)
        rows = sum(_count_rows(p) for p in shards)
        print(f"wrote {len(shards)} shard(s), {rows} rows, {total / 2**20:.1f} MiB, to {args.out} "
              f"(labels in {Path(args.out) / 'labels.json'})")
    return 0


def _count_rows(shard: Path) -> int:
    """Rows in a shard, from its footer (no data is read)."""
    if shard.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(shard).metadata.num_rows
    with pa.memory_map(str(shard)) as source:
        return pa.ipc.open_file(source).count_rows()
