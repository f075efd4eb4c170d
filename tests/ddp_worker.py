"""Run under `torchrun --nproc_per_node=N`: exercises AudioLoader in a real gloo process group.

Usage: torchrun --nproc_per_node=2 tests/ddp_worker.py SHARDS OUT.json
Rank 0 writes what every rank saw to OUT.json for the test to check.
Its `SMALL`, `gather` and `rows_of` serve the other torchrun scripts (elastic_worker.py, multinode_worker.py).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import audioloader as al

SMALL = al.MelSpectrogramConfig(sample_rate=8000, clip_seconds=0.25, n_fft=256, hop_length=128, n_mels=16)


def gather(value) -> list:
    """``value`` of every rank, in rank order (`torch.distributed.all_gather_object`)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def rows_of(batch) -> list[int]:
    """The row indices of a batch's valid rows."""
    index = batch["index"]
    return index[batch["valid"]].tolist() if "valid" in batch else index.tolist()


def make(shards: str, **kwargs) -> al.AudioLoader:
    options = {"batch_size": 4, "features": SMALL, "seed": 3, "storage": al.Storage(split_rows=4),
               "workers": al.Workers(num_workers=1)}
    options.update(kwargs)
    return al.AudioLoader(shards, **options)


def eval_report(shards: str) -> dict:
    with make(shards, train=False) as loader:
        batches = list(loader)
        return {
            "rank": loader.rank, "world_size": loader.world_size, "len": len(loader),
            "batches": len(batches),
            "valid_indices": torch.cat([b["index"][b["valid"]] for b in batches]).tolist(),
        }


def train_first_pass(shards: str) -> list[int]:
    # A pass-through buffer keeps pass boundaries visible: the first rows this
    # rank yields are exactly its share of pass 0.
    with make(shards, shuffle=al.Shuffle(buffer_size=1, min_size=0)) as loader:
        rows = sum(split.num_rows for split in loader.reader.splits_for_pass(0))
        seen: list[int] = []
        for batch in loader:
            seen.extend(batch["index"].tolist())
            if len(seen) >= rows:
                return seen[:rows]
    return seen


def resume_report(shards: str) -> tuple[bool, dict]:
    options = {"shuffle": al.Shuffle(buffer_size=10, min_size=5)}
    with make(shards, **options) as loader:
        it = iter(loader)
        for _ in range(2):
            next(it)
        state = loader.state_dict()
        expected = [next(it)["index"].tolist() for _ in range(3)]
    with make(shards, **options) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        got = [next(it)["index"].tolist() for _ in range(3)]
    return got == expected, state


def main() -> None:
    shards, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    report = {"eval": eval_report(shards), "train_pass0": train_first_pass(shards)}
    report["resume_exact"], state = resume_report(shards)
    states = gather(state)
    # Loading another rank's checkpoint must be refused, naming the rank.
    other = states[(rank + 1) % world_size]
    try:
        with make(shards, shuffle=al.Shuffle(buffer_size=10, min_size=5)) as loader:
            loader.load_state_dict(other)
        report["foreign_state"] = "loaded"
    except al.CheckpointMismatchError as error:
        report["foreign_state"] = sorted(error.fields)
    reports = gather(report)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(reports, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
