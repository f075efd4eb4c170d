"""One rule for what is local and what is a store's URL, shared by the dataset and the tools: a ``file://`` URL is
its local path everywhere (the dataset read it; ``audioloader pack`` refused it as "SRC 'file:/...' does not
exist"), a Windows drive letter is no scheme, anything else with ``scheme://`` is a store. One opener too
(`audioloader.shards.storage.locations.filesystem_for`): the tools' `open_url` asks it."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from audioloader.shards import ShardDataset
from audioloader.shards.storage.locations import filesystem_for, is_url, local_path
from audioloader.shards.storage.retry import DEFAULT_RETRY, FSSpecHandler
from audioloader.tools.input_lists import locate
from audioloader.tools.pack import pack_dataset
from audioloader.tools.remote_files import RemoteFile, open_url
from tests.helpers import class_tree

CASES = [
    ("s3://bucket/data?endpoint_override=host:9000", None),
    ("gs://bucket/data", None),
    ("memory://folder/x.arrow", None),
    ("/data/shards", "/data/shards"),
    ("shards/*.arrow", "shards/*.arrow"),
    ("C:\\data\\shards", "C:\\data\\shards"),
    ("file:///data/my%20shards", "/data/my shards"),
]


@pytest.mark.parametrize(("text", "path"), CASES)
def test_the_dataset_and_the_tools_agree_on_what_is_local(text, path):
    assert local_path(text) == path
    assert is_url(text) is (path is None)


def test_a_manifest_row_that_is_a_file_url_is_that_local_file(tmp_path):
    assert locate(f"file://{tmp_path}/a%20b.wav", RemoteFile("s3://bucket/lists")) == tmp_path / "a b.wav"
    assert locate("s3://bucket/a.wav", tmp_path) == RemoteFile("s3://bucket/a.wav")
    assert locate("a.wav", tmp_path) == tmp_path / "a.wav"


def test_pack_and_the_dataset_take_file_urls(tmp_path):
    src = class_tree(tmp_path / "src")
    summary = pack_dataset(f"file://{src}", f"file://{tmp_path / 'out'}", progress=False)
    assert summary.rows > 0 and (tmp_path / "out").is_dir()
    by_url = ShardDataset(f"file://{tmp_path / 'out'}")
    by_path = ShardDataset(str(tmp_path / "out"))
    assert [f.path for f in by_url.files] == [f.path for f in by_path.files]
    assert by_url.num_rows == by_path.num_rows == summary.rows


def test_the_dataset_and_the_tools_open_a_file_url_as_the_local_file():
    for opened in (filesystem_for("file:///data/my%20shards/a.arrow"), open_url("file:///data/my%20shards/a.arrow")):
        assert isinstance(opened[0], pafs.LocalFileSystem)
        assert opened[1] == "/data/my shards/a.arrow"


def test_the_dataset_and_the_tools_open_a_store_the_same_way():
    """The same filesystem and path for an fsspec scheme; on S3 the tools keep the client's own retries and timeouts
    (pack does not retry a request itself), the dataset's reads are retried by `with_retries` instead."""
    pytest.importorskip("fsspec")
    for fs, path in (filesystem_for("memory://folder/x.arrow"), open_url("memory://folder/x.arrow")):
        assert isinstance(fs.handler, FSSpecHandler)  # a throttled request raises, never reads as 'missing'
        assert path == "/folder/x.arrow"
    url = "s3://bucket/dir/x.arrow?endpoint_override=localhost:9&scheme=http"
    (dataset_fs, dataset_path), (tools_fs, tools_path) = filesystem_for(url), open_url(url)
    assert dataset_path == tools_path == "bucket/dir/x.arrow"
    assert dataset_fs.__reduce__()[1][0]["request_timeout"] == DEFAULT_RETRY.timeout  # tuned: no retries of its own
    assert tools_fs.__reduce__()[1][0]["request_timeout"] == -1.0  # the client's default
