"""PyTorch Lightning: an `AudioLoader` returned by ``train_dataloader()`` resumes exactly.

    from audioloader.integrations.lightning import ExactResume

    trainer = lightning.Trainer(max_steps=..., callbacks=[ExactResume(), ModelCheckpoint(...)])
    trainer.fit(module)                      # module.train_dataloader() returns an AudioLoader
    trainer.fit(module, ckpt_path="last")    # goes on with the first batch the model did not train on

Lightning saves and loads the state of a loader that has ``state_dict``/``load_state_dict`` by
itself (``fit_loop`` -> ``CombinedLoader._state_dicts``). But its fetcher
(``lightning.pytorch.loops.fetchers._PrefetchDataFetcher``) takes batch k+1 from the loader
before the model trains on batch k, whenever the loader has no length (an infinite training
loader), to know whether k is the last. A checkpoint saved after batch k would hold the
loader's state after k+1. The loader corrects that by itself where it can read the fetcher
(`audioloader.loader.batches_ahead_of_framework`), and warns naming this callback where it
cannot; this callback is the explicit form, independent of Lightning's internals. It calls
``loader.mark_trained()`` on every AudioLoader of the training dataloader once per trained
batch (``on_train_batch_end``, which runs before ``ModelCheckpoint`` saves: Lightning runs
checkpoint callbacks last), so the loader's ``state_dict()`` is the position after the last
batch trained on. Evaluation loaders need nothing: Lightning does not checkpoint them, and each
validation run starts their pass anew.

Not covered: ``training_step(self, dataloader_iter)`` takes batches itself, and the state is
exact without this callback (it does nothing then); several training loaders in
``CombinedLoader(mode="sequential")`` (one loader per step: use an `audioloader.Mix` instead).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..audio_loader import AudioLoader


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError as error:
            raise ImportError("audioloader.integrations.lightning needs PyTorch Lightning: pip install lightning "
                              "(or pytorch-lightning)") from error
    return Callback


def audio_loaders(dataloaders: Any) -> Iterator[AudioLoader]:
    """The `AudioLoader` s in what ``trainer.train_dataloader`` holds (one loader, or lists and dicts of them)."""
    if isinstance(dataloaders, AudioLoader):
        yield dataloaders
    elif isinstance(dataloaders, Mapping):
        for value in dataloaders.values():
            yield from audio_loaders(value)
    elif isinstance(dataloaders, (list, tuple)):
        for value in dataloaders:
            yield from audio_loaders(value)
    elif hasattr(dataloaders, "iterables"):  # a CombinedLoader
        yield from audio_loaders(dataloaders.iterables)


class ExactResume(_callback_base()):  # type: ignore[misc]
    """Tells each training `AudioLoader` which batches the model has trained on, for exact resume.

    Add it to the Trainer's callbacks wherever ``train_dataloader()`` returns an AudioLoader
    (or a list or dict of them). Cost: one ``mark_trained()`` per batch, well under a
    microsecond, and the loader keeps the states after its last 16 batches (docs/integrations.md).
    """

    def __init__(self) -> None:
        super().__init__()
        self._active = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # With training_step(self, dataloader_iter) the module takes batches itself, as many as it
        # likes per step; nothing is fetched ahead of it, and counting steps would be wrong.
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        self._active = type(fetcher).__name__ != "_DataLoaderIterDataFetcher"

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._active:
            return
        for loader in audio_loaders(trainer.train_dataloader):
            loader.mark_trained()
