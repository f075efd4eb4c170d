"""AudioLoader: the DataLoader-shaped front of the default chain.

The chain itself is built in `audioloader.chain`, its options are checked in
`audioloader.options`, and its checkpoints are made and checked in
`audioloader.checkpoint`; this class holds them together and iterates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import checkpoint, checks, elastic
from .budget import Shuffle, largest_fitting, out_of_memory_errors
from .chain import (
    Chain,
    build_chain,
    chain_layers,
    open_sources,
    pinned_source,
    settle,
    settle_for_checkpoint,
)
from .dsp.config import FeatureConfig, LengthPolicy
from .errors import CheckpointMismatchError
from .loader import Loader, Stream, StreamIterator, batches_ahead_of_framework, shutdown_keeping_error
from .mix import Mix, Source
from .nodes.bucket_rules import bucket_sample
from .options import Bucketing, OnError, Settings, Storage, Workers, refuse_removed_keywords, resolve
from .samples import Key, Sample
from .shards import IcebergTable
from .stats import LoaderStats, bottleneck_line, feature_stage

STATE_FORMAT = checkpoint.STATE_FORMAT

Shards = str | Path | Sequence[str | Path]


class AudioLoader:
    """Batches of features from Arrow/Parquet/ORC audio shards or Iceberg tables, resumable bit for bit.

    Builds the default chain (`audioloader.chain.build_chain`): ``reader -> ShuffleBuffer
    -> DecodeSpectrogram -> Batcher -> Prefetcher`` under an audioloader `Loader` (the
    buffer before or after decoding, see `Shuffle`; with ``batching=`` a `DurationBucketer`
    before decoding; with a `Mix` a `WeightedMix` of one reader per source; with
    ``device=`` the features per batch on that device).

    Each batch is a dict: the features (``spectrogram`` float32 ``[B, n_mels, frames]``
    for the default log-mel; ``fbank`` ``[B, frames, bins]``; ``waveform`` ``[B, samples]``),
    ``label`` int64 ``[B]`` (unless the source has ``label_column=None``), ``index`` int64
    ``[B]`` (global row index), in eval ``valid`` bool ``[B]`` (false for the padding that
    keeps ranks at equal batch counts), and each of ``columns`` (numbers -> tensors, others
    -> lists). Whole utterances add ``lengths`` and ``padding_mask``; a `Mix` adds ``source``
    int64 ``[B]`` (names in ``source_names``); `Mixup` adds ``mixup_weights``,
    ``mixup_partner`` and ``mixup_labels``.

    Args:
        source: a directory, glob, file, URL or a list of them; an `IcebergTable` (one
            snapshot of an Apache Iceberg table, docs/lakehouse.md); a `Source` (shards with
            their audio/label columns, filter and filesystem); or a `Mix` of sources at
            weights (docs/mixing.md).
        batch_size: samples per batch (with ``batching=``, the most rows a batch may hold is
            the bucketing's).
        train: the mode's preset. True: infinite passes, random crops, a shuffle buffer of
            10000 rows and 256 MiB (first fill 8000 rows or 32 MiB), one pass at a time, the
            reader's interleave fitted to the budget (`audioloader.budget`). False: one pass, each
            sample exactly once across ranks, center crops, no shuffle (rows in file order).
        seed: every random choice is a pure function of ``seed`` and the sample's key.
        infinite: override the preset: passes forever (True) or one pass per ``iter`` (False). With
            ``train=False``: an endless stream of identical eval passes (each sample once across ranks, the same
            ``num_batches`` on every rank each pass), for a validation stream.
        features: `MelSpectrogramConfig` (default), `FbankConfig` or `WaveformConfig`.
        length: `LengthPolicy`: fixed crops (default) or whole utterances (``crop=None``).
        batching: `Bucketing` (whole utterances batched by total duration), or None.
        augment: ``augment(waveform: np.ndarray float32 [clip_samples], rng) -> np.ndarray``
            (``rng`` seeded from (seed, key)), or a list of augmentations (`Gain`, `AddNoise`,
            `Reverb`, `SpeedPerturb`, `SpecAugment`, `Mixup`) and such functions.
        columns: extra columns carried into each batch.
        shuffle: `Shuffle` (buffer size, min fill, raw rows or decoded samples, interleave).
        workers: `Workers` (how many, processes or threads, start method, prefetch, pinning).
        storage: `Storage` (rank and world size, split size, filesystem, retries, a local cache of
            remote shards: ``Storage(cache_dir=..., cache_limit=...)``).
        device: None (default): features per sample in the decode workers. A torch device
            (``"cuda"``): the workers deliver cropped waveforms and each batch's features
            are computed there in one call on a side stream (`BatchFeatures`); every tensor
            of the batch arrives on that device. ``"cpu"`` runs the same batched code on the
            CPU (slower than the default; it exists to check the GPU path against the CPU one).
        drop_last: drop a final partial batch.
        on_error: ``"skip"`` (count and report bad rows, within an error budget), ``"raise"``,
            or an `OnError` with the budget.

    0.2's flat keywords (``num_workers=``, ``shuffle_buffer_size=``, ``rank=``,
    ``label_column=``, ...) were removed in 0.4: each is a ``TypeError`` naming the group
    that holds it now (see CHANGELOG.md).
    """

    def __init__(
        self,
        source: Shards | Source | Mix | IcebergTable,
        *,
        batch_size: int = 64,
        train: bool = True,
        seed: int = 0,
        infinite: bool | None = None,
        features: FeatureConfig | None = None,
        length: LengthPolicy | None = None,
        batching: Bucketing | None = None,
        augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | Sequence[Any] | None = None,
        columns: Sequence[str] = (),
        shuffle: Shuffle | None = None,
        workers: Workers | None = None,
        storage: Storage | None = None,
        device: str | torch.device | None = None,
        drop_last: bool = False,
        on_error: str | OnError = "skip",
        **removed: Any,
    ) -> None:
        self._built_chain: Chain | None = None  # built on first use (`_built`); set first: __del__ needs it
        self._pid = os.getpid()
        refuse_removed_keywords(removed)  # 0.2's flat keywords: a TypeError naming the group that holds each now
        arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__", "removed")}
        # One line: the options checked (mix options too) -> the shards opened -> every setting final -> (the chain,
        # built once on first use: iter(), state_dict(), len(), or a node asked for).
        resolved = resolve(**arguments)
        self.stats_counters = LoaderStats(feature_stage(resolved.features.batch_key))
        self._bottleneck_every, self._bottleneck_to, self._batches_out = 0, None, 0  # see report_bottleneck
        self.sources = open_sources(source, resolved, self.stats_counters)
        # The arguments, to rebuild this loader elsewhere (pickling: see __reduce__).
        self._arguments = {**arguments, "source": pinned_source(source, self.sources)}
        self._settled = settle(resolved, self.sources)  # what a checkpoint is settled against (`load_state_dict`)
        self._settled_fingerprint = checkpoint.fingerprint(self._settled, self.sources)
        self._generation = 0  # of the newest iterator, kept across the chains of one loader
        self._loaded: dict[str, Any] | None = None  # a state loaded before the chain is built: its start
        self._use(self._settled, self._settled_fingerprint)
        self._warned_prefetch = False  # the warning that a framework's look-ahead is unknown, given once
        self._warned_bad_rows = False  # the warning at the first bad row, given once (`_warn_bad_rows`)

    # ------------------------------------------------------------- the resolved options, as attributes

    train = property(lambda self: self.settings.train)
    batch_size = property(lambda self: self.settings.batch_size)
    seed = property(lambda self: self.settings.seed)
    infinite = property(lambda self: self.settings.infinite)
    drop_last = property(lambda self: self.settings.drop_last)
    features = property(lambda self: self.settings.features)
    length = property(lambda self: self.settings.length)
    batching = property(lambda self: self.settings.batching)
    device = property(lambda self: self.settings.device)
    augmentations = property(lambda self: self.settings.augmentations)
    columns = property(lambda self: self.settings.columns)
    num_workers = property(lambda self: self.settings.workers.num_workers)
    worker_type = property(lambda self: self.settings.workers.kind)
    start_method = property(lambda self: self.settings.workers.start_method)
    prefetch_batches = property(lambda self: self.settings.workers.prefetch_batches)
    pin_memory = property(lambda self: self.settings.workers.pin_memory)
    shuffle_buffer_size = property(lambda self: self.settings.shuffle.buffer_size)
    shuffle_min_size = property(lambda self: self.settings.shuffle.min_size)
    interleave = property(lambda self: self.settings.shuffle.interleave)
    shuffle_max_bytes = property(lambda self: self.settings.shuffle.max_bytes)
    shuffle_min_bytes = property(lambda self: self.settings.shuffle.min_bytes)
    shuffle_before_decode = property(lambda self: self.settings.shuffle.before_decode)
    rank = property(lambda self: self.settings.storage.rank)
    world_size = property(lambda self: self.settings.storage.world_size)
    mix = property(lambda self: self.sources.mix)
    reader = property(lambda self: self._built().reader)
    readers = property(lambda self: self._built().readers)
    rows = property(lambda self: self._built().rows)
    source_names = property(lambda self: self.sources.names)
    decoder = property(lambda self: self._built().decoder)
    batcher = property(lambda self: self._built().batcher)
    num_batches = property(lambda self: self.settings.num_batches)
    _duration_column = property(lambda self: self.settings.duration_column)

    @property
    def _chain(self) -> Chain:
        return self._built()

    @property
    def _stream(self) -> Stream:
        self._built()
        return self._built_stream

    # ------------------------------------------------------------- iteration

    def __iter__(self) -> StreamIterator[dict[str, Any]]:
        """A new iterator of batches; call it any number of times, as with ``torch.utils.data.DataLoader``.

        The new iterator supersedes the earlier ones (using one of those again raises
        ``RuntimeError``); it starts the chain at its first ``next()``, so an iterator never used
        holds nothing. Where it starts: an infinite loader (``train=True``, or ``infinite=True``) goes on where
        `state_dict()` says, i.e. after the last batch handed out (after the last one marked
        trained, with `mark_trained`): a second ``iter()`` continues the stream, it does not
        start it over. A loader of one pass per iteration (``train=False``, ``infinite=False``)
        starts the next pass, as a DataLoader starts the next epoch. After `load_state_dict`:
        where the loaded state says. One ``next()`` at a time: a second thread calling
        ``next()`` during one gets ``RuntimeError`` (two consumers never share one stream).
        """
        if not hasattr(self, "settings"):
            raise RuntimeError("this AudioLoader failed to construct")
        self._check_process()
        return self._stream.iterator(self._next_batch)

    def _next_batch(self, iterator: StreamIterator[dict[str, Any]]) -> dict[str, Any]:
        try:
            return self._take_batch(iterator)
        except KeyboardInterrupt:
            # Wherever in this call Ctrl-C lands, the loader stops every thread and worker before the interrupt
            # goes on. Often it lands right after the wait for a batch: when another thread took the signal, the
            # interpreter raises it at the next call this thread makes once the wait is over.
            self.shutdown()
            raise

    def _take_batch(self, iterator: StreamIterator[dict[str, Any]]) -> dict[str, Any]:
        self._check_process()
        start = time.perf_counter()
        try:
            batch = self._stream.next(iterator)  # the first call starts the chain: seconds to restore a buffer
        except StopIteration as end:
            self._warn_bad_rows()
            # torchdata re-raises a StopIteration object made in its thread and kept
            # in its frames; with this frame in its traceback, `self` would sit in a
            # reference cycle and the loader's threads would wait for gc to stop.
            end.__traceback__ = None
            raise StopIteration from None
        self.stats_counters.add_seconds("wait", time.perf_counter() - start)
        self._warn_bad_rows()
        self._batches_out += 1
        if self._bottleneck_every and self._batches_out % self._bottleneck_every == 0:
            self._bottleneck_to(bottleneck_line(self.stats_counters.bottleneck()))
        return batch

    def _warn_bad_rows(self) -> None:
        """Bad rows skipped under ``on_error="skip"`` are never silent: a warning at the first, then one at the end
        of each pass that had some, with the count (the rows themselves: ``stats()["bad_rows"]``). Called from
        `_take_batch`: ``stacklevel=5`` names the line of the program that asked for the batch."""
        counters = self.stats_counters
        if not self._warned_bad_rows and counters.counters["bad_rows"]:
            self._warned_bad_rows = True
            first = counters.bad_rows[0] if counters.bad_rows else {}
            warnings.warn(
                f"audioloader skipped a row whose audio could not be decoded (on_error='skip'): row "
                f"{first.get('row')} of {first.get('file')!r}: {first.get('reason')}. Such rows are skipped and "
                "counted: loader.stats()['counters']['bad_rows'] counts them, loader.stats()['bad_rows'] names "
                "them. This warning is shown once; a count follows at the end of each pass that has bad rows. "
                "on_error='raise' stops at the first instead", UserWarning, stacklevel=5)
        for note in counters.take_pass_notes():
            warnings.warn(
                f"audioloader: pass {note['pass']} ended with {note['bad_rows']} row(s) skipped because their "
                f"audio could not be decoded ({counters.counters['bad_rows']} in all so far); "
                "loader.stats()['bad_rows'] names them", UserWarning, stacklevel=5)

    def report_bottleneck(self, every: int = 100, to: Callable[[str], None] | None = None) -> None:
        """Every ``every`` batches, hand one line saying what bounds the run now (``stats()["bottleneck"]``) to
        ``to``: a progress bar's ``tqdm.write`` or ``set_postfix_str``, ``print``; default the ``audioloader``
        logger at INFO. ``every=0`` stops it."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"report_bottleneck(every={every!r}): must be an integer >= 0 (0 stops the reports)")
        if to is None:
            import logging

            to = logging.getLogger("audioloader").info
        self._bottleneck_every, self._bottleneck_to = every, to

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(_FORKED_MESSAGE.format(pid=self._pid))

    def mark_trained(self, batches: int = 1) -> None:
        """The oldest ``batches`` batches handed out and not yet marked have been trained on.

        For a consumer that takes batches ahead of training (Lightning's fetcher takes batch
        k+1 before training on batch k): once this is called, `state_dict()` is the state
        after the last batch marked trained, so a checkpoint resumes with the first batch not
        trained on, not after the prefetched ones. `audioloader.integrations.lightning.ExactResume`
        calls it for Lightning; a plain training loop, which trains on each batch before it
        asks for the next, needs none of this. Cost: the states after the last 16 batches are
        kept (the chain's own small dicts). Raises ``ValueError`` when more batches are marked
        than were handed out.
        """
        self._stream.mark_trained(batches)

    def __getitem__(self, index: Any) -> Any:
        raise TypeError("an AudioLoader is a data loader, not a dataset: iterate it directly (for batch in loader) "
                        "instead of wrapping it in torch.utils.data.DataLoader; its own num_workers decode in "
                        "parallel, and its batches are already collated")

    def __len__(self) -> int:
        if self.infinite:
            per_pass = "" if self.num_batches is None else f" (a pass is loader.num_batches={self.num_batches} batches)"
            raise TypeError(f"len() of an infinite AudioLoader is undefined{per_pass}; "
                            "pass infinite=False for one pass per iteration. (If a "
                            "torch.utils.data.DataLoader asked: iterate the AudioLoader directly instead of "
                            "wrapping it.)")
        if self.num_batches is not None:
            return self.batcher.batches_this_pass
        if self.settings.stop == "first_exhausted":
            raise TypeError("len() of a Mix(stop='first_exhausted') is not known before it runs (it ends when a "
                            "random draw first exhausts a source); use stop='all_exhausted' for a known length")
        rows = sum(split.num_rows for plan in self.settings.reads for split in plan.splits_for_pass(0))
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    # ----------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """A small plain dict (no tensors) to resume from; call between batches, in the iterating thread.

        It is the position after the last batch handed out, or, once `mark_trained` is in use,
        after the last batch marked trained. Taken by PyTorch Lightning for a checkpoint, it is the
        position after the last batch trained on without `mark_trained` too: Lightning's fetcher takes
        a batch ahead of training, and the loader leaves out the batches that fetcher holds
        (`audioloader.loader.batches_ahead_of_framework`; docs/integrations.md).
        """
        ahead = batches_ahead_of_framework()
        if ahead is None:
            ahead = 0
            self._warn_unknown_prefetch()
        return {"format": STATE_FORMAT, "fingerprint": self._fingerprint, "loader": self._stream.state_dict(ahead)}

    def _warn_unknown_prefetch(self) -> None:
        if self._warned_prefetch or self._stream.marking:
            return
        self._warned_prefetch = True
        warnings.warn(
            "PyTorch Lightning took this AudioLoader's state for a checkpoint, but how many batches its fetcher "
            "took ahead of training cannot be read here (no fetcher is running, as in a save after fit() returned; "
            "or a fetcher or CombinedLoader mode audioloader does not know, such as mode='max_size'): a run "
            "resumed from this checkpoint may skip the batch(es) taken ahead, never trained on. Add "
            "audioloader.integrations.lightning.ExactResume() to the Trainer's callbacks: it marks each batch "
            "trained, and the state follows the marks (docs/integrations.md)", UserWarning, stacklevel=3)

    def load_state_dict(self, state_dict: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """The next batch continues exactly where ``state_dict`` was taken: from a new ``iter()``, or from the
        iterator already in use (its next batch is the one after the state; never the one it would have yielded).

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
        resume = checkpoint.Resume.of(state_dict, self.rank, self.world_size)
        if resume.elastic and self.mix is not None:
            raise CheckpointMismatchError(
                f"this Mix checkpoint was saved on {len(resume.states)} ranks and this loader runs on "
                f"{self.world_size}: a mix resumes only on the same number of ranks (its draws are per rank); "
                f"resume with world_size={len(resume.states)}", {"world_size": (len(resume.states), self.world_size)})
        # Settled again with the checkpoint: the construction's settings, or those it was taken with.
        settings = settle_for_checkpoint(self._settled, self.sources, resume, self._settled_fingerprint)
        state = None if resume.elastic else resume.states[0]["loader"]
        if resume.elastic:
            # The rows the old ranks left of their pass, spread over the new ranks (`elastic.plan`, which reads the
            # old states by the node types of a chain of these settings: no chain is built for it), become this
            # rank's reader's start and batch count.
            start = elastic.plan(chain_layers(settings), self.sources.datasets[0], settings.reads[0],
                                 [old["loader"]["root"] for old in resume.states])
            settings = elastic.resumed(settings, self.sources, start)
        self._start_at(settings, state)

    def _start_at(self, settings: Settings, state: dict[str, Any] | None) -> None:
        """The next iteration starts at the chain state ``state`` of a chain of ``settings`` (None: at the start its
        settings hold, an elastic resume's, whose settings are always new): the chain built already when it has
        them, else one built anew on first use."""
        if settings is self.settings and self._built_chain is not None:  # the running chain goes on from the state
            self._stream.load_state_dict(state)
            return
        if self._built_chain is not None:  # taken with other settings: a new chain, built with them when first used
            self.shutdown()
            self._generation = self._built_stream.generation  # the live iterator goes on, from the loaded state
            self._built_chain = self._loader = None
        if settings is not self.settings:
            self._use(settings, checkpoint.fingerprint(settings, self.sources))
        self._loaded = state

    def _use(self, settings: Settings, fingerprint: dict[str, Any]) -> None:
        """Final ``settings`` (`chain.settle`) for the chain built on first use, the ``fingerprint`` of its
        checkpoints, and what ``stats()`` reports of them."""
        self.settings, self._fingerprint = settings, fingerprint
        self._note_memory()
        self._note_buckets()
        self._note_shuffle_quality()

    def _built(self) -> Chain:
        """The chain of ``self.settings``, built once, on first use (as torchdata resets lazily), with its `Loader`
        and `Stream`, at the state loaded before (if any)."""
        if self._built_chain is None:
            chain = build_chain(self.settings, self.sources, self.stats_counters)
            self._loader = Loader(chain.root)
            # Infinite loaders continue their stream on a new iter(); one-pass loaders start the next pass.
            stream = Stream(self._loader, continues=self.settings.infinite, repeats=self.settings.infinite)
            stream.generation = self._generation
            if self._loaded is not None:
                stream.load_state_dict(self._loaded)
            self._built_chain, self._built_stream, self._loaded = chain, stream, None
        return self._built_chain

    def _note_shuffle_quality(self) -> None:
        """Give ``stats.shuffle`` each source's splits of pass 0 on this rank (``(first global index, rows)``) and
        the mix's weights, for its per-batch figures and their references (`stats.ShuffleQuality`)."""
        split_rows = []
        for dataset, reads in zip(self.sources.datasets, self.settings.reads, strict=True):
            files = dataset.files
            split_rows.append([(files[s.file_id].index_offset + s.start, s.num_rows)
                               for s in reads.splits_for_pass(0)])
        weights = self.sources.mix.weights if self.sources.mix is not None else [1.0]
        self.stats_counters.shuffle.configure(split_rows, weights, self.settings.batch_size)

    def _note_buckets(self) -> None:
        """``stats()["bucketing"]``: how many duration buckets, their edges, and why that many."""
        if self.settings.buckets is not None:
            self.stats_counters.bucketing = self.settings.buckets.report(self.settings.batching.max_duration)

    def _note_memory(self) -> None:
        """The whole budget and the readers' lanes, beside what the buffer and the bucketer report holding."""
        shuffle = self.settings.shuffle
        self.stats_counters.memory.notes.update(
            loader_budget_bytes=shuffle.max_bytes, interleave=shuffle.interleave, lane_bytes=shuffle.lane_bytes,
            legacy_checkpoint=shuffle.legacy)

    # ------------------------------------------------------------ pickling

    def __reduce__(self):
        """Pickle as the constructor's arguments plus the position: unpickled, a fresh loader that goes on from there.

        Threads, worker processes and open files do not travel; the other side
        builds its own chain, loads the state (if this loader had started) and
        continues where this one was. The arguments must pickle: functions passed
        as ``augment`` must be importable (module level, not lambdas).
        """
        loader = self._loader if self._built_chain is not None else None
        positioned = self._loaded is not None or (loader is not None and loader.positioned)
        return _rebuild_audio_loader, (self._arguments, self.state_dict() if positioned else None)

    # ------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Counters (samples, batches, bad rows...), per-stage seconds, bad-row reports, buffer fill."""
        self._built()  # a first use too: the nodes report what they hold (``"memory"``) from their construction on
        return self.stats_counters.snapshot()

    def shutdown(self) -> None:
        """Stop every thread and worker of the loader (idempotent, safe in every state).

        A new iterator starts them again: an infinite loader where `state_dict()` says, a
        one-pass loader with its next pass.
        """
        if self._built_chain is not None:  # nothing runs before the chain is built
            self._built_stream.stop()
            self._loader.shutdown()

    def __enter__(self) -> AudioLoader:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        shutdown_keeping_error(self.shutdown, error)  # a failure to stop never hides the error leaving the block

    def __del__(self, _is_finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # At interpreter exit the threads are daemons that die with the process;
        # joining them (or starting a helper thread) could hang finalization. The check is bound at definition:
        # at exit this module's globals (`sys`) may already be None when a loader held by __main__ is collected.
        if _is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.shutdown()


_FORKED_MESSAGE = ("this AudioLoader was started in process {pid}; a forked child cannot use its threads or worker "
                   "processes (it would wait forever): build the loader in the process that iterates it")


def _rebuild_audio_loader(arguments: dict[str, Any], state: dict[str, Any] | None) -> AudioLoader:
    loader = AudioLoader(**arguments)
    if state is not None:
        loader.load_state_dict(state)
    return loader


# -- the device's memory: a batch size per bucket, found by an out-of-memory search -----------------------------


def tune_batch_sizes(source: Any, bucketing: Any, step: Any, *, columns: Sequence[str] = (), margin: float = 0.05,
                     max_size: int = 4096, **loader_options: Any) -> Any:
    """A `Bucketing` with a batch size per bucket: the largest batch of each bucket ``step`` runs without running
    out of memory, less ``margin``.

    The buckets are those a loader with ``bucketing`` settles on (``source`` and ``loader_options``: the
    `AudioLoader` arguments of the training run: ``features=``, ``length=``, ``storage=``, ...). For each bucket,
    probe batches of ``n`` rows are made from that bucket's longest row, its longest transcript, then its other
    rows most expensive first (cycled when it has fewer than ``n``: a batch's memory follows its longest row and
    transcript; every row is looked at when the shards have a duration column, else the ``estimate_rows``
    sample) through the loader's own decode and
    batcher, so they hold the same keys as real batches, the ``columns`` included. ``step(batch)`` is the user's
    training step (forward, backward, optimizer step, gradients zeroed); a run that raises an out-of-memory error
    (``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError`` or ``MemoryError``) does not fit. Sizes double
    from 1 until one does not fit (or ``max_size``), then a binary search finds the largest that fits; memory is
    freed between probes (``gc.collect()``, ``torch.cuda.empty_cache()``). Any other exception propagates.

    Returns ``bucketing`` with the edges settled (``boundaries``, ``token_boundaries``), ``batch_sizes`` of
    ``largest - floor(largest × margin)`` (at least 1) and no duration or token budget (the sizes bound the batches):
    pass it to `AudioLoader` as ``batching=``, and keep it with ``Bucketing.save(path)`` /
    ``Bucketing.load(path)``; a checkpoint records the sizes (its fingerprint), so a resumed run batches as the
    run did instead of searching again. Raises ``ValueError`` naming the bucket when one row does not fit.
    """
    if not isinstance(bucketing, Bucketing):
        raise TypeError(f"bucketing must be an audioloader.Bucketing, got {type(bucketing).__name__}")
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise ValueError(f"margin={margin!r}: must be a fraction in [0, 1), e.g. 0.05")
    max_size = checks.count("max_size", max_size)
    errors = out_of_memory_errors()
    wanted = dataclasses.replace(bucketing, sync_buckets=False, first=None, batch_sizes=None)
    options = {"workers": Workers(num_workers=0), "train": True, **loader_options}
    with AudioLoader(source, batching=wanted, columns=columns, **options) as loader:
        settings, sources = loader.settings, loader.sources
        limits, fetch = settings.bucket_limits, sources.fetch()
        if settings.duration_column is not None:  # a column to read: every row, so each bucket's worst is found
            every = dataclasses.replace(settings.batching, estimate_rows=len(sources.datasets[0].kept_indices()))
            settings = dataclasses.replace(settings, batching=every)
        indices, seconds, tokens = bucket_sample(settings, sources)
        by_bucket: list[list[int]] = [[] for _ in range(limits.count)]
        for k in sorted(range(len(indices)), key=lambda k: (-limits.cost(seconds[k]), -tokens[k], indices[k])):
            by_bucket[limits.bucket_of(seconds[k], tokens[k])].append(k)
        # Each bucket's probe rows: its longest, its densest transcript, then the rest most expensive first.
        by_bucket = [[indices[k] for k in dict.fromkeys([*rows[:1], *sorted(rows, key=lambda k: -tokens[k])[:1],
                                                          *rows])] for rows in by_bucket]

        def fits(rows: list[int], n: int) -> bool:
            decoded = loader.decoder.decode_many(fetch([Key(rows[i % len(rows)], 0) for i in range(n)]))
            samples = [s for s in decoded if isinstance(s, Sample)]  # a bad row is left out, as in a real batch
            batch = loader.batcher.collate(samples)  # the loader's own batcher: the keys of its batches
            try:
                step(batch)
                return True
            except errors:
                return False
            finally:
                del batch, samples, decoded
                gc.collect()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()

        largest = [largest_fitting(rows, fits, max_size, b) if rows else None for b, rows in enumerate(by_bucket)]
    found = [n for n in largest if n is not None]
    if not found:
        raise ValueError("tune_batch_sizes: no sampled row fell in any bucket (an empty source?)")
    # A bucket no sampled row fell in gets the smallest size found: its rows are few, and rarely the longest.
    # The margin in whole rows, rounded down: a batch of 8 that fits stays 8 (7 would be 12 % below it).
    sizes = tuple(max(1, n - math.floor(n * margin)) for n in (min(found) if n is None else n for n in largest))
    return dataclasses.replace(bucketing, boundaries=tuple(settings.buckets.boundaries),
                               token_boundaries=settings.buckets.token_boundaries, batch_sizes=sizes,
                               num_buckets=None, max_duration=None, quadratic_duration=None, max_tokens=None)
