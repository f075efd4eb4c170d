"""The inputs ``audioloader pack`` recognises, and how it tells them apart.

- ``folders``: ``SRC/<class>/.../*.wav``, one sub-folder per class; column ``label``
  (the sorted sub-folder names).
- ``files``: every audio file under ``SRC``, at any depth, without labels (a self-supervised or
  TTS corpus); no ``label`` column.
- ``csv``, ``tsv``, ``jsonl``: a manifest (`audioloader.tools.input_lists`), with its own columns.
- ``audiofolder``: Hugging Face ``audiofolder``, ``metadata.csv`` / ``metadata.jsonl``
  files naming the audio in ``file_name``, with their own columns.
- ``librispeech``: ``<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` beside the
  ``.flac`` files; columns ``text``, ``speaker``, ``chapter``.
- ``commonvoice``: a Common Voice TSV (``train.tsv``, ``validated.tsv``, ...) beside
  ``clips/``; ``sentence`` becomes ``text``, ``client_id`` ``speaker``, the rest is carried.

`detect_format` picks one from the source (a folder: metadata files, then
transcripts, then audio files with no sub-folder beside them (``files``), else class
folders; a file: its extension, then its content);
``input_format=`` forces one. A LibriSpeech tree is never read as class folders
unless asked: speakers are not classes.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pyarrow as pa

from audioloader.errors import OptionError

from .input_lists import Entry, Inputs, Skips, Table, build_inputs, iter_lines, read_table

__all__ = ["AUDIO_EXTENSIONS", "INPUT_FORMATS", "collect_local_inputs", "detect_format"]

#: File name suffixes (lower case) treated as audio when scanning a folder.
AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff",
                              ".aifc", ".au", ".snd", ".w64", ".rf64", ".caf"})
#: What ``input_format=`` accepts (``None`` / ``"auto"``: `detect_format`).
INPUT_FORMATS = ("folders", "csv", "tsv", "jsonl", "audiofolder", "librispeech", "commonvoice", "files")
_FOLDER_FORMATS = ("folders", "files", "audiofolder", "librispeech")
_METADATA_FILES = ("metadata.csv", "metadata.jsonl")
#: Common Voice TSV columns that identify one (with ``path``).
_COMMON_VOICE_COLUMNS = {"sentence", "client_id"}
#: Columns only Common Voice TSVs have: three of them (with ``path``) make a TSV one even when a column
#: of ``_COMMON_VOICE_COLUMNS`` is missing or misspelt, so that the error names that column.
_COMMON_VOICE_ONLY = {"client_id", "sentence_id", "sentence", "sentence_domain", "up_votes", "down_votes", "accents",
                      "variant", "locale", "segment"}
_COMMON_VOICE_TSVS = ("train.tsv", "dev.tsv", "test.tsv", "validated.tsv", "other.tsv", "invalidated.tsv")


def _is_hidden(name: str) -> bool:
    # Also skips macOS "._x.wav" resource forks, which have an audio suffix but no audio.
    return name.startswith(".")


def _walk(folder: Path) -> list[tuple[Path, list[str]]]:
    """``(folder, sorted visible file names)`` of every visible folder under ``folder``, in sorted order."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        found.append((Path(root), sorted(f for f in files if not _is_hidden(f))))
    return found


def _is_audio(name: str) -> bool:
    return Path(name).suffix.lower() in AUDIO_EXTENSIONS


# -- detection ---------------------------------------------------------------------------------------------


def _header(path: Path) -> str:
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        return fh.readline()


def _is_common_voice(path: Path) -> bool:
    columns = set(_header(path).rstrip("\r\n").split("\t"))
    return "path" in columns and (columns >= _COMMON_VOICE_COLUMNS or len(columns & _COMMON_VOICE_ONLY) >= 3)


def detect_format(src: Path) -> str:
    """The input format of ``src`` (see the module's table); raises ValueError when it is none of them."""
    if src.is_dir():
        if any((src / name).is_file() for name in _METADATA_FILES) or any(
                (d / name).is_file() for d in src.iterdir() if d.is_dir() for name in _METADATA_FILES):
            return "audiofolder"
        if any(name.endswith(".trans.txt") for _, files in _walk(src) for name in files):
            return "librispeech"
        tsvs = [name for name in _COMMON_VOICE_TSVS if (src / name).is_file()]
        if (src / "clips").is_dir() and tsvs:
            raise ValueError(f"SRC {str(src)!r} is a Common Voice folder: give one of its TSV files "
                             f"({', '.join(tsvs)}), e.g. {str(src / tsvs[0])!r}")
        visible = [p for p in src.iterdir() if not _is_hidden(p.name)]
        if any(p.is_file() and _is_audio(p.name) for p in visible) and not any(p.is_dir() for p in visible):
            return "files"  # a flat folder of audio: no classes to read from it
        return "folders"
    suffix = src.suffix.lower()
    if suffix in AUDIO_EXTENSIONS:
        raise ValueError(f"SRC {str(src)!r} is an audio file; give a folder or a manifest (CSV, TSV, JSONL)")
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix == ".tsv" or (suffix != ".csv" and "\t" in _header(src)):
        return "commonvoice" if _is_common_voice(src) else "tsv"
    if suffix != ".csv" and _header(src).lstrip().startswith("{"):
        return "jsonl"
    return "csv"


