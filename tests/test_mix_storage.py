"""A mix of sources meets the storage features: a filter per source, content identity per source, elastic refusal."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

import audioloader as al
from tests.helpers import MIX_ROWS as ROWS
from tests.helpers import mix_loader, mix_of, take


def kept_uids(folder, expression) -> set[int]:
    """The ``uid`` of every row of a source's files that ``expression`` keeps."""
    kept = set()
    for path in sorted(folder.glob("*.arrow")):
        table = ipc.open_file(str(path)).read_all()
        kept |= set(table.filter(expression).column("uid").to_pylist())
    return kept


def test_a_filter_given_to_every_source_of_a_mix_applies_to_each(mix_root):
    # 0.2's flat filter= (removed in 0.4) is refused naming the Source that takes it now.
    expression = pc.field("label") != 1
    with pytest.raises(TypeError, match=r"AudioLoader\(filter=\.\.\.\) was removed in 0\.4: pass al\.Source\(shards, "
                                        r"filter=\.\.\.\) as the source"):
        mix_loader(mix_root, mix_of(mix_root, stop="all_exhausted"), train=False, filter=expression)
    filtered = {name: al.Source(str(mix_root / name), filter=expression) for name in ROWS}
    with mix_loader(mix_root, mix_of(mix_root, stop="all_exhausted", **filtered), train=False,
                    columns=["uid"]) as loader:
        seen = Counter((int(s), int(u)) for b in loader
                       for s, u, ok in zip(b["source"], b["uid"], b["valid"], strict=True) if ok)
    expected = {(s, uid) for s, name in enumerate(ROWS) for uid in kept_uids(mix_root / name, expression)}
    assert set(seen) == expected and set(seen.values()) == {1}  # each kept row of each source, once


def test_a_changed_file_of_one_source_is_named(mix_root, tmp_path):
    copy = tmp_path / "mix"
    shutil.copytree(mix_root, copy)
    with mix_loader(copy) as loader:
        take(loader, 2)
        state = loader.state_dict()
    changed = sorted((copy / "b").glob("*.arrow"))[0]
    stat = os.stat(changed)
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten in place, same bytes' size
    with mix_loader(copy) as resumed, pytest.raises(al.CheckpointMismatchError) as info:
        resumed.load_state_dict(state)
    assert str(changed) in str(info.value) and "rewritten in place" in str(info.value)
    assert "/a/" not in str(info.value) and "/c/" not in str(info.value)


def test_elastic_resume_of_a_mix_is_refused_naming_the_world_size(mix_root):
    states = []
    for rank in range(2):
        with mix_loader(mix_root, storage=al.Storage(rank=rank, world_size=2)) as loader:
            take(loader, 1)
            states.append(loader.state_dict())
    with mix_loader(mix_root, storage=al.Storage(rank=0, world_size=3)) as resumed, \
            pytest.raises(al.CheckpointMismatchError, match="world_size=2") as info:
        resumed.load_state_dict(states)
    assert "world_size" in info.value.fields
