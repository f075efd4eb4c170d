"""AudioLoader: the DataLoader-shaped front that builds the default chain."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import pickle
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import BaseNode, PinMemory

from . import budget, elastic
from .distributed import resolve_rank
from .dsp.augment import Augmentations
from .dsp.config import FeatureConfig, LengthPolicy, MelSpectrogramConfig, check_features
from .errors import CheckpointMismatchError
from .loader import Loader
from .mix import Mix, check_columns, check_lengths, fetch_mixed, source_seed
from .nodes.arrow_shard_reader import ArrowShardReader
from .nodes.batch_augment import BatchAugment
from .nodes.batch_features import BatchFeatures
from .nodes.batcher import Batcher
from .nodes.catch_failures import CatchFailures
from .nodes.decode_spectrogram import DecodeSpectrogram
from .nodes.duration_bucketer import DurationBucketer, estimate_boundaries, plan, row_seconds
from .nodes.prefetcher import Prefetcher
from .nodes.shuffle_buffer import ShuffleBuffer
from .nodes.weighted_mix import WeightedMix
from .options import Bucketing, Shuffle, Workers, merge
from .samples import BadRow, Key, RawSample, Sample
from .shards import IcebergTable, Retry, ShardDataset
from .stats import LoaderStats

STATE_FORMAT = "audioloader.AudioLoader/1"

#: ``worker_type="auto"`` decodes in processes on machines with at least this many cores, else in threads.
#: Measured on 2 cores with a training step in the loop (benchmarks/bench_train_loop.py): processes 928 vs
#: threads 754 samples/s on PCM16, even on FLAC; on 16 cores threads stop scaling at 5-10 busy cores.
AUTO_PROCESS_MIN_CORES = 2

Shards = str | Path | Sequence[str | Path]


@dataclass(frozen=True)
class ModePreset:
    """Defaults of one mode (DESIGN.md, "Modes"); its shuffle buffer's are in `audioloader.budget`."""

    infinite: bool
    num_workers: int


TRAIN = ModePreset(infinite=True, num_workers=8)
# Eval does not shuffle (buffer of 1 = pass-through, budget.EVAL), unlike DESIGN.md's 1000 / 0: a
# metric does not depend on order, and the growing buffer made the first batch wait
# for twice as many decodes (benchmark: first batch 0.66 s -> 0.26 s, 40% less memory).
EVAL = ModePreset(infinite=False, num_workers=4)


