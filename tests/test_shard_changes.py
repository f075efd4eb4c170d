"""A shard that changes while it is read is an error naming the file, never a crash (SIGBUS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import make_shards

ROOT = Path(__file__).parent.parent

# Iterate one batch, truncate the memory-mapped shard to half its size, go on:
# touching the missing pages of the map would be SIGBUS (exit 135, no message).
SCRIPT = textwrap.dedent("""
    import os, sys
    import audioloader as al
    from tests.ddp_worker import SMALL
    folder, train, worker_type = sys.argv[1], sys.argv[2] == "train", sys.argv[3]
    options = dict(shuffle_buffer_size=24, shuffle_min_size=16) if train else {{}}
    shard = os.path.join(folder, "part-00000.arrow")
    with al.AudioLoader(folder, batch_size=4, train=train, features=SMALL, split_rows=4, num_workers=2,
                        worker_type=worker_type, **options) as loader:
        it = iter(loader)
        next(it)
        os.truncate(shard, os.path.getsize(shard) // 2)
        try:
            for _ in range(200):
                next(it)
        except al.ShardReadError as error:
            print("ShardReadError:", error)
            sys.exit(0)
        except StopIteration:
            pass
    print("no error")
""")


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_truncated_shard_raises_shard_read_error_not_sigbus(tmp_path, mode, worker_type):
    make_shards(tmp_path, [64], "ipc_file", batch_rows=4, seconds=0.4)
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(), str(tmp_path), mode, worker_type],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "ShardReadError:" in result.stdout, result.stdout[-2000:]
    message = result.stdout.split("ShardReadError:", 1)[1]
    assert str(tmp_path / "part-00000.arrow") in message
    assert "changed while it was being read" in message and "size" in message