def collect_local_inputs(src: str | os.PathLike[str], input_format: str | None = None) -> Inputs:
    """Read the source's rows (`Inputs`): the files, their columns and labels, and what was left out.

    Args:
        src: a folder or a manifest file on this machine (in object storage: `remote_inputs.remote_inputs`;
            `pack.collect_inputs` takes either).
        input_format: one of `INPUT_FORMATS`, or None / ``"auto"`` to detect it.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: an unknown format, a format that does not fit ``src``, a malformed manifest (the
            message names the file and line), or no row left to pack.
    """
    path = Path(src)
    if not path.exists():
        raise FileNotFoundError(f"SRC {str(path)!r} does not exist; give a folder of audio files or a manifest "
                                "(CSV, TSV, JSONL)")
    fmt = detect_format(path) if input_format in (None, "auto") else input_format
    if fmt not in INPUT_FORMATS:
        raise OptionError.spelled(f"{{format}}: must be one of {', '.join(INPUT_FORMATS)}, or 'auto'",
                                  format=(f"input_format={input_format!r}", f"--input-format {input_format}"))
    if (fmt in _FOLDER_FORMATS) != path.is_dir():
        kind = "a folder" if fmt in _FOLDER_FORMATS else "a file"
        raise OptionError.spelled(f"{{format}} reads {kind}, but SRC {str(path)!r} is not one; give another "
                                  "input format, or none to detect it",
                                  format=(f"input_format={fmt!r}", f"--input-format {fmt}"))
    if fmt == "folders":
        return _from_class_folders(path)
    if fmt == "files":
        return _from_files(path)
    if fmt == "audiofolder":
        return _from_audiofolder(path)
    if fmt == "librispeech":
        return _from_librispeech(path)
    if fmt == "commonvoice":
        return _from_common_voice(path)
    return build_inputs(read_table(path, fmt), fmt, path.parent)


# -- class folders -----------------------------------------------------------------------------------------


def _from_class_folders(src: Path) -> Inputs:
    entries = sorted(p for p in src.iterdir() if not _is_hidden(p.name))
    classes = [p for p in entries if p.is_dir()]
    stray = [p for p in entries if p.is_file() and _is_audio(p.name)]
    if stray:
        raise ValueError(f"{stray[0]}: audio file directly in SRC {str(src)!r} beside sub-folders read as classes; "
                         "put each file in a sub-folder named after its class (SRC/<class>/file), list files in a "
                         "manifest, or pass input_format='files' (--input-format files) to pack every audio file "
                         "under SRC without labels")
    if not classes:
        raise ValueError(f"SRC {str(src)!r} has no class sub-folders; expected SRC/<class>/<audio files>, "
                         "or a manifest (CSV, TSV, JSONL) with a path column")
    names = [c.name for c in classes]
    rows = []
    for label, folder in enumerate(classes):
        for root, files in _walk(folder):
            rows += [Entry(root / f, (root / f).relative_to(src).as_posix(), (root / f).relative_to(src).as_posix(),
                           label) for f in files if _is_audio(f)]
    if not rows:
        raise ValueError(f"SRC {str(src)!r}: no audio files in its class sub-folders {names} "
                         f"(looked for {', '.join(sorted(AUDIO_EXTENSIONS))})")
    rows.sort(key=lambda entry: entry.rel)
    return Inputs("folders", rows, {}, names, Skips())


def _from_files(src: Path) -> Inputs:
    """Every audio file under ``src``, at any depth, in sorted path order, unlabelled: ``path`` and ``duration``."""
    rows = [Entry(root / f, (root / f).relative_to(src).as_posix(), (root / f).relative_to(src).as_posix())
            for root, files in _walk(src) for f in files if _is_audio(f)]
    if not rows:
        raise ValueError(f"SRC {str(src)!r}: no audio files under it "
                         f"(looked for {', '.join(sorted(AUDIO_EXTENSIONS))})")
    rows.sort(key=lambda entry: entry.rel)
    return Inputs("files", rows, {}, None, Skips())


# -- Hugging Face audiofolder ------------------------------------------------------------------------------


def _from_audiofolder(src: Path) -> Inputs:
    """Every ``metadata.csv`` / ``metadata.jsonl`` under ``src`` (e.g. one per split folder), in path order."""
    metadata = [root / name for root, files in _walk(src) for name in files if name in _METADATA_FILES]
    skips = Skips()
    parts = []
    for path in metadata:
        table = read_table(path, "jsonl" if path.suffix == ".jsonl" else "csv")
        parts.append(build_inputs(table, "audiofolder", path.parent, rel_base=src, skips=skips))
    first = parts[0]
    for path, part in zip(metadata[1:], parts[1:], strict=True):
        if part.columns != first.columns or (part.label_names is None) != (first.label_names is None):
            raise ValueError(f"{path}: its columns {list(part.columns)} differ from {metadata[0]}'s "
                             f"{list(first.columns)}; give every metadata file the same columns")
    names = _merged_label_names([p.label_names for p in parts])
    entries = [e for part in parts for e in _relabelled(part, names)]
    return Inputs("audiofolder", entries, first.columns, names, skips, first.segments)


