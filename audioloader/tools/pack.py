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
Beside them, ``OUT/_audioloader_manifest.arrow`` is the folder's dataset manifest
(`audioloader.shards.catalog.manifest`), not a shard.

At scale (`audioloader.tools.pack_journal`, `pack_store`): a journal in OUT lists
each finished shard, so a pack killed at any point continues where it stopped
when run again; ``part="K/N"`` packs one of N contiguous parts of the rows (any
scheduler can run the parts; `audioloader.tools.pack_ray` runs them on Ray);
SRC and OUT may be URLs (``s3://...``): shards are uploaded once complete.

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
import itertools
import json
import os
import random
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from audioloader.errors import OptionError
from audioloader.shards.catalog.manifest import MANIFEST_NAME
from audioloader.shards.formats.writer import FORMATS, ShardWriter
from audioloader.shards.storage.locations import is_url, local_path

from .. import checks
from .input_lists import EXAMPLES_PER_REASON, Entry, Inputs, Skips
from .layouts import AUDIO_EXTENSIONS, INPUT_FORMATS, collect_local_inputs
from .pack_audio import CODECS, Packed, Skipped, forget_decoded, load_entry, reencode
from .pack_journal import (
    Journal,
    Part,
    entries_fingerprint,
    journal_name,
    journal_part,
    parse_part,
    part_range,
    shard_name,
    shard_part,
    unfinished_parts,
)
from .pack_store import LocalOut, RemoteOut, crash_point, forget_crash_points, open_out
from .remote_inputs import remote_inputs

__all__ = ["AUDIO_EXTENSIONS", "CODECS", "INPUT_FORMATS", "PackSummary", "add_arguments", "collect_inputs", "pack",
           "pack_dataset", "reencode"]

_EXTENSION = {"ipc_file": "arrow", "parquet": "parquet"}
_OVERWRITE = ("overwrite=True", "--overwrite")

Loaded = Packed | Skipped


@dataclass
class PackSummary:
    """What `pack_dataset` wrote and what it left out.

    Attributes:
        shards: the shard files (URLs for a remote OUT), in order.
        out: the output folder (or URL).
        input_format: the input format read (`audioloader.tools.layouts.INPUT_FORMATS`).
        rows: rows written.
        seconds: total duration of the stored audio, in seconds.
        audio_bytes: total size of the stored audio, in bytes.
        columns: the shards' columns, in order.
        label_names: class names in id order, or None (no label column).
        skipped: ``{reason: rows}`` left out.
        examples: ``{reason: [the first few rows, named]}``.
        part: ``"K/N"`` for one part of a split pack, else None.
        resumed: shards an earlier, interrupted run had finished (kept, not made again).
        complete: an earlier run had finished the whole pack (or part): nothing was done.
        checked: how the stored audio was checked (a line of the summary; empty when every row was decoded).
        indexed: the metadata index was written (by a whole pack, or the last part to finish).
    """

    shards: list[Path | str]
    out: Path | str
    input_format: str
    rows: int = 0
    seconds: float = 0.0
    audio_bytes: int = 0
    columns: list[str] = field(default_factory=list)
    label_names: list[str] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    part: str | None = None
    resumed: int = 0
    indexed: bool = False
    complete: bool = False
    checked: str = ""

    def text(self) -> str:
        """The summary as the command line prints it."""
        length = f"{self.seconds / 3600:.2f} h" if self.seconds >= 360 else f"{self.seconds:.1f} s"
        what = "wrote" if self.part is None else f"part {self.part}: wrote"
        lines = [f"{what} {len(self.shards)} shard(s), {self.rows} rows, {length} of audio, "
                 f"{self.audio_bytes / 2**20:.1f} MiB, to {self.out} (input: {self.input_format})",
                 f"columns: {', '.join(self.columns)}"]
        if self.complete:
            lines.append("already complete: an earlier run finished this pack, nothing was done "
                         "(--overwrite packs it again)")
        elif self.resumed:
            lines.append(f"continued: {self.resumed} shard(s) were finished by an earlier run and kept")
        if self.part is not None and not self.indexed:
            lines.append("other parts are not finished: the part finishing last writes the index "
                         f"(or run `audioloader index {self.out}` after all parts)")
        if self.label_names is not None:
            lines.append(f"labels: {len(self.label_names)} classes, names in {self.out}/labels.json")
        skipped = sum(self.skipped.values())
        if skipped:
            lines.append(f"skipped {skipped} row(s):")
            for reason, count in sorted(self.skipped.items(), key=lambda item: (-item[1], item[0])):
                more = ", ..." if count > len(self.examples[reason]) else ""
                lines.append(f"  {reason}: {count} (" + "; ".join(self.examples[reason]) + more + ")")
        else:
            lines.append("skipped: none")
        return "\n".join([*lines, self.checked] if self.checked else lines)


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

    def bad(name: str, flag: str, value: object, rule: str) -> OptionError:
        # Named as the caller spelled it: the keyword from Python, the option on the command line.
        return OptionError(f"{name}={value!r}: {rule}", f"{flag} {value}: {rule}")

    if fmt not in FORMATS:
        raise bad("fmt", "--format", fmt, f"must be one of {', '.join(FORMATS)}")
    if shard_rows is not None and not positive_int(shard_rows):
        raise bad("shard_rows", "--shard-size", shard_rows, "must be a positive number of rows, or None")
    if shard_mb is not None and not (isinstance(shard_mb, (int, float)) and not isinstance(shard_mb, bool)
                                     and shard_mb > 0):
        raise bad("shard_mb", "--shard-mb", shard_mb, "must be a positive size in MiB, or None (0 on the command "
                  "line)")
    if not positive_int(rows_per_batch):
        raise bad("rows_per_batch", "--rows-per-batch", rows_per_batch, "must be a positive integer")
    if sample_rate is not None and not positive_int(sample_rate):
        raise bad("sample_rate", "--sample-rate", sample_rate, "must be a positive integer in Hz, or None")
    if codec is not None and codec not in CODECS:
        raise bad("codec", "--codec", codec, f"must be one of {', '.join(CODECS)}, or None")
    if not positive_int(workers):
        raise bad("workers", "--workers", workers, "must be a positive integer")


def collect_inputs(src: str | os.PathLike[str], input_format: str | None = None) -> Inputs:
    """The rows to pack (`Inputs`): `layouts.collect_local_inputs` for a folder or manifest here,
    `remote_inputs.remote_inputs` for a URL (a manifest or class folders in object storage)."""
    if is_url(os.fspath(src)):
        return remote_inputs(os.fspath(src), input_format)
    return collect_local_inputs(src, input_format)


def _check_out_not_in_src(src: str | os.PathLike[str], store: LocalOut | RemoteOut) -> None:
    # A second run would otherwise scan OUT as one more (empty) class folder.
    if is_url(os.fspath(src)) or store.remote:
        return
    src = Path(src)
    if src.is_dir() and store.folder.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"OUT {store.display!r} is inside SRC {str(src)!r}; choose an output folder outside SRC")


