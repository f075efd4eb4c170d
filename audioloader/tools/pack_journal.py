"""How ``audioloader pack`` resumes and splits: parts of the input, shard names, and the progress journal.

**Parts.** ``--part K/N`` packs the K-th of N contiguous runs of the input's rows, in the
order a single pack stores them (the input's order, or its seeded permutation): part K gets
rows ``[K * M // N, (K + 1) * M // N)`` of the M rows. The split is by order, not by a hash
of each path, so that the shards of all N parts read in name order hold exactly the rows of
a single pack, in its order (only the shard boundaries differ). Its names
``shard-p{K}of{N}-{i}.arrow`` (numbers zero-padded to the same width) sort part by part, and
parts of one N never collide.

**Journal.** Each pack (each part) keeps ``_audioloader_pack.json`` (a part:
``_audioloader_pack-p0003of0016.json``) in OUT: the settings that decide the output, a
fingerprint of the input rows, and, per finished shard, its name, the position in the input
after its last row (``end``), its rows, seconds and bytes. The journal is rewritten (atomically)
after each shard is published, so it never lists a shard that is not complete. A rerun with
the same settings and input starts at the last listed shard's ``end`` with the next shard
number: cutting a shard depends only on the rows, so the shards are those of an uninterrupted
run. A shard published but not yet listed when the pack died is made again, byte for byte.
Names starting with ``_`` are bookkeeping to the reader: the journal is never read as a shard.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from audioloader.errors import OptionError
from audioloader.shards.sources.pack_folders import PACK_JOURNAL, unfinished_parts

from .input_lists import Entry, Skips

__all__ = ["JOURNAL_PREFIX", "SHARD_PATTERN", "Journal", "Part", "entries_fingerprint", "journal_name",
           "parse_part", "part_range", "shard_name", "unfinished_parts"]

JOURNAL_PREFIX = "_audioloader_pack"
JOURNAL_VERSION = 1
#: Every shard name ``audioloader pack`` writes: ``shard-00012.arrow`` or ``shard-p0003of0016-00012.parquet``.
SHARD_PATTERN = re.compile(r"^shard-(?:p(\d+)of(\d+)-)?\d{5,}\.(?:arrow|parquet)$")
_JOURNAL_PATTERN = PACK_JOURNAL  # the loader refuses a folder whose journals say it is unfinished

#: The settings a journal records, with their command line flags (a difference is named by both).
SETTINGS = {"input_format": "--input-format", "fmt": "--format", "shard_rows": "--shard-size",
            "shard_mb": "--shard-mb", "rows_per_batch": "--rows-per-batch", "sample_rate": "--sample-rate",
            "codec": "--codec", "shuffle_seed": "--shuffle-seed", "part": "--part", "verify": "--verify"}


@dataclass(frozen=True)
class Part:
    """Part ``index`` (0-based) of ``count`` parts of the input."""

    index: int
    count: int

    @property
    def tag(self) -> str:
        """``p0003of0016``: both numbers zero-padded to the same width (at least 4), so names sort by part."""
        width = max(4, len(str(self.count)))
        return f"p{self.index:0{width}d}of{self.count:0{width}d}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_part(value: Any) -> Part | None:
    """``"K/N"``, ``(K, N)`` or a `Part` as a `Part` (``None`` stays None: the whole input).

    Raises:
        ValueError: not ``K/N`` with ``0 <= K < N``.
    """
    if value is None or isinstance(value, Part):
        return value
    try:
        k, n = (int(v) for v in (value.split("/") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        k = n = -1
    if not 0 <= k < n:
        rule = "must be K/N with 0 <= K < N, e.g. 3/16 for the 4th of 16 parts (parts are numbered from 0)"
        raise OptionError(f"part={value!r}: {rule}", f"--part {value}: {rule}")
    return Part(k, n)


def part_range(rows: int, part: Part | None) -> tuple[int, int]:
    """The input positions ``[start, stop)`` of ``part`` among ``rows`` rows (all of them for None)."""
    if part is None:
        return 0, rows
    return part.index * rows // part.count, (part.index + 1) * rows // part.count


def shard_name(part: Part | None, number: int, extension: str) -> str:
    """``shard-00012.arrow`` (a whole pack) or ``shard-p0003of0016-00012.arrow`` (a part)."""
    return f"shard-{number:05d}.{extension}" if part is None else f"shard-{part.tag}-{number:05d}.{extension}"


def journal_name(part: Part | None) -> str:
    return f"{JOURNAL_PREFIX}.json" if part is None else f"{JOURNAL_PREFIX}-{part.tag}.json"


def shard_part(name: str) -> Part | bool | None:
    """The part a shard name belongs to, None for a whole pack's, False for a name pack does not write."""
    match = SHARD_PATTERN.match(name)
    if match is None:
        return False
    return None if match.group(1) is None else Part(int(match.group(1)), int(match.group(2)))


