"""audioloader: fast, exact, resumable audio loading from Apache Arrow shards.

``AudioLoader`` is the DataLoader-shaped front; the nodes it composes are in
``audioloader.nodes``. torchaudio is not needed at run time.

The public names are imported on first use (PEP 562 ``__getattr__``), so that
``import audioloader`` and the ``audioloader`` command's ``--help`` do not pay
for importing torch (one to several seconds). ``from audioloader import X``,
``audioloader.X`` and ``from audioloader import *`` work as with eager imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .shards._lazy import lazy_attributes

#: Where each public name is defined: a module path relative to this package. A module that moves is a
#: one-line change here (and in the TYPE_CHECKING block below, which tests/test_package.py keeps in step).
_LAZY_NAMES: dict[str, str] = {
    "AccessDeniedError": ".errors",
    "AddNoise": ".dsp.augment",
    "AudioFiles": ".shards",
    "AudioLoader": ".audio_loader",
    "AudioLoaderError": ".errors",
    "BadRow": ".samples",
    "Bucketing": ".options",
    "CheckpointMismatchError": ".errors",
    "DecodeError": ".errors",
    "ErrorBudgetExceeded": ".errors",
    "FbankConfig": ".dsp.config",
    "Gain": ".dsp.augment",
    "IcebergTable": ".shards",
    "Key": ".samples",
    "LengthPolicy": ".dsp.config",
    "Loader": ".loader",
    "MelSpectrogramConfig": ".dsp.config",
    "Mix": ".mix",
    "Mixup": ".dsp.augment",
    "LhotseShar": ".shards",
    "NemoTarred": ".shards",
    "OnError": ".errors",
    "RawSample": ".samples",
    "Retry": ".shards",
    "Reverb": ".dsp.augment",
    "Sample": ".samples",
    "SchemaError": ".errors",
    "Segments": ".dsp.config",
    "ShardDataset": ".shards",
    "ShardChangedError": ".errors",
    "ShardReadError": ".errors",
    "ShardWriter": ".shards.formats.writer",
    "Shuffle": ".budget",
    "Source": ".mix",
    "PackFolderError": ".shards",
    "SourceNotFoundError": ".shards",
    "SpecAugment": ".dsp.augment",
    "SpeedPerturb": ".dsp.augment",
    "Storage": ".options",
    "WaveformConfig": ".dsp.config",
    "Workers": ".options",
    "mixup_targets": ".dsp.augment_math",
    "tune_batch_sizes": ".audio_loader",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time the names come from __getattr__
    from .audio_loader import AudioLoader, tune_batch_sizes
    from .budget import Shuffle
    from .dsp.augment import AddNoise, Gain, Mixup, Reverb, SpecAugment, SpeedPerturb
    from .dsp.augment_math import mixup_targets
    from .dsp.config import FbankConfig, LengthPolicy, MelSpectrogramConfig, Segments, WaveformConfig
    from .errors import (
        AccessDeniedError,
        AudioLoaderError,
        CheckpointMismatchError,
        DecodeError,
        ErrorBudgetExceeded,
        OnError,
        SchemaError,
        ShardChangedError,
        ShardReadError,
    )
    from .loader import Loader
    from .mix import Mix, Source
    from .options import Bucketing, Storage, Workers
    from .samples import BadRow, Key, RawSample, Sample
    from .shards import (
        AudioFiles,
        IcebergTable,
        LhotseShar,
        NemoTarred,
        PackFolderError,
        Retry,
        ShardDataset,
        SourceNotFoundError,
    )
    from .shards.formats.writer import ShardWriter

#: The distribution (the name pip installs) that holds this package; the import name stays ``audioloader``.
_DISTRIBUTION = "audioloader-arrow"

__all__ = [
    "AccessDeniedError",
    "AddNoise",
    "AudioFiles",
    "AudioLoader",
    "AudioLoaderError",
    "BadRow",
    "Bucketing",
    "CheckpointMismatchError",
    "DecodeError",
    "ErrorBudgetExceeded",
    "FbankConfig",
    "Gain",
    "IcebergTable",
    "Key",
    "LengthPolicy",
    "LhotseShar",
    "Loader",
    "MelSpectrogramConfig",
    "Mix",
    "Mixup",
    "NemoTarred",
    "OnError",
    "PackFolderError",
    "RawSample",
    "Retry",
    "Reverb",
    "Sample",
    "SchemaError",
    "Segments",
    "ShardChangedError",
    "ShardDataset",
    "ShardReadError",
    "ShardWriter",
    "Shuffle",
    "Source",
    "SourceNotFoundError",
    "SpecAugment",
    "SpeedPerturb",
    "Storage",
    "WaveformConfig",
    "Workers",
    "__version__",
    "mixup_targets",
    "tune_batch_sizes",
]


def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one source); ``0+unknown`` when this package
    runs from a checkout that was never installed (no metadata to read)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


__getattr__, __dir__ = lazy_attributes(__name__, __path__, _LAZY_NAMES, {"__version__": _version})
