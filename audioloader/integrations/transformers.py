"""Hugging Face Transformers: a ``Trainer`` / ``Seq2SeqTrainer`` that trains from AudioLoaders and resumes exactly.

    from audioloader.integrations.transformers import AudioLoaderTrainer

    args = TrainingArguments("out", max_steps=4000, save_steps=1000, eval_strategy="steps", eval_steps=1000)
    train = al.AudioLoader("shards/train", batch_size=16)          # after TrainingArguments: its rank
    evaluation = al.AudioLoader("shards/eval", batch_size=16, train=False)
    trainer = AudioLoaderTrainer(model=model, args=args, train_loader=train, eval_loader=evaluation,
                                 to_inputs=lambda batch: {"input_features": batch["spectrogram"], ...})
    trainer.train()
    trainer.train(resume_from_checkpoint=True)   # or "out/checkpoint-2000": the batches of the uninterrupted run

What the Trainer is missing, and what these subclasses add (docs/integrations.md):

* ``get_train_dataloader`` / ``get_eval_dataloader`` hand the Trainer the loaders themselves (through
  ``to_inputs``, which maps a loader batch to the model's keyword arguments), never a
  ``torch.utils.data.DataLoader`` around them and never through ``accelerator.prepare``: a loader
  already reads its rank's share, decodes in its own workers and collates.
* `LoaderCheckpoint`, a callback added before the callbacks you pass, marks each micro-batch trained
  (``loader.mark_trained()``: the state follows what the model trained on, whatever the Trainer takes
  ahead) and, in ``on_save``, writes the states of every rank's training loader (`AllRanksState`, a
  collective: every rank runs ``on_save``) into the ``checkpoint-N/`` folder just written, as
  ``audioloader_state.pt``, from the processes the Trainer lets save (``args.should_save``).
* ``train(resume_from_checkpoint=...)`` loads that file before training: each rank takes its own state (or,
  on another number of processes, the loader spreads the rows left over the new ranks), and the Trainer is
  told not to skip batches (``args.ignore_data_skip`` is True for the call): its skip re-reads and throws
  away every batch already trained on, and ``accelerate.skip_first_batches`` needs a ``DataLoader``.

Importing this module imports ``transformers``; nothing else in audioloader does.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..audio_loader import AudioLoader
from .accelerate import AllRanksState

try:
    from transformers import Seq2SeqTrainer, Trainer, TrainerCallback, TrainerState
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as error:  # tests/test_hf_trainer.py blocks the import to check this message
    raise ImportError("audioloader.integrations.transformers needs Hugging Face Transformers: pip install "
                      "transformers (or audioloader-arrow[transformers])") from error

#: The file each ``checkpoint-N/`` gets: ``{"ranks": [state of rank 0, ...]}`` (`AllRanksState`), via torch.save.
STATE_FILE = "audioloader_state.pt"

Inputs = Callable[[dict[str, Any]], Mapping[str, Any]]


class LoaderCheckpoint(TrainerCallback):
    """Keeps a training `AudioLoader`'s state in step with the Trainer's checkpoints.

    ``on_substep_end`` / ``on_step_end`` (one of them after each micro-batch): ``loader.mark_trained()``.
    ``on_save``: every rank's state into ``<output_dir>/checkpoint-<global_step>/audioloader_state.pt``.
    `AudioLoaderTrainer` adds it itself; `load` reads the file back.
    """

    def __init__(self, loader: AudioLoader) -> None:
        self.loader = loader
        self.epochs: Callable[[int], float] | None = None  # set for a resumed train(): the epoch after a step

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loader.mark_trained()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loader.mark_trained()
        if self.epochs is not None:
            state.epoch = self.epochs(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        states = AllRanksState(self.loader).state_dict()  # every rank runs on_save: the gather is collective
        if not args.should_save:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"the Trainer saved checkpoint {state.global_step} but {folder} does not exist: "
                                    "the loader's position cannot go with it (hyperparameter_search's run folders "
                                    "are not supported)")
        temporary = os.path.join(folder, f".{STATE_FILE}.partial")
        torch.save(states, temporary)
        os.replace(temporary, os.path.join(folder, STATE_FILE))  # a checkpoint never holds half a state

    def load(self, checkpoint: str) -> None:
        """The training loader continues where ``checkpoint`` (a ``checkpoint-N`` folder) says."""
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} does not exist: {checkpoint} was not saved by AudioLoaderTrainer, so where its training "
                "loader stood is unknown. Resume from a checkpoint an AudioLoaderTrainer saved (or start the run anew)")
        AllRanksState(self.loader).load_state_dict(torch.load(path, weights_only=True))


class _LoaderMixin:
    """What `AudioLoaderTrainer` and `AudioLoaderSeq2SeqTrainer` add to their Trainer (see the module doc)."""

    def __init__(self, model: Any = None, args: Any = None, *, train_loader: AudioLoader | None = None,
                 eval_loader: AudioLoader | Mapping[str, AudioLoader] | None = None, to_inputs: Inputs | None = None,
                 callbacks: list[Any] | None = None, **trainer_kwargs: Any) -> None:
        name = type(self).__name__
        for given in ("train_dataset", "eval_dataset", "data_collator"):
            if given in trainer_kwargs:
                raise TypeError(f"{name}({given}=...): the batches come from the loaders: pass train_loader= and "
                                "eval_loader= (AudioLoaders), and to_inputs= to turn a batch into the model's inputs")
        _check_loader(name, "train_loader", train_loader)
        evaluation = eval_loader.items() if isinstance(eval_loader, Mapping) else [("", eval_loader)]
        for key, loader in evaluation:
            _check_loader(name, f"eval_loader{f'[{key!r}]' if key else ''}", loader, evaluation=True)
        self.loader_checkpoint = None if train_loader is None else LoaderCheckpoint(train_loader)
        extra = [] if self.loader_checkpoint is None else [self.loader_checkpoint]
        super().__init__(model=model, args=args, train_dataset=train_loader, eval_dataset=eval_loader,
                         callbacks=[*extra, *(callbacks or [])], **trainer_kwargs)
        _check_arguments(name, self.args, [train_loader, *(loader for _, loader in evaluation)])
        self.to_inputs = to_inputs

    # ----------------------------------------------------------------------------- loaders

    def get_train_dataloader(self) -> ModelInputs:
        if self.train_dataset is None:
            raise ValueError(f"{type(self).__name__}: training needs train_loader= (an AudioLoader)")
        return ModelInputs(self.train_dataset, self._inputs_function())

    def get_eval_dataloader(self, eval_dataset: str | AudioLoader | None = None) -> ModelInputs:
        loader = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else eval_dataset
        loader = self.eval_dataset if loader is None else loader
        _check_loader(type(self).__name__, "the evaluation loader", loader, evaluation=True)
        if loader is None:
            raise ValueError(f"{type(self).__name__}: evaluation needs eval_loader= (an AudioLoader, train=False)")
        return ModelInputs(loader, self._inputs_function())

    def get_test_dataloader(self, test_dataset: AudioLoader) -> ModelInputs:
        _check_loader(type(self).__name__, "predict()'s loader", test_dataset, evaluation=True)
        return ModelInputs(test_dataset, self._inputs_function())

    def _inputs_function(self) -> Inputs:
        if self.to_inputs is not None:
            return self.to_inputs
        accepted = forward_keywords(self.model)
        return lambda batch: batch if accepted is None else {k: v for k, v in batch.items() if k in accepted}

    # ----------------------------------------------------------------------------- resume

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; from a checkpoint, the training loader first goes back to its saved position."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        elif resume_from_checkpoint is False:
            resume_from_checkpoint = None
        checkpoint = self.loader_checkpoint
        if resume_from_checkpoint is not None and checkpoint is not None:
            epochs = self._resumed_epochs(resume_from_checkpoint)  # first: it may refuse the checkpoint
            checkpoint.load(resume_from_checkpoint)
            checkpoint.epochs = epochs
        skip = self.args.ignore_data_skip
        self.args.ignore_data_skip = True  # the loader is at its position: the Trainer must not read batches away
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.args.ignore_data_skip = skip
            if checkpoint is not None:
                checkpoint.epochs = None

    def _resumed_epochs(self, checkpoint: str) -> Callable[[int], float]:
        """``state.epoch`` after each step of the resumed run, as the uninterrupted run has it.

        The Trainer counts the epoch from the batches of this call when it does not skip, so the fraction
        restarts at 0 in the resumed epoch; steps are counted in full groups of gradient accumulation, and
        an epoch is the loader's pass (one pass of an infinite loader: ``max_steps`` steps).
        """
        accumulation = self.args.gradient_accumulation_steps
        loader = self.train_dataset
        if loader.infinite:
            batches = self.args.max_steps * accumulation
        else:
            batches = len(loader)
            steps = max(-(-batches // accumulation), 1)
            saved = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME)).global_step
            if batches % accumulation and saved % steps:
                raise ValueError(
                    f"resuming from {checkpoint} in the middle of a pass of an infinite=False training loader of "
                    f"{batches} batches a pass with gradient_accumulation_steps={accumulation}: the Trainer would not "
                    "apply the pass's last, partial step in the resumed run, as the uninterrupted run did. Train from "
                    "an infinite loader (train=True, the default) with max_steps, or accumulate a number of batches "
                    "that divides the pass")
        steps = max(-(-batches // accumulation), 1)

        def epochs(global_step: int) -> float:
            epoch, step = divmod(global_step, steps)
            return epoch + min(step * accumulation, batches) / batches

        return epochs


class AudioLoaderTrainer(_LoaderMixin, Trainer):
    """A ``transformers.Trainer`` that trains from an `AudioLoader` and resumes with exactly its batches.

    ``AudioLoaderTrainer(model, args, train_loader=..., eval_loader=..., to_inputs=..., **trainer_kwargs)``:
    ``train_loader`` an AudioLoader (``train=True``, infinite: give ``args.max_steps``; or ``infinite=False``,
    one pass an epoch); ``eval_loader`` an AudioLoader of one pass (``train=False``) or a dict of them;
    ``to_inputs(batch) -> dict`` the model's keyword arguments from a loader batch (default: the batch's keys
    the model's ``forward`` takes). Other keywords go to ``Trainer`` (no ``train_dataset``, ``eval_dataset``
    or ``data_collator``). See the module doc and docs/integrations.md.
    """


class AudioLoaderSeq2SeqTrainer(_LoaderMixin, Seq2SeqTrainer):
    """`AudioLoaderTrainer` for ``transformers.Seq2SeqTrainer`` (``predict_with_generate`` evaluation: Whisper)."""


class ModelInputs:
    """An AudioLoader as the Trainer iterates it: ``to_inputs(batch)`` of each batch; ``len`` the loader's."""

    def __init__(self, loader: AudioLoader, to_inputs: Inputs) -> None:
        self.loader = loader
        self.to_inputs = to_inputs

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return map(self.to_inputs, self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # TypeError for an infinite loader: the Trainer then counts max_steps


def forward_keywords(model: Any) -> set[str] | None:
    """The keyword arguments ``model.forward`` takes; None when it takes any (``**kwargs``)."""
    parameters = inspect.signature(model.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


def _check_loader(trainer: str, what: str, loader: Any, evaluation: bool = False) -> None:
    if loader is None:
        return
    if not isinstance(loader, AudioLoader):
        raise TypeError(f"{trainer}: {what} must be an audioloader.AudioLoader, got {type(loader).__name__} (for a "
                        "Dataset use transformers.Trainer itself)")
    if evaluation and loader.infinite:
        raise ValueError(f"{trainer}: {what} is infinite (train=True): an evaluation would never end; build it with "
                         "train=False (one pass, every row once across ranks)")


def _check_arguments(trainer: str, args: Any, loaders: list[AudioLoader | None]) -> None:
    """Refuse Trainer options that would order or split the data and that an AudioLoader cannot honour."""
    if args.dataloader_num_workers:
        raise ValueError(f"{trainer}: dataloader_num_workers={args.dataloader_num_workers} has no effect here: the "
                         "AudioLoader decodes in its own workers. Set them on the loader: "
                         f"AudioLoader(..., workers=al.Workers(num_workers={args.dataloader_num_workers})), and leave "
                         "dataloader_num_workers at 0")
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy != "random" or getattr(args, "group_by_length", False):
        raise ValueError(f"{trainer}: train_sampling_strategy={strategy!r} (group_by_length) orders a Dataset's "
                         "samples; an AudioLoader orders its own. Batch by duration with "
                         "AudioLoader(batching=al.Bucketing(...)), and leave the strategy at 'random'")
    if args.auto_find_batch_size:
        raise ValueError(f"{trainer}: auto_find_batch_size=True retries with a smaller per_device_train_batch_size, "
                         "which an AudioLoader does not read: its batch_size is its own. Leave it False")
    config = args.accelerator_config
    for option in ("split_batches", "dispatch_batches"):
        if getattr(config, option, None):
            raise ValueError(f"{trainer}: accelerator_config {option}=True shapes a DataLoader that Accelerate wraps; "
                             "an AudioLoader is not wrapped and already reads its own rank's share with its own "
                             "batch_size. Leave it unset")
    for loader in loaders:
        if loader is not None and (loader.rank, loader.world_size) != (args.process_index, args.world_size):
            raise ValueError(f"{trainer}: a loader reads rank {loader.rank} of {loader.world_size} but this process "
                             f"is rank {args.process_index} of {args.world_size}: build the AudioLoaders after "
                             "TrainingArguments (it starts the process group a loader takes its rank from), or pass "
                             "storage=al.Storage(rank=args.process_index, world_size=args.world_size)")
