"""Several sources mixed at weights: `Source` (one source's shards and columns) and `Mix` (sources at weights).

``AudioLoader(al.Mix({"speech": ("librispeech/", 0.7), "noisy": (al.Source("noisy/", audio_column="wav"), 0.3)}))``
reads each source with its own `ArrowShardReader` and interleaves them with a
`WeightedMix` node. A sample's key gains its source's position in the mix
(``Key(index, pass, source)``), so every random choice about it (crop,
augmentation) is a pure function of ``(seed, source, index, pass)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from torchdata.nodes import StopCriteria

from .dsp import hashing
from .dsp.config import FeatureConfig, LengthPolicy, Segments
from .dsp.ffmpeg import BACKENDS as DECODERS
from .shards.formats.writer import shard_doc

#: When a mix ends (see `Mix`): the behaviours of `audioloader.nodes.WeightedMix`.
STOP_CRITERIA = ("cycle", "first_exhausted", "all_exhausted")

#: torchdata's names (``torchdata.nodes.StopCriteria``) for the same criteria, accepted too.
TORCHDATA_STOP_CRITERIA = {
    StopCriteria.CYCLE_FOREVER: "cycle",
    StopCriteria.FIRST_DATASET_EXHAUSTED: "first_exhausted",
    StopCriteria.ALL_DATASETS_EXHAUSTED: "all_exhausted",
}


def stop_criterion(stop: Any) -> str:
    """``stop`` as one of `STOP_CRITERIA` (torchdata's names accepted); ``ValueError`` naming the choices."""
    if stop in STOP_CRITERIA:
        return stop
    if stop in TORCHDATA_STOP_CRITERIA:
        return TORCHDATA_STOP_CRITERIA[stop]
    raise ValueError(f"stop={stop!r}: must be one of {STOP_CRITERIA} (or torchdata's StopCriteria "
                     f"{sorted(TORCHDATA_STOP_CRITERIA)}); CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED is not supported: "
                     "use 'cycle' for training or 'all_exhausted' to read every source once")


@dataclass(frozen=True)
class Source:
    """One source of shards: where they are and which columns to read (alone, or in a `Mix`).

    Attributes:
        data: a folder, glob, file, URL or a list of them, or a `ShardDataset`.
        audio_column: the encoded audio column of these shards.
        label_column: their integer label column, or None (then every source of the mix must be unlabeled).
        length: this source's `LengthPolicy` (None: the loader's ``length=``). Sources
            may differ in crop mode, ``min_seconds``, ``max_seconds`` and ``too_long``, but
            batches must stack: all fixed-length crops of the same length, or all whole utterances.
        filesystem: a ``pyarrow.fs.FileSystem`` for ``data``'s paths (None: the loader's
            ``Storage.filesystem``, else from the URL scheme).
        filter: a ``pyarrow.compute.Expression`` over non-audio columns, e.g.
            ``pc.field("duration") < 10.0``: only the rows it keeps are read (Parquet row
            groups pruned by statistics first; docs/storage.md). Rows keep their index.
        segments: `Segments`: each row is a window of its audio, named by two numeric
            columns (``start``/``end`` seconds, or ``start``/``duration``): only the window
            is decoded (WAV/FLAC/AIFF seek to it), crops and whole utterances are taken
            from it, and duration bucketing uses its length. None: whole rows. A single
            source only, for now (not in a `Mix`).
        decoder: the decoder backend (docs/codecs.md): ``"auto"`` (containers only FFmpeg reads, such as
            AAC in MP4/M4A or Opus in WebM, through FFmpeg, sniffed from the bytes; the rest through
            libsndfile), ``"sndfile"`` or ``"ffmpeg"`` (every row through FFmpeg; ``pip install
            "audioloader-arrow[ffmpeg]"``). Part of the data's identity: a checkpoint records it.

    The loader's ``columns=`` are read from every source. A loader of one source takes
    a `Source` too: ``AudioLoader(al.Source("speech/", label_column=None), ...)``.
    """

    data: Any
    audio_column: str = "audio"
    label_column: str | None = "label"
    length: LengthPolicy | None = None
    filesystem: Any = None
    filter: Any = None
    segments: Segments | None = None
    decoder: str = "auto"

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ValueError(f"Source.decoder={self.decoder!r}: must be one of {DECODERS} (docs/codecs.md)")
        if isinstance(self.data, Source):
            raise TypeError("Source(data=...) takes shards (a path, a list of paths or a ShardDataset), not a Source")
        if self.length is not None and not isinstance(self.length, LengthPolicy):
            raise TypeError(f"Source.length must be an audioloader.LengthPolicy or None, got "
                            f"{type(self.length).__name__}")
        if self.segments is not None and not isinstance(self.segments, Segments):
            raise TypeError(f"Source.segments must be an audioloader.Segments or None, got "
                            f"{type(self.segments).__name__}; e.g. al.Segments(start='start', end='end')")


@dataclass(frozen=True)
class MixEntry:
    """One source of a `Mix`, resolved: its name, `Source` and weight (normalised: the weights sum to 1)."""

    name: str
    source: Source
    weight: float


@dataclass(frozen=True)
class Mix:
    """Several sources interleaved at weights: ``Mix({name: (source, weight), ...}, stop=None)``.

    Each draw takes the next row of one source, chosen with probability
    proportional to its weight; draw ``d`` of epoch ``e`` on rank ``r`` is a pure
    function of ``(seed, r, e, d)``, so the interleaving, like everything else,
    does not depend on workers, timing or resumes. A source is a path (or list,
    or `ShardDataset`) read with the loader's columns, or a `Source` with its own.

    ``stop`` says what happens when a source has given all its rows (the end of
    its pass):

    - ``"cycle"`` (training default): it starts its next pass (a new split order,
      new keys, so new crops and augmentations); the mix never ends, and the
      realised proportions follow the weights however small a source is.
    - ``"all_exhausted"`` (evaluation, the only choice there): it drops out and the
      others go on at their relative weights; the mix ends when every source has
      given every row once. In evaluation that is each row of each source exactly
      once across all ranks; the weights then only set the interleaving.
    - ``"first_exhausted"``: the mix ends when the first source runs out (the
      others' remaining rows of that pass are not read).

    With ``infinite`` (the training default) a mix that ends starts again, every
    source at its next pass. torchdata's ``StopCriteria`` names are accepted for
    the same three.

    Attributes:
        sources: ``{name: (source, weight)}``, in key order (a source's position is
            its id: ``batch["source"]``, ``Key.source``). Weights are positive numbers.
        stop: one of `STOP_CRITERIA`, or None for the mode's default.
        entries: the resolved `MixEntry` list (weights normalised to sum to 1).
    """

    sources: Mapping[str, tuple[Any, float]]
    stop: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sources, Mapping) or not self.sources:
            raise TypeError("Mix(sources) takes a non-empty dict {name: (source, weight)}, got "
                            f"{type(self.sources).__name__}")
        if self.stop is not None:
            object.__setattr__(self, "stop", stop_criterion(self.stop))
        entries = [_entry(name, value) for name, value in self.sources.items()]
        total = math.fsum(e.weight for e in entries)
        object.__setattr__(self, "entries", tuple(MixEntry(e.name, e.source, e.weight / total) for e in entries))
        object.__setattr__(self, "sources", dict(self.sources))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(e.weight for e in self.entries)


