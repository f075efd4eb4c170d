"""``torch.distributed.checkpoint`` (DCP): the loader's position as one more `Stateful`, resumable on any world size.

    import torch.distributed.checkpoint as dcp
    from audioloader.integrations.dcp import LoaderState

    dcp.save({"model": model_state, "optim": optim_state, "data": LoaderState(loader)}, checkpoint_id=folder)
    ...
    dcp.load({"model": model_state, "optim": optim_state, "data": LoaderState(loader)}, checkpoint_id=folder)
    for batch in loader:       # the first batch after the one the saving run handed out last
        ...

Every rank calls ``dcp.save`` and ``dcp.load`` (DCP requires it). ``LoaderState.state_dict()`` gathers
the state of every rank's loader (`AllRanksState`, ``all_gather_object``) into one list indexed by rank;
every rank holds the same list, and DCP writes it once. On load each rank hands the whole list to
``loader.load_state_dict``: with the saving run's number of ranks it takes its own rank's state (exact, bit
for bit); with another number it resumes *elastically* (the rows the old ranks had left of their pass
are spread over the new ranks, each delivered once: docs/storage.md). Training loops that keep one
``Stateful`` per data-parallel rank under that rank's key (torchtitan's) cannot load on another
data-parallel degree; this one can.

Why a list of bytes: DCP flattens nested dicts and lists of dicts into one key per leaf, and a load asks
for the keys of the state it is given. A loader's state is a nested dict whose shape depends on where the
run stopped, and a run on another world size could not even name the old ranks' keys. Each rank's state
is therefore stored serialised (``torch.save`` of plain data, read back with ``weights_only=True``), and
the list of them is one leaf under one key whatever the world size.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from ..audio_loader import AudioLoader
from .accelerate import AllRanksState


class LoaderState:
    """An `AudioLoader`'s position on every rank, as a ``torch.distributed.checkpoint.stateful.Stateful``.

    ``state_dict()``: ``{"ranks": [bytes of rank 0's state, bytes of rank 1's, ...]}`` (a collective when a
    process group is initialized: every rank calls it, as ``dcp.save`` and ``dcp.load`` do).
    ``load_state_dict()`` gives every rank's state to ``loader.load_state_dict``, which resumes this rank
    exactly on the same world size and elastically on another. ``group``: the process group whose
    processes are the loader's ranks (default: all; pass the data-parallel group when tensor- or
    pipeline-parallel peers share a loader rank).
    """

    def __init__(self, loader: AudioLoader, group: Any = None) -> None:
        self._ranks = AllRanksState(loader, group)
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": [_to_bytes(state) for state in self._ranks.state_dict()["ranks"]]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ranks = state_dict.get("ranks") if isinstance(state_dict, dict) else None
        if not isinstance(ranks, list) or not all(isinstance(state, bytes) for state in ranks):
            keys = sorted(state_dict) if isinstance(state_dict, dict) else ""
            raise ValueError("LoaderState.load_state_dict: expected {'ranks': [bytes, ...]}, as "
                             "LoaderState.state_dict() makes (what dcp.load gives back for a LoaderState saved with "
                             f"dcp.save); got {type(state_dict).__name__} {keys}")
        self._ranks.load_state_dict({"ranks": [_from_bytes(state) for state in ranks]})


def _to_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), weights_only=True)  # a loader's state is plain data: no pickled code
