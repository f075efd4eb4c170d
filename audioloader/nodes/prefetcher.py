"""Prefetcher: torchdata's Prefetcher, with a reset that waits for its thread and one torch thread inside."""

from __future__ import annotations

from typing import Any

import torch
from torchdata.nodes import BaseNode
from torchdata.nodes import Prefetcher as _TorchdataPrefetcher

from ..workers.threads import join_or_report, pin_worker_to_one_thread


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
        # torchdata deletes ``_it`` before it builds the next one; when building fails (the source's
        # reset raises: a dead worker, a bad state) the node was left without ``_it`` and every later
        # shutdown() raised AttributeError, which inside ``with`` replaced the real error.
        self._it = None
        super().reset(initial_state)

    def shutdown(self) -> None:
        """Stop the background thread and wait for it (idempotent, in every state; ``get_state()`` still works)."""
        it = getattr(self, "_it", None)
        if it is None:
            return
        it._stop_event.set()
        thread = getattr(it, "_thread", None)
        if thread is not None:
            join_or_report(thread)
