"""``audioloader pack SRC OUT``: turn audio files, listed by a manifest or laid out in folders, into shards.

Inputs (`audioloader.tools.layouts`; detected, or forced with ``input_format=``):
a class-folder tree; a CSV, TSV or JSONL manifest with any columns (``path`` plus,
e.g., ``text``, ``speaker``, ``label``, ``start``/``end``); a Hugging Face
``audiofolder`` (``metadata.csv``/``.jsonl``); a LibriSpeech tree (``.trans.txt``
transcripts); a Common Voice TSV. Relative paths in a manifest are relative to its folder.

Output: ``OUT/shard-00000.arrow`` (or ``.parquet``), ... written with ``ShardWriter``:
columns ``audio``, ``label`` (only when the input has labels; then also
``OUT/labels.json``, ``{name: id}``), ``path``, ``duration`` (seconds of the stored
audio, from its header, for batching by duration), then the input's own columns.
Rows come in the input's order (manifests) or sorted path order (folders), or a
seeded permutation of it, so the same inputs give the same shards, byte for byte.

By default the original encoded bytes are stored untouched. With a
``sample_rate`` and/or ``codec`` the audio is decoded (soundfile), mixed to
mono, resampled (soxr) and re-encoded as FLAC or 16-bit PCM WAV, so loading
needs no resampling and a cheaper decode. Rows that are segments of a recording
are stored cut out of it (`audioloader.tools.pack_audio`). Rows that cannot be
used (missing or undecodable files, empty transcripts, ...) are skipped, counted
per reason and listed in the `PackSummary`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from audioloader.shards.manifest_source import write_folder_manifest
from audioloader.shards.writer import FORMATS, ShardWriter

from .. import checks
from .layouts import AUDIO_EXTENSIONS, INPUT_FORMATS, collect_inputs
from .manifests import Entry, Inputs
from .pack_audio import CODECS, Packed, Skipped, forget_decoded, load_entry, reencode

__all__ = ["AUDIO_EXTENSIONS", "CODECS", "INPUT_FORMATS", "PackSummary", "add_arguments", "collect_inputs", "pack",
           "pack_dataset", "reencode", "run"]

_EXTENSION = {"ipc_file": "arrow", "parquet": "parquet"}
_SHARD_NAME = re.compile(r"^shard-\d{5,}\.(arrow|parquet)$")

Loaded = Packed | Skipped


@dataclass
class PackSummary:
    """What `pack_dataset` wrote and what it left out.

    Attributes:
        shards: the shard files, in order.
        out: the output folder.
        input_format: the input format read (`audioloader.tools.layouts.INPUT_FORMATS`).
        rows: rows written.
        seconds: total duration of the stored audio, in seconds.
        audio_bytes: total size of the stored audio, in bytes.
        columns: the shards' columns, in order.
        label_names: class names in id order, or None (no label column).
        skipped: ``{reason: rows}`` left out.
        examples: ``{reason: [the first few rows, named]}``.
    """

    shards: list[Path]
    out: Path
    input_format: str
    rows: int = 0
    seconds: float = 0.0
    audio_bytes: int = 0
    columns: list[str] = field(default_factory=list)
    label_names: list[str] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def text(self) -> str:
        """The summary as the command line prints it."""
        length = f"{self.seconds / 3600:.2f} h" if self.seconds >= 360 else f"{self.seconds:.1f} s"
        lines = [f"wrote {len(self.shards)} shard(s), {self.rows} rows, {length} of audio, "
                 f"{self.audio_bytes / 2**20:.1f} MiB, to {self.out} (input: {self.input_format})",
                 f"columns: {', '.join(self.columns)}"]
        if self.label_names is not None:
            lines.append(f"labels: {len(self.label_names)} classes, names in {self.out / 'labels.json'}")
        skipped = sum(self.skipped.values())
        if skipped:
            lines.append(f"skipped {skipped} row(s):")
            for reason, count in sorted(self.skipped.items(), key=lambda item: (-item[1], item[0])):
                more = ", ..." if count > len(self.examples[reason]) else ""
                lines.append(f"  {reason}: {count} (" + "; ".join(self.examples[reason]) + more + ")")
        else:
            lines.append("skipped: none")
        return "\n".join(lines)


# -- reading in order, in threads ----------------------------------------------------------------------


def _ordered_map(fn: Callable[[Entry], Loaded], items: Iterable[Entry], workers: int
                 ) -> Iterator[tuple[Entry, Loaded]]:
    """``(item, fn(item))`` in input order, computed by ``workers`` threads with a bounded lookahead."""
    if workers == 1:
        for item in items:
            yield item, fn(item)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="audioloader-pack")
    # A bounded window keeps memory flat (at most this many encoded files in
    # flight) while the threads stay busy.
    window: deque[tuple[Entry, Future[Loaded]]] = deque()
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
        return checks.is_integer(value) and value > 0

    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: must be one of {', '.join(FORMATS)}")
    if shard_rows is not None and not positive_int(shard_rows):
        raise ValueError(f"shard_rows={shard_rows!r}: must be a positive number of rows, or None")
    if shard_mb is not None and not (isinstance(shard_mb, (int, float)) and not isinstance(shard_mb, bool)
                                     and shard_mb > 0):
        raise ValueError(f"shard_mb={shard_mb!r}: must be a positive size in MiB, or None")
    checks.positive_integer("rows_per_batch", rows_per_batch)
    if sample_rate is not None and not positive_int(sample_rate):
        raise ValueError(f"sample_rate={sample_rate!r}: must be a positive integer in Hz, or None")
    if codec is not None and codec not in CODECS:
        raise ValueError(f"codec={codec!r}: must be one of {', '.join(CODECS)}, or None")
    checks.positive_integer("workers", workers)


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


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], **options) -> list[Path]:
    """`pack_dataset`, returning only the shard paths in order (its options are the same)."""
    return pack_dataset(src, out, **options).shards


def pack_dataset(src: str | os.PathLike[str], out: str | os.PathLike[str], *, fmt: str = "ipc_file",
                 input_format: str | None = None, shard_rows: int | None = None, shard_mb: float | None = 256.0,
                 rows_per_batch: int = 64, sample_rate: int | None = None, codec: str | None = None,
                 workers: int = 2, shuffle_seed: int | None = None, overwrite: bool = False,
                 progress: bool = True) -> PackSummary:
    """Pack the audio of ``src`` into shards in ``out``; returns what was written and what was skipped.

    Args:
        src: a folder (class folders, ``audiofolder``, LibriSpeech) or a manifest file (CSV, TSV, JSONL,
            Common Voice TSV); see `audioloader.tools.layouts`.
        out: output folder (created). Gets ``shard-00000.<arrow|parquet>``, ... and, for labeled
            input, ``labels.json``.
        fmt: ``"ipc_file"`` (Arrow IPC file, default) or ``"parquet"``.
        input_format: one of `INPUT_FORMATS`, or None to detect it from ``src``.
        shard_rows: at most this many rows per shard (``None``: no row limit).
        shard_mb: start a new shard before the audio of the current one would pass
            this many MiB (``None``: no size limit). Default 256. A shard is cut at
            whichever limit comes first; a single larger file still gets a shard.
        rows_per_batch: rows per record batch / row group (see ``ShardWriter``).
        sample_rate: re-encode at this rate in Hz (mono). Implies ``codec="flac"`` when no codec is given.
        codec: ``"flac"`` or ``"pcm16"``: re-encode (mono; at ``sample_rate`` or the file's own rate).
            With neither, the original bytes are stored untouched (segments: cut, see `cut_segment`).
        workers: threads that read/re-encode files; the row order does not depend on it.
        shuffle_seed: ``None`` keeps the input order; an int stores a permutation of it
            seeded by this value (still deterministic), so shards mix the classes.
        overwrite: replace the shards and ``labels.json`` already in ``out`` (else that is an error).
        progress: show a tqdm progress bar (only when stderr is a terminal).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: bad arguments, bad input (naming the file or manifest line, e.g. a missing path
            column or a segment that does not fit its recording), or no row left to pack.

    On any error the shards this call already wrote are removed.
    """
    _check_args(fmt, shard_rows, shard_mb, rows_per_batch, sample_rate, codec, workers)
    if sample_rate is not None and codec is None:
        codec = "flac"
    _check_out_not_in_src(Path(src), Path(out))
    inputs = collect_inputs(src, input_format)
    entries = list(inputs.entries)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(entries)
    out_dir = Path(out)
    _prepare_out(out_dir, overwrite)

    summary = PackSummary([], out_dir, inputs.format, label_names=inputs.label_names)
    max_bytes = None if shard_mb is None else int(shard_mb * 2**20)
    try:
        _write_shards(entries, inputs, out_dir, summary, fmt=fmt, shard_rows=shard_rows, max_bytes=max_bytes,
                      rows_per_batch=rows_per_batch, workers=workers,
                      load=lambda entry: load_entry(entry, sample_rate, codec), progress=progress)
        if not summary.shards:
            reasons = "; ".join(f"{r}: {n} (e.g. {inputs.skips.examples[r][0]})" for r, n in
                                inputs.skips.counts.items())
            raise ValueError(f"SRC {os.fspath(src)!r}: every row was skipped, nothing to pack ({reasons})")
        if inputs.label_names is not None:
            _write_json_atomically(out_dir / "labels.json", {name: i for i, name in enumerate(inputs.label_names)})
        # The folder's manifest: a copy of the folder anywhere starts with no listing and no request per file.
        write_folder_manifest(out_dir)
    except BaseException:
        for p in summary.shards:
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    summary.skipped, summary.examples = dict(inputs.skips.counts), dict(inputs.skips.examples)
    return summary


def _write_shards(entries: list[Entry], inputs: Inputs, out_dir: Path, summary: PackSummary, *, fmt: str,
                  shard_rows: int | None, max_bytes: int | None, rows_per_batch: int, workers: int,
                  load: Callable[[Entry], Loaded], progress: bool) -> None:
    from tqdm import tqdm

    extra = {"path": pa.string(), "duration": pa.float64(), **inputs.columns}
    labeled = inputs.label_names is not None
    # Shards whose rows are segments cut from recordings say so: the loader must not cut them again.
    metadata = {"segments": "cut"} if inputs.segments is not None else None
    bar = tqdm(total=len(entries), unit="file", desc="pack", disable=not (progress and sys.stderr.isatty()))
    writer: ShardWriter | None = None
    rows = size = 0
    loaded = _ordered_map(load, entries, workers)
    try:
        for entry, result in loaded:
            bar.update()
            if isinstance(result, Skipped):
                inputs.skips.add(result.reason, result.detail)
                continue
            full = writer is not None and (
                (shard_rows is not None and rows >= shard_rows)
                or (max_bytes is not None and size + len(result.data) > max_bytes))
            if full:
                summary.shards.append(writer.close())
                writer = None
            if writer is None:
                path = out_dir / f"shard-{len(summary.shards):05d}.{_EXTENSION[fmt]}"
                writer = ShardWriter(path, fmt, label_names=inputs.label_names, labeled=labeled,
                                     rows_per_batch=rows_per_batch, extra_columns=extra, metadata=metadata)
                writer.open()
                rows = size = 0
            writer.write(result.data, entry.label, path=entry.rel, duration=result.seconds, **entry.values)
            rows += 1
            size += len(result.data)
            summary.rows += 1
            summary.seconds += result.seconds
            summary.audio_bytes += len(result.data)
        if writer is not None:
            summary.shards.append(writer.close())
            summary.columns = list(writer.schema.names)
            writer = None
    finally:
        loaded.close()  # stops the worker threads now, not when the generator is collected
        forget_decoded()
        if writer is not None:
            writer.abort()
        bar.close()


# -- command line --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``audioloader pack`` on ``parser``."""
    parser.add_argument("src", metavar="SRC",
                        help="a folder (class sub-folders, a Hugging Face audiofolder, a LibriSpeech tree) or a "
                             "manifest (CSV, TSV, JSONL, a Common Voice TSV)")
    parser.add_argument("out", metavar="OUT",
                        help="output folder for shard-NNNNN.arrow|parquet (and labels.json for labeled input)")
    parser.add_argument("--input-format", choices=("auto", *INPUT_FORMATS), default="auto",
                        help="how to read SRC (default: auto, detected from its extension, content or layout)")
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
                        help="store the rows in a permutation seeded by SEED (default: the input's order)")
    parser.add_argument("--overwrite", action="store_true", help="replace shards already in OUT")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")


def run(args: argparse.Namespace) -> int:
    """Run ``audioloader pack`` with parsed ``args``; returns the exit status."""
    summary = pack_dataset(args.src, args.out, fmt=args.fmt, input_format=args.input_format,
                           shard_rows=args.shard_rows, shard_mb=args.shard_mb or None,
                           rows_per_batch=args.rows_per_batch, sample_rate=args.sample_rate, codec=args.codec,
                           workers=args.workers, shuffle_seed=args.shuffle_seed, overwrite=args.overwrite,
                           progress=not args.quiet)
    if not args.quiet:
        print(summary.text())
    return 0
