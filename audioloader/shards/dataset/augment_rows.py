"""`AugmentRows`: the rows an ``AddNoise`` or ``Reverb`` draws from, read from its shards one row at a time.

The augmentations (`audioloader.dsp.augment`) are pure: they open no files. They are given an `AugmentRows` per
augmentation that reads rows of its own shards (noise clips, impulse responses) and hand it the row they drew; it
answers with the row's encoded audio, which the augmentation decodes.
"""

from __future__ import annotations

from typing import Any

from ...errors import DecodeError
from .shard_dataset import ShardDataset


class AugmentRows:
    """The shards of one ``AddNoise`` / ``Reverb`` (its ``source`` and ``audio_column``), read by random access.

    Picklable (worker processes get a copy; the shards are reopened there).

    Args:
        config: the augmentation: ``source`` (folder, glob, file, URL, a list, or a `ShardDataset`) and
            ``audio_column``.
    """

    def __init__(self, config: Any) -> None:
        source = config.source
        self.name = type(config).__name__
        self.dataset = source if isinstance(source, ShardDataset) else ShardDataset(
            source, audio_column=config.audio_column, label_column=None)

    @property
    def num_rows(self) -> int:
        return self.dataset.num_rows

    def read(self, row: int) -> tuple[Any, str, int]:
        """Row ``row`` (0 <= row < `num_rows`): ``(encoded audio, its file, its row in that file)``;
        `DecodeError` naming the row when it cannot be used (null audio)."""
        what = f"{self.name}: row {row} of its shards"
        shard_row = self.dataset.read_rows([row])[0]
        if shard_row.problem is not None:
            raise DecodeError(f"{what} ({shard_row.file}): {shard_row.problem}", reason=f"{what}: {shard_row.problem}")
        return shard_row.audio, shard_row.file, shard_row.row
