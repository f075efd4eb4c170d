"""Run under torchrun, one invocation per "node" on loopback: train a small model from S3 with DDP (gloo), each node
with its own machine cache; checkpoint mid-pass; resume.

Usage: torchrun --nnodes=N --nproc-per-node=P --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT \\
           tests/multinode_worker.py ACTION WORKDIR

Environment: ``SHARDS_URL`` (this node's ``s3://`` URL of the shards: each node reads through its own proxy, so the
test sees each node's requests), ``AUDIOLOADER_CACHE`` (this node's machine cache; the object cache is its
``objects/`` folder) and the S3 credentials.

- ``train``: `STEPS` training steps of a one-pass loader (a real shuffle buffer); after `SAVE_AT` steps every
  rank's loader state, the model and the optimizer are checkpointed (rank 0 writes ``checkpoint.pt``).
- ``resume``: from the checkpoint, the remaining ``STEPS - SAVE_AT`` steps: the same batches and the same model as
  the uninterrupted run's.
- ``finish``: from the checkpoint on any number of ranks (an elastic restart), to the end of the pass.

Rank 0 writes ``ACTION.json``: per global rank the rows of each step and a checksum of each batch's features, and
the model's parameters at the end.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import audioloader as al
from tests.ddp_worker import SMALL, gather, rows_of  # the launcher puts the repository on PYTHONPATH

SAVE_AT, STEPS = 3, 7


def make() -> al.AudioLoader:
    cache = os.path.join(os.environ["AUDIOLOADER_CACHE"], "objects")
    return al.AudioLoader(os.environ["SHARDS_URL"], batch_size=4, features=SMALL, seed=5, train=True, infinite=False,
                          shuffle=al.Shuffle(buffer_size=8, min_size=4), workers=al.Workers(num_workers=1),
                          storage=al.Storage(split_rows=4, cache_dir=cache,
                                             retry=al.Retry(attempts=6, initial_delay=0.05, timeout=10.0)))


def main() -> None:
    action, workdir = sys.argv[1:3]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(SMALL.n_mels, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    checkpoint_path = os.path.join(workdir, "checkpoint.pt")
    steps: list[dict] = []
    with make() as loader:
        if action != "train":
            checkpoint = torch.load(checkpoint_path)
            loader.load_state_dict(checkpoint["loader"])  # every old rank's state: any world size resumes
            model.module.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        batches = iter(loader)
        step = SAVE_AT if action != "train" else 0
        while action == "finish" or step < STEPS:
            if action == "train" and step == SAVE_AT:
                states = gather(loader.state_dict())
                if dist.get_rank() == 0:
                    torch.save({"loader": states, "model": model.module.state_dict(),
                                "optimizer": optimizer.state_dict()}, checkpoint_path)
            batch = next(batches, None)
            if batch is None:
                break
            if action != "finish":  # ranks step together: a pass long enough for STEPS on every rank
                logits = model(batch["spectrogram"].mean(-1))
                loss = nn.functional.cross_entropy(logits, batch["label"])
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces the gradients over both nodes here
                optimizer.step()
            steps.append({"step": step, "rows": rows_of(batch), "checksum": float(batch["spectrogram"].double().sum())})
            step += 1
        cache = loader.stats()["counters"]
    report = {"steps": gather(steps), "cache": gather({k: v for k, v in cache.items() if k.startswith("cache_")}),
              "world_size": dist.get_world_size(),
              "model": {k: v.tolist() for k, v in model.module.state_dict().items()}}
    if dist.get_rank() == 0:
        with open(os.path.join(workdir, f"{action}.json"), "w") as f:
            json.dump(report, f)
    # DDP's module sits in a reference cycle that holds the gloo process group (its reducer, with the last
    # all-reduce's work and tensors): freed now, while the interpreter is whole, not by the collector during
    # interpreter shutdown, where releasing those tensors aborts the process after all its work is done.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
