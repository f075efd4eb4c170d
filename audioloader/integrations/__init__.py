"""Glue for training frameworks (docs/integrations.md); each module imports its framework, and only it does.

``audioloader.integrations.lightning``: `ExactResume`, a Lightning callback with which
``Trainer.fit(ckpt_path=...)`` continues with exactly the batches an uninterrupted run trains on.

``audioloader.integrations.accelerate``: `AllRanksState`, the loader's state of every rank as one
object for ``accelerator.register_for_checkpointing`` (Accelerate writes rank 0's copy only).

``audioloader.integrations.ray``: `pack`, ``audioloader pack``'s parts as Ray tasks (``audioloader pack --ray``).

Importing ``audioloader`` imports none of them; nothing here is needed for a plain or torchrun loop.
"""