def _entry(name: Any, value: Any) -> MixEntry:
    if not isinstance(name, str) or not name:
        raise TypeError(f"Mix source names must be non-empty strings, got {name!r}")
    if not (isinstance(value, tuple) and len(value) == 2):
        raise TypeError(f"Mix source {name!r}: expected a (source, weight) pair, got {value!r}; e.g. "
                        f"Mix({{{name!r}: ('shards/', 0.5), ...}})")
    data, weight = value
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"Mix source {name!r}: weight={weight!r} must be a positive finite number")
    source = data if isinstance(data, Source) else Source(data)
    return MixEntry(name, source, float(weight))


def source_seed(seed: int, position: int) -> int:
    """The seed of a mix's source ``position`` (its split order per pass): its own, unless it is the first."""
    return seed if position == 0 else hashing.mix(seed, hashing.SALT_SOURCE, position) >> 1


def resolve_mix(mix: Mix, *, train: bool, infinite: bool, batching: Any, length: LengthPolicy,
                features: FeatureConfig) -> tuple[str, tuple[LengthPolicy, ...]]:
    """A `Mix`'s options checked against the loader's (no file is opened): its stopping rule (``stop``, or the
    mode's: ``"cycle"`` for infinite training, else ``"all_exhausted"``) and each source's `LengthPolicy` (its own,
    else the loader's ``length``). ``ValueError`` naming the option and the fix."""
    with_segments = [e.name for e in mix.entries if e.source.segments is not None]
    if with_segments:
        raise ValueError(f"Mix source(s) {with_segments} have segments=: a Mix does not take segments yet; read "
                         "the segments of one source, or pack them into rows of their own (audioloader pack cuts "
                         "them)")
    if batching is not None:
        raise ValueError("batching=Bucketing(...) does not take a Mix yet: bucket one source, or mix "
                         "fixed-size batches (batch_size=)")
    stop = mix.stop or ("cycle" if infinite and train else "all_exhausted")
    if not train and stop != "all_exhausted":
        raise ValueError(f"Mix(stop={stop!r}) with train=False: evaluation reads every row of every source "
                         "exactly once (stop='all_exhausted', the default there); the weights then only set "
                         "the interleaving. Leave stop out, or evaluate the sources one by one")
    if stop == "cycle" and not infinite:
        raise ValueError("Mix(stop='cycle') never ends, but infinite=False asks for passes that end: use "
                         "stop='all_exhausted' (every row of every source once) or 'first_exhausted'")
    labelled = {e.name: e.source.label_column is not None for e in mix.entries}
    if len(set(labelled.values())) > 1:
        raise ValueError(f"Mix sources disagree on labels {labelled}: batches have a label for every sample "
                         "or for none; give every Source a label_column, or label_column=None to all")
    lengths = tuple(e.source.length or length for e in mix.entries)
    # The loader's own length= is checked with them: it sets the batches' shape.
    check_lengths(["length= of the loader", *mix.names], [length, *lengths], features)
    return stop, lengths


