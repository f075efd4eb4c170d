"""Session-wide test settings."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Metadata indexes built by remote constructions go to a temporary folder, never the user's cache."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUDIOLOADER_CACHE", str(tmp_path_factory.mktemp("audioloader-cache")))
        yield
