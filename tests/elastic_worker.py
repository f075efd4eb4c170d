"""Run under torchrun: checkpoint a run mid-pass (``save``), or resume all its ranks' states (``resume``).

Usage: torchrun --nproc_per_node=N tests/elastic_worker.py save|resume SHARDS WORKDIR

``save``: every rank takes two batches of a training pass (``infinite=False``, a
real shuffle buffer) and two of an evaluation pass, then the states of all ranks
are gathered with ``all_gather_object``; rank 0 writes them and the rows each
rank delivered. ``resume``: every rank loads the list of states and runs to the
end of both passes; rank 0 writes the rows delivered (file names carry the world size).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from ddp_worker import SMALL, gather, rows_of  # a sibling script: this folder is on sys.path

import audioloader as al

MODES = {"train": {"train": True, "infinite": False, "shuffle": al.Shuffle(buffer_size=10, min_size=5)},
         "eval": {"train": False}}


def make(shards: str, mode: str) -> al.AudioLoader:
    return al.AudioLoader(shards, batch_size=4, features=SMALL, seed=11, storage=al.Storage(split_rows=4),
                          workers=al.Workers(num_workers=1), **MODES[mode])


def main() -> None:
    action, shards, workdir = sys.argv[1:4]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    report = {}
    for mode in MODES:
        with make(shards, mode) as loader:
            if action == "save":
                it = iter(loader)
                rows = [i for _ in range(2) for i in rows_of(next(it))]
                states = gather(loader.state_dict())
                if dist.get_rank() == 0:
                    torch.save(states, os.path.join(workdir, f"{mode}-states.pt"))
            else:
                loader.load_state_dict(torch.load(os.path.join(workdir, f"{mode}-states.pt")))
                batches = list(loader)
                rows = [i for b in batches for i in rows_of(b)]
                report[f"{mode}-batches"] = gather(len(batches))
        report[mode] = [i for share in gather(rows) for i in share]
    if dist.get_rank() == 0:
        with open(os.path.join(workdir, f"{action}-{world}.json"), "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
