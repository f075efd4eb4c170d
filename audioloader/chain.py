"""The default chain of nodes, built in one function (`build_chain`), and the sources it starts from.

``open_sources`` turns the loader's source (shards, an Iceberg table, a `Source`
or a `Mix`) into readers; ``build_chain`` puts the nodes on top of them, source
to loader, in the order docs/concepts.md draws it. Eval planning (how many
batches each rank yields, the bucketing's edges) is here too: it reads the
same readers.
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

from .dsp.config import LengthPolicy, Segments
from .errors import CheckpointMismatchError
from .mix import Mix, Source, check_columns, check_lengths, source_seed
from .nodes.arrow_shard_reader import ArrowShardReader
from .nodes.batch_augment import BatchAugment
from .nodes.batch_features import BatchFeatures
from .nodes.batcher import Batcher
from .nodes.catch_failures import CatchFailures
from .nodes.decode_spectrogram import DecodeSpectrogram
from .nodes.duration_bucketer import DurationBucketer, estimate_boundaries, fit_bucket_count, plan, row_seconds
from .nodes.prefetcher import Prefetcher
from .nodes.rows import fetch_mixed
from .nodes.shuffle_buffer import ShuffleBuffer
from .nodes.weighted_mix import WeightedMix
from .options import DEFAULT_NUM_BUCKETS, FULL_BATCHES_PER_BUCKET, Settings
from .samples import BadRow, Key, RawSample, Sample
from .shards import IcebergTable, ShardDataset
from .shards.writer import shard_doc
from .stats import LoaderStats
from .workers.recycle import BatchArenas

#: Batches of memory the decode processes' features are copied into and reused (`BatchArenas`): the one being
#: filled, those prefetched and queued, the training loop's.
ARENA_BATCHES = 8


@dataclass(frozen=True, kw_only=True)
class Sources:
    """The readers of a loader's source and what the chain needs to know about them (built by keyword, whole).

    ``rows`` is the node the chain reads from: the one reader, or a `WeightedMix` of
    a mix's readers. ``lengths`` holds each source's `LengthPolicy`; ``names`` the
    mix's source names (empty for one source).
    """

    readers: list[ArrowShardReader]
    rows: BaseNode
    lengths: list[LengthPolicy]
    names: tuple[str, ...]
    mix: Mix | None
    has_labels: bool
    duration_column: str | None
    shuffle_before_decode: bool
    audio_column: str | None = "audio"  # the single source's (a mix's sources have their own)
    label_column: str | None = "label"
    segments: Segments | None = None  # the single source's

    def seconds_of(self, row: RawSample) -> float:
        """A row's duration for bucketing: its window's length (segments), its duration column, or its header."""
        return row_seconds(row, self.duration_column, self.segments)

    @property
    def reader(self) -> ArrowShardReader | None:
        """The reader of a single source (None for a mix)."""
        return self.readers[0] if self.mix is None else None

    def fetch(self) -> Callable[[Sequence[Key]], list[RawSample]]:
        """Random access to rows by key, picklable and holding no loader (restore, worker processes)."""
        if self.mix is None:
            return self.readers[0].fetcher
        return functools.partial(fetch_mixed, [reader.dataset for reader in self.readers])

    @property
    def datasets(self) -> list[ShardDataset]:
        return [reader.dataset for reader in self.readers]


@dataclass
class Chain:
    """The built chain: its root (what the `Loader` iterates) and the nodes the front talks to."""

    root: BaseNode
    decoder: DecodeSpectrogram
    batcher: Batcher
    boundaries: list[float] | None  # the bucketing's edges (None without bucketing)
    num_batches: int | None  # eval: batches every rank yields
    buffer: ShuffleBuffer | None = None  # the shuffle buffer and the bucketer, whose limits a legacy
    bucketer: DurationBucketer | None = None  # checkpoint sets (`budget.ShuffleSettings.configure`)
    buckets: Buckets | None = None  # the bucketing's count and edges, and how the count was chosen


@dataclass(frozen=True)
class Buckets:
    """The duration buckets of a loader with bucketing (`duration_buckets`).

    ``count``: buckets asked for (the edges may be fewer: equal durations merge); ``boundaries``: their
    edges in seconds; ``fitted``: the count was fitted to the data (``Bucketing(num_buckets=None)``);
    ``pass_seconds``: the estimated seconds of audio in one pass of a rank (None when the edges were given).
    """

    count: int
    boundaries: list[float]
    fitted: bool = False
    pass_seconds: float | None = None

    def report(self, max_duration: float) -> dict[str, Any]:
        """``stats()["bucketing"]``: the count, the edges, and, when fitted, why that many."""
        out: dict[str, Any] = {"num_buckets": self.count, "boundaries": list(self.boundaries),
                               "fitted": self.fitted, "pass_seconds": self.pass_seconds}
        if self.pass_seconds is None:
            return out
        if self.fitted and self.count < DEFAULT_NUM_BUCKETS:
            out["why"] = (f"{self.count} bucket(s), not {DEFAULT_NUM_BUCKETS}: a pass of this rank holds about "
                          f"{self.pass_seconds:.0f} s of audio, and each bucket should get at least "
                          f"{FULL_BATCHES_PER_BUCKET} batch(es) of {max_duration:g} s of it; more buckets would cut "
                          "batches small (Bucketing(num_buckets=...) sets the count)")
        elif self.pass_seconds / self.count < max_duration:
            out["why"] = (f"each of the {self.count} buckets gets about {self.pass_seconds / self.count:.1f} s of a "
                          f"pass of this rank, less than a batch of {max_duration:g} s: batches leave smaller. Fewer "
                          "buckets make them fuller (a count given, or a checkpoint's: on a new run, "
                          "Bucketing(num_buckets=None) fits the count to the data)")
        return out


def build_chain(settings: Settings, sources: Sources, stats: LoaderStats) -> Chain:
    """The default chain, source to loader (docs/concepts.md, "The chain").

    ``reader(s) [-> WeightedMix] -> ShuffleBuffer -> DecodeSpectrogram`` (raw rows in the
    buffer), or ``-> DecodeSpectrogram -> ShuffleBuffer`` (decoded samples), or with
    bucketing ``-> ShuffleBuffer (train) -> DurationBucketer -> DecodeSpectrogram``; then
    ``-> Batcher [-> BatchAugment] -> CatchFailures -> Prefetcher`` and, with a feature device,
    ``-> BatchFeatures [-> BatchAugment]``, else optionally ``-> PinMemory``.
    """
    s, rows = settings, sources.rows
    fetch_rows = sources.fetch()
    buckets = duration_buckets(settings, sources) if s.batching is not None else None
    boundaries = None if buckets is None else buckets.boundaries
    num_batches = count_batches(settings, sources, boundaries) if not s.train else None
    decoder = functools.partial(_decoder, settings, sources, stats)
    held: list[ShuffleBuffer] = []  # the buffer, once made

    def buffer(source: BaseNode, restore: Any) -> ShuffleBuffer:
        # The byte budget less the readers' lanes, shared with a bucketer after it (`audioloader.budget`).
        held.append(ShuffleBuffer(source, s.shuffle.buffer_size, s.shuffle.min_size, seed=s.seed, rank=s.storage.rank,
                                  restore=restore, stats=stats, max_bytes=s.shuffle.buffer_max_bytes,
                                  min_bytes=s.shuffle.min_bytes, one_pass=s.shuffle.one_pass))
        return held[0]

    bucketer, arenas = None, None
    if s.batching is not None:  # rows grouped by duration before they are decoded: only a batch's rows decode
        reader = sources.reader
        rows = buffer(reader, restore=reader.fetch) if s.train else reader
        rows = bucketer = DurationBucketer(
            rows, max_duration=s.batching.max_duration, boundaries=boundaries,
            max_batch_size=s.batching.max_batch_size, restore=reader.fetch, drop_last=s.drop_last, stats=stats,
            duration_fn=functools.partial(row_seconds, duration_column=sources.duration_column,
                                          segments=sources.segments),
            max_bytes=s.shuffle.bucketer_max_bytes, distinct=s.shuffle.one_pass)
        samples = decode = decoder(rows)
    elif sources.shuffle_before_decode:  # the buffer holds raw rows
        arenas = _batch_arenas(settings)  # the decoded samples go to the batcher in order
        samples = decode = decoder(buffer(rows, restore=fetch_rows), collate_into=arenas)
    else:  # the buffer holds decoded samples, rebuilt on resume by reading and decoding their rows again
        decode = decoder(rows)
        # A partial of a module function, not a bound method: the chain must not point back at the front.
        samples = buffer(decode, restore=functools.partial(_restore_decoded, fetch_rows, decode))
    batches = batcher = _batcher(settings, sources, samples, num_batches, stats, arenas)
    per_batch_augment = s.augmentations is not None and s.augmentations.per_batch
    if s.device is None and per_batch_augment:
        batches = BatchAugment(batches, s.augmentations, s.features.batch_key)
    root: BaseNode = Prefetcher(CatchFailures(batches), prefetch_factor=s.workers.prefetch_batches)
    if s.device is not None:  # features per batch on the device, after the prefetcher
        root = BatchFeatures(root, s.features, s.device)
        if per_batch_augment:
            root = BatchAugment(root, s.augmentations, s.features.batch_key)
    elif s.workers.pin_memory and _has_cuda():
        root = PinMemory(root)
    return Chain(root, decode, batcher, boundaries, num_batches, held[0] if held else None, bucketer, buckets)


def _batch_arenas(settings: Settings) -> BatchArenas | None:
    """Batch-shaped memory the decode processes' features are copied into, so the batcher copies nothing
    (`BatchArenas`); None where batches are not made of fixed-shape features in the decode order."""
    s = settings
    if s.workers.kind != "process" or not s.workers.num_workers or s.device is not None \
            or s.length.variable_length:
        return None
    shape = s.features.feature_shape(s.features.num_frames(s.length.clip_samples(s.features)))
    batch_bytes = 4 * s.batch_size * math.prod(shape)
    return BatchArenas(s.batch_size, shape, max_bytes=max(ARENA_BATCHES * batch_bytes, 64 << 20))


def _decoder(settings: Settings, sources: Sources, stats: LoaderStats, rows: BaseNode,
             collate_into: BatchArenas | None = None) -> DecodeSpectrogram:
    s = settings
    # Memory-mapped shards: a worker process reads its rows itself (zero-copy there)
    # rather than getting the encoded audio copied over from here.
    fetch = sources.fetch() if all(_raw_rows_are_free(r) for r in sources.readers) else None
    length = sources.lengths[0] if len(set(sources.lengths)) == 1 else sources.lengths
    return DecodeSpectrogram(
        rows, s.features, seed=s.seed, train=s.train, num_workers=s.workers.num_workers,
        augment=s.augmentations, on_error=s.on_error.action, max_error_fraction=s.on_error.max_fraction,
        error_budget_min_rows=s.on_error.min_rows, stats=stats, worker_type=s.workers.kind, fetch=fetch,
        start_method=s.workers.start_method, compute_features=s.device is None, length=length,
        guard=file_guard(sources.datasets), segments=sources.segments,
        max_bytes_in_flight=s.shuffle.decode_max_bytes, collate_into=collate_into)


def _batcher(settings: Settings, sources: Sources, samples: BaseNode, num_batches: int | None,
             stats: LoaderStats, arenas: BatchArenas | None = None) -> Batcher:
    # With a feature device the batcher stacks waveforms (in page-locked memory for a
    # GPU) and BatchFeatures, after the prefetcher, computes the features.
    s, per_sample, variable = settings, settings.device is None, settings.length.variable_length
    clip = 0 if variable else s.length.clip_samples(s.features)
    if per_sample:
        shape, time_axis = s.features.feature_shape(s.features.num_frames(clip) if clip else 0), s.features.time_axis
    else:
        shape, time_axis = (clip,), 0
    return Batcher(
        samples, s.batch_size, s.drop_last, num_batches=num_batches, spectrogram_shape=shape, columns=s.columns,
        tensor_columns=_numeric_columns(sources.readers[0].dataset.schema, s.columns),
        has_labels=sources.has_labels, stats=stats, sources=sources.mix is not None,
        features_key=s.features.batch_key if per_sample else "waveform",
        pin_memory=not per_sample and s.device.type == "cuda",
        time_axis=time_axis if variable else None, follow_markers=s.batching is not None, collate_from=arenas)


def _has_cuda() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    warnings.warn("pin_memory=True but CUDA is not available; batches are not pinned", stacklevel=4)
    return False


# -- sources ------------------------------------------------------------------------------------------------


def open_sources(source: Any, settings: Settings, stats: LoaderStats,
                 mix_columns: tuple[str | None, str | None] = ("audio", "label")) -> Sources:
    """The readers of ``source`` (shards, an `IcebergTable`, a `Source` or a `Mix`), checked against each other.
    ``mix_columns``: the audio and label column a `Mix` records (0.2's flat keywords; its sources have their own)."""
    if isinstance(source, Mix):
        sources = _open_mix(source, settings, stats, mix_columns)
    else:
        sources = _open_one(source if isinstance(source, Source) else Source(source), settings, stats)
    stats.shuffle.configure([_split_rows_of(reader) for reader in sources.readers],
                            sources.mix.weights if sources.mix is not None else [1.0], settings.batch_size)
    return sources


def _open_one(source: Source, settings: Settings, stats: LoaderStats) -> Sources:
    s = settings
    duration_column, dataset = _with_duration_column(_dataset(source, settings), settings, source.segments)
    reader = _reader(dataset, settings, seed=s.seed, infinite=s.infinite, stats=stats)
    return Sources(readers=[reader], rows=reader, lengths=[source.length or s.length], names=(), mix=None,
                   has_labels=source.label_column is not None, duration_column=duration_column,
                   shuffle_before_decode=_before_decode(settings, [reader]), audio_column=source.audio_column,
                   label_column=source.label_column, segments=source.segments)


def _before_decode(settings: Settings, readers: Sequence[ArrowShardReader]) -> bool:
    """Whether the shuffle buffer holds raw rows: with batching always (the rows are grouped before they are
    decoded: whatever holds them holds raw rows), else ``Shuffle(before_decode=...)``, else by the shards."""
    before = settings.shuffle.before_decode
    if settings.batching is not None:
        return True
    return all(_raw_rows_by_default(r) for r in readers) if before is None else bool(before)


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
    return duration_column, dataset if columns == list(settings.columns) else dataset.with_columns(columns)


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


def _reader(dataset: ShardDataset, settings: Settings, *, seed: int, infinite: bool, stats: LoaderStats | None = None,
            rank: int | None = None) -> ArrowShardReader:
    """The reader of ``dataset`` with the loader's settings: the chain's (``stats``: counted), or, with ``rank``,
    one that plans that rank's batches. The single source, a mix's sources and the planning all read through it."""
    s = settings
    return ArrowShardReader(dataset, seed=seed, rank=s.storage.rank if rank is None else rank,
                            world_size=s.storage.world_size, shuffle=s.train, infinite=infinite, stats=stats,
                            interleave=s.shuffle.interleave)


def _open_mix(mix: Mix, settings: Settings, stats: LoaderStats, columns: tuple[str | None, str | None]) -> Sources:
    """One reader per source of the `Mix`, interleaved by a `WeightedMix` node."""
    s = settings
    with_segments = [e.name for e in mix.entries if e.source.segments is not None]
    if with_segments:
        raise ValueError(f"Mix source(s) {with_segments} have segments=: a Mix does not take segments yet; read "
                         "the segments of one source, or pack them into rows of their own (audioloader pack cuts "
                         "them)")
    if s.batching is not None:
        raise ValueError("batching=Bucketing(...) does not take a Mix yet: bucket one source, or mix "
                         "fixed-size batches (batch_size=)")
    stop = mix.stop or ("cycle" if s.infinite else "all_exhausted")
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
    readers = [_mix_reader(position, entry, settings, stats) for position, entry in enumerate(mix.entries)]
    check_columns(mix.names, [r.dataset.schema for r in readers], s.columns)
    stats.describe_sources(mix.names, mix.weights)
    rows = WeightedMix(dict(zip(mix.names, readers, strict=True)), dict(zip(mix.names, mix.weights, strict=True)),
                       stop=stop, infinite=s.infinite, seed=s.seed, rank=s.storage.rank, stats=stats)
    return Sources(readers=readers, rows=rows, lengths=lengths, names=mix.names, mix=mix,
                   has_labels=all(labelled.values()), duration_column=None,
                   shuffle_before_decode=_before_decode(settings, readers), audio_column=columns[0],
                   label_column=columns[1])


def _mix_reader(position: int, entry: Any, settings: Settings, stats: LoaderStats) -> ArrowShardReader:
    try:
        return _reader(_dataset(entry.source, settings), settings, seed=source_seed(settings.seed, position),
                       infinite=False, stats=stats)
    except Exception as error:
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"(in Mix source {entry.name!r})")
        raise


