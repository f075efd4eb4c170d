"""BatchAugment: the augmentations that run on whole batches (SpecAugment on device features, Mixup)."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from ..dsp.augment import Augmentations
from ..dsp.augment_math import apply_masks, mixup_batch
from .batcher import BATCH_PARAMS_KEY
from .held import RowsHeld, passed_through


class BatchAugment(BaseNode[dict]):
    """Applies the per-batch stage of an ``augment=`` list to each batch, on the batch's device.

    The parameters were drawn per sample in the decode workers (from the seed and
    the sample's key) and travel in ``batch["batch_params"]`` (see `Batcher`); this
    node removes that entry and:

    - ``masks``: SpecAugment where the features are computed per batch (after
      `BatchFeatures`): the same masks, the same fill as the per-sample path;
    - ``mixup``: `Mixup`: features mixed in pairs, plus ``mixup_weights``
      float32 ``[B, 2]``, ``mixup_partner`` int64 ``[B]`` and ``mixup_labels``
      int64 ``[B, 2]`` (see `audioloader.dsp.augment.Mixup`).

    Stateless: its state is its source's, unchanged (adding it changes no checkpoint).

    Args:
        source: node of batch dicts (after `Batcher`, or after `BatchFeatures`).
        augment: the loader's `Augmentations`.
        features_key: the batch key of the features (``spectrogram``, ``fbank``...).
    """

    def __init__(self, source: BaseNode, augment: Augmentations, features_key: str) -> None:
        super().__init__()
        self.source = source
        self.augment = augment
        self.features_key = features_key

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self) -> dict[str, Any]:
        batch = next(self.source)
        params = batch.pop(BATCH_PARAMS_KEY, None)
        if params is None:  # a batch of padding only: nothing to do
            return batch
        spec = self.augment.spec
        if "masks" in params:
            cfg = spec.config
            batch[self.features_key] = apply_masks(batch[self.features_key], params["masks"], cfg.freq_masks,
                                                   self.augment.features.time_axis, cfg.fill, batch.get("lengths"))
        if "mixup" in params:
            batch = mixup_batch(batch, params["mixup"], self.features_key)
        return batch

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """Holds no rows; its state is its source's (see `audioloader.nodes.held`)."""
        return passed_through(state)
