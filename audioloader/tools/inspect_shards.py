"""``audioloader inspect PATH``: what is in a set of shards.

Prints the files (format, size, rows), the total rows, the schema, the number
of splits, the label histogram (with class names when the shards carry them),
and, for a sample of rows spread evenly over the data, the audio format, sample
rate, channels and duration read from each clip's header (``soundfile.info``,
not a full decode). ``--json`` prints the same as one JSON object.

The histogram reads the label column of every row: on local Arrow IPC files
that is cheap (memory-mapped, audio pages are not touched); Parquet row groups
are read whole.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .. import checks
from ..errors import OptionError

__all__ = ["add_arguments", "format_report", "inspect", "run"]

_FILES_SHOWN = 20  # in the text report; --json lists all


def _open(source: Any, audio_column: str, label_column: str | None, split_rows: int,
          filesystem: Any) -> tuple[Any, str | None]:
    """``(ShardDataset, note)``: the dataset with the label column when the shards have an integer one,
    and ``path`` when present; ``note`` says why a requested label column is not used."""
    from audioloader.shards import ShardDataset

    probe = ShardDataset(source, audio_column=audio_column, label_column=None, split_rows=split_rows,
                         filesystem=filesystem)
    schema = probe.schema
    label, note = None, None
    if label_column is not None:
        if label_column not in schema.names:
            note = f"no column {label_column!r}"
        elif not pa.types.is_integer(schema.field(label_column).type):
            note = f"column {label_column!r} has type {schema.field(label_column).type}, not integer class ids"
        else:
            label = label_column
    extras = [c for c in ("path",) if c in schema.names and c not in (audio_column, label)]
    if label is None and not extras:
        return probe, note
    return ShardDataset(source, audio_column=audio_column, label_column=label, columns=extras,
                        split_rows=split_rows, filesystem=filesystem), note


def _metadata(schema: pa.Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (schema.metadata or {}).items():
        name = key.decode("utf-8", "replace")
        text = value.decode("utf-8", "replace")
        try:
            out[name] = json.loads(text)
        except ValueError:
            out[name] = text
    return out


def _label_histogram(ds: Any) -> dict[str, Any] | None:
    """``{"column", "classes": [{"id", "name", "count"}], "nulls"}`` over all rows, or None if unlabeled."""
    if ds.label_column is None:
        return None
    counts: Counter[int] = Counter()
    nulls = 0
    for split in ds.splits:
        for batch in ds.read_split(split):
            column = batch.column(ds.label_column)
            nulls += column.null_count
            for entry in pc.value_counts(column.drop_null()).to_pylist():
                counts[int(entry["values"])] += int(entry["counts"])
    names = ds.label_names or []
    # Every named class is listed (a count of 0 is worth seeing), plus any id without a name.
    ids = sorted(set(range(len(names))) | set(counts))
    classes = [{"id": i, "name": names[i] if 0 <= i < len(names) else None, "count": counts.get(i, 0)}
               for i in ids]
    return {"column": ds.label_column, "classes": classes, "nulls": nulls}


def _audio_info(audio: Any) -> dict[str, Any]:
    """Header facts of one encoded clip (``soundfile.info``), or ``{"error": reason}``."""
    import soundfile as sf

    if audio is None:
        return {"error": "audio is null"}
    try:
        info = sf.info(io.BytesIO(audio))
    except Exception as e:  # libsndfile's errors vary by format; any of them means "unreadable"
        # LibsndfileError's str() names the BytesIO object; its error_string is the reason.
        return {"error": getattr(e, "error_string", None) or str(e) or type(e).__name__}
    return {"format": info.format, "subtype": info.subtype, "sample_rate": int(info.samplerate),
            "channels": int(info.channels), "frames": int(info.frames),
            "duration_s": info.frames / info.samplerate if info.samplerate else None}


def _sample(ds: Any, n: int) -> dict[str, Any]:
    """Header facts of ``n`` rows spread evenly over the data, and their summary."""
    count = min(n, ds.num_rows)
    indices = sorted({k * ds.num_rows // count for k in range(count)}) if count else []
    names = ds.label_names or []
    rows = []
    for row in ds.read_rows(indices):
        entry = {"index": row.index, "file": row.file, "row": row.row, "label": row.label,
                 "label_name": names[row.label] if row.label is not None and 0 <= row.label < len(names) else None,
                 "bytes": None if row.audio is None else len(row.audio), "path": row.extras.get("path")}
        entry.update(_audio_info(row.audio))
        rows.append(entry)
    good = [r for r in rows if "error" not in r]
    durations = [r["duration_s"] for r in good if r["duration_s"] is not None]
    summary = {
        "rows": len(rows),
        "formats": dict(Counter(f"{r['format']}/{r['subtype']}" for r in good).most_common()),
        "sample_rates": dict(sorted(Counter(r["sample_rate"] for r in good).items())),
        "channels": dict(sorted(Counter(r["channels"] for r in good).items())),
        "duration_s": ({"min": min(durations), "mean": sum(durations) / len(durations), "max": max(durations)}
                       if durations else None),
        "unreadable": len(rows) - len(good),
    }
    return {"summary": summary, "rows": rows}


def inspect(source: Any, *, sample: int = 20, audio_column: str = "audio", label_column: str | None = "label",
            split_rows: int = 512, filesystem: Any = None) -> dict[str, Any]:
    """A report of the shards of ``source`` as plain data (what ``--json`` prints).

    Args:
        source: anything ``ShardDataset`` accepts (folder, glob, file, URL, list).
        sample: rows whose audio headers are read (spread evenly; 0 for none).
        audio_column: the encoded-audio column.
        label_column: the integer label column for the histogram; ``None``, or a
            column the shards lack, skips it.
        split_rows: passed to ``ShardDataset`` (changes only the split count shown).
        filesystem: a ``pyarrow.fs.FileSystem`` for the source, or ``None``.

    Returns:
        ``{"source", "files": [{"path", "format", "size", "rows", "batches"}], "num_files", "num_rows",
        "total_bytes", "schema": [{"name", "type"}], "metadata", "splits", "split_rows", "label_names",
        "labels": {"column", "classes": [{"id", "name", "count"}], "nulls"} | None,
        "labels_note": why there is no histogram, or None,
        "sample": {"summary": {...}, "rows": [...]}}``. Sizes are in bytes, durations in seconds.
    """
    if not checks.is_integer(sample) or sample < 0:
        raise checks.bad("sample", sample, "must be a number of rows >= 0")
    ds, label_note = _open(source, audio_column, label_column, split_rows, filesystem)
    files = [{"path": f.path, "format": f.format, "size": f.size, "rows": f.num_rows,
              "batches": len(f.batch_rows)} for f in ds.files]
    return {
        "source": [os.fspath(s) for s in source] if isinstance(source, (list, tuple)) else os.fspath(source),
        "files": files,
        "num_files": len(files),
        "num_rows": ds.num_rows,
        "total_bytes": sum(f.size for f in ds.files),
        "schema": [{"name": f.name, "type": str(f.type)} for f in ds.schema],
        "metadata": _metadata(ds.schema),
        "splits": len(ds.splits),
        "split_rows": split_rows,
        "label_names": ds.label_names,
        "labels": _label_histogram(ds),
        "labels_note": label_note,
        "sample": _sample(ds, sample),
    }


# -- text report ---------------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"  # unreachable; keeps type checkers calm


def _counts(counter: dict[Any, int], suffix: str = "") -> str:
    return ", ".join(f"{key}{suffix} ×{n}" for key, n in counter.items()) or "-"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def _files_section(report: dict[str, Any]) -> list[str]:
    formats = ", ".join(sorted({f["format"] for f in report["files"]}))
    lines = [f"files: {report['num_files']} ({formats}), {_size(report['total_bytes'])}, "
             f"{report['num_rows']} rows"]
    shown = report["files"][:_FILES_SHOWN]
    lines += _table(["file", "format", "size", "rows", "batches"],
                    [[f["path"], f["format"], _size(f["size"]), f["rows"], f["batches"]] for f in shown])
    if len(report["files"]) > len(shown):
        lines.append(f"  ... {len(report['files']) - len(shown)} more (--json lists all)")
    return lines


def _schema_section(report: dict[str, Any]) -> list[str]:
    lines = ["schema:"] + [f"  {f['name']}: {f['type']}" for f in report["schema"]]
    for key, value in report["metadata"].items():
        text = json.dumps(value, ensure_ascii=False)
        lines.append(f"  metadata {key}: {text if len(text) <= 200 else text[:197] + '...'}")
    return lines


def _labels_section(report: dict[str, Any]) -> list[str]:
    labels = report["labels"]
    if labels is None:
        return [f"labels: none ({report['labels_note'] or 'no label column'})"]
    total = sum(c["count"] for c in labels["classes"])
    lines = [f"labels: column {labels['column']!r}, {len(labels['classes'])} classes, {total} labeled rows"
             + (f", {labels['nulls']} null" if labels["nulls"] else "")]
    lines += _table(["id", "name", "rows", "share"],
                    [[c["id"], c["name"], c["count"], f"{100 * c['count'] / max(total, 1):.1f}%"]
                     for c in labels["classes"]])
    return lines


def _sample_section(report: dict[str, Any]) -> list[str]:
    sample = report["sample"]
    summary = sample["summary"]
    if not summary["rows"]:
        return ["sample: none"]
    lines = [f"sample: {summary['rows']} of {report['num_rows']} rows (audio headers, spread evenly)",
             f"  formats: {_counts(summary['formats'])}",
             f"  sample rates: {_counts(summary['sample_rates'], ' Hz')}",
             f"  channels: {_counts(summary['channels'])}"]
    d = summary["duration_s"]
    if d:
        lines.append(f"  durations: {d['min']:.3f} .. {d['max']:.3f} s (mean {d['mean']:.3f} s)")
    if summary["unreadable"]:
        lines.append(f"  unreadable: {summary['unreadable']}")
    rows = []
    for r in sample["rows"]:
        label = r["label_name"] if r["label_name"] is not None else r["label"]
        if "error" in r:
            rows.append([r["index"], label, f"error: {r['error']}", None, None, None, r["bytes"], r["path"]])
        else:
            seconds = None if r["duration_s"] is None else f"{r['duration_s']:.3f}"
            rows.append([r["index"], label, f"{r['format']}/{r['subtype']}", r["sample_rate"], r["channels"],
                         seconds, r["bytes"], r["path"]])
    lines += _table(["index", "label", "format", "rate", "ch", "seconds", "bytes", "path"], rows)
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The human-readable text of a report from `inspect`."""
    lines = [f"source: {report['source']}"]
    lines += _files_section(report)
    lines += _schema_section(report)
    lines.append(f"splits: {report['splits']} (split_rows={report['split_rows']})")
    lines += _labels_section(report)
    lines += _sample_section(report)
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``audioloader inspect`` on ``parser``."""
    parser.add_argument("path", metavar="PATH", nargs="+",
                        help="shard folder, glob, file or URL (several allowed)")
    parser.add_argument("--sample", type=int, default=20, metavar="N",
                        help="read the audio headers of N rows spread over the data (default: 20; 0: none)")
    parser.add_argument("--audio-column", default="audio", help="encoded-audio column (default: audio)")
    parser.add_argument("--label-column", default="label",
                        help="label column for the histogram (default: label; 'none' to skip)")
    parser.add_argument("--split-rows", type=int, default=512, metavar="ROWS",
                        help="target rows per split, as given to the loader (default: 512)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


#: `inspect`'s keywords, named in messages as ``keyword=value``, and this command's options for them.
_KEYWORD = re.compile(r"\b(sample|audio_column|label_column|split_rows)=(\S*)")
#: The library's fix for a column ("al.Source(..., audio_column=...)"): on the command line, the option itself.
_SOURCE_FIX = re.compile(r"al\.Source\(\.\.\., (audio_column|label_column)=([^)]*)\)")


def _as_options(error: ValueError) -> OptionError:
    """``error`` with `inspect`'s keywords named as this command's options (``--audio-column NAME``, not
    ``audio_column=``): the command line's user never wrote the keyword."""
    def option(match: re.Match[str]) -> str:
        value = match.group(2)
        return f"--{match.group(1).replace('_', '-')} {'NAME' if value in ('', '...') else value}"

    text = _SOURCE_FIX.sub(lambda m: f"{m.group(1)}={m.group(2)}", str(error))
    return OptionError(str(error), _KEYWORD.sub(option, text))


def run(args: argparse.Namespace) -> int:
    """Run ``audioloader inspect`` with parsed ``args``; returns the exit status."""
    label = None if args.label_column.lower() == "none" else args.label_column
    source = args.path[0] if len(args.path) == 1 else list(args.path)
    if args.split_rows <= 0:
        raise OptionError(f"split_rows={args.split_rows}: must be a positive number of rows",
                          f"--split-rows {args.split_rows}: must be a positive number of rows")
    try:
        report = inspect(source, sample=args.sample, audio_column=args.audio_column, label_column=label,
                         split_rows=args.split_rows)
    except ValueError as error:
        raise _as_options(error) from error
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0
