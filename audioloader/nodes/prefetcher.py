"""Prefetcher: torchdata's Prefetcher, with a reset that waits for its thread and one torch thread inside."""

from __future__ import annotations

from typing import Any

import torch
from torchdata.nodes import BaseNode
from torchdata.nodes import Prefetcher as _TorchdataPrefetcher

from ..workers.threads import pin_worker_to_one_thread
from ._torchdata_compat import forget_single_threaded, stop_single_threaded
from .held import RowsHeld, at_snapshot


class _OneTorchThread(BaseNode):
    """Passes ``source`` through unchanged (state included); torch ops in the calling thread use one thread.

    Inside the prefetch thread the work is copies (collating a batch: 16 MB for
    64 log-mels), which torch would spread over its whole intra-op pool; next to
    busy decode workers the pool's threads wait for cores and a 1 ms copy took
    26 ms (measured, 2 worker processes on 2 cores).
    """

    def __init__(self, source: BaseNode) -> None:
        super().__init__()
        self.source = source
        self._user_threads = torch.get_num_threads()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self) -> Any:
        pin_worker_to_one_thread(self._user_threads)  # once per thread
        return next(self.source)

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()


class Prefetcher(_TorchdataPrefetcher):
    """Runs the source in a background thread, ``prefetch_factor`` items ahead.

    torchdata 0.11's ``reset`` gives the old thread 0.5 s to stop and then goes
    on regardless; a thread still inside the source's ``next()`` (a batch being
    decoded) would race with the source's reset and corrupt the new epoch's
    state. Here ``reset`` and ``shutdown`` wait until the thread has stopped.
    The thread runs torch ops on one intra-op thread (see `_OneTorchThread`).
    """

    def __init__(self, source: BaseNode, prefetch_factor: int) -> None:
        super().__init__(_OneTorchThread(source), prefetch_factor)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        self.shutdown()
        forget_single_threaded(self)  # a failed reset must leave a node that shutdown() can stop (see there)
        super().reset(initial_state)

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """The batches it fetched ahead are not in its state, which is at a snapshot: its source's state (the
        one-thread wrapper in between passes it through; see `audioloader.nodes.held`)."""
        return at_snapshot(state)

    def shutdown(self) -> None:
        """Stop the background thread and wait for it (idempotent, in every state; ``get_state()`` still works)."""
        stop_single_threaded(self)
