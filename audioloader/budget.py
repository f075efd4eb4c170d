"""Memory as a budget: what the shuffle buffer and the bucketer may hold, per mode, and what checkpoints recorded.

`AudioLoader` resolves its ``shuffle=`` group (`Shuffle`) against the preset of its
mode into one `ShuffleSettings`: the buffer's rows and bytes, its first fill in
rows and bytes, the interleaving, and the rules that keep a buffer to one pass.
Everything that holds audio ahead of the decode stage (the `ShuffleBuffer`, a
`DurationBucketer` after it) shares one byte budget, ``max_bytes``, and reports
what it holds in ``stats()["memory"]`` (docs/concepts.md, "Memory").

Why 256 MiB a loader: it is what one rank may hold without thought on a laptop (8-16 GB)
and on a 16-rank machine (4 GiB for all ranks together, next to 16 models and their
optimizer states), and it holds about 1,000 decoded 5 s log-mels (256 KB each), or
1,000 Parquet speech rows (10 s of 16 kHz FLAC/WAV, 150-330 KB), or any number of rows of
memory-mapped Arrow IPC shards (a held row there is a view of the file, about 600 bytes
of Python objects). Interleaving ``k`` splits makes a small buffer mix like a large one
(`ArrowShardReader`), so the bytes go further (benchmarks/bench_shuffle_quality.py).

A checkpoint taken before byte budgets (no ``"memory"`` in its fingerprint) resumes
with the settings it was taken with (`ShuffleSettings.legacy`): the row-count buffer of
10000 / 8000 rows, no byte bound, no one-pass rule, so the run goes on exactly as it began.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .options import Shuffle

MiB = 1 << 20


@dataclass(frozen=True)
class ShufflePreset:
    """The shuffle defaults of one mode; a `Shuffle` field left None takes its value here."""

    buffer_size: int  # most rows held
    min_size: int  # rows held before the first item leaves ...
    max_bytes: int | None  # most bytes held by the buffer and a bucketer after it (None: rows only)
    min_bytes: int | None  # ... or these bytes, whichever comes first
    interleave: int  # splits read at once


#: Training, fixed crops. The rows are the 0.1 preset's; the bytes bound what rows cannot: 10000 decoded
#: log-mels were 2.5 GB, now at most 256 MiB (about 1,000); the first batch waits for 32 MiB of held data
#: (about 128 decoded clips) instead of 8000 decodes. Raw rows of memory-mapped IPC shards cost about 600 B
#: each, so there the rows decide, as before.
TRAIN = ShufflePreset(buffer_size=10000, min_size=8000, max_bytes=256 * MiB, min_bytes=32 * MiB, interleave=1)

#: Training with ``batching=Bucketing(...)``: whole utterances held as raw rows before the bucketer.
#: Measured by shuffle quality per byte (benchmarks/bench_shuffle_quality.py --bucketing).
SPEECH = ShufflePreset(buffer_size=10000, min_size=8000, max_bytes=256 * MiB, min_bytes=32 * MiB, interleave=4)

#: Evaluation: no shuffling (a buffer of 1 passes rows through), one pass in file order.
EVAL = ShufflePreset(buffer_size=1, min_size=0, max_bytes=None, min_bytes=None, interleave=1)

#: What training resolved to before byte budgets (the row-count buffer): legacy checkpoints resume with it.
LEGACY_TRAIN = ShufflePreset(buffer_size=10000, min_size=8000, max_bytes=None, min_bytes=None, interleave=1)

#: The share of ``max_bytes`` a bucketer may hold in its buckets before it hands out its fullest bucket early.
BUCKETER_SHARE = 0.5


@dataclass(frozen=True)
class ShuffleSettings:
    """What the shuffle buffer, the bucketer and the readers are built with (see the module docstring).

    ``preset_fields``: the `Shuffle` fields the user left to the preset (a legacy
    checkpoint may set those, never one the user gave).
    """

    buffer_size: int
    min_size: int
    max_bytes: int | None
    min_bytes: int | None
    interleave: int
    one_pass: bool
    bucketer_max_bytes: int | None
    preset_fields: frozenset[str]
    legacy: bool = False

    def fingerprint(self) -> dict[str, Any] | None:
        """The checkpoint fingerprint's ``"memory"`` field (None for legacy settings: the checkpoint has none)."""
        if self.legacy:
            return None
        return {"max_bytes": self.max_bytes, "min_bytes": self.min_bytes, "one_pass": self.one_pass,
                "bucketer_max_bytes": self.bucketer_max_bytes}

    def as_legacy(self, theirs: dict[str, Any]) -> ShuffleSettings:
        """These settings as the loader that saved fingerprint ``theirs`` (from before byte budgets) had them.

        The fields the user left to the preset take the checkpoint's values; the
        byte bounds and the one-pass rules did not exist.
        """
        taken = {"buffer_size": theirs.get("shuffle_buffer_size"), "min_size": theirs.get("shuffle_min_size"),
                 "interleave": theirs.get("interleave", 1)}
        changes = {name: int(value) for name, value in taken.items()
                   if name in self.preset_fields and value is not None}
        return dataclasses.replace(self, **changes, max_bytes=None, min_bytes=None, one_pass=False,
                                   bucketer_max_bytes=None, legacy=True)

    def configure(self, buffer: Any, bucketer: Any, readers: Sequence[Any]) -> None:
        """Set these settings on nodes built with other ones, before they start (a legacy checkpoint's)."""
        if buffer is not None:
            buffer.capacity, buffer.min_size = self.buffer_size, self.min_size
            buffer.max_bytes, buffer.min_bytes, buffer.one_pass = self.max_bytes, self.min_bytes, self.one_pass
            buffer.describe()
        if bucketer is not None:
            bucketer.max_bytes, bucketer.distinct = self.bucketer_max_bytes, self.one_pass
            bucketer.describe()
        for reader in readers:
            reader.set_interleave(self.interleave)


def resolve(shuffle: Shuffle, *, train: bool, bucketing: bool, mixed: bool) -> ShuffleSettings:
    """The settings of a loader: ``shuffle``'s fields, the rest from the preset of its mode.

    ``one_pass`` (a buffer holds one pass; a bucket never holds an utterance twice) is on
    in training from one source; a `Mix` draws its sources' passes at their weights, so
    passes of different sources always overlap there.
    """
    preset = (SPEECH if bucketing else TRAIN) if train else EVAL
    given = {"buffer_size": shuffle.buffer_size, "min_size": shuffle.min_size, "max_bytes": shuffle.max_bytes,
             "min_bytes": shuffle.min_bytes, "interleave": shuffle.interleave}
    preset_fields = frozenset(name for name, value in given.items() if value is None)
    values = {name: getattr(preset, name) if value is None else value for name, value in given.items()}
    if shuffle.min_size is None:
        values["min_size"] = min(preset.min_size, values["buffer_size"])
    if values["min_size"] > values["buffer_size"]:
        raise ValueError(f"shuffle_min_size={values['min_size']} must be <= "
                         f"shuffle_buffer_size={values['buffer_size']}")
    one_pass = train and not mixed
    bucketer_max_bytes = None
    if train and bucketing and values["max_bytes"] is not None:
        bucketer_max_bytes = max(1, int(values["max_bytes"] * BUCKETER_SHARE))
    return ShuffleSettings(**values, one_pass=one_pass, bucketer_max_bytes=bucketer_max_bytes,
                           preset_fields=preset_fields)
