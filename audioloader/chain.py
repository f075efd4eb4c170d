"""The default chain of nodes, built in one function (`build_chain`), and the sources it starts from.

Three steps, in this order, after `options.resolve` checked every option: ``open_sources`` opens the
loader's source (shards, an Iceberg table, a `Source` or a `Mix`) as datasets and checks them against each
other (nothing is decided there); ``settle`` makes every setting final from them (the readers' interleave
fitted to the byte budget, where the shuffle buffer sits, each reader's plan, the
bucketing's edges, the batches each rank yields in evaluation, each node's group);
``build_chain`` wires the nodes, each given its group whole, readers first, source
to loader, in the order docs/concepts.md draws it. No node
exists before the settings are final, and no node's settings change afterwards:
a checkpoint taken with other settings (`settle_for_checkpoint`) gets a new chain.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from torchdata.nodes import BaseNode, PinMemory

from . import checkpoint
from .budget import lane_bytes
from .checkpoint import Resume
from .dsp.config import Segments
from .elastic import count_batches
from .errors import CheckpointMismatchError
from .mix import Mix, Source, check_source_columns
from .nodes.arrow_shard_reader import ArrowShardReader
from .nodes.batch_augment import BatchAugment
from .nodes.batch_features import BatchFeatures
from .nodes.batcher import Batcher, BatchLayout
from .nodes.bucket_rules import bucket_limits, buckets_out_of_step, duration_buckets, in_step_ignored
from .nodes.catch_failures import CatchFailures
from .nodes.decode_config import DecodeConfig
from .nodes.decode_spectrogram import DecodeSpectrogram
from .nodes.duration_bucketer import DurationBucketer, row_seconds
from .nodes.prefetcher import Prefetcher
from .nodes.read_order import ReadPlan
from .nodes.rows import fetch_mixed, fetch_rows
from .nodes.shuffle_buffer import BufferLimits, ShuffleBuffer
from .nodes.weighted_mix import WeightedMix
from .options import Settings
from .samples import BadRow, Key, RawSample, Sample
from .shards import IcebergTable, ShardDataset
from .shards.formats.scan import FORMATS
from .stats import LoaderStats
from .workers.recycle import BatchArenas

#: Batches of memory the decode processes' features are copied into and reused (`BatchArenas`): the one being
#: filled, those prefetched and queued, the training loop's.
ARENA_BATCHES = 8


@dataclass(frozen=True, kw_only=True)
class Sources:
    """The opened datasets of a loader's source and what was opened (no node, no decision: those are the
    `Settings`'; built by keyword, whole).

    ``datasets``: one per source (the mix's in its order); ``names`` the mix's source names (empty for one
    source); ``mix``: the `Mix` opened (None for one source); the columns, segments and decoder backends are the
    sources' own (a mix's sources each read their own columns).
    """

    datasets: list[ShardDataset]
    names: tuple[str, ...]
    mix: Mix | None
    has_labels: bool
    audio_column: str | None = "audio"  # the single source's (a mix's sources have their own)
    label_column: str | None = "label"
    segments: Segments | None = None  # the single source's
    decoders: tuple[str, ...] = ("auto",)  # each source's decoder backend (`Source.decoder`)

    def fetch(self) -> Callable[[Sequence[Key]], list[RawSample]]:
        """Random access to rows by key, picklable and holding no loader (restore, worker processes)."""
        if self.mix is None:
            return functools.partial(fetch_rows, self.datasets[0])
        return functools.partial(fetch_mixed, list(self.datasets))


@dataclass
class Chain:
    """The built chain: its root (what the `Loader` iterates) and the nodes the front talks to.

    ``rows`` is the node the rest reads from: the one reader, or a `WeightedMix` of a mix's readers.
    """

    root: BaseNode
    decoder: DecodeSpectrogram
    batcher: Batcher
    readers: list[ArrowShardReader]
    rows: BaseNode
    buffer: ShuffleBuffer | None = None
    bucketer: DurationBucketer | None = None

    @property
    def reader(self) -> ArrowShardReader | None:
        """The reader of a single source (None for a mix)."""
        return None if isinstance(self.rows, WeightedMix) else self.readers[0]


# -- settings: every one final before a node is built --------------------------------------------------------


def settle(settings: Settings, sources: Sources) -> Settings:
    """``settings`` (checked and preset by `options.resolve`) made final for the opened ``sources``.

    What is decided here, before any node exists: the readers' interleave, when the
    preset's (`budget.ShuffleSettings.fitted` to the shards' units), where the shuffle
    buffer sits (``shuffle.before_decode``, `_before_decode`), the bucketing's duration column when the shards
    have it (``duration_column``), each source's `ReadPlan`
    (``reads``: the splits every rank reads each pass), the bucketing's count and edges
    (``buckets``, `duration_buckets`), in evaluation the batches every rank yields
    (``num_batches``, `elastic.count_batches`), and the groups the other nodes take whole
    (`_node_groups`: ``buffer_limits``, ``bucket_limits``, ``batch_layout``, ``arena_bytes``).
    """
    shuffle = settings.shuffle.fitted(lane_bytes(sources.datasets))
    shuffle = dataclasses.replace(shuffle, before_decode=_before_decode(settings, sources))
    duration_column = _duration_column(settings, sources.datasets[0].schema)
    settings = dataclasses.replace(settings, shuffle=shuffle, duration_column=duration_column)
    return _node_groups(_planned(settings, sources), sources)


def settle_for_checkpoint(settings: Settings, sources: Sources, resume: Resume,
                          fingerprint: dict[str, Any] | None = None) -> Settings:
    """The final settings the checkpoint ``resume`` resumes with, checked against it: ``settings`` (`settle`'s,
    whose checkpoint fingerprint is ``fingerprint`` when known), or, where the checkpoint was taken with settings a
    loader given the same arguments no longer chooses, those. Raises `CheckpointMismatchError` naming every field
    and file that differs (`checkpoint.check_fingerprint`).

    A count of duration buckets other than the one fitted here (0.2's 16, 0.3's 32), when this loader was
    given none: the default changed, the run did not (a count given is kept, and a differing checkpoint
    refused by the fingerprint check). A checkpoint from before byte budgets (no ``"memory"``): the settings
    it was taken with (`budget.ShuffleSettings.as_legacy`). The caller builds a new chain from what differs.
    """
    theirs, changes = resume.fingerprint, {}
    batching, taken = settings.batching, (theirs.get("batching") or {}).get("num_buckets")
    if (batching is not None and batching.num_buckets is None and batching.boundaries is None
            and isinstance(taken, int) and taken != settings.buckets.count):
        changes["batching"], changes["buckets"] = dataclasses.replace(batching, num_buckets=taken), None
    if not resume.elastic and buckets_out_of_step(settings, theirs):  # 0.3's, before ranks in step: as it was
        changes["batching"] = dataclasses.replace(changes.get("batching", batching), sync_buckets=False)
        changes["buckets"] = None
    if "memory" not in theirs and not settings.shuffle.legacy:
        changes["shuffle"] = settings.shuffle.as_legacy(theirs)
    resumed = _planned(dataclasses.replace(settings, **changes), sources) if changes else settings
    ours = fingerprint if resumed is settings and fingerprint is not None else checkpoint.fingerprint(resumed, sources)
    datasets = ({None: sources.datasets[0]} if sources.mix is None else
                dict(zip(sources.names, sources.datasets, strict=True)))
    # With batching rows are buffered raw, whatever an older loader reported.
    ignore = (*resume.ignore, "shuffle_before_decode") if settings.batching is not None else resume.ignore
    if resume.elastic:  # in step or not follows the world size, unless given
        ours, theirs = in_step_ignored(settings, ours), in_step_ignored(settings, theirs)
    checkpoint.check_fingerprint(ours, theirs, datasets, ignore)
    return _node_groups(resumed, sources) if changes else settings


def _planned(settings: Settings, sources: Sources) -> Settings:
    """``settings`` with each source's `ReadPlan` and the bucketing's `Buckets` (unless known), in that order (the
    second needs the first); then come the nodes' groups and the batches a pass yields (`_node_groups`)."""
    settings = dataclasses.replace(settings, reads=read_plans(settings, sources))
    if settings.batching is not None and settings.buckets is None:
        settings = dataclasses.replace(settings, buckets=duration_buckets(settings, sources))
    return settings


