"""Checkpoints of an `AudioLoader`: the state format, the fingerprint of what a state depends on, and its checks.

A state is ``{"format": STATE_FORMAT, "fingerprint": {...}, "loader": <the chain's state>}``. The
fingerprint names every argument and file the chain's state depends on; loading a state into a loader
whose fingerprint differs raises `CheckpointMismatchError` naming each field (and each changed file).
Fields of options added after 0.1 appear only when used, so old checkpoints keep loading.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dsp.config import LengthPolicy, MelSpectrogramConfig
from .errors import CheckpointMismatchError
from .shards import ShardDataset

STATE_FORMAT = "audioloader.AudioLoader/1"

#: A dataset of more files than this is recorded in a fingerprint by hashes of its file list and of its files'
#: identities, a few hundred bytes, instead of file by file: about 110 bytes a file, 110 MB in every rank's
#: checkpoint at 1,000,000 files. A changed file is then found, not named (`_changed_files`).
LISTED_FILES = 10_000
_IDENTITY_LISTS = ("digests", "mtimes", "etags")
_HASHED_FILES_KEYS = {"count", "rows", "bytes", "sha256"}


def fingerprint(settings: Any, sources: Any) -> dict[str, Any]:
    """What a state of this loader depends on (the final `Settings`, `chain.settle`'s; `chain.Sources`)."""
    s = settings
    if sources.mix is None:
        files, identity = files_of(sources.datasets[0]), _identity_of(sources.datasets[0])
    else:
        pairs = list(zip(sources.names, sources.datasets, strict=True))
        files = {name: files_of(dataset) for name, dataset in pairs}
        identity = {name: _identity_of(dataset) for name, dataset in pairs}
    return {
        "files": files, "file_identity": identity,
        "seed": s.seed, "rank": s.storage.rank, "world_size": s.storage.world_size,
        "features": s.features.to_dict(), "batch_size": s.batch_size,
        "shuffle_buffer_size": s.shuffle.buffer_size, "shuffle_min_size": s.shuffle.min_size,
        "train": s.train, "infinite": s.infinite, "drop_last": s.drop_last,
        "shuffle_before_decode": s.shuffle.before_decode, "split_rows": s.storage.split_rows,
        "audio_column": sources.audio_column, "label_column": sources.label_column,
        "columns": list(s.columns),
        **_newer_fields(settings, sources),
    }


def _newer_fields(settings: Any, sources: Any) -> dict[str, Any]:
    """Fields of newer options, present only when used (a 0.1 checkpoint has none of them)."""
    s, extra = settings, {}
    if not isinstance(s.features, MelSpectrogramConfig):
        extra["feature_type"] = type(s.features).__name__
    if s.length != LengthPolicy():
        extra["length"] = s.length.to_dict()
    if s.batching is not None:
        # The count used (given, fitted to the data, or a checkpoint's): a resume must bucket as the run did.
        extra["batching"] = {**s.batching.to_dict(), "num_buckets": s.buckets.count, "boundaries": s.buckets.boundaries,
                             "duration_column": s.duration_column, **s.buckets.fingerprint()}
    if sources.segments is not None:
        extra["segments"] = sources.segments.to_dict()
    if any(decoder != "auto" for decoder in sources.decoders):  # a backend is part of the data's identity
        extra["decoder"] = list(sources.decoders)
    if sources.mix is not None:
        # world_size here too: resuming a mix on another number of ranks is refused by name
        # (elastic resume redistributes one source's rows; a mix's draws are per rank).
        extra["mix"] = {"sources": [[e.name, e.weight, e.source.audio_column, e.source.label_column,
                                     None if e.source.length is None else e.source.length.to_dict()]
                                    for e in sources.mix.entries],
                        "stop": s.stop, "world_size": s.storage.world_size}
    if s.augmentations is not None and s.augmentations.builtin:
        extra["augment"] = [{**described, "files": files_of(dataset)} if dataset is not None else described
                            for described, dataset in zip(s.augmentations.describe(),
                                                          s.augmentations.datasets(), strict=True)]
    if sources.datasets[0].filter is not None:
        extra["filter"] = str(sources.datasets[0].filter)
    if s.shuffle.interleave > 1:
        extra["interleave"] = s.shuffle.interleave
    memory = s.shuffle.fingerprint()
    if memory is not None:  # a checkpoint without it was taken before byte budgets (budget.LEGACY_TRAIN)
        extra["memory"] = memory
    tables = [[d.table.table, d.table.snapshot_id] for d in sources.datasets if d.table]
    if tables:
        extra["iceberg"] = tables  # [table, snapshot id] per Iceberg source: a resume reads the same snapshot
    return extra


def check_fingerprint(ours: dict[str, Any], theirs: dict[str, Any], datasets: dict[str | None, ShardDataset],
                      ignore: Sequence[str] = ()) -> None:
    """`CheckpointMismatchError` naming every field of ``theirs`` (a checkpoint's) that differs from ``ours``,
    then every file whose content changed (``datasets``: by mix source name, or ``{None: dataset}``)."""
    _check_snapshots(theirs.get("iceberg"), ours.get("iceberg"))
    theirs = {key: value if key == "file_identity" else _hashed_like(value, ours.get(key))
              for key, value in theirs.items()}
    skip = {"file_identity", *ignore}
    differ = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(theirs) | set(ours))
              if theirs.get(k) != ours.get(k) and k not in skip}
    if differ:
        lines = _difference_lines(differ)
        if "files" in differ:  # the real cause: what follows from the data (bucket edges, ...) is listed after it
            lead = ("this state dict was saved by an AudioLoader reading other shard files: resume on the data the "
                    "checkpoint was taken on, or start a new run on this data. What differs:\n")
        else:
            lead = ("this state dict was saved by an AudioLoader built with different arguments; build the "
                    "loader with the checkpoint's values for these fields:\n")
        raise CheckpointMismatchError(lead + "\n".join(lines), differ)
    _check_file_identity(ours["file_identity"], theirs.get("file_identity"), datasets)