class AudioLoader:
    """Batches of log-mel spectrograms from Arrow/Parquet audio shards, resumable bit for bit.

    Builds ``ArrowShardReader -> DecodeSpectrogram -> ShuffleBuffer -> Batcher
    -> Prefetcher (-> PinMemory)`` under an audioloader `Loader`, or, with
    ``shuffle_before_decode``, ``reader -> ShuffleBuffer -> decode -> ...``: the
    buffer then holds raw rows. For local Arrow IPC shards (memory-mapped) a raw
    row is a zero-copy view that costs no memory, so that order is the default
    there: measured on 10 s FLAC clips, half the anonymous memory, the first
    batch twice as soon, and a resume at buffer 10000 in 0.4 s instead of the
    37 s it takes to decode 10000 clips again. It is the default for remote
    shards too (their rows are copies the reader owns; measured on S3: faster,
    sooner, less memory; docs/storage.md). Local Parquet and ORC keep decoded samples.

    Each batch is a dict: ``spectrogram`` float32 ``[B, n_mels, frames]``,
    ``label`` int64 ``[B]`` (unless ``label_column=None``), ``index`` int64
    ``[B]`` (global row index), in eval ``valid`` bool ``[B]`` (false for the
    padding that keeps ranks at equal batch counts), and each of ``columns``
    (numbers -> tensors, others -> lists). A `Mix` adds ``source`` int64 ``[B]``
    (the position of each sample's source in the mix; names in ``source_names``);
    `Mixup` adds ``mixup_weights``, ``mixup_partner`` and ``mixup_labels``.

    Args:
        source: directory, glob, file, or a list of them; local path or URL. Or an
            `IcebergTable`: one snapshot of an Apache Iceberg table (docs/lakehouse.md;
            the snapshot id is in the checkpoint). Or a
            `Mix` of several sources at weights (see docs/mixing.md): each source has
            its own shards, columns and optionally length policy; keys gain the
            source; ``stats()["sources"]`` counts per source. In eval a mix reads
            every row of every source exactly once across ranks.
        batch_size: samples per batch.
        train: preset. True: infinite passes, random crop, a shuffle buffer of 10000 rows and
            256 MiB, first fill 8000 rows or 32 MiB, one pass at a time (`audioloader.budget`),
            8 decode threads. False: one pass, each sample exactly
            once across ranks, center crop, no shuffle buffer (rows in file order), 4 threads.
        seed: every random choice is a pure function of ``seed`` and the sample's key.
        features: `MelSpectrogramConfig`.
        num_workers, shuffle_buffer_size, shuffle_min_size, infinite: override the preset.
        augment: optional ``augment(waveform: np.ndarray float32 [clip_samples],
            rng: np.random.Generator) -> np.ndarray``; ``rng`` is seeded from (seed, key).
            Or a list of augmentations (`Gain`, `AddNoise`, `Reverb`, `SpeedPerturb`,
            `SpecAugment`, `Mixup`; see `audioloader.dsp.augment`) and such functions, in
            that order of stages: each a pure function of (seed, key).
        audio_column: binary column, or a struct with a ``bytes`` field (HF ``Audio``).
        label_column: integer column, or None for unlabeled data.
        columns: extra columns carried into each batch.
        rank, world_size: default from ``torch.distributed`` when initialized, else 0 / 1.
        drop_last: drop a final partial batch.
        pin_memory: pin batches (needs CUDA; ignored with a warning otherwise).
        on_error: ``"skip"`` (count and report bad rows, within an error budget) or ``"raise"``.
        split_rows: target rows per split (the unit assigned to ranks).
        prefetch_batches: batches prepared ahead in a background thread.
        shuffle_before_decode: shuffle raw rows, then decode (see above); ``None``
            chooses: True for local Arrow IPC shards, for remote shards and with ``batching=`` (rows are
            grouped before they are decoded: False is refused there), False for local Parquet and ORC.
        max_error_fraction: error budget of ``on_error="skip"``.
        filesystem: a ``pyarrow.fs.FileSystem`` for the source paths.
        retry: how remote reads are retried and timed out (`Retry`; docs/storage.md).
        filter: a ``pyarrow.compute.Expression`` over non-audio columns, e.g.
            ``pc.field("duration") < 10.0``: only the rows it keeps are read (Parquet row
            groups pruned by statistics first; docs/storage.md). Rows keep their index.
        worker_type: ``"thread"``, ``"process"`` or ``"auto"`` (processes on machines
            with `AUTO_PROCESS_MIN_CORES` cores or more). Threads start instantly and
            need nothing picklable; processes scale past the GIL with the cores and
            leave the training loop's Python alone. Batches are identical either way.
        start_method: how worker processes start: ``None`` (default): a fork while
            the loader's process runs no other Python thread (instant), else a fork
            server (safe beside threads; imports torch once per process);
            ``"fork"``, ``"forkserver"`` or ``"spawn"`` to choose.
        device: None (default): features per sample in the decode workers. A torch
            device (``"cuda"``): the workers deliver cropped waveforms and each
            batch's features are computed there in one batched call on a side stream
            (`BatchFeatures`); every tensor of the batch arrives on that device.
            ``"cpu"`` runs the same batched code on the CPU (slower than the
            default; it exists to check the GPU path against the CPU one).
    """

    def __init__(
        self,
        source: Shards | Mix | IcebergTable,
        batch_size: int = 64,
        train: bool = True,
        seed: int = 0,
        features: FeatureConfig | None = None,
        num_workers: int | None = None,
        shuffle_buffer_size: int | None = None,
        shuffle_min_size: int | None = None,
        infinite: bool | None = None,
        augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | Sequence[Any] | None = None,
        audio_column: str = "audio",
        label_column: str | None = "label",
        columns: Sequence[str] = (),
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        pin_memory: bool = False,
        on_error: str = "skip",
        *,
        length: LengthPolicy | None = None,
        batching: Bucketing | None = None,
        workers: Workers | None = None,
        shuffle: Shuffle | None = None,
        device: str | torch.device | None = None,
        split_rows: int = 512,
        max_error_fraction: float = 0.01,
        filesystem: Any = None,
        retry: Retry | None = None,
        filter: Any = None,  # the name pyarrow and Iceberg scans use
        prefetch_batches: int | None = None,
        shuffle_before_decode: bool | None = None,
        worker_type: str | None = None,
        start_method: str | None = None,
    ) -> None:
        self._loader: Loader | None = None  # so __del__ works if construction fails
        # The arguments, to rebuild this loader elsewhere (pickling: see __reduce__).
        self._arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        preset = TRAIN if train else EVAL
        self.train = bool(train)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.seed = _int("seed", seed)
        self.features = features if features is not None else MelSpectrogramConfig()
        check_features(self.features)
        self.length = _group("length", length, LengthPolicy)
        self.batching = batching if batching is None else _group("batching", batching, Bucketing)
        if self.batching is not None and not self.length.variable_length:
            raise ValueError("batching=Bucketing(...) forms batches of whole utterances: pass "
                             "length=LengthPolicy(crop=None, max_seconds=...) too")
        if not self.length.variable_length:
            self.length.clip_samples(self.features)  # a crop needs a length: fail here, naming the fix
        self._resolve_workers(merge(_group("workers", workers, Workers), num_workers=num_workers,
                                    kind=worker_type, start_method=start_method,
                                    prefetch_batches=prefetch_batches), preset, augment)
        self.device = _feature_device(device, self.features, self.length)
        self.augmentations = Augmentations.of(augment, self.seed, self.features,
                                              per_batch_features=self.device is not None)
        if self.augmentations is not None and self.augmentations.mixup is not None:
            if not self.train:
                raise ValueError("Mixup with train=False: an evaluation pass should see each sample as it is; "
                                 "leave Mixup out of augment= for evaluation")
            if self.length.variable_length:
                raise ValueError("Mixup mixes equal-length crops; with whole utterances (LengthPolicy(crop=None)) "
                                 "leave Mixup out")
        shuffle = merge(_group("shuffle", shuffle, Shuffle), buffer_size=shuffle_buffer_size,
                        min_size=shuffle_min_size, before_decode=shuffle_before_decode)
        if self.batching is not None and shuffle.before_decode is False:
            raise ValueError("shuffle_before_decode=False with batching=Bucketing(...): the bucketer groups rows "
                             "by duration before they are decoded, so the buffer before it holds raw rows; leave "
                             "shuffle_before_decode out")
        self._settings = budget.resolve(shuffle, train=self.train, bucketing=self.batching is not None,
                                        mixed=isinstance(source, Mix))
        self._buffer: ShuffleBuffer | None = None
        self._bucketer: DurationBucketer | None = None
        self._split_rows = split_rows
        self.infinite = bool(_pick(infinite, preset.infinite))
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.stats_counters = LoaderStats()
        self.columns = tuple(columns)
        self.label_column = label_column
        self.audio_column = audio_column

        self.mix = source if isinstance(source, Mix) else None
        self.retry = retry
        if self.mix is None:
            self.reader: ArrowShardReader | None = ArrowShardReader(
                source, audio_column=audio_column, label_column=label_column,
                columns=self._reader_columns(source, audio_column, label_column, split_rows, filesystem, retry),
                seed=self.seed, rank=self.rank, world_size=self.world_size, shuffle=self.train,
                infinite=self.infinite, split_rows=split_rows, filesystem=filesystem, stats=self.stats_counters,
                retry=retry, filter=filter, interleave=self.interleave)
            self.readers, self.lengths, self.source_names = [self.reader], [self.length], ()
            self.rows: BaseNode = self.reader
            self._has_labels = label_column is not None
            if isinstance(source, IcebergTable) and source.snapshot_id is None:
                # Unpickled elsewhere, this loader reads the snapshot it reads here, not the table's current one.
                self._arguments["source"] = dataclasses.replace(
                    source, snapshot_id=self.reader.dataset.table.snapshot_id)
        else:
            self.reader = None
            self._build_mix(split_rows, filesystem, retry, filter)
        # With batching the rows are grouped before they are decoded: whatever holds them holds raw rows.
        self._settings = self._settings.fitted(budget.lane_bytes([r.dataset for r in self.readers]))
        self._settings.configure(None, None, self.readers)  # a preset's interleave, fitted to the budget
        self._note_memory()
        self.shuffle_before_decode = (True if self.batching is not None else
                                      all(_raw_rows_by_default(r) for r in self.readers)
                                      if shuffle.before_decode is None else bool(shuffle.before_decode))
        self._boundaries = self._bucket_boundaries() if self.batching is not None else None
        self.num_batches = self._count_batches() if not self.train else None
        self.stats_counters.shuffle.configure(
            [_split_rows_of(reader) for reader in self.readers],
            self.mix.weights if self.mix is not None else [1.0], self.batch_size)
        root = self._build_chain(on_error, max_error_fraction)
        if self.device is not None:
            root = BatchFeatures(root, self.features, self.device)
            if self.augmentations is not None and self.augmentations.per_batch:
                root = BatchAugment(root, self.augmentations, self.features.batch_key)
        elif pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but CUDA is not available; batches are not pinned", stacklevel=2)
        elif pin_memory:
            root = PinMemory(root)
        self._loader = Loader(root)
        self._fingerprint = self._make_fingerprint(split_rows)
        self._iterating = threading.Lock()  # held while an iterator of this loader is open
        self._pid = os.getpid()

    # ----------------------------------------------------------------- options

    def _resolve_workers(self, workers: Workers, preset: ModePreset, augment: Any) -> None:
        wanted = 1 if workers.num_workers is None else workers.num_workers
        self.worker_type = _worker_type(workers.kind, wanted, augment)
        default = default_num_workers(self.worker_type, self.train)
        self.num_workers = _non_negative_int("num_workers", _pick(workers.num_workers, default))
        self.start_method = workers.start_method
        self.prefetch_batches = _positive_int("prefetch_batches", workers.prefetch_batches)

    @property
    def shuffle_buffer_size(self) -> int:
        """Most rows the shuffle buffer holds (`Shuffle.buffer_size`, or the preset's)."""
        return self._settings.buffer_size

    @property
    def shuffle_min_size(self) -> int:
        """Rows held before the first item leaves the buffer, unless ``shuffle_min_bytes`` come first."""
        return self._settings.min_size

    @property
    def shuffle_max_bytes(self) -> int | None:
        """The byte budget of what is held ahead of decoding: reader lanes, shuffle buffer, bucketer (None: rows)."""
        return self._settings.max_bytes

    @property
    def shuffle_min_bytes(self) -> int | None:
        """Bytes held that end the buffer's first fill (None: rows only)."""
        return self._settings.min_bytes

    @property
    def interleave(self) -> int:
        """Splits the reader reads at once (`Shuffle.interleave`, or the preset's)."""
        return self._settings.interleave

    def _reader_columns(self, source: Any, audio: str, label: str | None, split_rows: int,
                        filesystem: Any, retry: Retry | None) -> tuple[str, ...]:
        """The user's extra columns, plus the bucketing's duration column when the shards have it."""
        self._duration_column = None
        wanted = self.batching.duration_column if self.batching is not None else None
        if wanted is None or wanted in self.columns:
            self._duration_column = wanted if wanted in self.columns else None
            return self.columns
        schema = ShardDataset(source, audio_column=audio, label_column=label, split_rows=split_rows,
                              filesystem=filesystem, retry=retry).schema
        if wanted in schema.names:
            self._duration_column = wanted
            return (*self.columns, wanted)
        return self.columns

    # ----------------------------------------------------------------- mix

    def _build_mix(self, split_rows: int, filesystem: Any, retry: Retry | None, filter: Any) -> None:
        """One reader per source of the `Mix`, interleaved by a `WeightedMix` node (``self.rows``)."""
        mix = self.mix
        if self.batching is not None:
            raise ValueError("batching=Bucketing(...) does not take a Mix yet: bucket one source, or mix "
                             "fixed-size batches (batch_size=)")
        stop = mix.stop or ("cycle" if self.infinite else "all_exhausted")
        if not self.train and stop != "all_exhausted":
            raise ValueError(f"Mix(stop={stop!r}) with train=False: evaluation reads every row of every source "
                             "exactly once (stop='all_exhausted', the default there); the weights then only set "
                             "the interleaving. Leave stop out, or evaluate the sources one by one")
        if stop == "cycle" and not self.infinite:
            raise ValueError("Mix(stop='cycle') never ends, but infinite=False asks for passes that end: use "
                             "stop='all_exhausted' (every row of every source once) or 'first_exhausted'")
        labelled = {e.name: e.source.label_column is not None for e in mix.entries}
        if len(set(labelled.values())) > 1:
            raise ValueError(f"Mix sources disagree on labels {labelled}: batches have a label for every sample "
                             "or for none; give every Source a label_column, or label_column=None to all")
        self._has_labels = all(labelled.values())
        self.lengths = [e.source.length or self.length for e in mix.entries]
        # The loader's own length= is checked with them: it sets the batches' shape.
        check_lengths(["length= of the loader", *mix.names], [self.length, *self.lengths], self.features)
        self.readers = [self._mix_reader(s, e, split_rows, filesystem, retry, filter)
                        for s, e in enumerate(mix.entries)]
        check_columns(mix.names, [r.dataset.schema for r in self.readers], self.columns)
        self.source_names = mix.names
        self.stats_counters.describe_sources(mix.names, mix.weights)
        self.rows = WeightedMix(dict(zip(mix.names, self.readers, strict=True)), dict(zip(mix.names, mix.weights,
                                strict=True)), stop=stop, infinite=self.infinite, seed=self.seed, rank=self.rank,
                                stats=self.stats_counters)

    def _mix_reader(self, position: int, entry: Any, split_rows: int, filesystem: Any, retry: Retry | None,
                    filter: Any) -> ArrowShardReader:
        source = entry.source
        try:
            return ArrowShardReader(
                source.data, audio_column=source.audio_column, label_column=source.label_column,
                columns=self.columns, seed=source_seed(self.seed, position), rank=self.rank,
                world_size=self.world_size, shuffle=self.train, infinite=False, split_rows=split_rows,
                filesystem=source.filesystem if source.filesystem is not None else filesystem,
                stats=self.stats_counters, retry=retry, filter=filter, interleave=self.interleave)
        except Exception as error:
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"(in Mix source {entry.name!r})")
            raise

    def _fetch_rows(self) -> Callable[[Sequence[Key]], list[RawSample]]:
        """Random access to rows by key, picklable and not holding this loader (restore, worker processes)."""
        if self.mix is None:
            return self.reader.fetcher
        return functools.partial(fetch_mixed, [reader.dataset for reader in self.readers])

    # ----------------------------------------------------------------- chain

    def _build_chain(self, on_error: str, max_error_fraction: float) -> BaseNode:
        fetch_rows = self._fetch_rows()
        # Memory-mapped shards: a worker process reads its rows itself (zero-copy there)
        # rather than getting the encoded audio copied over from here.
        fetch = fetch_rows if all(_raw_rows_are_free(r) for r in self.readers) else None
        length = self.lengths[0] if len(set(self.lengths)) == 1 else self.lengths

        def make_decoder(source: BaseNode) -> DecodeSpectrogram:
            return DecodeSpectrogram(
                source, self.features, seed=self.seed, train=self.train, num_workers=self.num_workers,
                augment=self.augmentations, on_error=on_error, max_error_fraction=max_error_fraction,
                stats=self.stats_counters, worker_type=self.worker_type, fetch=fetch,
                start_method=self.start_method, compute_features=self.device is None, length=length,
                guard=file_guard([reader.dataset for reader in self.readers]),
                max_bytes_in_flight=self._settings.decode_max_bytes)

        settings = self._settings

        def make_buffer(source: BaseNode, restore) -> ShuffleBuffer:
            self._buffer = ShuffleBuffer(
                source, settings.buffer_size, settings.min_size, seed=self.seed, rank=self.rank, restore=restore,
                stats=self.stats_counters, max_bytes=settings.buffer_max_bytes, min_bytes=settings.min_bytes,
                one_pass=settings.one_pass)
            return self._buffer

        if self.batching is not None:
            # Rows are grouped by duration before they are decoded, from their headers
            # or a duration column: only what a batch needs is decoded.
            rows: BaseNode = make_buffer(self.reader, self.reader.fetch) if self.train else self.reader
            planned = self._bucketer = DurationBucketer(
                rows, max_duration=self.batching.max_duration, boundaries=self._boundaries,
                max_batch_size=self.batching.max_batch_size, restore=self.reader.fetch, drop_last=self.drop_last,
                duration_fn=functools.partial(row_seconds, duration_column=self._duration_column),
                stats=self.stats_counters, max_bytes=settings.bucketer_max_bytes, distinct=settings.one_pass)
            self.decoder = make_decoder(planned)
            tail: BaseNode = self.decoder
        elif self.shuffle_before_decode:
            buffer = make_buffer(self.rows, fetch_rows)
            self.decoder = make_decoder(buffer)
            tail = self.decoder
        else:
            self.decoder = make_decoder(self.rows)
            # A partial of a module function, not a bound method: the chain must not
            # point back at this AudioLoader, or dropping it would need gc to stop threads.
            tail = make_buffer(self.decoder, functools.partial(_restore_decoded, fetch_rows, self.decoder))
        batches: BaseNode = self._make_batcher(tail)
        if self.device is None and self.augmentations is not None and self.augmentations.per_batch:
            batches = BatchAugment(batches, self.augmentations, self.features.batch_key)
        return Prefetcher(CatchFailures(batches), prefetch_factor=self.prefetch_batches)

    def _make_batcher(self, tail: BaseNode) -> Batcher:
        # With a feature device the batcher stacks waveforms (in page-locked memory for a
        # GPU) and BatchFeatures, after the prefetcher, computes the features.
        per_sample = self.device is None
        variable = self.length.variable_length
        if per_sample:
            shape = self.features.feature_shape(0 if variable else self.features.num_frames(self._clip_samples))
            time_axis = self.features.time_axis
        else:
            shape, time_axis = ((0,) if variable else (self._clip_samples,)), 0
        self._batcher = Batcher(
            tail, self.batch_size, self.drop_last, num_batches=self.num_batches, spectrogram_shape=shape,
            columns=self.columns, tensor_columns=_numeric_columns(self.readers[0].dataset.schema, self.columns),
            has_labels=self._has_labels, stats=self.stats_counters, sources=self.mix is not None,
            features_key=self.features.batch_key if per_sample else "waveform",
            pin_memory=not per_sample and self.device.type == "cuda",
            time_axis=time_axis if variable else None, follow_markers=self.batching is not None)
        return self._batcher

    @property
    def _clip_samples(self) -> int:
        return self.length.clip_samples(self.features)

    def _bucket_boundaries(self) -> list[float]:
        """The bucketing's edges: given, or estimated from rows spread evenly over the source (same on every rank)."""
        if self.batching.boundaries is not None:
            return list(self.batching.boundaries)
        kept = self.reader.dataset.kept_indices()
        n = len(kept)
        picks = kept[np.unique(np.linspace(0, n - 1, min(n, self.batching.estimate_rows)).round().astype(np.int64))]
        seconds: list[Any] = [None] * len(picks)
        if self._duration_column is not None:  # the column alone: no audio read before the first batch
            seconds = self.reader.dataset.read_column(self._duration_column, picks.tolist())
        missing = [k for k, value in enumerate(seconds) if value is None]
        rows = self.reader.fetch([Key(int(picks[k]), 0) for k in missing])
        for k, row in zip(missing, rows, strict=True):
            seconds[k] = row_seconds(row, self._duration_column)
        return estimate_boundaries((float(s) for s in seconds), self.batching.num_buckets)

    def _resumed_batches(self, start: elastic.Plan) -> int:
        """Eval, after an elastic resume: batches every new rank yields in the rest of the pass (equal on all)."""
        if self.batching is None:
            rows = start.rows_per_rank
            return min(rows) // self.batch_size if self.drop_last else math.ceil(max(rows) / self.batch_size)
        return self._planned_batches(start)

    def _count_batches(self) -> int:
        """Eval: batches every rank yields (equal across ranks, see Batcher.num_batches)."""
        if self.batching is not None:
            return self._planned_batches()
        rows = [sum(counts) for counts in zip(*(reader.rows_per_rank() for reader in self.readers), strict=True)]
        if self.drop_last:
            return min(rows) // self.batch_size
        return math.ceil(max(rows) / self.batch_size)

    def _planned_batches(self, start: elastic.Plan | None = None) -> int:
        """Eval with bucketing: the most batches a rank's rows make, each rank's read in its reader's order
        (interleaved too), from the pass's start or, after an elastic resume (``start``), from its carry."""
        counts = []
        for rank in range(self.world_size):
            rows = ArrowShardReader(self.reader.dataset, seed=self.seed, rank=rank, world_size=self.world_size,
                                    shuffle=self.train, infinite=False, interleave=self.interleave)
            if start is not None:
                rows.start_from(start.state_for(rows))
            counts.append(len(plan((row_seconds(r, self._duration_column) for r in rows), self._boundaries,
                                   self.batching.max_duration, self.batching.max_batch_size, self.drop_last)))
        return max(counts)

    # ------------------------------------------------------------- iteration

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Start iterating (a new pass, or where a loaded state says); one open iterator at a time.

        Raises ``RuntimeError`` while another iterator of this loader is open (not
        exhausted, closed or garbage-collected), e.g. in another thread: two
        iterators would split one stream between them.
        """
        if self._loader is None:
            raise RuntimeError("this AudioLoader failed to construct")
        if os.getpid() != self._pid:
            raise RuntimeError(_FORKED_MESSAGE.format(pid=self._pid))
        if not self._iterating.acquire(blocking=False):
            raise RuntimeError(
                "this AudioLoader is already being iterated (an iterator from an earlier iter(loader) or for-loop "
                "is still open, perhaps in another thread); iterating twice would split one stream of batches "
                "between the two. Use one iterator: finish or close the first (it.close(), or break out of its "
                "for-loop) before starting another; for a second, independent stream build a second AudioLoader")
        try:
            it = iter(self._loader)  # may restore a shuffle buffer: seconds of decoding
        except BaseException as error:
            self._iterating.release()
            if isinstance(error, KeyboardInterrupt):
                self.shutdown()
            raise
        return self._batches(it)

    def _batches(self, it: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        # A generator that holds `self`: the loader stays alive while it is iterated.
        # It holds `_iterating` from the first line of __iter__ to its end or close().
        try:
            while True:
                try:
                    batch = self._next_batch(it)
                except StopIteration:
                    return
                except KeyboardInterrupt:
                    # Wherever in this frame Ctrl-C lands (in next() or between its lines), the
                    # loader stops every thread and worker before the interrupt goes on.
                    self.shutdown()
                    raise
                yield batch
        finally:
            if os.getpid() == self._pid:
                self._iterating.release()

    def _next_batch(self, it: Iterator[dict[str, Any]]) -> dict[str, Any]:
        if os.getpid() != self._pid:
            raise RuntimeError(_FORKED_MESSAGE.format(pid=self._pid))
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration as end:
            # torchdata re-raises a StopIteration object made in its thread and kept
            # in its frames; with this frame in its traceback, `self` would sit in a
            # reference cycle and the loader's threads would wait for gc to stop.
            end.__traceback__ = None
            raise StopIteration from None
        self.stats_counters.add_seconds("wait", time.perf_counter() - start)
        return batch

    def __getitem__(self, index: Any) -> Any:
        raise TypeError("an AudioLoader is a data loader, not a dataset: iterate it directly (for batch in loader) "
                        "instead of wrapping it in torch.utils.data.DataLoader; its own num_workers decode in "
                        "parallel, and its batches are already collated")

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("len() of an infinite (train=True) AudioLoader is undefined; "
                            "pass infinite=False for one pass per iteration, or train=False. (If a "
                            "torch.utils.data.DataLoader asked: iterate the AudioLoader directly instead of "
                            "wrapping it.)")
        if self.num_batches is not None:
            return self._batcher.batches_this_pass
        if self.mix is not None and self.rows.stop == "first_exhausted":
            raise TypeError("len() of a Mix(stop='first_exhausted') is not known before it runs (it ends when a "
                            "random draw first exhausts a source); use stop='all_exhausted' for a known length")
        rows = sum(split.num_rows for reader in self.readers for split in reader.splits_for_pass(0))
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    # ----------------------------------------------------------------- state

    def _make_fingerprint(self, split_rows: int) -> dict[str, Any]:
        return {
            "files": (_files_of(self.reader.dataset) if self.mix is None else
                      {name: _files_of(r.dataset) for name, r in zip(self.source_names, self.readers, strict=True)}),
            "file_identity": (_identity_of(self.reader.dataset) if self.mix is None else
                              {name: _identity_of(r.dataset)
                               for name, r in zip(self.source_names, self.readers, strict=True)}),
            "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
            "features": self.features.to_dict(), "batch_size": self.batch_size,
            "shuffle_buffer_size": self.shuffle_buffer_size, "shuffle_min_size": self.shuffle_min_size,
            "train": self.train, "infinite": self.infinite, "drop_last": self.drop_last,
            "shuffle_before_decode": self.shuffle_before_decode, "split_rows": split_rows,
            "audio_column": self.audio_column, "label_column": self.label_column,
            "columns": list(self.columns),
            **self._shape_fingerprint(),
        }

    def _shape_fingerprint(self) -> dict[str, Any]:
        """Fields of newer options, present only when used (a 0.1 checkpoint has none of them)."""
        extra: dict[str, Any] = {}
        if not isinstance(self.features, MelSpectrogramConfig):
            extra["feature_type"] = type(self.features).__name__
        if self.length != LengthPolicy():
            extra["length"] = self.length.to_dict()
        if self.batching is not None:
            extra["batching"] = {**self.batching.to_dict(), "boundaries": self._boundaries,
                                 "duration_column": self._duration_column}
        if self.mix is not None:
            # world_size here too: resuming a mix on another number of ranks is refused by name
            # (elastic resume redistributes one source's rows; a mix's draws are per rank).
            extra["mix"] = {"sources": [[e.name, e.weight, e.source.audio_column, e.source.label_column,
                                         None if e.source.length is None else e.source.length.to_dict()]
                                        for e in self.mix.entries],
                            "stop": self.rows.stop, "world_size": self.world_size}
        if self.augmentations is not None and self.augmentations.builtin:
            extra["augment"] = [{**described, "files": _files_of(dataset)} if dataset is not None else described
                                for described, dataset in zip(self.augmentations.describe(),
                                                              self.augmentations.datasets(), strict=True)]
        if self.readers[0].dataset.filter is not None:
            extra["filter"] = str(self.readers[0].dataset.filter)
        if self.interleave > 1:
            extra["interleave"] = self.interleave
        memory = self._settings.fingerprint()
        if memory is not None:  # a checkpoint without it was taken before byte budgets (budget.LEGACY_TRAIN)
            extra["memory"] = memory
        tables = [[r.dataset.table.table, r.dataset.table.snapshot_id] for r in self.readers if r.dataset.table]
        if tables:
            extra["iceberg"] = tables  # [table, snapshot id] per Iceberg source: a resume reads the same snapshot
        return extra

    def state_dict(self) -> dict[str, Any]:
        """A small plain dict (no tensors) to resume from; call between batches, in the iterating thread."""
        return {"format": STATE_FORMAT, "fingerprint": self._fingerprint, "loader": self._loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """The next iteration continues exactly where ``state_dict`` was taken.

        ``state_dict``: this rank's state, or the states of **every** rank of the
        run that saved them (a list, any order; e.g. gathered with
        ``torch.distributed.all_gather_object``). From a list, a loader with the
        saving run's world size takes its own rank's state (the same as passing
        it alone); with another world size it resumes *elastically*: the rows the
        old ranks had left of their pass (unread splits, the rest of partial ones,
        rows held in shuffle buffers, bucketers and decode in flight) are spread
        evenly over the new ranks, so that every row of that pass is delivered
        exactly once across the two runs; later passes use the new layout (see
        `audioloader.elastic` and docs/storage.md).

        Raises `CheckpointMismatchError` naming every field that differs
        between the checkpoint's loader and this one (and, for a list, a rank
        that is missing or given twice).
        """
        if isinstance(state_dict, (list, tuple)):
            self._load_states_of_all_ranks(list(state_dict))
            return
        _check_format(state_dict)
        self._adopt_legacy(state_dict["fingerprint"])
        self._check_fingerprint(state_dict["fingerprint"])
        self._loader.load_state_dict(state_dict["loader"])

    def _adopt_legacy(self, theirs: dict[str, Any]) -> None:
        """A checkpoint taken before byte budgets: go on with the settings it was taken with (`budget`)."""
        if "memory" in theirs or self._settings.legacy:
            return
        self._settings = self._settings.as_legacy(theirs)
        self._settings.configure(self._buffer, self._bucketer, self.readers)
        self._note_memory()
        self._fingerprint = self._make_fingerprint(self._split_rows)

    def _note_memory(self) -> None:
        """The whole budget and the readers' lanes, beside what the buffer and the bucketer report holding."""
        settings = self._settings
        self.stats_counters.memory.notes.update(
            loader_budget_bytes=settings.max_bytes, interleave=settings.interleave,
            lane_bytes=settings.lane_bytes, legacy_checkpoint=settings.legacy)

    def _check_fingerprint(self, theirs: dict[str, Any], ignore: Sequence[str] = ()) -> None:
        ours = self._fingerprint
        _check_snapshots(theirs.get("iceberg"), ours.get("iceberg"))
        skip = {"file_identity", *ignore}
        if self.batching is not None:  # rows are buffered raw with batching, whatever an older loader reported
            skip.add("shuffle_before_decode")
        differ = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(theirs) | set(ours))
                  if theirs.get(k) != ours.get(k) and k not in skip}
        if differ:
            lines = [f"  {k}: checkpoint has {_short(a)}, this loader has {_short(b)}" for k, (a, b) in differ.items()]
            raise CheckpointMismatchError(
                "this state dict was saved by an AudioLoader built with different arguments; build the "
                "loader with the checkpoint's values for these fields:\n" + "\n".join(lines), differ)
        self._check_file_identity(theirs.get("file_identity"))

    def _load_states_of_all_ranks(self, states: list[dict[str, Any]]) -> None:
        """`load_state_dict` of a list: the states of ranks 0..W-1 of one run."""
        for state in states:
            _check_format(state)
        by_rank = _states_by_rank(states)
        if len(by_rank) == self.world_size:
            self.load_state_dict(by_rank[self.rank])
            return
        if self.mix is not None:
            raise CheckpointMismatchError(
                f"this Mix checkpoint was saved on {len(by_rank)} ranks and this loader runs on {self.world_size}: "
                "a mix resumes only on the same number of ranks (its draws are per rank); resume with "
                f"world_size={len(by_rank)}", {"world_size": (len(by_rank), self.world_size)})
        self._adopt_legacy(by_rank[0]["fingerprint"])
        self._check_fingerprint(by_rank[0]["fingerprint"], ignore=("rank", "world_size"))
        chain_states = [state["loader"]["root"] for state in by_rank]
        start = elastic.plan(self._loader.root, self.reader, chain_states)
        self.reader.start_from(start.state_for(self.reader))
        if self.num_batches is not None:
            self._batcher.start_pass_with(self._resumed_batches(start))
        self._loader.start_fresh()  # the next iteration starts the chain anew, at the reader's carry

    def _check_file_identity(self, theirs: dict[str, Any] | None) -> None:
        """`CheckpointMismatchError` naming each file whose content changed since the checkpoint.

        Same name, size and rows are not enough: the metadata digest must match,
        and where the data is still at the same location (not copied elsewhere,
        which resets modification times) so must the modification time.
        """
        if theirs is None:  # a checkpoint from before file identities: names, sizes and rows were checked
            return
        ours = self._fingerprint["file_identity"]
        if self.mix is None:
            changed = _changed_files(self.reader.dataset, theirs, ours)
        else:  # per source; the sources themselves were compared with the rest of the fingerprint
            changed = [line for name, reader in zip(self.source_names, self.readers, strict=True)
                       for line in _changed_files(reader.dataset, theirs[name], ours[name])]
        if changed:
            raise CheckpointMismatchError(
                f"{len(changed)} shard file(s) changed since the checkpoint was taken, so it would resume on other "
                "data:\n" + "\n".join(changed) + "\nResume on the data the checkpoint was taken on, or start "
                "a new run on the new data", {"file_identity": (theirs, ours)})

    # ------------------------------------------------------------ pickling

    def __reduce__(self):
        """Pickle as the constructor's arguments plus the position: unpickled, a fresh loader that goes on from there.

        Threads, worker processes and open files do not travel; the other side
        builds its own chain, loads the state (if this loader had started) and
        continues where this one was. The arguments must pickle: functions passed
        as ``augment`` must be importable (module level, not lambdas).
        """
        loader = self._loader
        positioned = loader is not None and (loader._it is not None or loader._next_iter_state_dict is not None)
        return _rebuild_audio_loader, (self._arguments, self.state_dict() if positioned else None)

    # ------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Counters (samples, batches, bad rows...), per-stage seconds, bad-row reports, buffer fill."""
        return self.stats_counters.snapshot()

    def shutdown(self) -> None:
        """Stop every thread of the loader; iterating again starts them anew."""
        if self._loader is not None:
            self._loader.shutdown()

    def __enter__(self) -> AudioLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        # At interpreter exit the threads are daemons that die with the process;
        # joining them (or starting a helper thread) could hang finalization.
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.shutdown()