def _is_sibling(name_part: Part | bool | None, part: Part | None) -> bool:
    """Whether a shard or journal of ``name_part`` belongs to the same split as ``part`` (same N, or both whole)."""
    if part is None:
        return name_part is None
    return isinstance(name_part, Part) and name_part.count == part.count


def _prepare_out(store: LocalOut | RemoteOut, part: Part | None, journal: Journal, overwrite: bool) -> Journal:
    """Check OUT against this run and return the journal to continue (``journal`` itself when starting afresh).

    Shards of this pack (this part) listed in its journal are kept when the settings and the input match;
    unlisted ones (published by a run killed before it listed them) are removed, as are its temporary files.
    """
    store.create()
    names = store.names()
    own = journal_name(part)
    mine = [n for n in names if shard_part(n) == part and shard_part(n) is not False]
    foreign = ([n for n in names if shard_part(n) is not False and not _is_sibling(shard_part(n), part)]
               + [n for n in names if journal_part(n) is not False and not _is_sibling(journal_part(n), part)])
    old = store.read_text(own) if own in names else None
    if overwrite:
        # Only pack's own files go: a stale shard-00007 from a bigger earlier run would otherwise be read
        # as part of this dataset. Other parts of this split are left alone (they may be running now).
        for name in mine + foreign + ([own] if old is not None else []):
            store.remove(name)
        store.remove(MANIFEST_NAME)  # it lists the shards just removed: a loader would read them (and fail)
        old = None
    elif foreign:
        split = "a whole pack" if part is None else f"a split into {part.count} parts"
        raise OptionError.spelled(f"OUT {store.display!r} already holds shards of another pack than {split} "
                                  f"({foreign[0]}, ...); pass {{overwrite}} to replace them, or choose an empty folder",
                                  overwrite=_OVERWRITE)
    elif old is None and mine:
        raise OptionError.spelled(f"OUT {store.display!r} already holds shards ({mine[0]}, ...) without a journal to "
                                  "continue from; pass {overwrite} to replace them, or choose an empty folder",
                                  overwrite=_OVERWRITE)
    store.remove_temporaries(lambda name: name == own or (shard_part(name) == part and shard_part(name) is not False))
    if old is None:
        return journal
    earlier = Journal.from_json(old, f"{store.display}/{own}")
    difference = earlier.difference(journal.settings, journal.input)
    if difference is not None:
        raise OptionError.spelled(f"OUT {store.display!r} already holds shards of a pack made with {{difference}}: "
                                  "run again with the same arguments to continue it, or pass {overwrite} to replace "
                                  "them", difference=difference, overwrite=_OVERWRITE)
    listed = {shard["name"] for shard in earlier.shards}
    for name in mine:
        if name not in listed:
            store.remove(name)
    return earlier


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], **options) -> list[Path | str]:
    """`pack_dataset`, returning only the shard paths in order (its options are the same)."""
    return pack_dataset(src, out, **options).shards