def _check_file_identity(ours: dict[str, Any], theirs: dict[str, Any] | None,
                         datasets: dict[str | None, ShardDataset]) -> None:
    """`CheckpointMismatchError` naming each file whose content changed since the checkpoint.

    Same name, size and rows are not enough: the metadata digest must match,
    and where the data is still at the same location (not copied elsewhere,
    which resets modification times) so must the modification time.
    """
    if theirs is None:  # a checkpoint from before file identities: names, sizes and rows were checked
        return
    if list(datasets) == [None]:
        changed = _changed_files(datasets[None], theirs, ours)
    else:  # per source; the sources themselves were compared with the rest of the fingerprint
        changed = [line for name, dataset in datasets.items()
                   for line in _changed_files(dataset, theirs[name], ours[name])]
    if changed:
        raise CheckpointMismatchError(
            f"{len(changed)} shard file(s) changed since the checkpoint was taken, so it would resume on other "
            "data:\n" + "\n".join(changed) + "\nResume on the data the checkpoint was taken on, or start "
            "a new run on the new data", {"file_identity": (theirs, ours)})


@dataclass(frozen=True)
class Resume:
    """A checkpoint given to `AudioLoader.load_state_dict`, read (`of`): its states checked, in rank order.

    ``states``: this rank's state alone, or every rank's of the run that saved them (ranks 0..W-1); ``elastic``:
    they are every rank's of a run with another world size (the rows left are spread over the new ranks,
    `audioloader.elastic`); ``fingerprint``: the one checked against the loader's (this rank's, or rank 0's);
    ``ignore``: the fingerprint's fields that may differ (an elastic resume's rank and world size).
    """

    states: list[dict[str, Any]]
    elastic: bool
    fingerprint: dict[str, Any]
    ignore: tuple[str, ...] = ()

    @classmethod
    def of(cls, state_dict: dict[str, Any] | Sequence[dict[str, Any]], rank: int, world_size: int) -> Resume:
        """``state_dict`` (one state, or a list of every rank's) read for rank ``rank`` of ``world_size``."""
        if not isinstance(state_dict, (list, tuple)):
            check_format(state_dict)
            return cls([state_dict], False, state_dict["fingerprint"])
        for state in state_dict:
            check_format(state)
        by_rank = states_by_rank(list(state_dict))
        if len(by_rank) == world_size:  # the same world: this rank's state, as if it were passed alone
            return cls([by_rank[rank]], False, by_rank[rank]["fingerprint"])
        return cls(by_rank, True, by_rank[0]["fingerprint"], ignore=("rank", "world_size"))


