"""Run under torchrun: save an AudioLoader's position with ``torch.distributed.checkpoint``, or load it.

Usage: torchrun --nproc_per_node=N tests/dcp_worker.py save|resume SHARDS WORKDIR

``save``: every rank takes two batches of a shuffled training pass, then ``dcp.save`` writes
``{"data": LoaderState(loader)}`` to WORKDIR/checkpoint, and the run goes on uninterrupted to the end of
the pass. ``resume`` (fresh processes, any number of them): ``dcp.load`` into a new loader and run to the
end of the pass. Rank 0 writes, for every rank, the rows and the SHA-256 of each batch it delivered
(``save-N.json``: before and after the checkpoint; ``resume-N.json``: after the load).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ddp_worker import SMALL, gather, rows_of  # a sibling script: this folder is on sys.path

import audioloader as al
from audioloader.integrations.dcp import LoaderState


def make(shards: str) -> al.AudioLoader:
    return al.AudioLoader(shards, batch_size=4, features=SMALL, seed=5, train=True, infinite=False,
                          shuffle=al.Shuffle(buffer_size=10, min_size=5), storage=al.Storage(split_rows=4),
                          workers=al.Workers(num_workers=1))


def digest(batch) -> str:
    h = hashlib.sha256()
    for name in ("spectrogram", "index", "label"):
        h.update(batch[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    action, shards, workdir = sys.argv[1:4]
    dist.init_process_group("gloo")
    checkpoint = os.path.join(workdir, "checkpoint")
    report: dict[str, list] = {}
    with make(shards) as loader:
        it = iter(loader)
        if action == "save":
            report["before"] = gather([i for _ in range(2) for i in rows_of(next(it))])
            dcp.save({"data": LoaderState(loader)}, checkpoint_id=checkpoint)
        else:
            dcp.load({"data": LoaderState(loader)}, checkpoint_id=checkpoint)
            it = iter(loader)  # the loaded position: the first batch the saving run had not handed out
        rest = list(it)
        report["rows"] = gather([i for batch in rest for i in rows_of(batch)])
        report["digests"] = gather([digest(batch) for batch in rest])
    if dist.get_rank() == 0:
        with open(os.path.join(workdir, f"{action}-{dist.get_world_size()}.json"), "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