def pack_dataset(src: str | os.PathLike[str], out: str | os.PathLike[str], *, fmt: str = "ipc_file",
                 input_format: str | None = None, shard_rows: int | None = None, shard_mb: float | None = 256.0,
                 rows_per_batch: int = 64, sample_rate: int | None = None, codec: str | None = None,
                 workers: int = 2, shuffle_seed: int | None = None, part: str | tuple[int, int] | None = None,
                 overwrite: bool = False, verify: bool = False, progress: bool = True,
                 on_progress: Callable[[int, int], None] | None = None) -> PackSummary:
    """Pack the audio of ``src`` into shards in ``out``; returns what was written and what was skipped.

    Args:
        src: a folder (class folders, ``audiofolder``, LibriSpeech) or a manifest file (CSV, TSV, JSONL,
            Common Voice TSV); see `audioloader.tools.layouts`. A URL (``s3://bucket/list.csv``,
            ``s3://bucket/classes/``) reads a manifest or a class-folder tree from object storage; a manifest's
            paths may be URLs, and relative ones are relative to its folder, local or remote.
        out: output folder (created), or a URL prefix (``s3://bucket/data``). Gets ``shard-00000.<arrow|parquet>``,
            ..., the journal ``_audioloader_pack.json``, the metadata index and, for labeled input, ``labels.json``.
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
        workers: threads that read/re-encode files; the row order does not depend on it. At most
            ``4 * workers`` files are in memory at once (read ahead of the writer), plus one record batch.
        shuffle_seed: ``None`` keeps the input order; an int stores a permutation of it
            seeded by this value (still deterministic), so shards mix the classes.
        part: ``"K/N"``: pack only the K-th (from 0) of N contiguous parts of the rows, into shards named
            ``shard-pKofN-00000...`` (`audioloader.tools.pack_journal`). Every part can run anywhere, at any
            time; the part that finishes last writes the metadata index (or run ``audioloader index OUT``).
        overwrite: replace the shards and journal of an earlier pack in ``out`` (else a pack with other
            arguments is an error, and one with the same arguments is continued where it stopped).
        verify: decode every frame of each file stored as it is (no codec), as the loader will, and leave out
            those that fail (without it, only the header is read: a truncated file can pass). Slower: a decode
            of all the audio. Re-encoded and cut rows are decoded anyway.
        progress: show a tqdm progress bar (only when stderr is a terminal).
        on_progress: called as ``on_progress(done, total)`` with this pack's (part's) input rows done (packed
            or skipped, finished ones of an earlier run included) and in all, at the start and after each row.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: bad arguments, bad input (naming the file or manifest line, e.g. a missing path
            column or a segment that does not fit its recording), no row left to pack, or an unfinished
            pack in ``out`` made with other arguments (naming the argument).

    Interrupted (killed, Ctrl-C, a full disk, a lost connection), the shards finished so far are kept and
    listed in the journal, and the same call continues after them. Stopped by bad input (a ValueError),
    this pack's shards are removed: the input has to change, and with it the shards.
    """
    _check_args(fmt, shard_rows, shard_mb, rows_per_batch, sample_rate, codec, workers)
    part = parse_part(part)
    if sample_rate is not None and codec is None:
        codec = "flac"
    src, out = (local_path(os.fspath(p)) or os.fspath(p) for p in (src, out))  # file:// URLs: their paths
    store = open_out(out)
    try:
        _check_out_not_in_src(src, store)
        inputs = collect_inputs(src, input_format)
        settings = {"input_format": inputs.format, "fmt": fmt, "shard_rows": shard_rows, "shard_mb": shard_mb,
                    "rows_per_batch": rows_per_batch, "sample_rate": sample_rate, "codec": codec,
                    "shuffle_seed": shuffle_seed, "part": None if part is None else str(part),
                    "verify": True if verify and codec is None else None}
        fingerprint = entries_fingerprint(inputs.entries, inputs.label_names, inputs.columns)
        entries = list(inputs.entries)
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(entries)
        journal = _prepare_out(store, part, Journal(settings, {"rows": len(entries), "fingerprint": fingerprint}),
                               overwrite)
        if not journal.shards and not journal.done:  # listed from the start: a run stopped before its first shard
            store.write_text(journal_name(part), journal.to_json())  # is continued, and a loader sees it unfinished
        forget_crash_points()
        summary = _pack_part(entries, inputs, store, journal, part, fmt=fmt, shard_rows=shard_rows,
                             max_bytes=None if shard_mb is None else int(shard_mb * 2**20),
                             rows_per_batch=rows_per_batch, workers=workers, progress=progress,
                             on_progress=on_progress, load=lambda entry: load_entry(entry, sample_rate, codec, verify))
        if codec is None and not verify:
            summary.checked = ("checked: each file's header only, its frames were not decoded (a truncated file "
                               "can have a good header); --verify decodes every row and leaves out those that fail")
        return summary
    except ValueError:
        store.discard_if_empty()  # refused: no empty OUT left behind
        raise
    finally:
        store.close()