def pinned_source(source: Any, sources: Sources) -> Any:
    """``source`` as it should be rebuilt elsewhere: an Iceberg table at the snapshot read here."""
    table = source.data if isinstance(source, Source) else source
    if not isinstance(table, IcebergTable) or table.snapshot_id is not None:
        return source
    pinned = dataclasses.replace(table, snapshot_id=sources.readers[0].dataset.table.snapshot_id)
    return dataclasses.replace(source, data=pinned) if isinstance(source, Source) else pinned


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
    """``Shuffle(before_decode=None)``: raw rows in the buffer for local Arrow IPC shards (zero-copy views)
    and for remote shards, decoded samples for local Parquet and ORC.

    Remote, benchmarks/bench_s3.py compares both on a loopback S3 server (samples/s, first batch, resume
    time, peak memory): raw rows win on each (docs/benchmarks.md, "Object storage: local vs S3"); a remote
    raw row owns a copy of its encoded bytes, the reader's, so holding it keeps no record batch alive,
    where decoded features are 256 KB each.
    """
    dataset = reader.dataset
    return _raw_rows_are_free(reader) or all(dataset.is_remote(i) for i in range(len(dataset.files)))


def _numeric_columns(schema: pa.Schema, columns: Sequence[str]) -> list[str]:
    """The extra columns whose Arrow type is integer, floating point or boolean (batched as tensors)."""
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return [name for name in columns if any(test(schema.field(name).type) for test in numeric)]


