"""Batcher: collate decoded samples into a dict of tensors."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from .. import checks
from ..samples import BatchEnd, Sample
from ..stats import LoaderStats
from ..workers.recycle import BatchArenas, Recycler
from .held import RowsHeld, nested

#: ``index``, ``label`` and ``source`` of a padding entry (eval under DDP, see ``num_batches``).
PAD_INDEX = -1
PAD_LABEL = -1
PAD_SOURCE = -1

#: Bytes of batch memory a `Batcher` reuses: the batches prefetched, queued and held by the training loop.
BATCH_RECYCLE_BYTES = 128 << 20

#: Batch key of the per-batch augmentation parameters (`Sample.batch_params`), consumed by `BatchAugment`.
BATCH_PARAMS_KEY = "batch_params"


@dataclass(frozen=True)
class BatchLayout:
    """The batches a `Batcher` makes, checked once, here: its arguments of the same names (see `Batcher`), as one
    group. ``spectrogram_shape`` is one sample's features' shape (required with ``num_batches``)."""

    batch_size: int
    drop_last: bool = False
    num_batches: int | None = None
    spectrogram_shape: tuple[int, ...] | None = None
    columns: tuple[str, ...] | None = None
    tensor_columns: frozenset[str] | None = None
    has_labels: bool | None = None
    features_key: str = "spectrogram"
    pin_memory: bool = False
    time_axis: int | None = None
    follow_markers: bool = False
    sources: bool = False
    first_pass_batches: int | None = None  # the first pass's batches instead of num_batches (an elastic resume's)

    def __post_init__(self) -> None:
        checks.count("batch_size", self.batch_size)
        if self.num_batches is not None and (not isinstance(self.num_batches, int) or self.num_batches < 0):
            raise ValueError(f"num_batches={self.num_batches!r} must be None or an integer >= 0")
        if self.first_pass_batches is not None and (self.num_batches is None or self.first_pass_batches < 0):
            raise ValueError(f"first_pass_batches={self.first_pass_batches!r}: an integer >= 0, with num_batches")
        if self.num_batches is not None and self.spectrogram_shape is None:
            raise ValueError("num_batches needs spectrogram_shape=(n_mels, frames) for padding entries")
        fields = {"spectrogram_shape": None if self.spectrogram_shape is None else tuple(self.spectrogram_shape),
                  "columns": None if self.columns is None else tuple(self.columns),
                  "tensor_columns": None if self.tensor_columns is None else frozenset(self.tensor_columns),
                  "drop_last": bool(self.drop_last), "pin_memory": bool(self.pin_memory),
                  "follow_markers": bool(self.follow_markers), "sources": bool(self.sources)}
        for name, value in fields.items():
            object.__setattr__(self, name, value)


#: `BatchLayout`'s fields in order (a `Batcher` has each as an attribute too).
_LAYOUT_FIELDS = tuple(field.name for field in dataclasses.fields(BatchLayout))


class Batcher(BaseNode[dict]):
    """Collates ``Sample`` items into batches.

    A batch is a dict:

    * ``spectrogram`` (or ``features_key``): the samples' ``features`` stacked,
      float32 ``[B, n_mels, frames]`` (``[B, samples]`` for waveforms)
    * ``label``: int64 ``[B]`` (absent when the samples carry no label)
    * ``index``: int64 ``[B]``, the global row index of each sample (within its source)
    * ``source``: int64 ``[B]``, only with ``sources=True`` (a mix): each sample's source
    * ``valid``: bool ``[B]``, only when ``num_batches`` is set (eval): false for padding
    * one entry per extra column: a tensor when the column is numeric (listed in
      ``tensor_columns``, or, when that is ``None``, when every value in the batch
      is a number), else a list.

    Args:
        source: node yielding ``Sample``.
        batch_size: samples per batch (>= 1).
        drop_last: drop a final batch smaller than ``batch_size``.
        num_batches: when set, yield exactly this many batches: stop early if the
            source has more, and when it runs out first, yield batches of
            ``batch_size`` padding entries (zeros, ``index``/``label`` = -1,
            ``valid`` false). Under DDP every rank then runs the same number of
            eval steps, with no sample duplicated for a metric to count twice.
        spectrogram_shape: shape of one sample's features, e.g. ``(n_mels, frames)``,
            for padding entries; required with ``num_batches``, since a rank may
            have no real sample to copy.
        columns: names of the extra columns (``None``: those of the samples'
            ``extras``); needed for a batch made only of padding.
        tensor_columns: extra columns to return as tensors (padding gets 0).
        has_labels: whether batches carry ``label``; ``None`` = when the samples' label is not None.
        stats: optional `LoaderStats`; counts ``batches``/``samples``.
        features_key: the batch key of the stacked features.
        pin_memory: stack the features straight into page-locked memory (for a fast,
            asynchronous copy to a GPU; needs CUDA).
        time_axis: for samples of different lengths (whole utterances): the axis
            of one sample's features that is time. Each batch is then zero-padded
            to its longest sample along it and carries ``lengths`` int64 ``[B]``
            (that axis's length per sample: frames, or samples for waveforms) and
            ``padding_mask`` bool ``[B, T]`` (True where padded). Padding entries
            have length 0; ``spectrogram_shape`` is then the shape at length 0.
        follow_markers: batches end at the `BatchEnd` markers of the stream (from a
            `DurationBucketer`) instead of after ``batch_size`` samples; a batch
            whose rows were all bad is skipped (in eval, with ``num_batches``, it
            is a batch of padding, so the count stays). Padding batches then have
            one entry.
        sources: add ``source`` (``Key.source`` of each sample; -1 for padding).
        collate_from: the `BatchArenas` its source's worker processes copied the features into: a batch
            whose features are one arena's rows in order is that arena (no copy); others are stacked.

    The constructor takes ``source``, ``layout`` (every argument above but ``source``, ``stats`` and
    ``collate_from`` as one checked group: `BatchLayout`; `AudioLoader` settles its own before the chain is
    built), ``stats`` and ``collate_from``; `of` takes the layout's fields one by one.

    Samples with ``batch_params`` (augmentations that run per batch) give the batch
    ``batch_params``: ``{name: tensor [B, ...]}`` (zeros for padding), for `BatchAugment`.
    With ``stats``, every batch's keys go to `LoaderStats.record_batch` (shuffle quality,
    per-source counts).
    """

    SOURCE_KEY = "source"

    @classmethod
    def of(cls, source: BaseNode, batch_size: int, drop_last: bool = False, *, num_batches: int | None = None,
           spectrogram_shape: tuple[int, int] | None = None, columns: Sequence[str] | None = None,
           tensor_columns: Collection[str] | None = None, has_labels: bool | None = None,
           stats: LoaderStats | None = None, features_key: str = "spectrogram", pin_memory: bool = False,
           time_axis: int | None = None, follow_markers: bool = False, sources: bool = False,
           collate_from: BatchArenas | None = None) -> Batcher:
        """A batcher built from its settings one by one: all but ``source``, ``stats`` and ``collate_from`` make
        its `BatchLayout`."""
        layout = BatchLayout(batch_size, drop_last, num_batches, spectrogram_shape, columns, tensor_columns,
                             has_labels, features_key, pin_memory, time_axis, follow_markers, sources)
        return cls(source, layout, stats=stats, collate_from=collate_from)

    def __init__(self, source: BaseNode, layout: BatchLayout | None = None, *, stats: LoaderStats | None = None,
                 collate_from: BatchArenas | None = None, **fields: Any) -> None:
        if fields or not isinstance(layout, BatchLayout):
            raise checks.node_fields("Batcher", "its batches' layout as one BatchLayout(batch_size, ...)", fields)
        super().__init__()
        self.source = source
        self.layout = layout
        for name in _LAYOUT_FIELDS:  # the group's fields, as the node's attributes too
            setattr(self, name, getattr(layout, name))
        self.stats = stats
        self._yielded = 0
        self._exhausted = False
        self._memory = Recycler(BATCH_RECYCLE_BYTES)
        self.collate_from = collate_from
        # num_batches for one pass only: the rest of a pass resumed on another world size (audioloader.elastic),
        # the layout's first_pass_batches, taken by the first fresh pass.
        self._pass_batches: int | None = None
        self._first_pass_batches = layout.first_pass_batches

    @property
    def batches_this_pass(self) -> int | None:
        """The batches of the pass under way (or about to start): ``num_batches`` unless overridden."""
        for value in (self._first_pass_batches, self._pass_batches):
            if value is not None:
                return value
        return self.num_batches

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self._yielded, self._exhausted = 0, False
            self._pass_batches, self._first_pass_batches = self._first_pass_batches, None
            self.source.reset(None)
        else:
            self._yielded, self._exhausted = initial_state["yielded"], initial_state["exhausted"]
            self._pass_batches = initial_state.get("num_batches")
            self.source.reset(initial_state[self.SOURCE_KEY])

    def next(self) -> dict[str, Any]:
        limit = self.num_batches if self._pass_batches is None else self._pass_batches
        if limit is not None and self._yielded >= limit:
            raise StopIteration
        while True:
            samples, closed = self._take(self.batch_size)
            if samples or not closed or self.num_batches is not None:
                break  # else: every row of a planned batch was bad; take the next batch
        if not samples:
            if self.num_batches is None:
                raise StopIteration
            batch = self._collate([], pad=1 if self.follow_markers else self.batch_size)
        elif len(samples) < self.batch_size and self.drop_last and not self.follow_markers:
            raise StopIteration
        else:
            batch = self._collate(samples, pad=0)
        self._yielded += 1
        if self.stats is not None:
            self.stats.count("batches")
            self.stats.count("samples", len(samples))
            self.stats.record_batch([s.key for s in samples])
        return batch

    def _take(self, n: int) -> tuple[list[Sample], bool]:
        """The next batch's samples, and whether a `BatchEnd` marker closed it."""
        samples: list[Sample] = []
        while (self.follow_markers or len(samples) < n) and not self._exhausted:
            try:
                item = next(self.source)
            except StopIteration:
                self._exhausted = True
                break
            if isinstance(item, BatchEnd):
                if self.follow_markers:
                    return samples, True
                continue
            samples.append(item)
        return samples, False

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """The batch this batcher makes of ``samples`` (outside its stream: no state, no stats; e.g. a probe batch
        of `audioloader.tune_batch_sizes`)."""
        return self._collate(samples, pad=0)

    def _collate(self, samples: Sequence[Sample], pad: int) -> dict[str, Any]:
        """Stack ``samples`` and append ``pad`` padding entries."""
        batch: dict[str, Any] = {}
        if self.time_axis is None:
            batch[self.features_key] = self._stack([s.features for s in samples], pad)
        else:
            batch[self.features_key], lengths = self._pad([s.features for s in samples], pad)
            batch["lengths"] = lengths
            batch["padding_mask"] = torch.arange(batch[self.features_key].shape[1 + self.time_axis]) >= lengths[:, None]
        labels = [s.label for s in samples]
        has_labels = self.has_labels if self.has_labels is not None else (not samples or labels[0] is not None)
        if has_labels:
            batch["label"] = torch.tensor([*labels, *[PAD_LABEL] * pad], dtype=torch.int64)
        batch["index"] = torch.tensor([*(s.key.index for s in samples), *[PAD_INDEX] * pad], dtype=torch.int64)
        if self.sources:
            batch["source"] = torch.tensor([*(s.key.source for s in samples), *[PAD_SOURCE] * pad], dtype=torch.int64)
        if self.num_batches is not None:
            batch["valid"] = torch.tensor([True] * len(samples) + [False] * pad, dtype=torch.bool)
        names = self.columns if self.columns is not None else (samples[0].extras if samples else ())
        for name in names:
            batch[name] = self._collate_column(name, [s.extras.get(name) for s in samples], pad)
        if samples and samples[0].batch_params is not None:
            batch[BATCH_PARAMS_KEY] = _stack_params([s.batch_params for s in samples], pad)
        return batch

    def _stack(self, features: list[torch.Tensor], pad: int) -> torch.Tensor:
        """``features`` stacked, then ``pad`` zero entries: one allocation (reused, see `_empty`), one copy per
        sample."""
        if not pad and self.collate_from is not None:
            ready = self.collate_from.batch_of(features)
            if ready is not None:  # the decode stage copied them into one batch's memory, in order
                return ready
        shape = (len(features) + pad, *(tuple(features[0].shape) if features else self.spectrogram_shape))
        out = self._empty(shape)
        if features:
            torch.stack(features, out=out[:len(features)])
        if pad:
            out[len(features):].zero_()
        return out

    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised float32 tensor of ``shape``: page-locked with ``pin_memory``, else memory of an earlier
        batch that nothing refers to any more (`Recycler`: a fresh 16 MiB batch costs 4,096 page faults)."""
        if self.pin_memory:
            return torch.empty(shape, dtype=torch.float32, pin_memory=True)
        count = math.prod(shape)
        memory = self._memory.empty(4 * count).view(np.float32)
        return torch.from_numpy(memory).view(shape)

    def _pad(self, features: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``features`` zero-padded to the longest along ``time_axis``, then ``pad`` empty entries; and the lengths."""
        axis = self.time_axis
        lengths = [f.shape[axis] for f in features] + [0] * pad
        shape = list(features[0].shape if features else self.spectrogram_shape)
        shape[axis] = max(lengths, default=0)
        out = torch.zeros((len(lengths), *shape), dtype=torch.float32, pin_memory=self.pin_memory)
        for i, f in enumerate(features):
            out[i].narrow(axis, 0, lengths[i]).copy_(f)
        return out, torch.tensor(lengths, dtype=torch.int64)

    def _collate_column(self, name: str, values: list[Any], pad: int) -> Any:
        numeric = (name in self.tensor_columns if self.tensor_columns is not None
                   else all(isinstance(v, numbers.Number) for v in values))
        if numeric:
            return torch.tensor([*values, *[0] * pad])
        return [*values, *[None] * pad]

    def get_state(self) -> dict[str, Any]:
        state = {self.SOURCE_KEY: self.source.state_dict(), "yielded": self._yielded, "exhausted": self._exhausted}
        if self._pass_batches is not None:
            state["num_batches"] = self._pass_batches
        return state

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """Holds no rows between batches (see `audioloader.nodes.held`)."""
        return nested(state, cls.SOURCE_KEY)


def _stack_params(params: list[dict[str, np.ndarray]], pad: int) -> dict[str, torch.Tensor]:
    """``{name: [B + pad, ...]}`` of the samples' per-batch augmentation parameters, zeros for padding."""
    out = {}
    for name in params[0]:
        values = [p[name] for p in params]
        out[name] = torch.from_numpy(np.stack([*values, *[np.zeros_like(values[0])] * pad]))
    return out