def _node_groups(settings: Settings, sources: Sources) -> Settings:
    """``settings`` with the shuffle buffer's `BufferLimits`, the bucketer's `BucketLimits`, the batches every rank
    yields in a pass where they are planned (``num_batches``: in evaluation, and in a training pass of ranks in
    step, every rank as many as the rank that makes the most; `elastic.count_batches`), then the batcher's
    `BatchLayout` and the bytes of batch memory the decode processes write into (`batch_layout`)."""
    s, shuffle = settings, settings.shuffle
    buffer = BufferLimits(shuffle.buffer_size, shuffle.min_size, shuffle.buffer_max_bytes, shuffle.min_bytes,
                          shuffle.one_pass)
    buckets = None
    if s.batching is not None:
        buckets = bucket_limits(s, shuffle.bucketer_max_bytes, shuffle.one_pass)
    settings = dataclasses.replace(settings, buffer_limits=buffer, bucket_limits=buckets)
    in_step = buckets is not None and buckets.schedule is not None and s.train and not s.infinite
    if in_step or not s.train:
        settings = dataclasses.replace(settings, num_batches=count_batches(settings, sources))
    layout, arena_bytes = batch_layout(settings, sources)
    return dataclasses.replace(settings, batch_layout=layout, arena_bytes=arena_bytes)


