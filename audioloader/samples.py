"""The records that flow between the nodes.

A row's identity is its ``Key``: the global row ``index`` (the file's offset in
the sorted file list plus the row number in that file), the ``pass_index``
(which sweep over the data produced it) and, in a mix of several sources, the
``source`` (its position in the `audioloader.Mix`). Every random choice about a
sample is a pure function of ``(seed, key)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch


class Key(NamedTuple):
    """Identity of one sample: global row index, the pass that produced it, and its source in a mix.

    ``index`` counts rows within the sample's own source; ``source`` is 0 for a
    single source (and for the first source of a mix).
    """

    index: int
    pass_index: int
    source: int = 0

    def parts(self) -> tuple[int, ...]:
        """The integers every random choice about this sample hashes (see `audioloader.dsp.hashing`).

        ``(index, pass)`` for source 0, ``(index, pass, source)`` otherwise: a
        single-source loader draws exactly what it drew before sources existed
        (same crops, same checkpoints), and the samples of other sources draw
        independently of it.
        """
        if self.source == 0:
            return (self.index, self.pass_index)
        return (self.index, self.pass_index, self.source)


@dataclass(slots=True)
class RawSample:
    """One row as read from a shard, audio still encoded.

    Attributes:
        key: ``Key(index, pass_index)``.
        audio: the encoded audio bytes: a zero-copy ``pyarrow.Buffer`` (memory-mapped Arrow IPC), else the
            row's own copy as a numpy ``uint8`` array (Parquet, ORC, remote), or ``None`` for a null value.
            Anything with the buffer protocol decodes.
        label: integer class id, or ``None`` when the loader has no label column.
        extras: the requested extra columns, ``{name: python value}``.
        file: path (or URL) of the shard file.
        row: row number within that file.
        problem: why this row is bad as read (e.g. "audio is null", "label is null"),
            or ``None``. The reader never raises for one row's data; the decode
            stage turns a problem into a counted, reported `BadRow`.
        checksum: `audio_checksum` of ``audio``, taken by the reader right after the
            read (0: not taken; `item_checksum` then computes it).
        mapped: for a row that is a view of a memory-mapped local shard, that file's ``(size in bytes,
            modification time in ns or None)`` as the loader knows it; the decode stage checks the file against
            them before it touches the audio (touching the missing pages of a truncated map is a SIGBUS).
            None for a row that owns its bytes.
    """

    key: Key
    audio: Any
    label: int | None
    extras: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    row: int = -1
    problem: str | None = None
    checksum: int = 0
    mapped: tuple[int, int | None] | None = None


@dataclass(slots=True)
class Sample:
    """One decoded sample.

    Attributes:
        key: ``Key(index, pass_index)``.
        features: float32 tensor: the log-mel spectrogram ``[n_mels, frames]``
            (log when the config's ``log`` is on), or the cropped waveform
            ``[samples]`` when features are computed per batch instead.
        label, extras, file, row: carried over from the ``RawSample``.
        batch_params: parameters of augmentations that run per batch, after the
            decode workers (`audioloader.dsp.augment`: SpecAugment masks where features
            are computed per batch, Mixup draws), ``{name: numpy array}``, or None.
            Drawn in the worker from ``(seed, key)`` like every other random choice.
        checksum: `audio_checksum` of the row's encoded audio (0: not computed), so a
            buffer of decoded samples can verify the rows it reads back on resume.
    """

    key: Key
    features: torch.Tensor
    label: int | None
    extras: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    row: int = -1
    batch_params: dict[str, Any] | None = None
    checksum: int = 0

    @property
    def spectrogram(self) -> torch.Tensor:
        """``features`` under its 0.1 name."""
        return self.features


@dataclass(slots=True)
class BadRow:
    """A row that yields no sample; counted, reported, then dropped.

    Either its audio could not be decoded (an error, under the error budget), or,
    with ``skipped``, the length policy left it out (too short or too long: not
    an error). Decode returns this instead of raising, so nothing around it is lost.
    """

    key: Key
    file: str
    row: int
    reason: str
    skipped: bool = False

    def report(self) -> dict[str, Any]:
        """A plain-dict record for ``loader.stats()`` and error reports."""
        report = {"index": self.key.index, "pass": self.key.pass_index, "file": self.file,
                  "row": self.row, "reason": self.reason}
        if self.key.source:
            report["source"] = self.key.source
        return report


@dataclass(slots=True)
class Failure:
    """An exception raised inside the chain, carried as an item to the consumer.

    torchdata turns exceptions raised in worker threads into strings and hangs on
    the next call after a source error. Carrying the exception object as an item
    and raising it in the caller's thread keeps its type, attributes and traceback.
    """

    error: BaseException


#: Python objects of one held row or sample besides its audio or features (the record, its key, extras,
#: file name; measured with tracemalloc: 560-590 bytes for a row with a short transcript and a duration).
ITEM_OVERHEAD_BYTES = 600


def item_key(item: Any) -> Key:
    """The `Key` of a `RawSample`, `Sample` or `BadRow` (``item.key``): the nodes' default ``key_fn``, a
    module-level function so that a node holding it pickles."""
    return item.key


def held_bytes(item: Any) -> int:
    """Bytes of process memory an item keeps alive while a node holds it (a shuffle buffer, a bucketer).

    A raw row's audio counts its length when it is the row's own copy (a numpy ``uint8`` array, as the reader
    makes for Parquet, ORC and remote shards, or ``bytes``); a ``pyarrow.Buffer`` is a view of a memory-mapped
    shard (local Arrow IPC), whose pages belong to the page cache, and counts nothing. A decoded sample counts
    its features (``nbytes``). Plus `ITEM_OVERHEAD_BYTES` for the Python objects.
    """
    audio = getattr(item, "audio", None)
    features = getattr(item, "features", None)
    n = ITEM_OVERHEAD_BYTES
    if isinstance(audio, (bytes, bytearray)):
        n += len(audio)
    elif isinstance(audio, np.ndarray):
        n += audio.nbytes
    if isinstance(features, torch.Tensor):
        n += features.element_size() * features.nelement()
    return n


class BatchEnd(NamedTuple):
    """Marks the end of a batch in a stream of rows or samples (see `DurationBucketer`).

    The decode stage passes it through unchanged; the `Batcher` then closes the
    batch there instead of counting ``batch_size`` samples.
    """

    seq: int