def _pack_part(entries: list[Entry], inputs: Inputs, store: LocalOut | RemoteOut, journal: Journal,
               part: Part | None, **options) -> PackSummary:
    """Write the shards of ``part`` from where ``journal`` stopped; finish with labels, journal and index."""
    start, stop = part_range(len(entries), part)
    # Rows left out while reading the source are the whole input's: reported once, by part 0.
    collected = inputs.skips if part is None or part.index == 0 else Skips()
    loaded = Skips()
    journal.restore_skips(loaded)
    summary = PackSummary([store.location(s["name"]) for s in journal.shards],
                          store.folder if not store.remote else store.display, inputs.format,
                          label_names=inputs.label_names, part=None if part is None else str(part),
                          resumed=len(journal.shards), complete=journal.done)
    summary.rows = sum(s["rows"] for s in journal.shards)
    summary.seconds = sum(s["seconds"] for s in journal.shards)
    summary.audio_bytes = sum(s["audio_bytes"] for s in journal.shards)
    summary.columns = list(journal.columns)
    position = stop if journal.done else start if journal.next_position is None else journal.next_position
    if options["on_progress"] is not None:
        options["on_progress"](position - start, stop - start)
    if not journal.done:
        try:
            _write_shards(entries, position, stop, inputs, store, journal, summary, loaded, part=part,
                          **options)
            if part is None and not summary.shards:
                skips = _merged(collected, loaded)
                reasons = "; ".join(f"{r}: {n} (e.g. {skips.examples[r][0]})" for r, n in skips.counts.items())
                raise ValueError(f"every row was skipped, nothing to pack ({reasons})")
        except ValueError:
            # Bad input: the input must change, and the shards with it.
            for name in [s["name"] for s in journal.shards] + [journal_name(part)]:
                store.remove(name)
            raise
        journal.record_skips(loaded)
        if inputs.label_names is not None:
            store.write_text("labels.json", json.dumps({name: i for i, name in enumerate(inputs.label_names)},
                                                       indent=2, ensure_ascii=False) + "\n")
        journal.done = True
        store.write_text(journal_name(part), journal.to_json())
        # The dataset manifest (a start with no listing and no request per file), once the journals say done (the
        # index refuses an unfinished pack): a whole pack's, or the last part to finish indexes every part's shards.
        if part is None or not _unfinished(store):
            store.write_index()
            summary.indexed = True
    summary.indexed = summary.indexed or part is None
    skips = _merged(collected, loaded)
    summary.skipped, summary.examples = dict(skips.counts), dict(skips.examples)
    return summary