def read_plans(settings: Settings, sources: Sources) -> tuple[ReadPlan, ...]:
    """Each source's `ReadPlan`: the splits this rank reads each pass. A mix's sources each have their seed and
    end with their pass (the `WeightedMix` decides when the mix ends)."""
    s, mixed = settings, sources.mix is not None
    plans = []
    for position, dataset in enumerate(sources.datasets):
        try:
            plans.append(ReadPlan.of(dataset, seed=s.seeds[position],
                                     rank=s.storage.rank, world_size=s.storage.world_size, shuffle=s.train,
                                     infinite=_endless_chain(s) and not mixed, interleave=s.shuffle.interleave))
        except Exception as error:
            if mixed and hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"(in Mix source {sources.names[position]!r})")
            raise
    return tuple(plans)


def _endless_chain(settings: Settings) -> bool:
    """The chain's readers go on into the next pass themselves: ``infinite`` training. An infinite evaluation
    loader's chain ends with its pass (every rank's equal batch count, with padding: `elastic.count_batches`); its
    `Stream` starts the next, identical pass (``repeats``), so no batch ever mixes two passes."""
    return settings.infinite and settings.train


def batch_layout(settings: Settings, sources: Sources) -> tuple[BatchLayout, int]:
    """The batcher's `BatchLayout`, and the bytes of batch memory the decode processes write features into (0:
    none). With a feature device the batcher stacks waveforms (in page-locked memory for a GPU) and
    `BatchFeatures`, after the prefetcher, computes the features."""
    s, per_sample, variable = settings, settings.device is None, settings.length.variable_length
    clip = 0 if variable else s.length.clip_samples(s.features)
    if per_sample:
        key, time_axis = s.features.batch_key, s.features.time_axis
        shape = tuple(s.features.feature_shape(s.features.num_frames(clip) if clip else 0))
    else:
        key, shape, time_axis = "waveform", (clip,), 0
    layout = BatchLayout(
        s.batch_size, s.drop_last, num_batches=s.num_batches, spectrogram_shape=shape, columns=s.columns,
        tensor_columns=frozenset(_numeric_columns(sources.datasets[0].schema, s.columns)),
        has_labels=sources.has_labels, features_key=key, pin_memory=not per_sample and s.device.type == "cuda",
        time_axis=time_axis if variable else None, follow_markers=s.batching is not None,
        sources=sources.mix is not None)
    # Process workers write fixed-shape features in decode order straight into batch rows (`BatchArenas`).
    arenas = (per_sample and not variable and s.batching is None and bool(s.shuffle.before_decode)
              and s.workers.kind == "process" and bool(s.workers.num_workers))
    batch_bytes = 4 * s.batch_size * math.prod(shape)
    return layout, max(ARENA_BATCHES * batch_bytes, 64 << 20) if arenas else 0


