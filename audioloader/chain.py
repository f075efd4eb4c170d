"""The default chain of nodes, built in one function (`build_chain`), and the sources it starts from.

Three steps, in this order: ``open_sources`` opens the loader's source (shards, an
Iceberg table, a `Source` or a `Mix`) as datasets and checks them against each
other; ``settle`` makes every setting final from them (the readers' interleave
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
from .dsp.config import LengthPolicy, Segments
from .elastic import planned_batches, steps_in_step
from .errors import CheckpointMismatchError
from .mix import Mix, Source, check_columns, check_lengths, source_seed
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
from .shards.formats import FORMATS
from .shards.writer import shard_doc
from .stats import LoaderStats
from .workers.recycle import BatchArenas

#: Batches of memory the decode processes' features are copied into and reused (`BatchArenas`): the one being
#: filled, those prefetched and queued, the training loop's.
ARENA_BATCHES = 8


@dataclass(frozen=True, kw_only=True)
class Sources:
    """The opened datasets of a loader's source and what the chain needs to know about them (no node; built
    by keyword, whole).

    ``datasets``: one per source (the mix's in its order); ``lengths`` holds each
    source's `LengthPolicy`; ``names`` the mix's source names (empty for one source);
    ``stop``: the mix's stopping rule, decided (None for one source).
    """

    datasets: list[ShardDataset]
    lengths: list[LengthPolicy]
    names: tuple[str, ...]
    mix: Mix | None
    has_labels: bool
    duration_column: str | None
    audio_column: str | None = "audio"  # the single source's (a mix's sources have their own)
    label_column: str | None = "label"
    segments: Segments | None = None  # the single source's
    stop: str | None = None
    decoders: tuple[str, ...] = ("auto",)  # each source's decoder backend (`Source.decoder`)

    def seconds_of(self, row: RawSample) -> float:
        """A row's duration for bucketing: its window's length (segments), its duration column, or its header."""
        return row_seconds(row, self.duration_column, self.segments)

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
    buffer sits (``shuffle.before_decode``, `_before_decode`), each source's `ReadPlan`
    (``reads``: the splits every rank reads each pass), the bucketing's count and edges
    (``buckets``, `duration_buckets`), in evaluation the batches every rank yields
    (``num_batches``, `count_batches`), and the groups the other nodes take whole
    (`_node_groups`: ``buffer_limits``, ``bucket_limits``, ``batch_layout``, ``arena_bytes``).
    """
    shuffle = settings.shuffle.fitted(lane_bytes(sources.datasets))
    shuffle = dataclasses.replace(shuffle, before_decode=_before_decode(settings, sources))
    return _node_groups(_planned(dataclasses.replace(settings, shuffle=shuffle), sources), sources)


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
    """``settings`` with each source's `ReadPlan`, the bucketing's `Buckets` (unless known) and, in evaluation,
    ``num_batches``, in that order (each needs the last); then come the other nodes' groups (`_node_groups`)."""
    settings = dataclasses.replace(settings, reads=read_plans(settings, sources))
    if settings.batching is not None and settings.buckets is None:
        settings = dataclasses.replace(settings, buckets=duration_buckets(settings, sources))
    return dataclasses.replace(settings, num_batches=None if settings.train else count_batches(settings, sources))


def _node_groups(settings: Settings, sources: Sources) -> Settings:
    """``settings`` with the shuffle buffer's `BufferLimits`, the bucketer's `BucketLimits`, the batcher's
    `BatchLayout` and the bytes of batch memory the decode processes write into (`batch_layout`)."""
    s, shuffle = settings, settings.shuffle
    buffer = BufferLimits(shuffle.buffer_size, shuffle.min_size, shuffle.buffer_max_bytes, shuffle.min_bytes,
                          shuffle.one_pass)
    buckets = None
    if s.batching is not None:
        buckets = bucket_limits(s, shuffle.bucketer_max_bytes, shuffle.one_pass)
    if buckets is not None and buckets.schedule is not None and s.train and not s.infinite:
        # A pass of ranks in step: every rank yields as many batches as the rank that makes the most.
        settings = dataclasses.replace(settings, buffer_limits=buffer, bucket_limits=buckets)
        settings = dataclasses.replace(settings, num_batches=steps_in_step(settings, sources))
    layout, arena_bytes = batch_layout(settings, sources)
    return dataclasses.replace(settings, buffer_limits=buffer, bucket_limits=buckets, batch_layout=layout,
                               arena_bytes=arena_bytes)


def read_plans(settings: Settings, sources: Sources) -> tuple[ReadPlan, ...]:
    """Each source's `ReadPlan`: the splits this rank reads each pass. A mix's sources each have their seed and
    end with their pass (the `WeightedMix` decides when the mix ends)."""
    s, mixed = settings, sources.mix is not None
    plans = []
    for position, dataset in enumerate(sources.datasets):
        try:
            plans.append(ReadPlan.of(dataset, seed=source_seed(s.seed, position) if mixed else s.seed,
                                     rank=s.storage.rank, world_size=s.storage.world_size, shuffle=s.train,
                                     infinite=_endless_chain(s) and not mixed, interleave=s.shuffle.interleave))
        except Exception as error:
            if mixed and hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"(in Mix source {sources.names[position]!r})")
            raise
    return tuple(plans)