def _merged_label_names(per_file: list[list[str] | None]) -> list[str] | None:
    if per_file[0] is None:
        return None
    if all(names == [str(i) for i in range(len(names))] for names in per_file):  # integer ids everywhere
        return [str(i) for i in range(max(len(names) for names in per_file))]
    return sorted({name for names in per_file for name in names})


def _relabelled(part: Inputs, names: list[str] | None) -> list[Entry]:
    if names is None or part.label_names == names[:len(part.label_names)]:
        return part.entries
    index = {name: i for i, name in enumerate(names)}
    return [Entry(e.file, e.rel, e.where, index[part.label_names[e.label]], e.values, e.span) for e in part.entries]


# -- LibriSpeech -------------------------------------------------------------------------------------------


def _from_librispeech(src: Path) -> Inputs:
    """``<utterance id> <TRANSCRIPT>`` lines of every ``*.trans.txt``; the audio ``<utterance id>.<ext>`` beside it."""
    skips = Skips()
    entries = []
    for root, files in _walk(src):
        audio = {Path(f).stem: f for f in reversed(files) if _is_audio(f)}  # reversed: .flac before .wav
        listed = set()
        for name in (f for f in files if f.endswith(".trans.txt")):
            where_file = (root / name).relative_to(src).as_posix()
            for line, text in iter_lines(root / name):
                utterance, _, transcript = text.partition(" ")
                where = f"{where_file}, line {line}"
                listed.add(utterance)
                if not transcript.strip():
                    skips.add("empty transcript", where)
                    continue
                if utterance not in audio:
                    skips.add("missing file", f"{where}: {utterance}.flac")
                    continue
                file = root / audio[utterance]
                speaker, chapter = [*utterance.split("-"), "", ""][:2]
                entries.append(Entry(file, file.relative_to(src).as_posix(), where, None,
                                     {"text": transcript.strip(), "speaker": speaker, "chapter": chapter}))
        if any(name.endswith(".trans.txt") for name in files):
            for stem in sorted(set(audio) - listed):
                skips.add("no transcript line", (root / audio[stem]).relative_to(src).as_posix())
    if not entries:
        raise ValueError(f"SRC {str(src)!r}: no utterance to pack from its .trans.txt files "
                         f"({_reasons(skips) or 'they are empty'})")
    entries.sort(key=lambda entry: entry.rel)
    # Speaker and chapter ids are numbers in LibriSpeech (and then stored as int64); else all kept as strings.
    numeric = {name: all(e.values[name].isdigit() for e in entries) for name in ("speaker", "chapter")}
    entries = [Entry(e.file, e.rel, e.where, None, {name: int(value) if numeric.get(name) else value
                                                    for name, value in e.values.items()}) for e in entries]
    columns = {"text": pa.string(), **{name: pa.int64() if numeric[name] else pa.string() for name in numeric}}
    return Inputs("librispeech", entries, columns, None, skips)


def _reasons(skips: Skips) -> str:
    return "; ".join(f"{reason}: {count} (e.g. {skips.examples[reason][0]})" for reason, count in skips.counts.items())


# -- Common Voice ------------------------------------------------------------------------------------------


def _from_common_voice(tsv: Path) -> Inputs:
    """A Common Voice TSV: ``path`` is a clip in ``clips/`` beside it; ``sentence`` -> ``text``, ``client_id`` ->
    ``speaker``; the other columns (votes, age, gender, accents, locale, ...) carried as they are."""
    table = read_table(tsv, "tsv")
    missing = sorted(({"path"} | _COMMON_VOICE_COLUMNS) - set(table.columns))
    if missing:
        near = [f"{close[0]!r} for {name!r}" for name in missing
                if (close := difflib.get_close_matches(name, table.columns, n=1, cutoff=0.75))]
        fix = f"is it misspelt ({', '.join(near)})? Rename it, or read" if near else "Read"
        raise OptionError.spelled(
            f"{tsv}, line 1: a Common Voice TSV has the columns path, sentence, client_id; this one lacks "
            f"{', '.join(map(repr, missing))}: {fix} the file as a plain manifest with {{format}} (its paths are "
            "then relative to the TSV's folder, not to clips/)", format=("input_format='tsv'", "--input-format tsv"))
    clips = tsv.parent / "clips"
    if not clips.is_dir():
        raise ValueError(f"{tsv}: no clips/ folder beside it ({clips}); Common Voice keeps the audio there")
    rows = [(where, {**row, "path": f"clips/{row['path']}" if row.get("path") else row.get("path")})
            for where, row in table.rows]
    table = Table(table.source, table.columns, rows, typed=False)
    return build_inputs(table, "commonvoice", tsv.parent, rename={"sentence": "text", "client_id": "speaker"})

