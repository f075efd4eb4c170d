"""Memory as a budget: what the shuffle buffer and the bucketer may hold, per mode, and what checkpoints recorded.

The ``shuffle=`` group of `AudioLoader` (`Shuffle`, defined here beside what reads it)
is resolved against the preset of its mode into one `ShuffleSettings`: the buffer's rows and bytes, its first fill in
rows and bytes, the interleaving, and the rules that keep a buffer to one pass.
Everything that holds audio ahead of the decode stage shares one byte budget,
``max_bytes``: the reader's lanes (a unit each, where units are read into memory),
then the `ShuffleBuffer` and a `DurationBucketer` after it, which report what they
hold in ``stats()["memory"]`` (docs/concepts.md, "Memory").

Why 256 MiB a loader: it is what one rank may hold without thought on a laptop (8-16 GB)
and on a 16-rank machine (4 GiB for all ranks together, next to 16 models and their
optimizer states), and it holds about 1,000 decoded 5 s log-mels (256 KB each), or
1,000 Parquet speech rows (10 s of 16 kHz FLAC/WAV, 150-330 KB), or any number of rows of
memory-mapped Arrow IPC shards (a held row there is a view of the file, about 600 bytes
of Python objects). Interleaving ``k`` splits makes a small buffer mix like a large one
(`ArrowShardReader`), so the bytes go further (benchmarks/pipeline/bench_shuffle_quality.py).

A checkpoint taken before byte budgets (no ``"memory"`` in its fingerprint) resumes
with the settings it was taken with (`ShuffleSettings.legacy`): the row-count buffer of
10000 / 8000 rows, no byte bound, no one-pass rule, so the run goes on exactly as it began.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import checks

MiB = 1 << 20


@dataclass(frozen=True)
class Shuffle:
    """The shuffle buffer: how much it holds, in rows and in bytes, and how soon the first batch leaves.

    ``buffer_size``: most rows held; ``max_bytes``: most bytes held ahead of decoding
    (the reader's lanes, the buffer and a bucketer after it together; raw rows count
    their own audio copies, nothing for memory-mapped Arrow IPC shards; decoded
    samples their features; see docs/concepts.md, "Memory"). ``min_size`` rows or
    ``min_bytes`` bytes, whichever comes first, are held before the first item leaves
    (the first batch waits for no more). None takes the mode's preset
    (`audioloader.budget`): train 10000 rows / 256 MiB, first fill 8000 rows / 32 MiB;
    eval 1 / 0 (no shuffle). In training from one source a buffer never holds two
    passes: a corpus smaller than the buffer is shuffled whole each pass.

    ``before_decode``: hold raw rows and decode after the buffer (far less memory,
    fast resume, same batches); None: yes for local Arrow IPC shards, remote shards,
    and with ``batching=`` (the bucketer groups rows before they are decoded; False
    is refused there).

    ``interleave``: splits the reader reads at once, taking one row of each in turn
    (a seeded order each round; `ArrowShardReader`), so that consecutive rows rarely
    come from one split and a small buffer mixes far better (docs/lakehouse.md,
    "Interleaving"). 1: one split after the other. None: the preset (training: as
    many as half the byte budget holds, up to 16; 16 on memory-mapped IPC shards,
    whose lanes cost nothing; evaluation: 1). Costs a record batch / row group /
    stripe in memory per split read at once (nothing for memory-mapped IPC shards).
    """

    buffer_size: int | None = None
    min_size: int | None = None
    before_decode: bool | None = None
    interleave: int | None = None
    max_bytes: int | None = None
    min_bytes: int | None = None

    def __post_init__(self) -> None:
        checks.field_count(self, "buffer_size", allow_none=True)
        checks.field_count(self, "min_size", minimum=0, allow_none=True)
        checks.field_count(self, "interleave", allow_none=True)
        checks.field_count(self, "max_bytes", allow_none=True)
        checks.field_count(self, "min_bytes", minimum=0, allow_none=True)



@dataclass(frozen=True)
class ShufflePreset:
    """The shuffle defaults of one mode; a `Shuffle` field left None takes its value here."""

    buffer_size: int  # most rows held
    min_size: int  # rows held before the first item leaves ...
    max_bytes: int | None  # most bytes held ahead of decoding: reader lanes, buffer, bucketer (None: rows only)
    min_bytes: int | None  # ... or these bytes, whichever comes first
    interleave: int | None  # splits read at once (None: as many as half the budget holds, `fit_interleave`)


#: Training. The rows are the 0.1 preset's; the bytes bound what rows cannot: 10000 decoded log-mels
#: were 2.5 GB, now at most 256 MiB (about 1,000); the first batch waits for 32 MiB of held data (about
#: 128 decoded clips, 100-200 Parquet speech rows) instead of 8000 decodes. Raw rows of memory-mapped IPC
#: shards cost about 600 B each, so there the rows decide, as before.
TRAIN = ShufflePreset(buffer_size=10000, min_size=8000, max_bytes=256 * MiB, min_bytes=32 * MiB, interleave=None)

#: Evaluation: no shuffling (a buffer of 1 passes rows through), one pass in file order.
EVAL = ShufflePreset(buffer_size=1, min_size=0, max_bytes=None, min_bytes=None, interleave=1)

#: What training resolved to before byte budgets (the row-count buffer): legacy checkpoints resume with it.
LEGACY_TRAIN = ShufflePreset(buffer_size=10000, min_size=8000, max_bytes=None, min_bytes=None, interleave=1)

#: The share of ``max_bytes`` a bucketer may hold in its buckets before it hands out its fullest bucket early.
BUCKETER_SHARE = 0.5

#: The least share of ``max_bytes`` the buffer and the bucketer keep when ``Shuffle(interleave=k)`` asks for more lanes
#: than the budget holds (those lanes then come on top of the budget).
BUFFER_FLOOR = 0.25

#: The share of ``max_bytes`` the rows in flight to the decode workers may hold (reported apart: see `ParallelMap`).
DECODE_SHARE = 0.5

#: Most splits read at once by default: a batch of 64 then draws from 16 splits even from a small buffer.
MAX_INTERLEAVE = 16

#: The share of ``max_bytes`` the reader's lanes may hold (a unit each where units are read into memory).
#: Chosen by benchmarks/pipeline/bench_shuffle_quality.py --bucketing (splits a batch against bytes held, for lanes and
#: budgets): at equal bytes, lanes mix more than buffer rows once the buffer holds what the bucketer needs
#: (figures: docs/benchmarks.md, "Shuffle quality per byte for speech").
LANES_SHARE = 0.5


@dataclass(frozen=True)
class ShuffleSettings:
    """What the shuffle buffer, the bucketer and the readers are built with (see the module docstring).

    ``max_bytes`` is the budget; the readers' lanes take ``interleave`` units of
    ``lane_bytes`` each out of it (a preset's interleave at most `LANES_SHARE` of it), the
    buffer and the bucketer share the rest (``buffer_max_bytes``; the bucketer at most
    `BUCKETER_SHARE` of that). ``preset_fields``: the `Shuffle` fields the user left to
    the preset (a legacy checkpoint may set those, never one the user gave).
    """

    buffer_size: int
    min_size: int
    max_bytes: int | None
    min_bytes: int | None
    interleave: int
    one_pass: bool
    bucketing: bool
    preset_fields: frozenset[str]
    before_decode: bool | None = None  # None until `chain.settle` decides it by the shards
    lane_bytes: int = 0
    legacy: bool = False

    @property
    def buffer_max_bytes(self) -> int | None:
        """The budget less the readers' lanes: what the buffer and a bucketer after it hold together (at least
        `BUFFER_FLOOR` of the budget, however many lanes were asked for)."""
        if self.max_bytes is None:
            return None
        return max(int(self.max_bytes * BUFFER_FLOOR), 1, self.max_bytes - self.interleave * self.lane_bytes)

    @property
    def bucketer_max_bytes(self) -> int | None:
        """Most bytes a bucketer holds in its buckets (training: rows only in evaluation, whose batches are planned)."""
        if self.buffer_max_bytes is None or not self.bucketing or not self.one_pass:
            return None
        return max(1, int(self.buffer_max_bytes * BUCKETER_SHARE))

    @property
    def decode_max_bytes(self) -> int | None:
        """Most bytes of rows handed to the decode workers and not yet back (at least one chunk always goes):
        half the budget, which holds more than ``num_workers x 2`` chunks of ordinary rows, and stops hour-long
        recordings from taking a chunk per worker at once."""
        return None if self.max_bytes is None else max(1, int(self.max_bytes * DECODE_SHARE))

    def fitted(self, lane_bytes: int) -> ShuffleSettings:
        """These settings for readers whose lanes hold ``lane_bytes`` each (`lane_bytes`): a preset's interleave
        becomes `fit_interleave`'s (`chain.settle`, before the readers are built)."""
        interleave = self.interleave
        if "interleave" in self.preset_fields and not self.legacy and self.max_bytes is not None:
            interleave = fit_interleave(self.max_bytes, lane_bytes)
        return dataclasses.replace(self, interleave=interleave, lane_bytes=int(lane_bytes))

    def fingerprint(self) -> dict[str, Any] | None:
        """The checkpoint fingerprint's ``"memory"`` field (None for legacy settings: the checkpoint has none)."""
        if self.legacy:
            return None
        return {"max_bytes": self.max_bytes, "min_bytes": self.min_bytes, "one_pass": self.one_pass,
                "buffer_max_bytes": self.buffer_max_bytes, "bucketer_max_bytes": self.bucketer_max_bytes}

    def as_legacy(self, theirs: dict[str, Any]) -> ShuffleSettings:
        """These settings as the loader that saved fingerprint ``theirs`` (from before byte budgets) had them.

        The fields the user left to the preset take the checkpoint's values; the
        byte bounds and the one-pass rules did not exist.
        """
        taken = {"buffer_size": theirs.get("shuffle_buffer_size", LEGACY_TRAIN.buffer_size),
                 "min_size": theirs.get("shuffle_min_size", LEGACY_TRAIN.min_size),
                 "interleave": theirs.get("interleave", LEGACY_TRAIN.interleave)}
        changes = {name: int(value) for name, value in taken.items()
                   if name in self.preset_fields and value is not None}
        return dataclasses.replace(self, **changes, max_bytes=None, min_bytes=None, one_pass=False, legacy=True)


