"""Fixtures several test modules share: small shard folders, written once per session and only read
(`shard_folder`, `ipc_shards`, `mix_root`); a class-folder tree for ``audioloader pack`` (`src`); S3 servers on
loopback, one a module (`s3`, `s3_servers` for a module that fills its own at its start) and their proxy (`proxy`);
the session's settings; and for each test a process that has learned no store's request rate yet.

Helpers that are plain functions (builders, loaders, checks) are in `tests.helpers`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from audioloader.shards.storage.throttle import forget_rates
from tests.helpers import IPC_ROWS, class_tree, make_shards, make_sources


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Metadata indexes built by remote constructions go to a temporary folder, never the user's cache."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUDIOLOADER_CACHE", str(tmp_path_factory.mktemp("audioloader-cache")))
        yield


@pytest.fixture(autouse=True)
def _fresh_store_rates():
    """Each test starts with no store's request rate learned, as a new process does: the rate this process learned
    from the 503s (SlowDown) an earlier test injected into a bucket (``shards``, ``throttle``...) would otherwise pace
    every later test's requests to that bucket down to `audioloader.shards.storage.throttle.FLOOR` (one every 2 s)."""
    forget_rates()


@pytest.fixture(scope="session")
def shard_folder(tmp_path_factory):
    """``shard_folder(rows_per_file, fmt="ipc_file", batch_rows=4, seconds=0.4) -> Path``: a folder of
    `tests.helpers.make_shards`' files (rows 0, 1, ... in order, label i % 3), written once a session for each set of
    arguments and shared by the modules that ask for it: only read (a test that changes files writes its own)."""
    written: dict[tuple, Path] = {}

    def folder(rows_per_file, fmt: str = "ipc_file", batch_rows: int = 4, seconds: float = 0.4) -> Path:
        key = (tuple(rows_per_file), fmt, batch_rows, seconds)
        if key not in written:
            written[key] = tmp_path_factory.mktemp(fmt)
            make_shards(written[key], list(rows_per_file), fmt, batch_rows=batch_rows, seconds=seconds)
        return written[key]

    return folder


@pytest.fixture(scope="session")
def ipc_shards(shard_folder) -> Path:
    """40 rows (13, 9, 18) in three Arrow IPC files, record batches of 4 rows, 0.4 s WAV clips; label i % 3."""
    return shard_folder(IPC_ROWS)


@pytest.fixture
def src(tmp_path) -> Path:
    """A tree of class folders for ``audioloader pack`` (`tests.helpers.class_tree`): 15 short WAV files, one broken."""
    return class_tree(tmp_path / "src")


@pytest.fixture(scope="session")
def mix_root(tmp_path_factory) -> Path:
    """Sources a, b, c, a noise source and an impulse-response source (`tests.helpers.make_sources`)."""
    return make_sources(tmp_path_factory.mktemp("mix"))


@pytest.fixture(scope="module")
def s3_servers():
    """``start(**options) -> S3Server``: starts moto S3 servers on loopback behind the test proxy
    (`tests.s3_server.S3Server`, ``options`` its own, e.g. ``enforce_auth=True``) for a test module, all closed at its
    end; the credentials are in the environment meanwhile. A module that uploads its own data at its start defines
    its ``s3`` with it (started, then filled)."""
    from tests.s3_server import S3_ENVIRONMENT, S3Server

    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as servers:
        for name, value in S3_ENVIRONMENT.items():
            env.setenv(name, value)

        def start(**options) -> S3Server:
            server = S3Server(**options)
            servers.callback(server.close)
            return server

        yield start


@pytest.fixture(scope="module")
def s3(s3_servers):
    """A moto S3 server on loopback behind the test proxy, one a test module (`s3_servers`)."""
    return s3_servers()


@pytest.fixture
def proxy(s3):
    """The module server's proxy, its log cleared before the test; after it, requests it holds are released and its
    shaping is off again (no latency, no bandwidth cap), so the next test finds it as new."""
    s3.proxy.clear()
    try:
        yield s3.proxy
    finally:
        s3.proxy.release()
        s3.proxy.configure(latency=0.0, bandwidth=None)
        s3.proxy.clear()
