"""Fixtures several test modules share: small shard folders, written once per session and only read.

Helpers that are plain functions (builders, loaders, checks) are in `tests.helpers`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import IPC_ROWS, make_shards, make_sources


@pytest.fixture(scope="session")
def ipc_shards(tmp_path_factory) -> Path:
    """40 rows (13, 9, 18) in three Arrow IPC files, record batches of 4 rows, 0.4 s WAV clips; label i % 3."""
    folder = tmp_path_factory.mktemp("ipc")
    make_shards(folder, IPC_ROWS, "ipc_file", batch_rows=4, seconds=0.4)
    return folder


@pytest.fixture(scope="session")
def mix_root(tmp_path_factory) -> Path:
    """Sources a, b, c, a noise source and an impulse-response source (`tests.helpers.make_sources`)."""
    return make_sources(tmp_path_factory.mktemp("mix"))
