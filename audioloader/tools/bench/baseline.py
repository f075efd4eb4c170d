"""The user baseline: what a user writes today to train from audio in Arrow shards, without audioloader.

A map-style ``torch.utils.data.Dataset`` over the shards (pyarrow memory-mapped
tables, as Hugging Face ``datasets`` does), decoding the whole file with
soundfile, mixing to mono, resampling to 32 kHz with
``torchaudio.functional.resample`` (or soxr: the well-tuned peer), a random
5 s crop (zero padding for a short clip), ``torchaudio.transforms.MelSpectrogram``
and ``log(mel + 1e-6)``; batched by ``DataLoader(num_workers=2, shuffle=True,
batch_size=64)``. Same output as audioloader's default features.

Nothing here is tuned beyond what the docs of these libraries show; it is the
reference the loader's speed-up is measured against.
"""

from __future__ import annotations

import bisect
import io
import random
from pathlib import Path

import pyarrow as pa
import soundfile as sf
import soxr
import torch
import torchaudio

SAMPLE_RATE = 32000
CLIP_SECONDS = 5.0
LOG_OFFSET = 1e-6


class ArrowAudioDataset(torch.utils.data.Dataset):
    """Row ``i`` of the sorted ``*.arrow`` shards of ``folder`` -> ``(log-mel [128, 501], label)``.

    Args:
        folder: shards folder (Arrow IPC files with ``audio`` binary and ``label`` int columns).
        resampler: ``"torchaudio"`` (``torchaudio.functional.resample``, its defaults) or ``"soxr"``
            (``soxr.resample``, its default HQ quality).
    """

    def __init__(self, folder: str | Path, resampler: str = "torchaudio") -> None:
        if resampler not in ("torchaudio", "soxr"):
            raise ValueError(f"resampler={resampler!r}: 'torchaudio' or 'soxr'")
        self.resampler = resampler
        # Shards only: a name starting with "_" is bookkeeping (the metadata index), as in audioloader's listing.
        self.files = sorted(str(p) for p in Path(folder).glob("*.arrow") if not p.name.startswith("_"))
        if not self.files:
            raise FileNotFoundError(f"no .arrow shards in {folder}")
        self.tables = [pa.ipc.open_file(pa.memory_map(f)).read_all() for f in self.files]
        self.starts = [0]
        for table in self.tables:
            self.starts.append(self.starts[-1] + table.num_rows)
        self.clip = round(CLIP_SECONDS * SAMPLE_RATE)
        self.mel = torchaudio.transforms.MelSpectrogram(sample_rate=SAMPLE_RATE, n_fft=1024, hop_length=320,
                                                        n_mels=128)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        f = bisect.bisect_right(self.starts, i) - 1
        table, row = self.tables[f], i - self.starts[f]
        data = table.column("audio")[row].as_py()
        label = table.column("label")[row].as_py()
        wav, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        mono = wav.mean(axis=1)
        if self.resampler == "soxr":
            x = torch.from_numpy(soxr.resample(mono, sr, SAMPLE_RATE))
        else:
            x = torchaudio.functional.resample(torch.from_numpy(mono), sr, SAMPLE_RATE)
        if len(x) >= self.clip:
            start = random.randint(0, len(x) - self.clip)
            x = x[start:start + self.clip]
        else:
            x = torch.nn.functional.pad(x, (0, self.clip - len(x)))
        return torch.log(self.mel(x) + LOG_OFFSET), label


def make_loader(folder: str | Path, resampler: str = "torchaudio", batch_size: int = 64,
                num_workers: int = 2, samples: int | None = None) -> torch.utils.data.DataLoader:
    """``DataLoader(ArrowAudioDataset(folder), batch_size, shuffle=True, num_workers)``.

    ``samples``: one shuffled epoch of that many samples (``RandomSampler(num_samples=...)``), so a
    measurement on a small dataset is not dominated by the worker restarts at each epoch's end.
    """
    dataset = ArrowAudioDataset(folder, resampler)
    sampler = torch.utils.data.RandomSampler(dataset, num_samples=samples) if samples else None
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                                       num_workers=num_workers)