def check_lengths(names: Sequence[str], lengths: Sequence[LengthPolicy], features: FeatureConfig) -> None:
    """Sources may differ in length policy only where their samples still stack into one batch."""
    variable = {name: length.variable_length for name, length in zip(names, lengths, strict=True)}
    if len(set(variable.values())) > 1:
        raise ValueError(f"Mix sources mix fixed crops and whole utterances (crop=None per source: {variable}); "
                         "a batch holds one or the other: give every source the same kind of LengthPolicy")
    if not any(variable.values()):
        clips = {name: length.clip_samples(features) for name, length in zip(names, lengths, strict=True)}
        if len(set(clips.values())) > 1:
            raise ValueError(f"Mix sources crop to different lengths (samples per source: {clips}); a batch "
                             "stacks equal crops: give every source the same clip_seconds")


def check_source_columns(names: Sequence[str], schemas: Sequence[pa.Schema], columns: Sequence[str],
                         segments: Sequence[Segments | None], token_column: str | None) -> None:
    """The shards of each source (a mix's named ``names``; ``schemas`` and ``segments`` in their order) have the
    columns the options name: numeric ``segments`` columns, rows not already cut by ``audioloader pack``, an integer
    ``token_column``; and the loader's extra ``columns`` have one type across sources. ``ValueError`` naming the fix."""
    for schema, windows in zip(schemas, segments, strict=True):
        if windows is not None:
            _check_segment_columns(schema, windows)
        if token_column is not None:
            _check_token_column(schema, token_column)
    first = schemas[0]
    for name, schema in zip(names[1:], schemas[1:], strict=True):
        for column in columns:
            if schema.field(column).type != first.field(column).type:
                raise ValueError(f"column {column!r} is {first.field(column).type} in Mix source {names[0]!r} but "
                                 f"{schema.field(column).type} in {name!r}; one column must have one type in every "
                                 "source")


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