def _before_decode(settings: Settings, sources: Sources) -> bool:
    """Whether the shuffle buffer holds raw rows: with batching always (the rows are grouped before they are
    decoded: whatever holds them holds raw rows), else ``Shuffle(before_decode=...)``, else by the shards
    (`_raw_rows_by_default`)."""
    before = settings.shuffle.before_decode
    if settings.batching is not None:
        return True
    return all(_raw_rows_by_default(d) for d in sources.datasets) if before is None else bool(before)


# -- the chain ------------------------------------------------------------------------------------------------


def build_chain(settings: Settings, sources: Sources, stats: LoaderStats) -> Chain:
    """The default chain, source to loader (docs/concepts.md, "The chain").

    ``reader(s) [-> WeightedMix] -> ShuffleBuffer -> DecodeSpectrogram`` (raw rows in the
    buffer), or ``-> DecodeSpectrogram -> ShuffleBuffer`` (decoded samples), or with
    bucketing ``-> ShuffleBuffer (train) -> DurationBucketer -> DecodeSpectrogram``; then
    ``-> Batcher [-> BatchAugment] -> CatchFailures -> Prefetcher`` and, with a feature device,
    ``-> BatchFeatures [-> BatchAugment]``, else optionally ``-> PinMemory``.

    ``settings`` are final (`settle`): every node is built with them and none changes them afterwards.
    """
    s = settings
    readers, rows = _readers(settings, sources, stats)
    held: list[ShuffleBuffer] = []  # the buffer, once made

    def buffer(source: BaseNode, restore: Any) -> ShuffleBuffer:
        # The byte budget less the readers' lanes, shared with a bucketer after it (`audioloader.budget`).
        held.append(ShuffleBuffer(source, limits=s.buffer_limits, seed=s.seed, rank=s.storage.rank, restore=restore,
                                  stats=stats))
        return held[0]

    def augmented(batches: BaseNode) -> BaseNode:  # per-batch augmentations, where the batches have features
        per_batch = s.augmentations is not None and s.augmentations.per_batch
        return BatchAugment(batches, s.augmentations, s.features.batch_key) if per_batch else batches

    source_rows, fetch_rows = rows, sources.fetch()
    decoder = functools.partial(_decoder, settings, sources, stats)
    arenas = None
    if s.arena_bytes:
        arenas = BatchArenas(s.batch_size, s.batch_layout.spectrogram_shape, max_bytes=s.arena_bytes)
    bucketer = None
    if s.batching is not None:  # rows grouped by duration before they are decoded: only a batch's rows decode
        rows = buffer(rows, restore=fetch_rows) if s.train else rows
        rows = bucketer = DurationBucketer(
            rows, limits=s.bucket_limits, drop_last=s.drop_last, restore=fetch_rows, stats=stats,
            duration_fn=functools.partial(row_seconds, duration_column=s.duration_column,
                                          segments=sources.segments))
        samples = decode = decoder(rows)
    elif s.shuffle.before_decode:  # the buffer holds raw rows
        samples = decode = decoder(buffer(rows, restore=fetch_rows), collate_into=arenas)
    else:  # the buffer holds decoded samples, rebuilt on resume by reading and decoding their rows again
        decode = decoder(rows)
        # A partial of a module function, not a bound method: the chain must not point back at the front.
        samples = buffer(decode, restore=functools.partial(_restore_decoded, fetch_rows, decode))
    batcher = Batcher(samples, layout=s.batch_layout, stats=stats, collate_from=arenas)
    if s.device is None:  # features per sample, made by the decoder
        root: BaseNode = Prefetcher(CatchFailures(augmented(batcher)), prefetch_factor=s.workers.prefetch_batches)
        if _pins(s, warn=True):
            root = PinMemory(root)
    else:  # features per batch on the device, after the prefetcher
        root = Prefetcher(CatchFailures(batcher), prefetch_factor=s.workers.prefetch_batches)
        root = augmented(BatchFeatures(root, s.features, s.device))
    return Chain(root, decode, batcher, readers, source_rows, held[0] if held else None, bucketer)


