"""Prefetcher: torchdata's Prefetcher, with a reset that waits for its thread."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import Prefetcher as _TorchdataPrefetcher


class Prefetcher(_TorchdataPrefetcher):
    """Runs the source in a background thread, ``prefetch_factor`` items ahead.

    torchdata 0.11's ``reset`` gives the old thread 0.5 s to stop and then goes
    on regardless; a thread still inside the source's ``next()`` (a batch being
    decoded) would race with the source's reset and corrupt the new epoch's
    state. Here ``reset`` and ``shutdown`` wait until the thread has stopped.
    """

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        self.shutdown()
        super().reset(initial_state)

    def shutdown(self) -> None:
        """Stop the background thread and wait for it (idempotent; ``get_state()`` still works)."""
        it = self._it
        if it is None:
            return
        it._stop_event.set()
        thread = getattr(it, "_thread", None)
        if thread is not None and thread.is_alive():
            thread.join()
