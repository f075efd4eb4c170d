"""``audioloader pack`` inputs in object storage: a manifest at a URL, or a class-folder tree under a prefix.

- A manifest (``s3://bucket/lists/train.csv``; CSV, TSV, JSONL or a Common Voice TSV): read
  whole (one request), then as a local one; its relative paths are relative to its folder in
  the bucket, and a path may also be a full URL. The audio is not listed or checked: a missing
  object is skipped as "missing file" when the pack reads it.
- A prefix (``s3://bucket/classes/``): one recursive listing; each first-level folder is a
  class, as for a local class-folder tree (hidden names skipped, paths in sorted order).
  An ``audiofolder`` or LibriSpeech tree in a bucket is not read directly: list its files in a
  manifest (paths relative to it, or URLs) and pack that.

The URL's options (``?endpoint_override=...``) are kept for every file read; the ``path``
column stores paths relative to the source, or URLs without their query string.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.fs as pafs

from audioloader.errors import redacted

from .input_lists import Entry, Inputs, Skips, Table, build_inputs, read_table
from .layouts import AUDIO_EXTENSIONS, INPUT_FORMATS, detect_format
from .remote_files import RemoteFile, fetch, open_url

__all__ = ["remote_inputs"]

_LIST_FORMATS = ("csv", "tsv", "jsonl", "commonvoice")


def remote_inputs(url: str, input_format: str | None) -> Inputs:
    """The rows of a manifest or class-folder tree in object storage (see the module docstring)."""
    fs, path = open_url(url)
    info = fs.get_file_info(path)
    shown = redacted(url)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"SRC {shown!r} does not exist; give a manifest (CSV, TSV, JSONL) or a prefix "
                                "of class folders")
    fmt = None if input_format in (None, "auto") else input_format
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise ValueError(f"input_format={input_format!r}: must be one of {', '.join(INPUT_FORMATS)}, or 'auto'")
    if info.type == pafs.FileType.File:
        if fmt is not None and fmt not in _LIST_FORMATS:
            raise ValueError(f"input format {fmt!r} reads a folder, but SRC {shown!r} is an object")
        return _input_list(RemoteFile(url), fmt)
    if fmt not in (None, "folders"):
        raise ValueError(f"SRC {shown!r}: a prefix in object storage is read as class folders; for an "
                         f"{fmt} layout, list its files in a manifest (CSV or JSONL with a path column) and pack that")
    return _class_folders(RemoteFile(url), fs, path, AUDIO_EXTENSIONS)


def _input_list(file: RemoteFile, fmt: str | None) -> Inputs:
    with tempfile.TemporaryDirectory(prefix="audioloader-list-") as folder:
        local = Path(folder) / (file.name or "manifest.csv")
        local.write_bytes(fetch(file))
        fmt = fmt or detect_format(local)
        if fmt not in _LIST_FORMATS:
            raise ValueError(f"SRC {str(file)!r} is not a manifest (read as {fmt})")
        table = read_table(local, "tsv" if fmt == "commonvoice" else fmt)
    # Messages name the manifest by its name (its lines by number), not by the temporary copy.
    table = Table(Path(file.name), table.columns, table.rows, table.typed)
    if fmt != "commonvoice":
        return build_inputs(table, fmt, file.parent)
    missing = sorted({"path", "sentence", "client_id"} - set(table.columns))
    if missing:
        raise ValueError(f"{file}, line 1: a Common Voice TSV has the columns path, sentence, client_id; this one "
                         f"lacks {missing}. Read it as a plain manifest with input_format='tsv'")
    rows = [(where, {**row, "path": f"clips/{row['path']}" if row.get("path") else row.get("path")})
            for where, row in table.rows]
    return build_inputs(Table(table.source, table.columns, rows, False), "commonvoice", file.parent,
                        rename={"sentence": "text", "client_id": "speaker"})


def _class_folders(root: RemoteFile, fs, path: str, extensions: frozenset[str]) -> Inputs:
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = []
    for info in infos:
        rel = info.path[len(path):].lstrip("/")
        parts = rel.split("/")
        if info.type != pafs.FileType.File or any(p.startswith((".", "_")) for p in parts):
            continue
        if parts[-1] in ("metadata.csv", "metadata.jsonl") or parts[-1].endswith(".trans.txt"):
            raise ValueError(f"{root}/{rel}: SRC {str(root)!r} looks like an audiofolder or LibriSpeech tree, "
                             "which is read from a local folder only; list its files in a manifest (paths "
                             "relative to it, or URLs) and pack that")
        if Path(parts[-1]).suffix.lower() in extensions:
            files.append((rel, parts))
    stray = [rel for rel, parts in files if len(parts) == 1]
    if stray:
        raise ValueError(f"{root}/{stray[0]}: audio file directly in SRC {str(root)!r}; put each file in a "
                         "sub-folder named after its class (SRC/<class>/file), or list files in a manifest")
    if not files:
        raise ValueError(f"SRC {str(root)!r} has no audio files in class sub-folders; expected "
                         "SRC/<class>/<audio files>, or a manifest (CSV, TSV, JSONL) with a path column")
    names = sorted({parts[0] for _, parts in files})
    label = {name: i for i, name in enumerate(names)}
    entries = sorted((Entry(root.join(rel), rel, rel, label[parts[0]]) for rel, parts in files),
                     key=lambda entry: entry.rel)
    return Inputs("folders", entries, {}, names, Skips())
