"""What a remote shard's identity check refuses, and a URL whose options pyarrow refuses is named as such."""

from __future__ import annotations

import pytest

import audioloader as al
from tests.helpers import SMALL


@pytest.mark.parametrize("url", ["s3://bucket/speech?session_token=SECRETTOKEN&region=us-east-1",
                                 "gs://bucket/speech?token=SECRETTOKEN"])
def test_an_option_pyarrow_does_not_take_in_a_url_is_named_first_not_a_missing_package(url):
    # It said "no filesystem for this scheme ... install s3fs", the real cause in parentheses.
    with pytest.raises(ValueError) as info:
        al.AudioLoader(url, features=SMALL)
    message = str(info.value)
    scheme = url.split(":")[0]
    assert message.startswith(f"cannot open '{scheme}://bucket/speech': pyarrow's {scheme}:// filesystem refused the "
                              "URL: Unexpected query parameter"), message
    assert "session_token=..." in message and "install" not in message and "SECRETTOKEN" not in message