_FORKED_MESSAGE = ("this AudioLoader was started in process {pid}; a forked child cannot use its threads or worker "
                   "processes (it would wait forever): build the loader in the process that iterates it")


def _check_format(state: Any) -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointMismatchError(f"not an AudioLoader state dict (expected format {STATE_FORMAT!r}, got {got!r})",
                                      {"format": (got, STATE_FORMAT)})


def _states_by_rank(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def _rebuild_audio_loader(arguments: dict[str, Any], state: dict[str, Any] | None) -> AudioLoader:
    loader = AudioLoader(**arguments)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def _group(name: str, value: Any, cls: type) -> Any:
    """An option group: ``value``, or ``cls()`` when None; a ``TypeError`` naming ``name`` for anything else."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be an audioloader.{cls.__name__}, got {type(value).__name__}")
    return value


def _restore_decoded(fetch: Callable[[Sequence[Key]], list[RawSample]], decoder: DecodeSpectrogram,
                     keys: Sequence[Key]) -> list[Sample]:
    """Rebuild decoded buffer items on resume: random-access read, same decode, same per-key seeds."""
    decoded = decoder.decode_many(fetch(keys))
    bad = [item for item in decoded if isinstance(item, BadRow)]
    if bad:
        raise CheckpointMismatchError(
            f"resuming: {len(bad)} buffered rows no longer decode (first: {bad[0].file} row {bad[0].row}: "
            f"{bad[0].reason}); the data changed since the checkpoint was taken",
            {"rows": ([b.key.index for b in bad], None)})
    return list(decoded)


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

    The metadata digest must match; where the data is still at the same location
    (not copied elsewhere, which resets modification times) so must the
    modification time.
    """
    in_place = theirs.get("location") == ours["location"]
    changed = []
    for f, digest, mtime, their_digest, their_mtime in zip(
            dataset.files, ours["digests"], ours["mtimes"], theirs["digests"], theirs["mtimes"], strict=True):
        if digest != their_digest:
            changed.append(f"  {f.path}: its metadata differs (footer / schema / batch layout digest "
                           f"{their_digest} -> {digest}) with the same name, size and rows")
        elif in_place and mtime != their_mtime and None not in (mtime, their_mtime):
            changed.append(f"  {f.path}: rewritten in place (modification time {_when(their_mtime)} -> "
                           f"{_when(mtime)}) with the same name, size and rows")
    return changed


def _identity_of(dataset: ShardDataset) -> dict[str, Any]:
    """What identifies the content of a dataset's files (`ShardDataset.identity`) and where they are."""
    return {"location": _common_folder([f.path for f in dataset.files]), **dataset.identity()}


def file_guard(datasets: Sequence[ShardDataset]) -> Any:
    """One picklable ``guard(path)`` for the local shard files of all ``datasets`` (see `ShardDataset.file_guard`)."""
    guards = [dataset.file_guard() for dataset in datasets]
    if len(guards) == 1:
        return guards[0]
    return type(guards[0])({path: expected for guard in guards for path, expected in guard.expected.items()})


def _files_of(dataset: ShardDataset) -> list[list[Any]]:
    """What identifies a dataset's rows in a checkpoint fingerprint (a source's, a noise source's)."""
    return _portable_files(dataset.fingerprint()["files"])


def _common_folder(paths: list[str]) -> str:
    """The longest folder (ending in "/") that holds every path or URL."""
    # String prefix on purpose (URLs are not OS paths), then cut back to a "/".
    prefix = os.path.commonprefix([path.rsplit("/", 1)[0] + "/" for path in paths])  # noqa: RUF071
    return prefix[: prefix.rfind("/") + 1]  # a whole folder, never part of a name


def _portable_files(files: list[list[Any]]) -> list[list[Any]]:
    """``[[path, size, rows], ...]`` with paths made relative to the files' common folder.

    A checkpoint must survive the data moving to another mount point or bucket
    prefix; the files' names, sizes, row counts and metadata digests identify the
    data (their modification times only while it stays where it was).
    """
    prefix = _common_folder([str(entry[0]) for entry in files])
    return [[str(entry[0])[len(prefix):], *entry[1:]] for entry in files]


def _when(mtime_ns: int | None) -> str:
    if mtime_ns is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mtime_ns / 1e9)) + f".{mtime_ns % 10**9:09d} UTC"


