"""Grouped options of `AudioLoader`: how batches are formed, shuffled and computed.

Each group is a small frozen dataclass; ``None`` fields take the mode's preset
(see `AudioLoader`). What the samples look like (features, length) is in
`audioloader.dsp.config`.
"""

from __future__ import annotations

import dataclasses
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
from .errors import ON_ERROR_ACTIONS, DeprecatedKeywordWarning, OnError
from .shards.splits import resolve_rank
from .shards.storage import Storage  # the group lives with the shards it reads; its old home still names it
from .workers import AUTO_WORKERS, Workers

#: The most duration buckets `Bucketing` uses when ``num_buckets`` is None (fewer on small data, see
#: `FULL_BATCHES_PER_BUCKET`). Measured: on 1-20 s utterances, batches of 200 s pad 0.959 of their frames with
#: 32 buckets against 0.926 with 16 (docs/benchmarks.md, speech).
DEFAULT_NUM_BUCKETS = 32
#: With ``num_buckets`` None, the buckets are as many as let each get this many full batches of one rank's pass
#: (at most `DEFAULT_NUM_BUCKETS`, at least 1). 32 buckets over 112 s of audio got 3.5 s each, and gave batches of
#: one or two utterances where ``max_duration=200`` asked for 200 s. Measured (1-20 s utterances, 200 s batches,
#: train, one pass in the buffer): on 595 s, 32 buckets filled batches to 0.09 of 200 s, 2 (this rule) to 0.81, 4
#: to 0.74; on 6,237 s, 32 buckets filled them to 0.89 and 0.955 of their frames were audio, 31 (this rule) 0.84
#: and 0.953, where 4 batches a bucket (7 buckets) would give only 0.862. One batch a bucket keeps large data at 32.
FULL_BATCHES_PER_BUCKET = 1


@dataclass(frozen=True)
class Bucketing:
    """Batches by total duration, from buckets of rows of similar duration (`DurationBucketer`).

    For whole utterances (``LengthPolicy(crop=None)``): instead of ``batch_size``
    samples, a batch holds up to ``max_duration`` seconds of audio, taken from
    one of ``num_buckets`` duration buckets, so it pads little. Like Lhotse's
    ``DynamicBucketingSampler``; a pure function of the seed and the input order,
    and resumable exactly.

    Attributes:
        max_duration: seconds of audio per batch (the sum of its rows' durations).
        max_batch_size: most rows per batch (None: no limit).
        num_buckets: duration buckets; their edges split the rows' durations into
            parts of equal total duration. None: fitted to the data, as many as let each
            bucket get `FULL_BATCHES_PER_BUCKET` (1) full batch of one rank's pass, at
            most `DEFAULT_NUM_BUCKETS` (32; small datasets get fewer, so batches are not
            cut small); ``stats()["bucketing"]`` says how many and why. A checkpoint taken
            with another count and no ``num_buckets`` given (0.2: 16, 0.3: 32) resumes with its own.
        boundaries: explicit bucket edges in seconds (ascending), instead of estimating them.
        estimate_rows: rows, evenly spread over the source, whose durations estimate the edges.
        duration_column: a float column of durations in seconds used where the
            shards have it (``audioloader pack`` writes ``duration``); otherwise
            each row's duration comes from its audio header (no decoding).
    """

    max_duration: float
    max_batch_size: int | None = None
    num_buckets: int | None = None
    boundaries: tuple[float, ...] | None = None
    estimate_rows: int = 2000
    duration_column: str | None = "duration"

    def __post_init__(self) -> None:
        if not (isinstance(self.max_duration, (int, float)) and math.isfinite(self.max_duration)
                and self.max_duration > 0):
            raise checks.field_error(self, "max_duration", "must be a positive number of seconds")
        checks.field_count(self, "max_batch_size", allow_none=True)
        checks.field_count(self, "num_buckets", allow_none=True)
        if self.boundaries is not None:
            edges = list(self.boundaries)
            if edges != sorted(edges) or any(not math.isfinite(e) or e <= 0 for e in edges):
                raise checks.field_error(self, "boundaries", "must be ascending positive seconds")
            object.__setattr__(self, "boundaries", tuple(float(e) for e in edges))
        checks.field_count(self, "estimate_rows", allow_none=True)

    @property
    def buckets(self) -> int:
        """``num_buckets``, or `DEFAULT_NUM_BUCKETS` when it is None: the most a fitted count can be, and the
        count recorded with explicit ``boundaries`` (the count a loader uses is `Buckets.count`)."""
        return DEFAULT_NUM_BUCKETS if self.num_buckets is None else self.num_buckets

    def to_dict(self) -> dict[str, Any]:
        """The fields, with ``num_buckets`` as `buckets` (a checkpoint records the count used, not "None")."""
        return {**dataclasses.asdict(self), "num_buckets": self.buckets}