def journal_part(name: str) -> Part | bool | None:
    """The part a journal name belongs to, None for a whole pack's, False for another file."""
    match = _JOURNAL_PATTERN.match(name)
    if match is None:
        return False
    return None if match.group(1) is None else Part(int(match.group(1)), int(match.group(2)))


def entries_fingerprint(entries: Sequence[Entry], label_names: list[str] | None, columns: dict[str, Any]) -> str:
    """A hash of the rows to pack, in order: stored path, label, the other columns' values, the segment.

    It does not read the audio (a file rewritten in place under the same name is not noticed)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps([label_names, {k: str(v) for k, v in columns.items()}]).encode())
    for e in entries:
        digest.update(json.dumps([e.rel, e.label, e.values, e.span], default=str, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


@dataclass
class Journal:
    """What a pack (or one part of it) has finished; see the module docstring.

    Attributes:
        settings: ``{name: value}`` of `SETTINGS` (``part`` as ``"K/N"`` or None).
        input: ``{"rows": M, "fingerprint": ...}`` of the whole input (every part sees the same).
        shards: per finished shard ``{"name", "end", "rows", "seconds", "audio_bytes"}``, in order.
        skips: rows of this part left out while loading, up to the last finished shard's ``end``:
            ``{"counts": {reason: n}, "examples": {reason: [...]}}``.
        columns: the shards' columns (known once a shard is written).
        done: every row of the part is in a listed shard.
    """

    settings: dict[str, Any]
    input: dict[str, Any]
    shards: list[dict[str, Any]] = field(default_factory=list)
    skips: dict[str, dict[str, Any]] = field(default_factory=lambda: {"counts": {}, "examples": {}})
    columns: list[str] = field(default_factory=list)
    done: bool = False

    def to_json(self) -> str:
        doc = {"version": JOURNAL_VERSION, "settings": self.settings, "input": self.input, "done": self.done,
               "columns": self.columns, "skips": self.skips, "shards": self.shards}
        return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Journal:
        try:
            doc = json.loads(text)
            if doc["version"] != JOURNAL_VERSION:
                raise ValueError(f"version {doc['version']}")
            return cls(doc["settings"], doc["input"], doc["shards"], doc["skips"], doc["columns"], doc["done"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{where}: not a journal this version of audioloader pack can continue ({error}); "
                             "pass overwrite=True (--overwrite) to start over") from None

    @property
    def next_position(self) -> int | None:
        """Where the next shard starts in the input, or None when no shard is finished."""
        return self.shards[-1]["end"] if self.shards else None

    def record_skips(self, skips: Skips) -> None:
        self.skips = {"counts": dict(skips.counts), "examples": {k: list(v) for k, v in skips.examples.items()}}

    def restore_skips(self, skips: Skips) -> None:
        """Add the journal's load-time skips to ``skips`` (whose collection-time ones come first, as in a clean run)."""
        for reason, count in self.skips["counts"].items():
            skips.counts[reason] = skips.counts.get(reason, 0) + count
            examples = skips.examples.setdefault(reason, [])
            examples += self.skips["examples"].get(reason, [])[:max(0, 3 - len(examples))]

    def difference(self, settings: dict[str, Any], input_: dict[str, Any]) -> tuple[str, str] | None:
        """The first setting (or the input) that differs from this run's, as a phrase spelled for Python and for
        the command line; None when all agree."""
        for name, flag in SETTINGS.items():
            then, now = self.settings.get(name), settings.get(name)
            if then != now:
                return (f"{name}={then!r}, this run has {name}={now!r}",
                        f"{_flag(flag, then)}, this run has {_flag(flag, now)}")
        if self.input != input_:
            phrase = (f"an input of {self.input.get('rows')} rows with fingerprint {self.input.get('fingerprint')}, "
                      f"this run's input has {input_['rows']} rows with fingerprint {input_['fingerprint']} "
                      "(SRC's files, their order or their columns changed)")
            return phrase, phrase
        return None


def _flag(flag: str, value: Any) -> str:
    """A setting as the command line gives it: ``--sample-rate 16000``, ``no --sample-rate``."""
    if value is None:
        return "--shard-mb 0" if flag == "--shard-mb" else f"no {flag}"
    if value is True:
        return flag
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