def fit_interleave(max_bytes: int, lane_bytes: int) -> int:
    """Splits read at once by default: `MAX_INTERLEAVE` where a lane costs nothing (memory-mapped shards), else
    as many lanes as `LANES_SHARE` of the budget holds (at least 1)."""
    if lane_bytes <= 0:
        return MAX_INTERLEAVE
    return int(min(MAX_INTERLEAVE, max(1, LANES_SHARE * max_bytes // lane_bytes)))


def lane_bytes(datasets: Sequence[Any]) -> int:
    """Bytes one reader lane may hold: the largest unit (record batch, row group, stripe) of the files whose units
    are read into memory (Parquet, ORC, remote), from their sizes; 0 when every file is memory-mapped."""
    return max((dataset.largest_unit_bytes() for dataset in datasets), default=0)


def resolve(shuffle: Shuffle, *, train: bool, bucketing: bool, mixed: bool) -> ShuffleSettings:
    """The settings of a loader: ``shuffle``'s fields, the rest from the preset of its mode.

    ``one_pass`` (a buffer holds one pass; a bucket never holds an utterance twice) is on
    in training from one source; a `Mix` draws its sources' passes at their weights, so
    passes of different sources always overlap there. A preset's interleave is 1 until
    `chain.settle` fits it to the shards' units (`ShuffleSettings.fitted`), before any reader exists.
    """
    preset = TRAIN if train else EVAL
    given = {"buffer_size": shuffle.buffer_size, "min_size": shuffle.min_size, "max_bytes": shuffle.max_bytes,
             "min_bytes": shuffle.min_bytes, "interleave": shuffle.interleave}
    preset_fields = frozenset(name for name, value in given.items() if value is None)
    values = {name: getattr(preset, name) if value is None else value for name, value in given.items()}
    if shuffle.min_size is None:
        values["min_size"] = min(preset.min_size, values["buffer_size"])
    if values["min_size"] > values["buffer_size"]:
        raise ValueError(f"Shuffle.min_size={values['min_size']} must be <= "
                         f"Shuffle.buffer_size={values['buffer_size']}: the first batch waits for min_size rows, "
                         "which the buffer must be able to hold")
    values["interleave"] = values["interleave"] or 1
    return ShuffleSettings(**values, one_pass=train and not mixed, bucketing=bucketing, preset_fields=preset_fields,
                           before_decode=shuffle.before_decode)


# -- the device's memory: a batch size per bucket, found by an out-of-memory search -----------------------------

def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """What `audio_loader.tune_batch_sizes` takes for "does not fit": PyTorch's out-of-memory error
    (``torch.OutOfMemoryError``, also ``torch.cuda.OutOfMemoryError``) and ``MemoryError`` (a CPU allocation, or a
    step checking a budget)."""
    import torch

    found = [MemoryError]
    for owner, name in ((torch, "OutOfMemoryError"), (getattr(torch, "cuda", None), "OutOfMemoryError")):
        kind = getattr(owner, name, None)
        if isinstance(kind, type) and kind not in found:
            found.append(kind)
    return tuple(found)


def largest_fitting(rows: list[int], fits: Any, max_size: int, bucket: int) -> int:
    """The largest ``n <= max_size`` with ``fits(rows, n)``: doubling from 1, then a binary search."""
    if not fits(rows, 1):
        raise ValueError(f"tune_batch_sizes: bucket {bucket}: a batch of one of its rows (index {rows[0]}) runs out "
                         "of memory; cap the utterances' length (LengthPolicy(max_seconds=...)) or use a smaller "
                         "model or device batch")
    good, bad = 1, None
    while bad is None and good < max_size:
        n = min(2 * good, max_size)
        if fits(rows, n):
            good = n
        else:
            bad = n
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(rows, middle):
            good = middle
        else:
            bad = middle
    return good
