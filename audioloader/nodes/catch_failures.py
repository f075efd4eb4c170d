"""CatchFailures: turn an exception in the source into an item, then end cleanly."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from ..samples import Failure
from .held import RowsHeld, nested


class CatchFailures(BaseNode):
    """Pass items through; when ``source.next()`` raises, yield ``Failure(error)`` once, then stop.

    Put it directly under a torchdata ``ParallelMapper`` or ``Prefetcher``. In
    torchdata 0.11 an exception in their source thread is turned into a string
    (type attributes and traceback object lost) and the *next* ``next()`` call
    hangs forever. As an item, the exception object crosses the thread boundary
    intact; the consumer (`raise_failure`) raises it in the caller's thread with
    its original type and traceback, and the source thread finishes normally.
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode) -> None:
        super().__init__()
        self.source = source
        self._failed = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._failed = False
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state is not None else None)

    def next(self) -> Any:
        if self._failed:
            raise StopIteration
        try:
            return next(self.source)
        except StopIteration:
            raise
        except Exception as error:  # carried to the consumer, raised there
            self._failed = True
            return Failure(error)

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """Holds no rows (see `audioloader.nodes.held`)."""
        return nested(state, cls.SOURCE_KEY)


def raise_failure(item: Any) -> Any:
    """Return ``item``, or raise the exception it carries if it is a `Failure`."""
    if isinstance(item, Failure):
        raise item.error
    return item