@dataclass(frozen=True)
class Buckets:
    """The duration buckets of a loader with bucketing (`chain.duration_buckets`).

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


#: 0.2's flat keywords of `AudioLoader` that moved into a group: name -> (argument, field). Accepted for one
#: more release with a ``FutureWarning`` naming the new form (`fold_moved_keywords`).
MOVED_KEYWORDS = {
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


def fold_moved_keywords(groups: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """``groups`` (argument name -> group) with 0.2's flat keywords in ``moved`` folded in, one warning each.

    An unknown keyword is a ``TypeError`` as Python would raise it; a keyword that
    contradicts its group's field is a ``ValueError`` naming both (see `merge`).
    """
    unknown = sorted(set(moved) - set(MOVED_KEYWORDS))
    if unknown:
        raise TypeError(f"AudioLoader() got an unexpected keyword argument {unknown[0]!r}")
    by_group: dict[str, dict[str, Any]] = {}
    for name, value in moved.items():
        argument, field = MOVED_KEYWORDS[name]
        cls = _GROUP_CLASS_NAMES[argument]
        warnings.warn(f"AudioLoader({name}=...) is deprecated and will be removed in 0.4: pass "
                      f"{argument}=al.{cls}({field}={value!r}) instead (see CHANGELOG.md)", DeprecatedKeywordWarning,
                      stacklevel=4)
        by_group.setdefault(argument, {})[field] = value
    out = dict(groups)
    for argument, fields in by_group.items():
        out[argument] = merge(out[argument], **fields) if argument != "source" else fields
    return out


def merge(group: Any, **legacy: Any) -> Any:
    """``group`` with the fields given as individual keyword arguments (not None) filled in.

    A field given both ways with different values is a ``ValueError`` naming both.
    """
    changes = {}
    for field, value in legacy.items():
        if value is None:
            continue
        current = getattr(group, field)
        default = next(f.default for f in dataclasses.fields(group) if f.name == field)
        if current != default and current != value:
            raise ValueError(f"{field}={value!r} conflicts with {type(group).__name__}({field}={current!r}); "
                             "give it once")
        changes[field] = value
    return dataclasses.replace(group, **changes) if changes else group


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
    if kind != "auto":
        return kind
    if (os.cpu_count() or 1) < AUTO_PROCESS_MIN_CORES or num_workers == 0:
        return "thread"
    if augment is not None:
        try:
            pickle.dumps(augment)
        except (pickle.PicklingError, TypeError, AttributeError):
            warnings.warn("augment cannot be sent to worker processes (define it at the top level of a module, "
                          "not as a lambda or inside a function), so decoding runs in threads; on many cores "
                          "processes are faster (workers=al.Workers(kind='process'))", stacklevel=5)
            return "thread"
    return "process"


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

    Where each setting becomes final: `resolve` checks the arguments and fills in the presets (every field
    but those below); `chain.settle`, once the sources' shards are open and before any node is built,
    decides what depends on the shards: ``shuffle.interleave`` and ``shuffle.lane_bytes`` (a preset's
    interleave fitted to the byte budget and the shards' units), ``shuffle.before_decode`` (None until then),
    ``buckets`` and ``num_batches``, and the nodes' own groups: each source's ``reads`` (the splits every rank
    reads each pass), the buffer's, the bucketer's and the batcher's, and the batch memory;
    `chain.settle_for_checkpoint` gives the settings a checkpoint was taken
    with (its bucket count, a legacy buffer), from which the chain is built anew. Nodes never change them.
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
    buckets: Buckets | None = None  # with batching: the count and edges (`chain.settle`)
    num_batches: int | None = None  # evaluation: batches every rank yields (`chain.settle`)
    # The nodes' own groups (`chain.settle`), handed to each node whole by `chain.build_chain`:
    reads: tuple[Any, ...] = ()  # each source's `nodes.read_order.ReadPlan`
    buffer_limits: Any = None  # the shuffle buffer's `nodes.shuffle_buffer.BufferLimits`
    bucket_limits: Any = None  # with batching, the `nodes.duration_bucketer.BucketLimits`
    batch_layout: Any = None  # the batcher's `nodes.batcher.BatchLayout`
    arena_bytes: int = 0  # shared memory the decode processes write features into (`workers.recycle.BatchArenas`)


def resolve(*, batch_size: Any, train: Any, seed: Any, infinite: Any, features: Any, length: Any, batching: Any,
            augment: Any, columns: Any, shuffle: Any, workers: Any, storage: Any, device: Any, drop_last: Any,
            on_error: Any, source: Any = None) -> Settings:
    """Check the front's arguments and fill in the mode's presets; errors name the argument and the fix."""
    from .dsp.augment import Augmentations
    from .dsp.config import LengthPolicy, MelSpectrogramConfig, check_features
    from .shards.augment_rows import AugmentRows

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
    from .mix import Mix

    shuffle = resolve_shuffle(shuffle, train=train, bucketing=batching is not None, mixed=isinstance(source, Mix))
    return Settings(
        train=train, batch_size=batch_size, seed=seed, infinite=bool(preset.infinite if infinite is None else infinite),
        drop_last=bool(drop_last), features=features, length=length, batching=batching, augmentations=augmentations,
        columns=_column_names(columns), shuffle=shuffle, workers=workers,
        storage=resolve_storage(checks.instance("storage", storage, Storage, default=Storage())), device=device,
        on_error=resolve_on_error(on_error))


def _column_names(columns: Any) -> tuple[str, ...]:
    if isinstance(columns, str):
        raise TypeError(f"columns={columns!r}: a list of column names, e.g. columns=[{columns!r}]")
    return tuple(columns)
