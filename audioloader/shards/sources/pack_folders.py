"""The folders `audioloader pack` writes, read as sources: a folder is one finished dataset only when every
journal in it says done, and a folder holding several packs in sub-folders is refused rather than read as
their union (a listing would merge them silently)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

from ...errors import AudioLoaderError, redacted

#: The journal `audioloader pack` keeps in its OUT folder: ``_audioloader_pack.json``, a part's
#: ``_audioloader_pack-p0003of0016.json`` (`audioloader.tools.pack_journal`). ``{"done": true, ...}`` once finished.
PACK_JOURNAL = re.compile(r"^_audioloader_pack(?:-p(\d+)of(\d+))?\.json$")


class PackFolderError(AudioLoaderError, ValueError):
    """A folder ``audioloader pack`` wrote is not one finished dataset: a pack (or some of its parts) not finished,
    or several packs in sub-folders that a listing would merge into one."""


def unfinished_parts(journals: dict[str, str]) -> tuple[int | None, list[str]]:
    """Of the pack journals found in a folder (``{name: text}``): the number of parts, and the parts not done
    (``"K/N"``; a part without a journal counts as not done; ``"the whole pack"`` for an unfinished whole pack).
    ``(None, [])`` when there is none.

    Raises:
        ValueError: journals of a whole pack and of parts, or of different part counts, in one folder.
    """
    parts = {name: m.groups() for name in journals if (m := PACK_JOURNAL.match(name))}
    counts = {None if count is None else int(count) for _, count in parts.values()}
    if not counts:
        return None, []
    if len(counts) > 1:
        raise ValueError(f"pack journals of different splits in one folder ({', '.join(sorted(parts))}): the shards "
                         "of one split would repeat the rows of another; pack again into an empty folder or with "
                         "--overwrite")
    count = counts.pop()
    done = set()
    for name, (index, _) in parts.items():
        with contextlib.suppress(ValueError, AttributeError):
            if json.loads(journals[name]).get("done"):
                done.add(None if index is None else f"{int(index)}/{count}")
    if count is None:
        return 1, [] if None in done else ["the whole pack"]
    return count, [f"{k}/{count}" for k in range(count) if f"{k}/{count}" not in done]


def check_pack_folders(root: str, journals: dict[str, dict[str, Callable[[], str]]]) -> None:
    """Refuse a folder source that is not one finished pack. ``journals`` maps each folder under ``root`` that
    holds pack journals (relative to ``root``: ``"."`` for itself) to ``{journal name: read its text}``; ``root``
    as shown to users. Nothing is read for a folder without journals (not a pack's: nothing to check).

    Raises:
        PackFolderError: journals in more than one folder (several packs: their union would be read as one
            dataset), or a pack whose journals say it is not finished, naming the parts that are missing.
    """
    root = redacted(root).rstrip("/")
    if len(journals) > 1:
        inside = sorted(journals)
        listed = ", ".join(f"{name!r}" for name in inside[:8]) + (f", ... ({len(inside)} in all)"
                                                                  if len(inside) > 8 else "")
        raise PackFolderError(
            f"shard source {root!r} holds {len(inside)} packs, each with its own `audioloader pack` journal (in "
            f"{listed}): reading the folder would merge them into one dataset. Give the one you mean (e.g. "
            f"{root}/{inside[-1]}), or a list of the folders to read them together")
    for folder, found in journals.items():
        count, missing = unfinished_parts({name: read() for name, read in found.items()})
        shown = root if folder == "." else f"{root}/{folder}"
        if missing == ["the whole pack"]:
            raise PackFolderError(
                f"shard source {shown!r}: the `audioloader pack` into it is not finished (its journal "
                "_audioloader_pack.json does not say done): run the same `audioloader pack SRC OUT ...` again to "
                f"finish it; to read the shards written so far anyway, name them (a glob: '{shown}/shard-*')")
        if missing:
            listed = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
            raise PackFolderError(
                f"shard source {shown!r}: {len(missing)} of the {count} parts of the `audioloader pack` into it "
                f"are not finished: --part {listed}. Run `audioloader pack SRC OUT --part K/{count}` (the same "
                "arguments) for each; to read the finished parts alone, name their shards (a glob such as "
                f"'{shown}/shard-p0000of*' for part 0)")