def _split_rows_of(reader: ArrowShardReader) -> list[tuple[int, int]]:
    """``(first global index, rows)`` of each split this rank reads in pass 0 (for the shuffle-quality figures)."""
    files = reader.dataset.files
    return [(files[s.file_id].index_offset + s.start, s.num_rows) for s in reader.splits_for_pass(0)]


def _raw_rows_are_free(reader: ArrowShardReader) -> bool:
    """True when every shard is a local Arrow IPC file or stream: memory-mapped, so a
    buffered raw row is a view into the page cache, not a copy."""
    return all(file.format in ("ipc_file", "ipc_stream") and "://" not in file.path
               for file in reader.dataset.files)


def _raw_rows_by_default(reader: ArrowShardReader) -> bool:
    """``shuffle_before_decode=None``: raw rows in the buffer for local Arrow IPC shards (zero-copy views)
    and for remote shards, decoded samples for local Parquet and ORC.

    Remote, measured on a loopback S3 server (benchmarks/bench_s3.py, default features, buffer 1000):
    raw rows 1.6-1.9x the samples/s, the first batch 2-3.6x sooner, resume 2.7-3.6x faster and
    20 % less peak memory than decoded samples (a remote raw row owns a copy of its encoded bytes,
    the reader's, so holding it keeps no record batch alive; decoded features are 256 KB each).
    """
    dataset = reader.dataset
    return _raw_rows_are_free(reader) or all(dataset.is_remote(i) for i in range(len(dataset.files)))


