"""Rank and world size: explicit, or from torch.distributed when a process group is initialized."""

from __future__ import annotations

import torch.distributed as dist


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return ``(rank, world_size)``.

    ``None`` values come from the initialized default process group, else 0 / 1.
    Raises ``ValueError`` for a negative rank, a world size below 1, or
    ``rank >= world_size``.
    """
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size}); "
                         "pass rank and world_size together, or neither under torch.distributed")
    return rank, world_size
