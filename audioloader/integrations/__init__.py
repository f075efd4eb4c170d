"""Glue for training frameworks (docs/integrations.md); each module imports its framework, and only it does.

``audioloader.integrations.lightning``: `ExactResume`, a Lightning callback with which
``Trainer.fit(ckpt_path=...)`` continues with exactly the batches an uninterrupted run trains on.

``audioloader.integrations.accelerate``: `AllRanksState`, the loader's state of every rank as one
object for ``accelerator.register_for_checkpointing`` (Accelerate writes rank 0's copy only).

``audioloader.integrations.transformers``: `AudioLoaderTrainer` and `AudioLoaderSeq2SeqTrainer`, a Hugging Face
``Trainer``/``Seq2SeqTrainer`` that trains from AudioLoaders and keeps every rank's position in each ``checkpoint-N/``.

``audioloader.integrations.dcp``: `LoaderState`, every rank's position as a ``torch.distributed.checkpoint``
``Stateful`` (resumes on the same world size exactly, on another elastically).

``audioloader.integrations.ray``: `pack`, ``audioloader pack``'s parts as Ray tasks (``audioloader pack --ray``).

Importing ``audioloader`` imports none of them; nothing here is needed for a plain or torchrun loop.
"""
