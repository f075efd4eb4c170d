"""Hugging Face Accelerate: what ``accelerator.prepare`` should get, and the loader's state in ``save_state``.

    accelerator = Accelerator()
    loader = al.AudioLoader(shards, batch_size=32)   # after Accelerator(): rank and world size
                                                     # come from its process group
    model, optimizer = accelerator.prepare(model, optimizer)   # not the loader
    accelerator.register_for_checkpointing(AllRanksState(loader))
    for batch in loader:
        batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        ...
    accelerator.save_state(folder)           # every rank calls it
    accelerator.load_state(folder)           # in the resumed run, before iterating

Do not pass the loader to ``accelerator.prepare``: it already reads only its rank's share of
every pass (``Storage(rank=, world_size=)``, from the process group by default), collates, and
decodes in its own workers. Accelerate wraps a ``torch.utils.data.DataLoader`` to shard it by rank
and move its batches; an AudioLoader is not one, so ``prepare`` hands it back untouched (harmless,
but then nothing saves its state either). Move batches to ``accelerator.device`` yourself, or
build the loader with ``device=accelerator.device`` to compute features there.

``accelerator.save_state`` calls ``state_dict()`` of registered objects on every rank but writes
rank 0's result only, so registering the loader itself would resume every rank with rank 0's
position. `AllRanksState` gathers every rank's state into one list (a collective: all ranks call
``save_state``, as Accelerate requires anyway); each rank's loader takes its own from the list on
load, and with another number of processes the loader resumes elastically (docs/storage.md).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..audio_loader import AudioLoader


class AllRanksState:
    """The state of one `AudioLoader` on every rank, as one checkpointable object.

    ``state_dict()``: ``{"ranks": [state of rank 0, state of rank 1, ...]}`` (gathered with
    ``torch.distributed.all_gather_object`` when a process group is initialized; only this
    process's state otherwise). ``load_state_dict()`` hands the list to ``loader.load_state_dict``,
    which picks this rank's state (or spreads the rows over a new world size).

    ``group``: the process group whose processes are the loader's ranks (default: all processes).
    """

    def __init__(self, loader: AudioLoader, group: Any = None) -> None:
        if not isinstance(loader, AudioLoader):
            raise TypeError(f"{type(self).__name__}(loader): expected an audioloader.AudioLoader, "
                            f"got {type(loader).__name__}")
        self.loader = loader
        self.group = group

    def state_dict(self) -> dict[str, Any]:
        state = self.loader.state_dict()
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.group) == 1:
            return {"ranks": [state]}
        states: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(states, state, group=self.group)
        return {"ranks": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "ranks" not in state:
            raise ValueError("AllRanksState.load_state_dict: expected {'ranks': [...]}, as AllRanksState.state_dict() "
                             "makes; a single loader state goes to loader.load_state_dict directly")
        self.loader.load_state_dict(state["ranks"])