def check_format(state: Any) -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointMismatchError(f"not an AudioLoader state dict (expected format {STATE_FORMAT!r}, got {got!r})",
                                      {"format": (got, STATE_FORMAT)})


def states_by_rank(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The states of one run in rank order; `CheckpointMismatchError` unless they are ranks 0..W-1 once each."""
    if not states:
        raise CheckpointMismatchError("an empty list of states: pass the states of every rank of the run",
                                      {"rank": ([], None)})
    worlds = sorted({s["fingerprint"]["world_size"] for s in states})
    ranks = sorted(s["fingerprint"]["rank"] for s in states)
    if len(worlds) != 1 or ranks != list(range(worlds[0])):
        raise CheckpointMismatchError(
            f"the list must hold the state of every rank of one run exactly once; it has ranks {ranks} of world "
            f"size(s) {worlds}. Gather all ranks' states (torch.distributed.all_gather_object) or list every "
            "rank's saved state", {"rank": (ranks, list(range(worlds[0])))})
    by_rank = sorted(states, key=lambda s: s["fingerprint"]["rank"])
    first = {k: v for k, v in by_rank[0]["fingerprint"].items() if k != "rank"}
    for state in by_rank[1:]:
        other = {k: v for k, v in state["fingerprint"].items() if k != "rank"}
        if other != first:
            fields = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise CheckpointMismatchError(
                f"the states of rank 0 and rank {state['fingerprint']['rank']} come from loaders built with "
                f"different {', '.join(fields)}: they are not one run's checkpoint",
                {k: (first.get(k), other.get(k)) for k in fields})
    return by_rank



def _check_snapshots(theirs: list[list[Any]] | None, ours: list[list[Any]] | None) -> None:
    """`CheckpointMismatchError` naming the table and both snapshot ids when a checkpoint of an Iceberg table's
    snapshot is loaded into a loader reading another snapshot of it (its rows and their indices differ)."""
    if not theirs or not ours or theirs == ours:
        return
    moved = [(table, then, now) for (table, then), (other, now) in zip(theirs, ours, strict=False)
             if table == other and then != now]
    if moved:
        raise CheckpointMismatchError(
            "\n".join(f"Iceberg table {table!r}: the checkpoint was taken on snapshot {then}, this loader reads "
                      f"snapshot {now}" for table, then, now in moved)
            + "\nResume on the checkpoint's snapshot (IcebergTable(..., snapshot_id=" + str(moved[0][1]) + ")), "
            "or start a new run on the new one", {"iceberg": (theirs, ours)})


def _changed_files(dataset: ShardDataset, theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """One line per file of ``dataset`` whose identity changed from ``theirs`` (checkpoint) to ``ours``.

    The metadata digest must match. Where the data is still at the same location (not
    copied elsewhere, which resets modification times and may change ETags) so must the
    object's ETag where both sides know it, else the modification time (S3's has 1 s
    resolution: a rewrite in the second of the upload keeps it; the ETag does not).
    Checkpoints from before ETags have none: their modification times are compared. Another ETag with the
    same bytes (uploaded again another way: one PUT instead of a multipart upload) is no change: the file is
    read once and its bytes checked against the checkpoint's ETag, an MD5 of them
    (`ShardDataset.holds_etag_content`); pyarrow's S3 client does not ask for the full-object checksums S3
    keeps (its HEAD's metadata has none), so the ETag is the content checksum there is.
    """
    if "digests_sha256" in ours or "digests_sha256" in theirs:
        changed = _changed_hashes(theirs, ours)
        if not changed or "digests" not in theirs:
            return changed
        ours = _identity_of(dataset, listed=True)  # the checkpoint lists its files: name those that changed
    in_place = theirs.get("location") == ours["location"]
    no_etags = [None] * len(dataset.files)
    changed = []
    for file_id, (f, digest, mtime, etag, their_digest, their_mtime, their_etag) in enumerate(zip(
            dataset.files, ours["digests"], ours["mtimes"], ours.get("etags", no_etags), theirs["digests"],
            theirs["mtimes"], theirs.get("etags", no_etags), strict=True)):
        if digest != their_digest:
            changed.append(f"  {f.path}: its metadata differs (footer / schema / batch layout digest "
                           f"{their_digest} -> {digest}) with the same name, size and rows")
        elif not in_place:
            continue
        elif None not in (etag, their_etag):
            if etag != their_etag and not dataset.holds_etag_content(file_id, their_etag):
                changed.append(f"  {f.path}: rewritten in place ({their_etag} -> {etag}; modification time "
                               f"{_when(their_mtime)} -> {_when(mtime)}) with the same name, size and rows")
        elif mtime != their_mtime and None not in (mtime, their_mtime):
            changed.append(f"  {f.path}: rewritten in place (modification time {_when(their_mtime)} -> "
                           f"{_when(mtime)}) with the same name, size and rows")
    return changed


def _changed_hashes(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """`_changed_files` where either side holds hashes (beyond `LISTED_FILES` files): one line, without the files'
    names, when the metadata digests differ, or, with the data where it was, the ETags (else the modification
    times). An object uploaded again with the same bytes another way (another ETag) counts as changed here."""
    theirs = theirs if "digests_sha256" in theirs else _hashed_identity(theirs)
    ours = ours if "digests_sha256" in ours else _hashed_identity(ours)
    names = ["digests"]
    if theirs.get("location") == ours["location"]:
        names.append("etags" if "etags_sha256" in theirs and "etags_sha256" in ours else "mtimes")
    differ = [name for name in names if theirs.get(f"{name}_sha256") != ours.get(f"{name}_sha256")]
    if not differ:
        return []
    what = {"digests": "metadata digests (footer / schema / batch layout)", "etags": "ETags",
            "mtimes": "modification times"}
    return [f"  some of the {ours['count']:,} files: their {' and '.join(what[name] for name in differ)} differ "
            f"(hash of the checkpoint's {theirs[differ[0] + '_sha256'][:12]}..., now {ours[differ[0] + '_sha256'][:12]}"
            f"...); a checkpoint of more than {LISTED_FILES:,} files records hashes, not each file, so the files are "
            "not named here"]


def _identity_of(dataset: ShardDataset, listed: bool = False) -> dict[str, Any]:
    """What identifies the content of a dataset's files (`ShardDataset.identity`) and where they are: file by file,
    or, beyond `LISTED_FILES` files (unless ``listed``), each list as its hash (`_hashed_identity`)."""
    identity = {"location": _common_folder(list(dataset.files.paths)), **dataset.identity()}
    return identity if listed or len(dataset.files) <= LISTED_FILES else _hashed_identity(identity)


def files_of(dataset: ShardDataset) -> list[list[Any]] | dict[str, Any]:
    """What identifies a dataset's rows in a checkpoint fingerprint (a source's, a noise source's): ``[[path,
    size, rows], ...]``, or, beyond `LISTED_FILES` files, that list's count, totals and hash (`_hashed_files`).

    The paths are relative to the files' common folder: a checkpoint must survive the data moving to another
    mount point or bucket prefix; the files' names, sizes, row counts and metadata digests identify the data
    (their modification times only while it stays where it was).
    """
    table = dataset.files
    paths = list(table.paths)
    cut = len(_common_folder(paths))
    files = [[path[cut:], size, rows] for path, size, rows in zip(
        paths, table.sizes.tolist(), np.diff(table.row_offsets).tolist(), strict=True)]
    return files if len(files) <= LISTED_FILES else _hashed_files(files)


def _hashed_files(files: list[list[Any]]) -> dict[str, Any]:
    """A file list as ``{"count", "rows", "bytes", "sha256"}``: a few hundred bytes in every checkpoint."""
    return {"count": len(files), "rows": sum(int(entry[2]) for entry in files),
            "bytes": sum(int(entry[1]) for entry in files), "sha256": _sha256(files)}


def _hashed_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """A file-by-file identity with each list replaced by its hash (``digests`` -> ``digests_sha256``, ...)."""
    return {"location": identity["location"], "count": len(identity["digests"]),
            **{f"{name}_sha256": _sha256(identity[name]) for name in _IDENTITY_LISTS if name in identity}}


def _sha256(values: list[Any]) -> str:
    return hashlib.sha256(json.dumps(values, separators=(",", ":")).encode()).hexdigest()


def _hashed_like(theirs: Any, ours: Any) -> Any:
    """``theirs`` (a checkpoint's fingerprint, or a part of it) with each file list hashed where ``ours`` holds
    the hash (`files_of` beyond `LISTED_FILES` files), so a checkpoint that lists its files compares with a
    loader that hashes them."""
    if isinstance(ours, dict) and ours.keys() == _HASHED_FILES_KEYS and isinstance(theirs, list):
        return _hashed_files(theirs)
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return {key: _hashed_like(value, ours.get(key)) for key, value in theirs.items()}
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [_hashed_like(a, b) for a, b in zip(theirs, ours, strict=True)]
    return theirs


def _common_folder(paths: list[str]) -> str:
    """The longest folder (ending in "/") that holds every path or URL."""
    # String prefix on purpose (URLs are not OS paths), then cut back to a "/". The paths' own common prefix cut
    # back so is their folders' (a million paths: one C call, not a million splits); a name without any "/" is
    # taken, as it always was, for a folder of its own.
    if not all("/" in path for path in paths):
        paths = [path.rsplit("/", 1)[0] + "/" for path in paths]
    prefix = os.path.commonprefix(paths)  # noqa: RUF071
    return prefix[: prefix.rfind("/") + 1]  # a whole folder, never part of a name


def _when(mtime_ns: int | None) -> str:
    if mtime_ns is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mtime_ns / 1e9)) + f".{mtime_ns % 10**9:09d} UTC"



#: At most this many differing (nested) fields are listed; the rest are counted.
MAX_LISTED_DIFFERENCES = 20
#: Fingerprint fields computed from the data, which no argument sets (bucket edges from the rows' durations).
DERIVED_FIELDS = ("batching.boundaries", "batching.num_buckets")
_ABSENT = object()


def _difference_lines(differ: dict[str, tuple[Any, Any]]) -> list[str]:
    """One line per differing field, named down to the value that differs (``features.low_freq``,
    ``files[3]``), with both values: a long settings dict is never shown cut where the difference is hidden."""
    found: list[tuple[str, Any, Any]] = []
    for key, (theirs, ours) in differ.items():
        _differences(key, theirs, ours, found)
    # The data first (a different dataset is the cause of everything else), then settings, and last what no
    # argument sets: values derived from the data (listed only by name when something else differs).
    derived = [f for f in found if f[0].startswith(DERIVED_FIELDS)]
    found = sorted((f for f in found if f not in derived), key=lambda f: not f[0].startswith("files"))
    if not found:
        found, derived = derived, []
    lines = [f"  {path}: checkpoint has {_shown(a)}, this loader has {_shown(b)}"
             for path, a, b in found[:MAX_LISTED_DIFFERENCES]]
    if len(found) > MAX_LISTED_DIFFERENCES:
        lines.append(f"  ... and {len(found) - MAX_LISTED_DIFFERENCES} more")
    if derived:
        names = sorted({path.split("[")[0] for path, _, _ in derived})
        lines.append(f"  (also {', '.join(names)}: derived from the data, not set by an argument; they follow "
                     "from the differences above)")
    return lines


def _differences(path: str, theirs: Any, ours: Any, found: list[tuple[str, Any, Any]]) -> None:
    """Append ``(path, theirs, ours)`` for each leaf that differs: into dicts key by key, into lists of equal
    length item by item (an item that is itself a list, such as a file's entry, is shown whole)."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in sorted(set(theirs) | set(ours), key=str):
            a, b = theirs.get(key, _ABSENT), ours.get(key, _ABSENT)
            if a != b:
                _differences(f"{path}.{key}", a, b, found)
    elif (isinstance(theirs, (list, tuple)) and isinstance(ours, (list, tuple)) and len(theirs) == len(ours)
          and not path.endswith("]")):
        for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            if a != b:
                _differences(f"{path}[{i}]", a, b, found)
    else:
        found.append((path, theirs, ours))


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "no such field"
    if isinstance(value, (list, tuple)) and len(repr(value)) > 120:
        return f"{len(value)} items {_short(value)}"
    return _short(value)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
