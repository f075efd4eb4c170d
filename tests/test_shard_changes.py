"""A shard that changes while it is read is an error naming the file, never a crash (SIGBUS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torchdata.nodes import IterableWrapper

import audioloader as al
from audioloader.nodes.decode_spectrogram import DecodeSpectrogram
from audioloader.samples import Key, RawSample
from tests.helpers import SMALL, clip_bytes, make_shards

ROOT = Path(__file__).parent.parent

# The shard is truncated to half its size after the first batch's samples, from inside
# the chain (an augment that runs in the one thread that reads and decodes: num_workers=0),
# so no read races the truncation. Touching the missing pages of the memory map (the
# reader's next record batch, or a zero-copy row already held in the shuffle buffer) was
# SIGBUS: exit 135, no message.
SCRIPT = textwrap.dedent("""
    import os, sys
    import audioloader as al
    from tests.helpers import SMALL
    folder, train = sys.argv[1], sys.argv[2] == "train"
    shard = os.path.join(folder, "part-00000.arrow")
    calls = []

    def truncate_after_first_batch(clip, rng):
        calls.append(1)
        if len(calls) == 4:
            os.truncate(shard, os.path.getsize(shard) // 2)
        return clip

    options = {"shuffle": al.Shuffle(buffer_size=24, min_size=16)} if train else {}
    with al.AudioLoader(folder, batch_size=4, train=train, features=SMALL, storage=al.Storage(split_rows=4),
                        workers=al.Workers(num_workers=0, kind="thread"), augment=truncate_after_first_batch,
                        **options) as loader:
        delivered = 0
        try:
            for batch in loader:
                delivered += 1
        except al.ShardReadError as error:
            print(f"after {delivered} batches, ShardReadError:", error)
            sys.exit(0)
    print("no error")
""")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_truncated_shard_raises_shard_read_error_not_sigbus(tmp_path, mode):
    make_shards(tmp_path, [64], "ipc_file", batch_rows=4, seconds=0.4)
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), mode], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "ShardReadError:" in result.stdout, result.stdout[-2000:]
    message = result.stdout.split("ShardReadError:", 1)[1]
    assert str(tmp_path / "part-00000.arrow") in message
    assert "changed while it was being read" in message and "size" in message


def test_shard_changed_on_a_new_handle_names_the_file(tmp_path):
    make_shards(tmp_path, [8], "ipc_file", batch_rows=4, seconds=0.1)
    dataset = al.ShardDataset(tmp_path)
    path = tmp_path / "part-00000.arrow"
    path.write_bytes(path.read_bytes() + b"\0" * 16)  # appended to: same rows, other size
    with pytest.raises(al.ShardReadError, match=r"part-00000\.arrow.*changed"):
        dataset.read_rows([0])


def failing_fetch(keys):
    raise al.ShardReadError("shard /data/x.arrow changed while it was being read (size 10 -> 5 bytes)")


def test_a_worker_process_that_cannot_read_its_rows_reports_the_error():
    # Worker processes read the rows of local shards themselves (`prepare`); a failed read
    # there reaches the caller as the same exception, not as a dead worker.
    rows = [RawSample(Key(i, 0), clip_bytes(i, 0.3, 8000), 0, {}, "x.arrow", i) for i in range(4)]
    node = DecodeSpectrogram.of(IterableWrapper(rows), SMALL, num_workers=1, worker_type="process",
                             fetch=failing_fetch)
    try:
        with pytest.raises(al.ShardReadError, match="changed while it was being read"):
            next(node)
    finally:
        node.shutdown()
