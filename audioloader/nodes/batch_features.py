"""BatchFeatures: the features of a whole batch, computed on a GPU (or any torch device)."""

from __future__ import annotations

from typing import Any

import torch
from torchdata.nodes import BaseNode

from ..dsp.config import FeatureConfig, check_features
from ..dsp.features import features_batch
from .held import RowsHeld, passed_through


class BatchFeatures(BaseNode[dict]):
    """Turns the batch's ``waveform`` into its features on ``device``.

    Put it after the `Batcher` of a chain whose decode stage delivers
    waveforms (``DecodeSpectrogram(..., compute_features=False)``). For a batch
    of equal-length crops the features are one batched call
    (`audioloader.dsp.features.features_batch`) instead of ~10 calls per clip in the
    decode workers: for log-mel on an H100 0.6 ms for 64 clips of 5 s, against
    ~150 ms of one CPU core. A batch of whole utterances (it has ``lengths``) is
    computed utterance by utterance on the device (so edge frames equal the
    per-sample path's) and padded again.

    Input: a batch dict with ``waveform`` float32 ``[B, samples]`` (page-locked
    for a GPU: ``Batcher(pin_memory=True)``). Output: the same dict with the
    features under ``features.batch_key`` (``spectrogram`` ``[B, n_mels, frames]``,
    ``fbank`` ``[B, frames, bins]``) in place of ``waveform``, ``lengths`` and
    ``padding_mask`` in frames, and every tensor of the batch on ``device``.
    Entries marked invalid (``valid`` false: eval padding) get zero features, as
    the per-sample path gives them.

    On CUDA the copies and the features run on a side stream, one batch ahead:
    while the training step works on batch ``k``, batch ``k + 1`` is copied and
    transformed; the batch handed out is made safe for the consumer's current
    stream (it waits for an event, nothing blocks the host). Run this node in
    the thread that consumes the batches (after any prefetching node).

    State: the source's state as of the batch handed out last, unchanged (no
    nesting), so a checkpoint is the same as that of the chain that computes
    features per sample; the batch prepared ahead is prepared again on resume.

    Args:
        source: node of batch dicts.
        features: the feature parameters (a `MelSpectrogramConfig`, an `FbankConfig`
            without dither, or a `WaveformConfig`: then only the device changes).
        device: where the features are computed (``"cuda"``, ``"cuda:1"``, ``"cpu"``...).
        waveform_key: the batch key read.
    """

    def __init__(self, source: BaseNode, features: FeatureConfig, device: str | torch.device, *,
                 waveform_key: str = "waveform") -> None:
        super().__init__()
        check_features(features)
        self.source = source
        self.features = features
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available; use device=None (features in the "
                             "decode workers, on the CPU)")
        self.waveform_key = waveform_key
        self.features_key = features.batch_key
        self._ahead = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._ahead else None
        self._pending: tuple[dict[str, Any], Any] | None = None
        self._state: dict[str, Any] | None = None
        self._source_done = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)
        self._pending = None
        self._source_done = False
        self._state = self.source.state_dict()

    def next(self) -> dict[str, Any]:
        if not self._ahead:
            batch = self._compute(next(self.source))
            self._state = self.source.state_dict()
            return batch
        if self._pending is None and not self._source_done:
            self._pending = self._launch_next()
        if self._pending is None:
            raise StopIteration
        batch, event = self._pending
        state = self.source.state_dict()  # as of `batch`: before the one launched next
        self._pending = self._launch_next()
        self._state = state
        return self._hand_over(batch, event)

    def get_state(self) -> dict[str, Any]:
        return self._state

    @classmethod
    def rows_held(cls, state: dict[str, Any]) -> RowsHeld:
        """Holds no rows: the batch it computes ahead is not in its state (see `audioloader.nodes.held`)."""
        return passed_through(state)

    # ------------------------------------------------------------------ the work

    def _compute(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Move the batch's tensors to the device and compute its features (on the current stream)."""
        out = {name: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
               for name, value in batch.items()}
        waveforms = out.pop(self.waveform_key)
        variable = "lengths" in out  # whole utterances
        features = self._per_utterance(waveforms, out) if variable else features_batch(waveforms, self.features)
        valid = out.get("valid")
        if valid is not None:
            features.mul_(valid.view(-1, *([1] * (features.dim() - 1))))  # padding entries: zeros
        out[self.features_key] = features
        return {name: out[name] for name in (self.features_key, *(n for n in out if n != self.features_key))}

    def _per_utterance(self, waveforms: torch.Tensor, out: dict[str, Any]) -> torch.Tensor:
        """Features of each utterance of a padded batch, padded again; ``lengths``/``padding_mask`` in frames."""
        cfg = self.features
        samples = out["lengths"].tolist()
        frames = [cfg.num_frames(n) if n >= cfg.min_samples() else 0 for n in samples]
        shape = list(cfg.feature_shape(max(frames, default=0)))
        padded = torch.zeros((len(samples), *shape), dtype=torch.float32, device=self.device)
        for i, n in enumerate(samples):
            if frames[i]:
                one = features_batch(waveforms[i:i + 1, :n], cfg)[0]
                padded[i].narrow(cfg.time_axis, 0, frames[i]).copy_(one)
        lengths = torch.tensor(frames, dtype=torch.int64, device=self.device)
        out["lengths"] = lengths
        out["padding_mask"] = torch.arange(shape[cfg.time_axis], device=self.device) >= lengths[:, None]
        return padded

    def _launch_next(self) -> tuple[dict[str, Any], Any] | None:
        """Start copying and transforming the next batch on the side stream; None at the end."""
        try:
            batch = next(self.source)
        except StopIteration:
            self._source_done = True
            return None
        with torch.cuda.stream(self._stream):
            out = self._compute(batch)
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def _hand_over(self, batch: dict[str, Any], event: Any) -> dict[str, Any]:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(current)  # made on the side stream, used and freed on this one
        return batch
