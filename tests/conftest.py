"""Fixtures several test modules share: small shard folders, written once per session and only read; and the
session's settings.

Helpers that are plain functions (builders, loaders, checks) are in `tests.helpers`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import IPC_ROWS, make_shards, make_sources


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Metadata indexes built by remote constructions go to a temporary folder, never the user's cache."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUDIOLOADER_CACHE", str(tmp_path_factory.mktemp("audioloader-cache")))
        yield


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


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback behind the test proxy (`tests.s3_server.S3Server`), one a test module, with the
    credentials and endpoint in the environment. A module that needs its own data defines its own ``s3``."""
    from tests.s3_server import S3_ENVIRONMENT, S3Server

    with pytest.MonkeyPatch.context() as env:
        for name, value in S3_ENVIRONMENT.items():
            env.setenv(name, value)
        server = S3Server()
        try:
            yield server
        finally:
            server.close()
