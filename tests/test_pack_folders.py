"""What a pack folder tells a loader and ``audioloader index``: unfinished parts refused by name, several packs in
one folder refused rather than merged, files written with the shards' permissions, a flat folder of unlabelled
audio packed without labels, and refusals and summaries that lead with the real cause (issue 39)."""

from __future__ import annotations

import os
import stat

import pytest

from audioloader.tools.pack import pack_dataset
from tests.helpers import class_tree


def _modes(folder):
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_pack_writes_manifest_and_journal_with_the_shards_permissions(tmp_path, mask):
    """A manifest written 0600 (mkstemp) locks the group out on a shared file system; every file pack or index
    writes gets the umask's permissions, as the shards do."""
    from audioloader.tools.cli import main

    src = class_tree(tmp_path / "src")
    old = os.umask(mask)
    try:
        pack_dataset(src, tmp_path / "out", progress=False)
        assert main(["index", str(tmp_path / "out")]) == 0  # written again by index: the same
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "out")
    assert {"_audioloader_manifest.arrow", "_audioloader_pack.json", "labels.json", "shard-00000.arrow"} <= set(modes)
    assert set(modes.values()) == {0o666 & ~mask}, modes