def _numeric_columns(schema: pa.Schema, columns: Sequence[str]) -> list[str]:
    """The extra columns whose Arrow type is integer, floating point or boolean (batched as tensors)."""
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return [name for name in columns if any(test(schema.field(name).type) for test in numeric)]


WORKER_TYPES = ("auto", "thread", "process")


def default_num_workers(worker_type: str, train: bool) -> int:
    """Decode workers when ``num_workers`` is not given: processes one per core (they scale to all of them;
    more only adds switching); threads 2 per core, up to the preset's 8 (train) or 4 (eval): on 2 cores 4
    threads made 299 samples/s and 8 made 278, and past ~8 threads the GIL stops them scaling."""
    cores = os.cpu_count() or 1
    if worker_type == "process":
        return cores
    return min((TRAIN if train else EVAL).num_workers, 2 * cores)


def _worker_type(worker_type: Any, num_workers: int, augment: Any) -> str:
    """Resolve ``worker_type="auto"``: processes on `AUTO_PROCESS_MIN_CORES` cores or more, else threads.

    An ``augment`` that cannot be sent to processes (a lambda, a closure) keeps
    "auto" on threads, with a warning saying how to get processes.
    """
    if worker_type not in WORKER_TYPES:
        raise ValueError(f"worker_type={worker_type!r}: must be one of {WORKER_TYPES}")
    if worker_type != "auto":
        return worker_type
    if (os.cpu_count() or 1) < AUTO_PROCESS_MIN_CORES or num_workers == 0:
        return "thread"
    if augment is not None:
        try:
            pickle.dumps(augment)
        except (pickle.PicklingError, TypeError, AttributeError):
            warnings.warn("augment cannot be sent to worker processes (define it at the top level of a module, "
                          "not as a lambda or inside a function), so decoding runs in threads; on many cores "
                          "processes are faster (worker_type='process')", stacklevel=3)
            return "thread"
    return "process"


def _feature_device(device: Any, features: FeatureConfig, length: LengthPolicy) -> torch.device | None:
    if device is None:
        return None
    if getattr(features, "dither", 0.0):
        raise ValueError("device= computes features per batch, where the fbank's dither cannot be seeded per row: "
                         "use FbankConfig(dither=0.0) with device=, or device=None")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r}: not a torch device ({error}); e.g. 'cuda', 'cuda:1', or None for "
                         "features computed per sample in the decode workers") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but CUDA is not available on this machine; pass device=None "
                         "to compute the features in the decode workers")
    return device


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _positive_int(name: str, value: Any) -> int:
    value = _int(name, value)
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")
    return value


def _non_negative_int(name: str, value: Any) -> int:
    value = _int(name, value)
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