def file_guard(datasets: Sequence[ShardDataset]) -> Any:
    """One picklable ``guard(path)`` for the local shard files of all ``datasets`` (see `ShardDataset.file_guard`)."""
    guards = [dataset.file_guard() for dataset in datasets]
    if len(guards) == 1:
        return guards[0]
    return type(guards[0])({path: expected for guard in guards for path, expected in guard.expected.items()})


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


def duration_buckets(settings: Settings, sources: Sources) -> Buckets:
    """The bucketing's `Buckets`: the edges given, or estimated from rows spread evenly over the source (the same
    on every rank) into ``Bucketing.num_buckets`` buckets, or, when that is None, as many as fit the data
    (`fit_bucket_count`: each bucket holds a few full batches of a rank's pass)."""
    batching = settings.batching
    if batching.boundaries is not None:
        return Buckets(batching.buckets, list(batching.boundaries))
    reader = sources.reader
    kept = reader.dataset.kept_indices()
    n = len(kept)
    picks = kept[np.unique(np.linspace(0, n - 1, min(n, batching.estimate_rows)).round().astype(np.int64))]
    seconds: list[Any] = [None] * len(picks)
    if sources.duration_column is not None and sources.segments is None:  # no audio read before the first batch
        seconds = reader.dataset.read_column(sources.duration_column, picks.tolist())
    missing = [k for k, value in enumerate(seconds) if value is None]
    for k, row in zip(missing, reader.fetch([Key(int(picks[k]), 0) for k in missing]), strict=True):
        seconds[k] = sources.seconds_of(row)
    durations = [float(x) for x in seconds]
    pass_seconds = float(np.mean(durations)) * n / settings.storage.world_size if durations else 0.0
    count, fitted = batching.num_buckets, batching.num_buckets is None
    if fitted:
        count = fit_bucket_count(durations, pass_seconds, batching.max_duration, batching.max_batch_size,
                                 most=DEFAULT_NUM_BUCKETS, full_batches=FULL_BATCHES_PER_BUCKET)
    return Buckets(count, estimate_boundaries(durations, count), fitted, pass_seconds)