def _unfinished(store: LocalOut | RemoteOut) -> list[str]:
    names = [n for n in store.names() if journal_part(n) is not False]
    return unfinished_parts({n: store.read_text(n) or "{}" for n in names})[1]


def _merged(first: Skips, second: Skips) -> Skips:
    merged = Skips()
    for skips in (first, second):
        for reason, count in skips.counts.items():
            merged.counts[reason] = merged.counts.get(reason, 0) + count
            examples = merged.examples.setdefault(reason, [])
            examples += skips.examples.get(reason, [])[:max(0, EXAMPLES_PER_REASON - len(examples))]
    return merged


def _write_shards(entries: list[Entry], position: int, stop: int, inputs: Inputs, store: LocalOut | RemoteOut,
                  journal: Journal, summary: PackSummary, skips: Skips, *, part: Part | None, fmt: str,
                  shard_rows: int | None, max_bytes: int | None, rows_per_batch: int, workers: int,
                  load: Callable[[Entry], Loaded], progress: bool, on_progress: Callable[[int, int], None] | None
                  ) -> None:
    """Pack ``entries[position:stop]`` into shards numbered on from the journal's; publish and list each."""
    from tqdm import tqdm

    extra = {"path": pa.string(), "duration": pa.float64(), **inputs.columns}
    labeled = inputs.label_names is not None
    # Shards whose rows are segments cut from recordings say so: the loader must not cut them again.
    metadata = {"segments": "cut"} if inputs.segments is not None else None
    start = part_range(len(entries), part)[0]
    bar = tqdm(total=stop - start, initial=position - start, unit="file", desc="pack" if part is None else
               f"pack {part}", disable=not (progress and sys.stderr.isatty()))
    writer: ShardWriter | None = None
    shard = {"rows": 0, "seconds": 0.0, "audio_bytes": 0}

    def finish(end: int) -> None:
        """Publish the open shard (its rows end before input position ``end``), then list it in the journal."""
        location = store.publish(writer.close())
        crash_point("shard")
        journal.shards.append({"name": writer.path.name, "end": end, **shard})
        journal.columns = list(writer.schema.names)
        journal.record_skips(skips)
        store.write_text(journal_name(part), journal.to_json())
        crash_point("journal")
        summary.shards.append(location)
        summary.columns = journal.columns

    loaded = _ordered_map(load, itertools.islice(entries, position, stop), workers)
    try:
        for at, (entry, result) in enumerate(loaded, start=position):
            bar.update()
            if on_progress is not None:
                on_progress(at + 1 - start, stop - start)
            if isinstance(result, Skipped):
                skips.add(result.reason, result.detail)
                continue
            if writer is not None and (
                    (shard_rows is not None and shard["rows"] >= shard_rows)
                    or (max_bytes is not None and shard["audio_bytes"] + len(result.data) > max_bytes)):
                finish(at)
                writer = None
            if writer is None:
                name = shard_name(part, len(journal.shards), _EXTENSION[fmt])
                writer = ShardWriter(store.staging / name, fmt, label_names=inputs.label_names, labeled=labeled,
                                     rows_per_batch=rows_per_batch, extra_columns=extra, metadata=metadata)
                writer.open()
                shard = {"rows": 0, "seconds": 0.0, "audio_bytes": 0}
            writer.write(result.data, entry.label, path=entry.rel, duration=result.seconds, **entry.values)
            crash_point("row")
            shard["rows"] += 1
            shard["seconds"] += result.seconds
            shard["audio_bytes"] += len(result.data)
            summary.rows += 1
            summary.seconds += result.seconds
            summary.audio_bytes += len(result.data)
        if writer is not None:
            finish(stop)
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
                             "manifest (CSV, TSV, JSONL, a Common Voice TSV); a URL (s3://...) for a manifest or "
                             "class folders in object storage")
    parser.add_argument("out", metavar="OUT",
                        help="output folder or URL prefix (s3://bucket/data): shard-NNNNN.arrow|parquet, "
                             "labels.json for labeled input, _audioloader_pack.json (the journal: an unfinished pack "
                             "there is continued) and _audioloader_manifest.arrow, the folder's dataset manifest (not "
                             "shards: the leading underscore keeps pyarrow.dataset and Spark from reading them as "
                             "data; a glob of your own should name the shards, e.g. OUT/shard-*.arrow, not "
                             "OUT/*.arrow)")
    parser.add_argument("--input-format", choices=("auto", *INPUT_FORMATS), default="auto",
                        help="how to read SRC (default: auto, detected from its extension, content or layout)")
    parser.add_argument("--from", dest="container", choices=("auto", "webdataset", "nemo", "shar", "files"),
                        default=None, help="SRC is audio in a container: WebDataset tars (.tar, .tar.gz), a NeMo "
                        "tarred manifest (with --tars), a Lhotse Shar folder, or audio files (a folder, or a "
                        "manifest naming them); auto: detected (a folder of tars, or of Shar cuts, is detected "
                        "without --from)")
    parser.add_argument("--tars", default=None, metavar="PATTERN",
                        help="with --from nemo: the tars, e.g. 'audio_{0..127}.tar' (NeMo's tarred_audio_filepaths)")
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
    parser.add_argument("--part", default=None, metavar="K/N",
                        help="pack only part K (from 0) of N contiguous parts of the rows, as shard-pKofN-*.arrow; "
                             "run all N anywhere (SLURM array, jobs, a loop), the last to finish writes the index")
    parser.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                        help="run the parts as Ray tasks: on the cluster at ADDRESS (host:port), or, without "
                             "ADDRESS, the one `ray start` runs here (else a local one); needs audioloader[ray]")
    parser.add_argument("--parts", type=int, default=None, metavar="N",
                        help="with --ray: split into N parts (default: the cluster's CPUs); keep N to resume")
    parser.add_argument("--verify", action="store_true",
                        help="decode every frame of each file stored as it is, and leave out those that fail "
                             "(default: read each file's header only; re-encoding decodes anyway)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the shards of an earlier pack in OUT (without it, a pack with the same "
                             "arguments continues where it stopped, and one with other arguments is refused)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