def chain_layers(settings: Settings) -> tuple[type[BaseNode], ...]:
    """The types of the nodes `build_chain` wires for ``settings`` (one source), root first, each pulling from the
    next, down to the reader: what an elastic resume reads the old ranks' states through (`elastic.plan`), with
    no chain built. A node's inner helpers (the decoder's `ParallelMap`, the prefetcher's thread wrapper) are
    not layers: the node answers for them. tests/test_construction.py checks these against built chains."""
    s = settings
    if s.batching is not None:
        samples = (DecodeSpectrogram, DurationBucketer, *((ShuffleBuffer,) if s.train else ()))
    elif s.shuffle.before_decode:
        samples = (DecodeSpectrogram, ShuffleBuffer)
    else:
        samples = (ShuffleBuffer, DecodeSpectrogram)
    per_batch = (BatchAugment,) if s.augmentations is not None and s.augmentations.per_batch else ()
    if s.device is None:
        top = (*((PinMemory,) if _pins(s, warn=False) else ()), Prefetcher, CatchFailures, *per_batch)
    else:
        top = (*per_batch, BatchFeatures, Prefetcher, CatchFailures)
    return (*top, Batcher, *samples, ArrowShardReader)


def _readers(settings: Settings, sources: Sources, stats: LoaderStats) -> tuple[list[ArrowShardReader], BaseNode]:
    """The readers of the sources (each reading its `ReadPlan`) and the node that reads from them: the one reader,
    or a `WeightedMix`."""
    readers = [ArrowShardReader(dataset, plan=plan, stats=stats)
               for dataset, plan in zip(sources.datasets, settings.reads, strict=True)]
    if sources.mix is None:
        return readers, readers[0]
    s, names = settings, sources.names
    return readers, WeightedMix(dict(zip(names, readers, strict=True)), dict(zip(names, sources.mix.weights,
                                                                                 strict=True)),
                                stop=s.stop, infinite=_endless_chain(s), seed=s.seed, rank=s.storage.rank,
                                stats=stats)


def _decoder(settings: Settings, sources: Sources, stats: LoaderStats, rows: BaseNode,
             collate_into: BatchArenas | None = None) -> DecodeSpectrogram:
    s = settings
    # Memory-mapped shards: a worker process reads its rows itself (zero-copy there)
    # rather than getting the encoded audio copied over from here.
    fetch = sources.fetch() if all(_raw_rows_are_free(d) for d in sources.datasets) else None
    length = s.lengths[0] if len(set(s.lengths)) == 1 else s.lengths
    config = DecodeConfig(
        s.features, seed=s.seed, train=s.train, augment=s.augmentations, on_error=s.on_error,
        compute_features=s.device is None, length=length, segments=sources.segments,
        decoder=sources.decoders[0] if len(set(sources.decoders)) == 1 else sources.decoders,
        max_bytes_in_flight=s.shuffle.decode_max_bytes)
    return DecodeSpectrogram(rows, config, s.workers, stats=stats, fetch=fetch, collate_into=collate_into)


def _pins(settings: Settings, warn: bool) -> bool:
    """Whether the chain ends with ``PinMemory``: ``pin_memory=True`` on a machine with CUDA (else, with ``warn``,
    a warning that batches are not pinned)."""
    import torch

    if not settings.workers.pin_memory:
        return False
    if torch.cuda.is_available():
        return True
    if warn:
        warnings.warn("pin_memory=True but CUDA is not available; batches are not pinned", stacklevel=4)
    return False


# -- sources ------------------------------------------------------------------------------------------------


def open_sources(source: Any, settings: Settings, stats: LoaderStats) -> Sources:
    """The datasets of ``source`` (shards, an `IcebergTable`, a `Source` or a `Mix`: a list of one source or the
    mix's), their columns checked against the options and each other (`mix.check_source_columns`); no node is built
    and nothing decided (`settle` decides, with the options `options.resolve` checked)."""
    mix = source if isinstance(source, Mix) else None
    ones = [e.source for e in mix.entries] if mix is not None else [
        source if isinstance(source, Source) else Source(source)]
    names = mix.names if mix is not None else ()
    datasets = [_dataset(one, settings, name) for one, name in zip(ones, names or (None,), strict=True)]
    tokens = settings.batching.token_column if settings.batching is not None else None
    check_source_columns(names, [dataset.schema for dataset in datasets], settings.columns,
                         [one.segments for one in ones], None if tokens in settings.columns else tokens)
    if mix is not None:
        stats.describe_sources(mix.names, mix.weights)
    # Each dataset reads, beside the loader's columns, the segments', the duration and the token column.
    datasets = [_with_extra_columns(dataset, settings, one.segments) for dataset, one in zip(datasets, ones,
                                                                                           strict=True)]
    # The single source's columns and segments (a mix's sources have their own, and no segments).
    one = {} if mix is not None else {"audio_column": ones[0].audio_column, "label_column": ones[0].label_column,
                                      "segments": ones[0].segments}
    return Sources(datasets=datasets, names=names, mix=mix, has_labels=all(o.label_column is not None for o in ones),
                   decoders=tuple(o.decoder for o in ones), **one)


