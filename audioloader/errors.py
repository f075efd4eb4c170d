"""Exceptions users can catch. Each message names the file, row, column or argument and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import checks

# A URL's user-info ("key:secret@") and query string ("?access_key=...&token=...") may hold credentials.
_USER_INFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s'\"]*@")
_QUERY = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^?#\s'\"]*)[?#][^\s'\"]*")


def redacted(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with each URL's user-info and query string left out.

    Errors, logs, stats and checkpoints show URLs this way: ``s3://key:secret@bucket/a?token=x`` -> ``s3://bucket/a``.
    """
    return _QUERY.sub(r"\1", _USER_INFO.sub(r"\1", text))


class AudioLoaderError(Exception):
    """Base class of audioloader's own errors."""


class SchemaError(AudioLoaderError, ValueError):
    """A shard's schema does not fit the requested columns (missing column, wrong type, files disagree)."""


class ShardReadError(AudioLoaderError, OSError):
    """A shard file cannot be opened or read (not Arrow/Parquet, truncated, unreadable)."""


class ShardChangedError(ShardReadError):
    """A shard is not what its dataset's manifest says (size, ETag, footer): it changed after the manifest was
    written; found when the file is first read, never used silently. Write the manifest again
    (``audioloader index FOLDER``) or restore the file."""


class AccessDeniedError(ShardReadError, PermissionError):
    """The storage refused the request (HTTP 401/403: credentials, permissions, region or endpoint); not retried."""


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


class OptionError(ValueError):
    """A bad argument, or a fix that names one, of a function a command line also runs (``audioloader pack``).

    ``str()`` spells options as Python keywords (``overwrite=True``, ``input_format='tsv'``); ``cli`` is the
    same message as the command line spells them (``--overwrite``, ``--input-format tsv``), which it prints.
    Build one with `spelled`.
    """

    def __init__(self, message: str, cli: str | None = None):
        super().__init__(message)
        self.cli = message if cli is None else cli

    @classmethod
    def spelled(cls, template: str, **options: tuple[str, str]) -> OptionError:
        """``template`` with each ``{name}`` replaced by ``options[name]``: ``(python spelling, cli spelling)``.

        ``OptionError.spelled("pass {overwrite} to replace them", overwrite=("overwrite=True", "--overwrite"))``.
        """
        python, cli = template, template
        for name, (in_python, on_cli) in options.items():
            python, cli = python.replace("{" + name + "}", in_python), cli.replace("{" + name + "}", on_cli)
        return cls(python, cli)

    def __reduce__(self):
        return (type(self), (str(self), self.cli))


class DeprecatedKeywordWarning(FutureWarning):
    """A keyword of 0.2 that still works for one release (``AudioLoader(num_workers=...)``, ...): the message names
    its option group. A class of its own, so that a test suite or an application can make these warnings errors
    wherever the warning's stack level points (pytest: ``"error::audioloader.errors.DeprecatedKeywordWarning"``)."""


class WorkerError(RuntimeError):
    """A worker process could not start, or died while it held work."""


class CudaInWorkerError(WorkerError):
    """Code in a worker process tried to initialise CUDA (device work belongs in the main process)."""


ON_ERROR_ACTIONS = ("skip", "raise")


@dataclass(frozen=True)
class OnError:
    """What a row whose audio cannot be decoded does: skip it (within a budget) or raise (``on_error=`` of
    `AudioLoader` and of `DecodeSpectrogram`).

    ``action="skip"``: it is skipped, counted and reported in ``stats()`` (a skip is
    deterministic: the same rows are skipped on every run and resume), until more
    than ``max_fraction`` of at least ``min_rows`` decoded rows failed; then
    `ErrorBudgetExceeded` stops the run (a corrupt dataset should not train
    silently). ``action="raise"``: the first bad row raises `DecodeError` naming
    its file and row. ``on_error="skip"`` / ``"raise"`` are shorthands.
    """

    action: str = "skip"
    max_fraction: float = 0.01
    min_rows: int = 100

    def __post_init__(self) -> None:
        checks.one_of("OnError.action", self.action, ON_ERROR_ACTIONS)
        value = self.max_fraction
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise checks.field_error(self, "max_fraction", "must be a fraction in [0, 1]")
        checks.field_count(self, "min_rows")