def _endless_chain(settings: Settings) -> bool:
    """The chain's readers go on into the next pass themselves: ``infinite`` training. An infinite evaluation
    loader's chain ends with its pass (every rank's equal batch count, with padding: `count_batches`); its
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
            duration_fn=functools.partial(row_seconds, duration_column=sources.duration_column,
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
        if s.workers.pin_memory and _has_cuda():
            root = PinMemory(root)
    else:  # features per batch on the device, after the prefetcher
        root = Prefetcher(CatchFailures(batcher), prefetch_factor=s.workers.prefetch_batches)
        root = augmented(BatchFeatures(root, s.features, s.device))
    return Chain(root, decode, batcher, readers, source_rows, held[0] if held else None, bucketer)


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
                                stop=sources.stop, infinite=_endless_chain(s), seed=s.seed, rank=s.storage.rank,
                                stats=stats)


def _decoder(settings: Settings, sources: Sources, stats: LoaderStats, rows: BaseNode,
             collate_into: BatchArenas | None = None) -> DecodeSpectrogram:
    s = settings
    # Memory-mapped shards: a worker process reads its rows itself (zero-copy there)
    # rather than getting the encoded audio copied over from here.
    fetch = sources.fetch() if all(_raw_rows_are_free(d) for d in sources.datasets) else None
    length = sources.lengths[0] if len(set(sources.lengths)) == 1 else sources.lengths
    config = DecodeConfig(
        s.features, seed=s.seed, train=s.train, augment=s.augmentations, on_error=s.on_error,
        compute_features=s.device is None, length=length, segments=sources.segments,
        decoder=sources.decoders[0] if len(set(sources.decoders)) == 1 else sources.decoders,
        max_bytes_in_flight=s.shuffle.decode_max_bytes)
    return DecodeSpectrogram(rows, config, s.workers, stats=stats, fetch=fetch, collate_into=collate_into)


def _has_cuda() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    warnings.warn("pin_memory=True but CUDA is not available; batches are not pinned", stacklevel=4)
    return False


# -- sources ------------------------------------------------------------------------------------------------


def open_sources(source: Any, settings: Settings, stats: LoaderStats,
                 mix_columns: tuple[str | None, str | None] = ("audio", "label")) -> Sources:
    """The datasets of ``source`` (shards, an `IcebergTable`, a `Source` or a `Mix`), checked against each other;
    no node is built (`build_chain` builds the readers, with the settings `settle` makes final).
    ``mix_columns``: the audio and label column a `Mix` records (0.2's flat keywords; its sources have their own)."""
    if isinstance(source, Mix):
        return _open_mix(source, settings, stats, mix_columns)
    return _open_one(source if isinstance(source, Source) else Source(source), settings)


def _open_one(source: Source, settings: Settings) -> Sources:
    duration_column, dataset = _with_duration_column(_dataset(source, settings), settings, source.segments)
    return Sources(datasets=[dataset], lengths=[source.length or settings.length], names=(), mix=None,
                   has_labels=source.label_column is not None, duration_column=duration_column,
                   audio_column=source.audio_column, label_column=source.label_column, segments=source.segments,
                   decoders=(source.decoder,))


def _with_duration_column(dataset: ShardDataset, settings: Settings,
                          segments: Any = None) -> tuple[str | None, ShardDataset]:
    """The bucketing's duration column when the shards have it (else None), and ``dataset`` reading it and the
    segments' columns too (`ShardDataset.with_columns`: no file is read again)."""
    columns = list(settings.columns)
    if segments is not None:
        _check_segment_columns(dataset.schema, segments)
        columns += [c for c in segments.columns if c not in columns]
    wanted = settings.batching.duration_column if settings.batching is not None else None
    duration_column = wanted if wanted is not None and (wanted in columns or wanted in dataset.schema.names) else None
    if duration_column is not None and duration_column not in columns:
        columns.append(duration_column)
    tokens = settings.batching.token_column if settings.batching is not None else None
    if tokens is not None and tokens not in columns:
        _check_token_column(dataset.schema, tokens)
        columns.append(tokens)
    return duration_column, dataset if columns == list(settings.columns) else dataset.with_columns(columns)


def _check_token_column(schema: pa.Schema, name: str) -> None:
    """The shards have an integer column of tokens per row (``Bucketing(token_column=...)``)."""
    if name not in schema.names:
        raise ValueError(f"Bucketing(token_column={name!r}): the shards have no column {name!r} (columns: "
                         f"{', '.join(schema.names)}); write each row's token count with `audioloader pack "
                         "--tokenizer MODULE:FUNCTION` (docs/speech.md, the token budget)")
    if not pa.types.is_integer(schema.field(name).type):
        raise ValueError(f"Bucketing(token_column={name!r}): column {name!r} has type {schema.field(name).type}; "
                         "it must hold integer token counts")


def _check_segment_columns(schema: pa.Schema, segments: Segments) -> None:
    """The shards have numeric segment columns, and their rows are not segments ``audioloader pack`` already cut."""
    for name in segments.columns:
        if name not in schema.names:
            raise ValueError(f"segments={segments}: the shards have no column {name!r} (columns: "
                             f"{', '.join(schema.names)}); name the columns holding each row's window in seconds")
        kind = schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise ValueError(f"segments={segments}: column {name!r} has type {kind}; the window needs numbers "
                             "(seconds). Write the times as floats")
    if shard_doc(schema).get("segments") == "cut":
        raise ValueError(f"segments={segments}: these shards were packed from segments, and each row's audio is "
                         "already its segment (audioloader pack cut it from its recording; the start/end columns "
                         "only say where it was). Leave segments= out")


def _dataset(source: Source, settings: Settings) -> ShardDataset:
    """The `ShardDataset` of one source: its files, columns and filter, read as ``settings.storage`` says (with the
    source's own filesystem, when it has one)."""
    storage = settings.storage
    if source.filesystem is not None:
        storage = dataclasses.replace(storage, filesystem=source.filesystem)
    return ShardDataset(source.data, audio_column=source.audio_column, label_column=source.label_column,
                        columns=settings.columns, filter=source.filter, storage=storage)


def _open_mix(mix: Mix, settings: Settings, stats: LoaderStats, columns: tuple[str | None, str | None]) -> Sources:
    """One dataset per source of the `Mix` (`build_chain` interleaves their readers with a `WeightedMix`)."""
    s = settings
    with_segments = [e.name for e in mix.entries if e.source.segments is not None]
    if with_segments:
        raise ValueError(f"Mix source(s) {with_segments} have segments=: a Mix does not take segments yet; read "
                         "the segments of one source, or pack them into rows of their own (audioloader pack cuts "
                         "them)")
    if s.batching is not None:
        raise ValueError("batching=Bucketing(...) does not take a Mix yet: bucket one source, or mix "
                         "fixed-size batches (batch_size=)")
    stop = mix.stop or ("cycle" if _endless_chain(s) else "all_exhausted")
    if not s.train and stop != "all_exhausted":
        raise ValueError(f"Mix(stop={stop!r}) with train=False: evaluation reads every row of every source "
                         "exactly once (stop='all_exhausted', the default there); the weights then only set "
                         "the interleaving. Leave stop out, or evaluate the sources one by one")
    if stop == "cycle" and not s.infinite:
        raise ValueError("Mix(stop='cycle') never ends, but infinite=False asks for passes that end: use "
                         "stop='all_exhausted' (every row of every source once) or 'first_exhausted'")
    labelled = {e.name: e.source.label_column is not None for e in mix.entries}
    if len(set(labelled.values())) > 1:
        raise ValueError(f"Mix sources disagree on labels {labelled}: batches have a label for every sample "
                         "or for none; give every Source a label_column, or label_column=None to all")
    lengths = [e.source.length or s.length for e in mix.entries]
    # The loader's own length= is checked with them: it sets the batches' shape.
    check_lengths(["length= of the loader", *mix.names], [s.length, *lengths], s.features)
    datasets = [_mix_dataset(entry, settings) for entry in mix.entries]
    check_columns(mix.names, [dataset.schema for dataset in datasets], s.columns)
    stats.describe_sources(mix.names, mix.weights)
    return Sources(datasets=datasets, lengths=lengths, names=mix.names, mix=mix, has_labels=all(labelled.values()),
                   duration_column=None, audio_column=columns[0], label_column=columns[1], stop=stop,
                   decoders=tuple(e.source.decoder for e in mix.entries))


def _mix_dataset(entry: Any, settings: Settings) -> ShardDataset:
    try:
        return _dataset(entry.source, settings)
    except Exception as error:
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"(in Mix source {entry.name!r})")
        raise