def _with_extra_columns(dataset: ShardDataset, settings: Settings, segments: Segments | None) -> ShardDataset:
    """``dataset`` reading, beside the loader's columns, the segments' columns and the bucketing's duration column
    (when the shards have it) and token column (`ShardDataset.with_columns`: no file is read again)."""
    columns = list(settings.columns)
    columns += [c for c in (segments.columns if segments is not None else ()) if c not in columns]
    duration_column = _duration_column(settings, dataset.schema)
    tokens = settings.batching.token_column if settings.batching is not None else None
    columns += [c for c in dict.fromkeys((duration_column, tokens)) if c is not None and c not in columns]
    return dataset if columns == list(settings.columns) else dataset.with_columns(columns)


def _duration_column(settings: Settings, schema: pa.Schema) -> str | None:
    """The bucketing's duration column when the shards have it (``Bucketing.duration_column``), else None."""
    wanted = settings.batching.duration_column if settings.batching is not None else None
    return wanted if wanted is not None and (wanted in settings.columns or wanted in schema.names) else None


def _dataset(source: Source, settings: Settings, name: str | None = None) -> ShardDataset:
    """The `ShardDataset` of one source (of the mix's source ``name``): its files, columns and filter, read as
    ``settings.storage`` says (with the source's own filesystem, when it has one)."""
    storage = settings.storage
    if source.filesystem is not None:
        storage = dataclasses.replace(storage, filesystem=source.filesystem)
    try:
        return ShardDataset(source.data, audio_column=source.audio_column, label_column=source.label_column,
                            columns=settings.columns, filter=source.filter, storage=storage)
    except Exception as error:
        if name is not None and hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"(in Mix source {name!r})")
        raise


def pinned_source(source: Any, sources: Sources) -> Any:
    """``source`` as it should be rebuilt elsewhere: an Iceberg table at the snapshot read here."""
    table = source.data if isinstance(source, Source) else source
    if not isinstance(table, IcebergTable) or table.snapshot_id is not None:
        return source
    pinned = dataclasses.replace(table, snapshot_id=sources.datasets[0].table.snapshot_id)
    return dataclasses.replace(source, data=pinned) if isinstance(source, Source) else pinned


def _raw_rows_are_free(dataset: ShardDataset) -> bool:
    """True when every shard is a local Arrow IPC file or stream: memory-mapped, so a
    buffered raw row is a view into the page cache, not a copy (`ShardDataset.is_memory_mapped`, for all files
    at once: a million files are two arrays, not a million calls)."""
    ipc = np.isin(dataset.files.format_codes, [FORMATS.index("ipc_file"), FORMATS.index("ipc_stream")])
    return bool((ipc & ~dataset.remote_files()).all())


def _raw_rows_by_default(dataset: ShardDataset) -> bool:
    """``Shuffle(before_decode=None)``: raw rows in the buffer for local Arrow IPC shards (zero-copy views)
    and for remote shards, decoded samples for local Parquet and ORC.

    Remote, benchmarks/remote/bench_s3.py compares both on a loopback S3 server (samples/s, first batch, resume
    time, peak memory): raw rows win on each (docs/benchmarks.md, "Object storage: local vs S3"); a remote
    raw row owns a copy of its encoded bytes, the reader's, so holding it keeps no record batch alive,
    where decoded features are 256 KB each.
    """
    return _raw_rows_are_free(dataset) or bool(dataset.remote_files().all())


def _numeric_columns(schema: pa.Schema, columns: Sequence[str]) -> list[str]:
    """The extra columns whose Arrow type is integer, floating point or boolean (batched as tensors)."""
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return [name for name in columns if any(test(schema.field(name).type) for test in numeric)]


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
