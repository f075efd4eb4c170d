"""Exceptions users can catch. Each message names the file, row, column or argument and the fix."""

from __future__ import annotations

from typing import Any


class AudioLoaderError(Exception):
    """Base class of audioloader's own errors."""


class SchemaError(AudioLoaderError, ValueError):
    """A shard's schema does not fit the requested columns (missing column, wrong type, files disagree)."""


class ShardReadError(AudioLoaderError, OSError):
    """A shard file cannot be opened or read (not Arrow/Parquet, truncated, unreadable)."""


class DecodeError(AudioLoaderError):
    """A row's audio could not be decoded (raised with ``on_error="raise"``).

    Attributes: ``file`` (shard path), ``row`` (row within that file),
    ``index`` (global row index), ``reason``.
    """

    def __init__(self, message: str, *, file: str = "", row: int = -1, index: int = -1, reason: str = ""):
        super().__init__(message)
        self.file = file
        self.row = row
        self.index = index
        self.reason = reason

    def __reduce__(self):
        return (_rebuild_decode_error, (type(self), str(self), self.file, self.row, self.index, self.reason))


def _rebuild_decode_error(cls, message, file, row, index, reason):
    return cls(message, file=file, row=row, index=index, reason=reason)


class ErrorBudgetExceeded(AudioLoaderError):
    """Too large a fraction of rows failed to decode under ``on_error="skip"``.

    ``report`` is the list of bad-row records (dicts with key, file, row, reason).
    """

    def __init__(self, message: str, report: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.report = list(report or [])

    def __reduce__(self):
        return (type(self), (str(self), self.report))


class CheckpointMismatchError(AudioLoaderError, ValueError):
    """A state dict was loaded into a loader built with different arguments.

    ``fields`` maps each differing field to ``(in_checkpoint, in_this_loader)``.
    """

    def __init__(self, message: str, fields: dict[str, tuple[Any, Any]] | None = None):
        super().__init__(message)
        self.fields = dict(fields or {})

    def __reduce__(self):
        return (type(self), (str(self), self.fields))