def pinned_source(source: Any, sources: Sources) -> Any:
    """``source`` as it should be rebuilt elsewhere: an Iceberg table at the snapshot read here."""
    table = source.data if isinstance(source, Source) else source
    if not isinstance(table, IcebergTable) or table.snapshot_id is not None:
        return source
    pinned = dataclasses.replace(table, snapshot_id=sources.datasets[0].table.snapshot_id)
    return dataclasses.replace(source, data=pinned) if isinstance(source, Source) else pinned


def note_shuffle_quality(settings: Settings, sources: Sources, stats: LoaderStats) -> None:
    """Give ``stats.shuffle`` each source's splits of pass 0 on this rank (``(first global index, rows)``) and the
    mix's weights, for its per-batch figures and their references (`stats.ShuffleQuality`)."""
    split_rows = []
    for dataset, reads in zip(sources.datasets, settings.reads, strict=True):
        files = dataset.files
        split_rows.append([(files[s.file_id].index_offset + s.start, s.num_rows) for s in reads.splits_for_pass(0)])
    stats.shuffle.configure(split_rows, sources.mix.weights if sources.mix is not None else [1.0],
                            settings.batch_size)


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


# -- eval planning ------------------------------------------------------------------------------------------


def count_batches(settings: Settings, sources: Sources) -> int:
    """Eval: batches every rank yields (equal across ranks, see Batcher.num_batches), from ``settings.reads`` and,
    with bucketing, ``settings.buckets``."""
    if settings.batching is not None:
        return planned_batches(settings, sources)
    rows = [sum(counts) for counts in zip(*(plan.rows_per_rank() for plan in settings.reads), strict=True)]
    if settings.drop_last:
        return min(rows) // settings.batch_size
    return math.ceil(max(rows) / settings.batch_size)