def count_batches(settings: Settings, sources: Sources, boundaries: list[float] | None) -> int:
    """Eval: batches every rank yields (equal across ranks, see Batcher.num_batches)."""
    if settings.batching is not None:
        return planned_batches(settings, sources, boundaries)
    rows = [sum(counts) for counts in zip(*(reader.rows_per_rank() for reader in sources.readers), strict=True)]
    if settings.drop_last:
        return min(rows) // settings.batch_size
    return math.ceil(max(rows) / settings.batch_size)


def resumed_batches(settings: Settings, sources: Sources, boundaries: list[float] | None, start: Any) -> int:
    """Eval, after an elastic resume: batches every new rank yields in the rest of the pass (equal on all)."""
    if settings.batching is None:
        rows = start.rows_per_rank
        return min(rows) // settings.batch_size if settings.drop_last else math.ceil(max(rows) / settings.batch_size)
    return planned_batches(settings, sources, boundaries, start)


def planned_batches(settings: Settings, sources: Sources, boundaries: list[float] | None, start: Any = None) -> int:
    """Eval with bucketing: the most batches a rank's rows make, each rank's read in its reader's order
    (interleaved too), from the pass's start or, after an elastic resume (``start``), from its carry."""
    s, counts = settings, []
    for rank in range(s.storage.world_size):
        rows = _reader(sources.reader.dataset, settings, seed=s.seed, infinite=False, rank=rank)
        if start is not None:
            rows.start_from(start.state_for(rows))
        counts.append(len(plan((sources.seconds_of(r) for r in rows), boundaries,
                               s.batching.max_duration, s.batching.max_batch_size, s.drop_last)))
    return max(counts)
