"""Where decoding runs: pools of worker processes or threads, and how items travel to them.

``pool`` runs chunks of items on threads or processes (fork or fork server), and
``process_worker`` is what runs inside a worker process;
``wire`` encodes results into reusable shared-memory slots; ``memory`` trims the
heap of long-running workers; ``threads`` pins a worker to one torch thread and
stops threads that do not end; ``preload`` is what the fork server imports once;
``forks`` keeps a process forked from the consumer away from the consumer's workers.
``Workers`` is the group that says who decodes (`AudioLoader`'s ``workers=``, `DecodeSpectrogram`'s).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import checks

WORKER_KINDS = ("auto", "thread", "process")
#: ``Workers(num_workers=...)`` for processes that size themselves while running (`audioloader.workers.autotune`).
AUTO_WORKERS = "auto"
START_METHODS = ("fork", "forkserver", "spawn")


@dataclass(frozen=True)
class Workers:
    """Who decodes: ``num_workers`` workers of ``kind`` ``"process"``, ``"thread"`` or ``"auto"``.

    ``"auto"``: processes on machines with 2 cores or more (threads when
    ``augment`` cannot be pickled). ``num_workers`` None: one per core for
    processes; threads 2 per core up to the preset (8 train, 4 eval).
    ``num_workers="auto"``: processes size themselves while running: one per core is
    started, and how many get work moves between 1 and that, starting from the cores the
    machine leaves free, up while the loader waits for them and more of them deliver
    more, down while it does not wait (decisions in ``stats()["workers"]["autotune"]``;
    batches and checkpoints are the same as with any fixed count). With threads,
    "auto" is the thread default.
    ``start_method``: how processes start (None: a fork while no other Python
    thread runs and CUDA is unused, else a fork server; never a fork once CUDA is
    in use, see `audioloader.workers.cuda`). ``prefetch_batches``: batches prepared ahead.
    ``pin_memory``: deliver batches in page-locked memory, for a fast copy to a
    GPU (needs CUDA; ignored with a warning otherwise; ``device=`` pins by itself).
    """

    num_workers: int | str | None = None
    kind: str = "auto"
    start_method: str | None = None
    prefetch_batches: int = 2
    pin_memory: bool = False

    def __post_init__(self) -> None:
        if self.num_workers != AUTO_WORKERS:
            if isinstance(self.num_workers, str):
                raise checks.field_error(self, "num_workers", f"must be an integer >= 0, None or {AUTO_WORKERS!r} "
                                         "(processes that size themselves)")
            checks.field_count(self, "num_workers", minimum=0, allow_none=True)
        if self.kind not in WORKER_KINDS:
            raise checks.field_error(self, "kind", f"must be one of {WORKER_KINDS}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise checks.field_error(self, "start_method", f"must be one of {START_METHODS} or None")
        checks.field_count(self, "prefetch_batches", allow_none=True)
