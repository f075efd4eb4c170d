"""Grouped options of `AudioLoader`: how batches are formed, shuffled and computed.

Each group is a small frozen dataclass; ``None`` fields take the mode's preset
(see `AudioLoader`). What the samples look like (features, length) is in
`audioloader.dsp.config`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from . import checks
from .budget import Shuffle, ShuffleSettings
from .budget import resolve as resolve_shuffle
from .errors import ON_ERROR_ACTIONS, OnError
from .mix import Mix, Source, resolve_mix, source_seed
from .nodes.bucket_rules import DEFAULT_NUM_BUCKETS, FULL_BATCHES_PER_BUCKET, Buckets  # noqa: F401 (their old home)
from .nodes.duration_bucketer import row_seconds
from .shards.sources.splits import resolve_rank
from .shards.storage.options import Storage  # the group lives with the shards it reads; its old home still names it
from .workers import AUTO_WORKERS, Workers

#: The tokens-per-second buckets per duration bucket with ``Bucketing(token_column=...)`` and no ``token_buckets``.
DEFAULT_TOKEN_BUCKETS = 4
#: ``Bucketing(first=...)``: the batch a fresh run starts with.
FIRST_BATCHES = ("largest",)


@dataclass(frozen=True)
class Bucketing:
    """Batches within budgets, from buckets of rows of similar duration (`DurationBucketer`).

    For whole utterances (``LengthPolicy(crop=None)``): instead of ``batch_size``
    samples, a batch holds up to ``max_duration`` seconds of audio, taken from
    one of ``num_buckets`` duration buckets, so it pads little. Like Lhotse's
    ``DynamicBucketingSampler``; a pure function of the seed and the input order,
    and resumable exactly.

    Attributes:
        max_duration: seconds of audio per batch (the sum of its rows' durations; with ``quadratic_duration``
            their costs). None: no duration budget (then ``max_tokens`` or ``batch_sizes`` bounds a batch).
        max_batch_size: most rows per batch (None: no limit).
        num_buckets: duration buckets; their edges split the rows' durations into
            parts of equal total duration. None: fitted to the data, as many as let each
            bucket get `FULL_BATCHES_PER_BUCKET` (1) full batch of one rank's pass, at
            most `DEFAULT_NUM_BUCKETS` (32; small datasets get fewer, so batches are not
            cut small); ``stats()["bucketing"]`` says how many and why. A checkpoint taken
            with another count and no ``num_buckets`` given (0.2: 16, 0.3: 32) resumes with its own.
        boundaries: explicit bucket edges in seconds (ascending), instead of estimating them.
        estimate_rows: rows, evenly spread over the source, whose durations (and tokens) estimate the edges.
        duration_column: a float column of durations in seconds used where the
            shards have it (``audioloader pack`` writes ``duration``); otherwise
            each row's duration comes from its audio header (no decoding).
        quadratic_duration: Q, in seconds: a row of ``d`` seconds counts ``d + d²/Q`` against ``max_duration``
            (Lhotse's option: attention costs grow with the square of the length; NeMo uses Q of 15-30 s for
            its attention encoders). None: ``d``.
        max_tokens: tokens per batch at most (the sum of the rows' ``token_column``), beside ``max_duration``.
        token_column: an integer column of each row's tokens (its transcript's length in the model's
            tokenizer: ``audioloader pack --tokenizer MODULE:FUNCTION`` writes ``tokens``). With it, buckets are
            2-D: each duration bucket is split by tokens per second into ``token_buckets`` buckets of equal rows
            (estimated from the same sample), so a dense transcript does not pad a batch of sparse ones.
        token_buckets: tokens-per-second buckets per duration bucket (None: `DEFAULT_TOKEN_BUCKETS`, 4).
        token_boundaries: explicit tokens-per-second edges, one ascending tuple per duration bucket (with
            ``boundaries``), instead of estimating them.
        batch_sizes: a batch size per bucket (with explicit ``boundaries``, and ``token_boundaries`` with a
            token column; 2-D buckets are numbered duration-major): a batch of bucket ``b`` holds at most
            ``batch_sizes[b]`` rows, beside any budget given. `tune_batch_sizes` finds them on a GPU.
        sync_buckets: ranks in step: at step ``i`` every rank takes its batch from the same bucket, drawn as a
            pure function of (seed, round, step) weighted by the batches each bucket has left to give in the
            round (estimated from the sample, so every rank knows them), and every rank yields one batch a step.
            None: True in training on more than one rank. Evaluation buckets each rank's rows on their own
            (every utterance once, equal batch counts).
        first: ``"largest"``: a fresh training run's first batch is the most expensive batch a bucket can make
            (its batch size of its most expensive sampled rows), so an out-of-memory error shows at step 0, not
            hours in; the batches after it are unchanged. None: no such batch.
    """

    max_duration: float | None = None
    max_batch_size: int | None = None
    num_buckets: int | None = None
    boundaries: tuple[float, ...] | None = None
    estimate_rows: int = 2000
    duration_column: str | None = "duration"
    quadratic_duration: float | None = None
    max_tokens: int | None = None
    token_column: str | None = None
    token_buckets: int | None = None
    token_boundaries: tuple[tuple[float, ...], ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    sync_buckets: bool | None = None
    first: str | None = None

    def __post_init__(self) -> None:
        if self.max_duration is not None and not (
                isinstance(self.max_duration, (int, float)) and math.isfinite(self.max_duration)
                and self.max_duration > 0):
            raise checks.field_error(self, "max_duration", "must be a positive number of seconds (or None with "
                                     "max_tokens= or batch_sizes=)")
        checks.field_count(self, "max_batch_size", allow_none=True)
        checks.field_count(self, "num_buckets", allow_none=True)
        if self.boundaries is not None:
            edges = list(self.boundaries)
            if edges != sorted(edges) or any(not math.isfinite(e) or e <= 0 for e in edges):
                raise checks.field_error(self, "boundaries", "must be ascending positive seconds")
            object.__setattr__(self, "boundaries", tuple(float(e) for e in edges))
        checks.field_count(self, "estimate_rows", allow_none=True)
        self._check_newer_fields()

    def _check_newer_fields(self) -> None:
        """The fields added after 0.3: costs, tokens, 2-D edges, batch sizes, ranks in step, the first batch."""
        if self.quadratic_duration is not None:
            checks.positive_number("Bucketing.quadratic_duration", self.quadratic_duration, unit="seconds")
            if self.max_duration is None:
                raise checks.field_error(self, "quadratic_duration", "weighs rows against max_duration: give "
                                         "max_duration too")
        checks.field_count(self, "max_tokens", allow_none=True)
        checks.field_count(self, "token_buckets", allow_none=True)
        if self.token_column is None and (self.max_tokens is not None or self.token_buckets is not None
                                          or self.token_boundaries is not None):
            raise checks.field_error(self, "token_column", "max_tokens=, token_buckets= and token_boundaries= "
                                     "read each row's tokens: name the column (e.g. token_column='tokens')")
        if self.token_boundaries is not None:
            if self.boundaries is None:
                raise checks.field_error(self, "token_boundaries", "edges within each duration bucket: give "
                                         "boundaries= too")
            grid = tuple(tuple(float(e) for e in row) for row in self.token_boundaries)
            if len(grid) != len(self.boundaries) + 1 or len({len(row) for row in grid}) != 1 \
                    or any(list(row) != sorted(row) for row in grid):
                raise checks.field_error(self, "token_boundaries", f"one ascending tuple of tokens-per-second "
                                         f"edges per duration bucket ({len(self.boundaries) + 1}), all of one length")
            object.__setattr__(self, "token_boundaries", grid)
        if self.batch_sizes is not None:
            sizes = tuple(self.batch_sizes)
            if not sizes or any(not checks.is_integer(n) or n < 1 for n in sizes):
                raise checks.field_error(self, "batch_sizes", "must be integers >= 1, one per bucket")
            if self.boundaries is None or (self.token_column is not None and self.token_boundaries is None):
                raise checks.field_error(self, "batch_sizes", "a size per bucket needs the buckets fixed: give "
                                         "boundaries= (and token_boundaries= with token_column=), e.g. from "
                                         "al.tune_batch_sizes(...) or Bucketing.load(path)")
            if len(sizes) != self.bucket_count:
                raise checks.field_error(self, "batch_sizes", f"{len(sizes)} sizes for {self.bucket_count} buckets")
            object.__setattr__(self, "batch_sizes", tuple(int(n) for n in sizes))
        if self.max_duration is None and self.max_tokens is None and self.batch_sizes is None:
            raise ValueError("Bucketing needs a budget: max_duration= (seconds a batch), max_tokens= (with "
                             "token_column=) or batch_sizes= (with boundaries=)")
        if self.sync_buckets is not None and not isinstance(self.sync_buckets, bool):
            raise checks.field_error(self, "sync_buckets", "must be True, False or None (True on several ranks)")
        checks.one_of("Bucketing.first", self.first, FIRST_BATCHES, allow_none=True)

    @property
    def buckets(self) -> int:
        """``num_buckets``, or `DEFAULT_NUM_BUCKETS` when it is None: the most a fitted count can be, and the
        count recorded with explicit ``boundaries`` (the count a loader uses is `Buckets.count`)."""
        return DEFAULT_NUM_BUCKETS if self.num_buckets is None else self.num_buckets

    @property
    def per_duration(self) -> int:
        """Tokens-per-second buckets per duration bucket (1 without a token column)."""
        if self.token_column is None:
            return 1
        if self.token_boundaries is not None:
            return len(self.token_boundaries[0]) + 1
        return DEFAULT_TOKEN_BUCKETS if self.token_buckets is None else self.token_buckets

    @property
    def bucket_count(self) -> int:
        """Buckets in all with explicit edges (duration buckets × tokens-per-second buckets)."""
        return (len(self.boundaries or ()) + 1) * self.per_duration

    def to_dict(self) -> dict[str, Any]:
        """The fields, with ``num_buckets`` as `buckets` (a checkpoint records the count used, not "None"); the
        fields added after 0.3 only when set, so a 0.3 checkpoint's fingerprint still matches."""
        fields = dataclasses.asdict(self)
        for name in _NEWER_FIELDS:
            if fields[name] is None:
                del fields[name]
        if fields.get("sync_buckets") is False:  # not in step, as 0.3 was: a 0.3 checkpoint records nothing either
            del fields["sync_buckets"]
        for name in ("token_boundaries", "batch_sizes"):
            if name in fields:
                fields[name] = [list(row) for row in fields[name]] if name == "token_boundaries" else list(fields[name])
        return {**fields, "num_buckets": self.buckets}

    def save(self, path: str | os.PathLike) -> None:
        """Write these settings to ``path`` as JSON (e.g. the batch sizes `tune_batch_sizes` found), for `load`."""
        text = json.dumps({"audioloader.Bucketing": 1, **dataclasses.asdict(self)}, indent=1)
        with open(path, "w") as f:
            f.write(text + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Bucketing:
        """The `Bucketing` `save` wrote to ``path`` (checked as if built by hand)."""
        with open(path) as f:
            data = json.load(f)
        if data.pop("audioloader.Bucketing", None) != 1:
            raise ValueError(f"{os.fspath(path)}: not a Bucketing saved by Bucketing.save (no "
                             "'audioloader.Bucketing': 1 in it)")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{os.fspath(path)}: unknown Bucketing field(s) {unknown}: saved by a newer audioloader?")
        for name in ("boundaries", "batch_sizes"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        if data.get("token_boundaries") is not None:
            data["token_boundaries"] = tuple(tuple(row) for row in data["token_boundaries"])
        return cls(**data)


#: `Bucketing`'s fields added after 0.3, left out of its fingerprint while None.
_NEWER_FIELDS = ("quadratic_duration", "max_tokens", "token_column", "token_buckets", "token_boundaries",
                 "batch_sizes", "sync_buckets", "first")


#: 0.2's flat keywords of `AudioLoader`, removed in 0.4: name -> (argument, field) of the group that holds it now
#: (`refuse_removed_keywords` names it in the error).
REMOVED_KEYWORDS = {
    "num_workers": ("workers", "num_workers"),
    "worker_type": ("workers", "kind"),
    "start_method": ("workers", "start_method"),
    "prefetch_batches": ("workers", "prefetch_batches"),
    "pin_memory": ("workers", "pin_memory"),
    "shuffle_buffer_size": ("shuffle", "buffer_size"),
    "shuffle_min_size": ("shuffle", "min_size"),
    "shuffle_before_decode": ("shuffle", "before_decode"),
    "rank": ("storage", "rank"),
    "world_size": ("storage", "world_size"),
    "split_rows": ("storage", "split_rows"),
    "filesystem": ("storage", "filesystem"),
    "retry": ("storage", "retry"),
    "max_error_fraction": ("on_error", "max_fraction"),
    "audio_column": ("source", "audio_column"),
    "label_column": ("source", "label_column"),
    "filter": ("source", "filter"),
}

_GROUP_CLASS_NAMES = {"workers": "Workers", "shuffle": "Shuffle", "storage": "Storage", "on_error": "OnError",
                      "source": "Source"}


def refuse_removed_keywords(given: dict[str, Any]) -> None:
    """A ``TypeError`` for keywords `AudioLoader` does not take: one of 0.2's flat keywords (removed in 0.4) names
    the group that holds it now; any other is refused as Python refuses an unknown keyword."""
    for name in given:
        if name not in REMOVED_KEYWORDS:
            raise TypeError(f"AudioLoader() got an unexpected keyword argument {name!r}")
        argument, field = REMOVED_KEYWORDS[name]
        cls = _GROUP_CLASS_NAMES[argument]
        instead = (f"al.{cls}(shards, {field}=...) as the source" if argument == "source" else
                   f"{argument}=al.{cls}({field}=...)")
        raise TypeError(f"AudioLoader({name}=...) was removed in 0.4: pass {instead} instead (0.2's flat "
                        "keywords moved into option groups; see CHANGELOG.md)")


# -- presets and resolution -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModePreset:
    """Defaults of one mode (docs/concepts.md, "Train vs eval"); its shuffle buffer's are in `audioloader.budget`."""

    infinite: bool
    num_workers: int


TRAIN = ModePreset(infinite=True, num_workers=8)
# Eval does not shuffle (buffer of 1 = pass-through, budget.EVAL), unlike the first design's 1000 / 0: a
# metric does not depend on order, and the growing buffer made the first batch wait
# for twice as many decodes (first batch and memory: docs/benchmarks.md, "Defaults chosen by measurement").
EVAL = ModePreset(infinite=False, num_workers=4)

#: ``Workers(kind="auto")`` decodes in processes on machines with at least this many cores, else in threads.
#: Chosen by benchmarks/end_to_end/bench_train_loop.py (samples/s and the training process's CPU, processes vs threads,
#: with a training step in the loop): processes are no slower on 2 cores and leave the training process's cores
#: free; threads stop scaling at 5-10 busy cores (docs/benchmarks.md, "Scaling with cores and the worker model").
AUTO_PROCESS_MIN_CORES = 2


def default_num_workers(worker_type: str, train: bool) -> int:
    """Decode workers when ``num_workers`` is not given: processes one per core (they scale to all of them;
    more only adds switching); threads 2 per core, up to the preset's 8 (train) or 4 (eval): more threads than
    that are no faster, and past about 8 the GIL stops them scaling (samples/s by thread count:
    docs/benchmarks.md, "Defaults chosen by measurement")."""
    cores = os.cpu_count() or 1
    if worker_type == "process":
        return cores
    return min((TRAIN if train else EVAL).num_workers, 2 * cores)


def resolve_workers(workers: Workers, train: bool, augment: Any) -> Workers:
    """``workers`` with ``kind`` ("auto" decided) and ``num_workers`` (the default for that kind) filled in."""
    wanted = 1 if workers.num_workers in (None, AUTO_WORKERS) else workers.num_workers
    kind = _worker_kind(workers.kind, wanted, augment)
    num_workers = workers.num_workers
    if num_workers is None or (num_workers == AUTO_WORKERS and kind == "thread"):
        num_workers = default_num_workers(kind, train)
    return dataclasses.replace(workers, kind=kind, num_workers=num_workers)


def _worker_kind(kind: str, num_workers: int, augment: Any) -> str:
    """Resolve ``kind="auto"``: processes on `AUTO_PROCESS_MIN_CORES` cores or more, else threads.

    An ``augment`` that cannot be sent to processes (a lambda, a closure) keeps
    "auto" on threads, with a warning saying how to get processes.
    """
    if kind == "process" and num_workers > 0 and augment is not None and not _picklable(augment):
        # Refused here, with the other options, not when the chain is built on first use.
        raise TypeError("augment cannot be sent to worker processes (workers=al.Workers(kind='process')): define it "
                        "at the top level of a module (not inside a function, not a lambda), or use threads "
                        "(workers=al.Workers(kind='thread'))")
    if kind != "auto":
        return kind
    if (os.cpu_count() or 1) < AUTO_PROCESS_MIN_CORES or num_workers == 0:
        return "thread"
    if augment is not None and not _picklable(augment):
        warnings.warn("augment cannot be sent to worker processes (define it at the top level of a module, "
                      "not as a lambda or inside a function), so decoding runs in threads; on many cores "
                      "processes are faster (workers=al.Workers(kind='process'))", stacklevel=5)
        return "thread"
    return "process"


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def resolve_storage(storage: Storage) -> Storage:
    """``storage`` with ``rank`` and ``world_size`` filled in (from torch.distributed when initialized)."""
    rank, world_size = resolve_rank(storage.rank, storage.world_size)
    return dataclasses.replace(storage, rank=rank, world_size=world_size)


def resolve_on_error(on_error: Any) -> OnError:
    """``on_error`` as an `OnError` (``"skip"``/``"raise"`` are shorthands)."""
    if isinstance(on_error, OnError):
        return on_error
    if isinstance(on_error, str):
        return OnError(action=checks.one_of("on_error", on_error, ON_ERROR_ACTIONS))
    raise TypeError(f"on_error must be 'skip', 'raise' or an audioloader.OnError, got {type(on_error).__name__}")


def resolve_device(device: Any, features: Any) -> torch.device | None:
    """The torch device that computes features per batch, or None (per sample in the workers)."""
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


@dataclass(frozen=True)
class Settings:
    """Every option of an `AudioLoader`, checked, with the mode's presets filled in (see `resolve`).

    Where each setting becomes final: `resolve` checks the arguments (a `Mix`'s options too) and fills in the
    presets (every field but those below; ``lengths`` and a mix's ``stop`` included); `chain.settle`, once the
    sources' shards are open and before any node is built, decides what depends on the shards:
    ``shuffle.interleave`` and ``shuffle.lane_bytes`` (a preset's interleave fitted to the byte budget and the
    shards' units), ``shuffle.before_decode`` (None until then), ``duration_column``, ``buckets`` and
    ``num_batches``, and the nodes' own groups: each source's ``reads`` (the splits every rank reads each pass),
    the buffer's, the bucketer's and the batcher's, and the batch memory; `chain.settle_for_checkpoint` gives the
    settings a checkpoint was taken with (its bucket count, a legacy buffer), and `elastic.resumed` those of an
    elastic resume (the reader's start, the batcher's first pass), from which the chain is built. Nodes never
    change them.
    """

    train: bool
    batch_size: int
    seed: int
    infinite: bool
    drop_last: bool
    features: Any  # a FeatureConfig
    length: Any  # a LengthPolicy
    batching: Bucketing | None
    augmentations: Any  # an Augmentations, or None
    columns: tuple[str, ...]
    shuffle: ShuffleSettings
    workers: Workers
    storage: Storage
    device: torch.device | None
    on_error: OnError
    lengths: tuple[Any, ...] = ()  # each source's `LengthPolicy` (its own, else ``length``), in the mix's order
    seeds: tuple[int, ...] = ()  # each source's seed of its split order (a mix's: `mix.source_seed`)
    stop: str | None = None  # a mix's stopping rule, decided (`mix.resolve_mix`); None for one source
    duration_column: str | None = None  # with batching: the duration column the shards have (`chain.settle`)
    buckets: Buckets | None = None  # with batching: the count and edges (`chain.settle`)
    num_batches: int | None = None  # evaluation: batches every rank yields (`chain.settle`)
    # The nodes' own groups (`chain.settle`), handed to each node whole by `chain.build_chain`:
    reads: tuple[Any, ...] = ()  # each source's `nodes.read_order.ReadPlan`
    buffer_limits: Any = None  # the shuffle buffer's `nodes.shuffle_buffer.BufferLimits`
    bucket_limits: Any = None  # with batching, the `nodes.duration_bucketer.BucketLimits`
    batch_layout: Any = None  # the batcher's `nodes.batcher.BatchLayout`
    arena_bytes: int = 0  # shared memory the decode processes write features into (`workers.recycle.BatchArenas`)

    def seconds_of(self, row: Any, segments: Any = None) -> float:
        """A row's duration for bucketing, in seconds: its window's length (``segments``, the source's), its
        duration column (``duration_column``), or its audio header (`nodes.duration_bucketer.row_seconds`)."""
        return row_seconds(row, self.duration_column, segments)


def resolve(*, batch_size: Any, train: Any, seed: Any, infinite: Any, features: Any, length: Any, batching: Any,
            augment: Any, columns: Any, shuffle: Any, workers: Any, storage: Any, device: Any, drop_last: Any,
            on_error: Any, source: Any = None) -> Settings:
    """Check the front's arguments and fill in the mode's presets; errors name the argument and the fix."""
    from .dsp.augment import Augmentations
    from .dsp.config import LengthPolicy, MelSpectrogramConfig, check_features
    from .shards.dataset.augment_rows import AugmentRows

    train = bool(train)
    preset = TRAIN if train else EVAL
    batch_size = checks.integer("batch_size", batch_size, minimum=1)
    seed = checks.integer("seed", seed)
    features = features if features is not None else MelSpectrogramConfig()
    check_features(features)
    length = checks.instance("length", length, LengthPolicy, default=LengthPolicy())
    batching = checks.instance("batching", batching, Bucketing)
    if batching is not None and not length.variable_length:
        raise ValueError("batching=Bucketing(...) forms batches of whole utterances: pass "
                         "length=LengthPolicy(crop=None, max_seconds=...) too")
    if not length.variable_length:
        length.clip_samples(features)  # a crop needs a length: fail here, naming the fix
    workers = resolve_workers(checks.instance("workers", workers, Workers, default=Workers()), train, augment)
    device = resolve_device(device, features)
    augmentations = Augmentations.of(augment, seed, features, per_batch_features=device is not None,
                                     open_rows=AugmentRows)
    if augmentations is not None and augmentations.mixup is not None:
        if not train:
            raise ValueError("Mixup with train=False: an evaluation pass should see each sample as it is; "
                             "leave Mixup out of augment= for evaluation")
        if length.variable_length:
            raise ValueError("Mixup mixes equal-length crops; with whole utterances (LengthPolicy(crop=None)) "
                             "leave Mixup out")
    shuffle = checks.instance("shuffle", shuffle, Shuffle, default=Shuffle())
    if batching is not None and shuffle.before_decode is False:
        raise ValueError("Shuffle(before_decode=False) with batching=Bucketing(...): the bucketer groups rows by "
                         "duration before they are decoded, so the buffer before it holds raw rows; leave "
                         "Shuffle(before_decode=...) out")
    shuffle = resolve_shuffle(shuffle, train=train, bucketing=batching is not None, mixed=isinstance(source, Mix))
    infinite = bool(preset.infinite if infinite is None else infinite)
    settings = Settings(
        train=train, batch_size=batch_size, seed=seed, infinite=infinite, drop_last=bool(drop_last),
        features=features, length=length, batching=batching, augmentations=augmentations,
        columns=_column_names(columns), shuffle=shuffle, workers=workers,
        storage=resolve_storage(checks.instance("storage", storage, Storage, default=Storage())), device=device,
        on_error=resolve_on_error(on_error))
    if not isinstance(source, Mix):
        one = source.length if isinstance(source, Source) else None
        return dataclasses.replace(settings, lengths=(one or length,), seeds=(seed,))
    # A mix's options, checked with the loader's before any file opens (`mix.resolve_mix`); each source's seed.
    stop, lengths = resolve_mix(source, train=train, infinite=infinite, batching=batching, length=length,
                                features=features)
    seeds = tuple(source_seed(seed, position) for position in range(len(source.entries)))
    return dataclasses.replace(settings, stop=stop, lengths=lengths, seeds=seeds)


def _column_names(columns: Any) -> tuple[str, ...]:
    if isinstance(columns, str):
        raise TypeError(f"columns={columns!r}: a list of column names, e.g. columns=[{columns!r}]")
    return tuple(columns)
