"""``audioloader pack`` on a Ray cluster: the parts of a split pack (``--part K/N``) as Ray tasks.

Python (``audioloader.integrations.ray`` hands on the same `pack`)::

    from audioloader.integrations import ray as al_ray

    summary = al_ray.pack("s3://bucket/lists/train.csv", "s3://bucket/shards/train", parts=64,
                          sample_rate=16000, address="head-node:6379")
    print(summary.text())

Command line: ``audioloader pack SRC OUT --ray [ADDRESS] [--parts N]``.

Each task runs `audioloader.tools.pack.pack_dataset` with ``part="K/N"`` (one CPU each, its
own threads for reading), so the shards, their names, the journals and the rows are exactly
those of running the N parts by hand; the driver shows one progress bar over every part and
returns one `PackSummary` (the rows, the skipped rows and the shards of every part, in name
order). A task Ray retries after a lost worker continues its part from its journal, and so
does the whole call run again after a crash. SRC and OUT must be reachable from every node:
object storage, or a shared filesystem.

Ray is imported only here, inside `pack` (``pip install audioloader[ray]``): importing this module, as
``audioloader pack`` does, does not import it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from audioloader.tools.input_lists import EXAMPLES_PER_REASON
from audioloader.tools.pack import PackSummary, pack_dataset
from audioloader.tools.pack_journal import journal_part, parse_part, shard_part
from audioloader.tools.pack_store import open_out

__all__ = ["pack"]

#: How often (rows) a task reports its progress to the driver.
_REPORT_EVERY = 16
#: How often (seconds) the driver refreshes the progress bar.
_REFRESH_SECONDS = 0.5


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], *, parts: int | None = None,
         address: str | None = None, num_cpus: float = 1, progress: bool = True, **options: Any) -> PackSummary:
    """Pack ``src`` into ``out`` as ``parts`` Ray tasks; the options are `pack_dataset`'s.

    Args:
        src, out: as for `pack_dataset` (paths every node sees, or URLs).
        parts: the number of parts (default: the cluster's CPUs). A rerun must give the same number to
            continue an interrupted pack (the journals are per part).
        address: the cluster to connect to (``"host:6379"``, ``"auto"``); None: ``RAY_ADDRESS``, else a
            cluster `ray start` runs on this machine, else a new local one. Ignored when Ray is already
            initialized in this process (the call then uses that cluster and leaves it running).
        num_cpus: CPUs Ray reserves for each task (with ``workers=`` threads inside it).
        progress: one tqdm bar over every part (only when stderr is a terminal).
        **options: `pack_dataset`'s (``fmt``, ``shard_rows``, ``sample_rate``, ``overwrite``, ...); not ``part``.

    Returns:
        The `PackSummary` of the whole pack: every part's shards, in name order.
    """
    import ray
    from tqdm import tqdm

    if "part" in options:
        raise ValueError("part=: the Ray pack runs every part itself; give parts=N")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        count = parts if parts is not None else max(1, int(ray.cluster_resources().get("CPU", 1)))
        parse_part((0, count))  # checks count
        if options.get("overwrite"):
            _remove_other_splits(out, count)
        tracker = ray.remote(num_cpus=0)(_Progress).remote(count)
        task = ray.remote(num_cpus=num_cpus)(_pack_part)
        pending = [task.remote(os.fspath(src), os.fspath(out), f"{k}/{count}", options, tracker)
                   for k in range(count)]
        refs = list(pending)
        bar = tqdm(unit="file", desc=f"pack ({count} parts, ray)", disable=not (progress and sys.stderr.isatty()))
        try:
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=_REFRESH_SECONDS)
                done, total = ray.get(tracker.totals.remote())
                bar.total = total
                bar.update(done - bar.n)
            summaries = ray.get(refs)
        finally:
            bar.close()
    finally:
        if started:
            ray.shutdown()
    return _merged(summaries, out)


def _remove_other_splits(out: str | os.PathLike[str], count: int) -> None:
    """With ``overwrite``: part 0 clears a whole pack or another split; the other parts must not race it."""
    store = open_out(out)
    try:
        for name in store.names():
            owner = shard_part(name)
            owner = journal_part(name) if owner is False else owner
            if owner is not False and (owner is None or owner.count != count):
                store.remove(name)
    finally:
        store.close()


class _Progress:
    """A Ray actor: each part's rows done and rows in all."""

    def __init__(self, count: int) -> None:
        self.done = [0] * count
        self.total = [0] * count

    def update(self, index: int, done: int, total: int) -> None:
        self.done[index], self.total[index] = done, total

    def totals(self) -> tuple[int, int]:
        return sum(self.done), sum(self.total)


def _pack_part(src: str, out: str, part: str, options: dict[str, Any], tracker: Any) -> PackSummary:
    """One Ray task: `pack_dataset` of one part, reporting its progress to ``tracker``."""
    index = parse_part(part).index

    def report(done: int, total: int) -> None:
        if done == total or done % _REPORT_EVERY == 0:
            tracker.update.remote(index, done, total)

    options = {**options, "progress": False, "on_progress": report}
    # overwrite: each part clears its own shards; other splits were cleared by the driver before.
    return pack_dataset(src, out, part=part, **options)


def _merged(summaries: list[PackSummary], out: str | os.PathLike[str]) -> PackSummary:
    """One summary of every part's (in part order: shards in name order, skipped rows each counted once)."""
    first = summaries[0]
    merged = PackSummary([s for summary in summaries for s in summary.shards], first.out, first.input_format,
                         label_names=first.label_names)
    for summary in summaries:
        merged.rows += summary.rows
        merged.seconds += summary.seconds
        merged.audio_bytes += summary.audio_bytes
        merged.resumed += summary.resumed
        merged.columns = merged.columns or summary.columns
        for reason, n in summary.skipped.items():
            merged.skipped[reason] = merged.skipped.get(reason, 0) + n
            examples = merged.examples.setdefault(reason, [])
            examples += summary.examples[reason][:max(0, EXAMPLES_PER_REASON - len(examples))]
    if merged.rows == 0:
        raise ValueError(f"every row was skipped, nothing to pack ({merged.skipped})")
    merged.indexed = any(s.indexed for s in summaries)
    if not merged.indexed:  # every part finished, but none saw all the others done (journals read as they ran)
        store = open_out(out)
        try:
            store.write_index()
        finally:
            store.close()
        merged.indexed = True
    return merged
