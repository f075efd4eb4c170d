"""``audioloader pack --from webdataset|nemo|shar|files SRC OUT``: audio already in a container, packed into Arrow
IPC (or Parquet) shards for the fastest reads.

The rows are read through the same readers that read these layouts in place
(`audioloader.shards.formats.tar_format`, `audioloader.shards.sources.tarred_sets`), in their order
(file by file, each file's rows in order), so the packed shards hold the same rows,
the same columns and the same encoded bytes as reading in place; only compressed
tars (``.tar.gz``, ``.tgz``), which cannot be read in place, are first decompressed
into a temporary folder. Columns: ``audio``, ``label`` (a WebDataset ``.cls``, or an
integer ``label`` field), then every other column of the source. Beside the shards,
``OUT/_audioloader_manifest.arrow`` (`audioloader.shards.catalog.manifest`).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from audioloader.errors import OptionError
from audioloader.shards.catalog.manifest_source import write_folder_manifest
from audioloader.shards.dataset.shard_dataset import ShardDataset
from audioloader.shards.formats.writer import ShardWriter
from audioloader.shards.sources.tarred_sets import AudioFiles, LhotseShar, NemoTarred

#: What ``--from`` accepts (``auto``: `detect_container`).
CONTAINERS = ("webdataset", "nemo", "shar", "files")


@dataclass
class ContainerSummary:
    """What `pack_from` wrote: ``shards`` (paths), ``rows``, ``audio_bytes``, ``columns``, ``source`` (the layout)."""

    shards: list[Path]
    out: Path
    source: str
    rows: int = 0
    audio_bytes: int = 0
    columns: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # rows without audio: "file, row"

    def text(self) -> str:
        lines = [f"wrote {len(self.shards)} shard(s), {self.rows} rows, {self.audio_bytes / 2**20:.1f} MiB of audio, "
                 f"to {self.out} (input: {self.source})", f"columns: {', '.join(self.columns)}"]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} row(s) without audio: {'; '.join(self.skipped[:5])}"
                         + (", ..." if len(self.skipped) > 5 else ""))
        return "\n".join(lines)


def detect_container(src: str) -> str | None:
    """The container layout of a local folder ``src``: ``shar`` (``cuts.NNNNNN.jsonl.gz``), ``webdataset``
    (``*.tar``, ``*.tar.gz``); None for anything else (the other inputs of ``audioloader pack``)."""
    path = Path(src)
    if not path.is_dir():
        return None
    names = [p.name for p in path.iterdir()]
    if any(re.fullmatch(r"cuts\.\d+\.jsonl(\.gz)?", n) for n in names):
        return "shar"
    if any(n.endswith((".tar", ".tar.gz", ".tgz")) for n in names):
        return "webdataset"
    return None


def _decompressed(src: Path, scratch: Path) -> Path:
    """``src`` (a folder of tars) with its ``.tar.gz`` / ``.tgz`` decompressed into ``scratch`` (plain tars
    linked beside them); ``src`` itself when it has none."""
    tars = sorted(p for p in src.rglob("*") if p.is_file() and p.name.endswith((".tar", ".tar.gz", ".tgz")))
    if not any(p.name.endswith((".tar.gz", ".tgz")) for p in tars):
        return src
    for p in tars:
        relative = p.relative_to(src).as_posix()
        target = scratch / re.sub(r"\.(tar\.gz|tgz)$", ".tar", relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.endswith(".tar"):
            os.symlink(p, target)
        else:
            with gzip.open(p, "rb") as f, open(target, "wb") as out:
                shutil.copyfileobj(f, out, 4 * 2**20)
    return scratch


def _source(src: str, kind: str, tars: str | None, scratch: Path) -> Any:
    if kind == "nemo":
        if tars is None:
            raise OptionError.spelled("{tars}: --from nemo needs the tars, e.g. 'audio_{{0..127}}.tar'",
                                      tars=("tars=", "--tars PATTERN"))
        return NemoTarred(src, tars)
    if kind == "shar":
        return LhotseShar(src)
    if kind == "files":
        return src if Path(src).is_dir() else AudioFiles(src)
    return str(_decompressed(Path(src), scratch))


def _rows(dataset: ShardDataset) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``(file, row in file, {column: value})`` of every row of ``dataset``, file by file, in order."""
    for split in dataset.splits:
        row = split.start
        for batch in dataset.read_split(split):
            for values in batch.to_pylist():
                yield dataset.files.paths[split.file_id], row, values
                row += 1


def pack_from(src: str | os.PathLike[str], out: str | os.PathLike[str], source: str = "auto", *,
              tars: str | None = None, fmt: str = "ipc_file", rows_per_batch: int = 64,
              shard_mb: float | None = 256.0) -> ContainerSummary:
    """Pack a WebDataset folder, a NeMo tarred set, a Lhotse Shar folder or audio files into shards in ``out``.

    Args:
        src: the folder (WebDataset, Shar, audio files), or the manifest (NeMo; audio files named by a
            JSON-lines / CSV / TSV manifest).
        out: the output folder (local), created if needed; shards ``shard-NNNNN.arrow`` (``.parquet``).
        source: one of `CONTAINERS`, or ``"auto"`` (`detect_container`).
        tars: NeMo's tars, e.g. ``audio_{0..127}.tar`` (see `audioloader.NemoTarred`).
        fmt: ``"ipc_file"`` or ``"parquet"``. rows_per_batch: rows a record batch / row group.
        shard_mb: a shard is closed once its audio passes this many MiB (None: one shard).

    Raises:
        OptionError: an unknown or undetectable layout, or ``--from nemo`` without its tars.
    """
    src = os.fspath(src)
    kind = detect_container(src) if source == "auto" else source
    if kind not in CONTAINERS:
        raise OptionError.spelled(f"{{source}}: must be one of {', '.join(CONTAINERS)} (or auto, which found none "
                                  f"in {src!r})", source=(f"source={source!r}", f"--from {source}"))
    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    limit = None if not shard_mb else int(shard_mb * 2**20)
    with tempfile.TemporaryDirectory(prefix="audioloader-unpack-", dir=out_path) as scratch:
        dataset = ShardDataset(_source(src, kind, tars, Path(scratch)), label_column=None)
        columns = [c for c in dataset.schema.names if c != "audio"]
        dataset = dataset.with_columns(columns)
        labeled = "label" in columns and pa.types.is_integer(dataset.schema.field("label").type)
        extras = {c: dataset.schema.field(c).type for c in columns if not (labeled and c == "label")}
        summary = ContainerSummary([], out_path, kind, columns=["audio", *(["label"] if labeled else []), *extras])
        writer, held = None, 0
        extension = "parquet" if fmt == "parquet" else "arrow"
        try:
            for file, number, row in _rows(dataset):
                audio = row.pop("audio")
                if audio is None:  # a sample without an audio member: nothing to train on, reported
                    summary.skipped.append(f"{file}, row {number}")
                    continue
                if writer is None:
                    path = out_path / f"shard-{len(summary.shards):05d}.{extension}"
                    writer = ShardWriter(path, fmt, labeled=labeled, extra_columns=extras,
                                         rows_per_batch=rows_per_batch).__enter__()
                    summary.shards.append(path)
                writer.write(audio=audio, label=row.pop("label") if labeled else None, **row)
                summary.rows += 1
                summary.audio_bytes += len(audio)
                held += len(audio)
                if limit is not None and held >= limit:
                    writer.close()
                    writer, held = None, 0
        finally:
            if writer is not None:
                writer.close()
    write_folder_manifest(str(out_path))
    return summary
