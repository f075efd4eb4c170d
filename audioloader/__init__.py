"""audioloader: fast, exact, resumable audio loading from Apache Arrow shards.

``AudioLoader`` is the DataLoader-shaped front; the nodes it composes are in
``audioloader.nodes``. torchaudio is not needed at run time.
"""

from .audio_loader import AudioLoader
from .dsp.augment import AddNoise, Gain, Mixup, Reverb, SpecAugment, SpeedPerturb
from .dsp.augment_math import mixup_targets
from .dsp.config import FbankConfig, LengthPolicy, MelSpectrogramConfig, Segments, WaveformConfig
from .errors import (
    AccessDeniedError,
    AudioLoaderError,
    CheckpointMismatchError,
    DecodeError,
    ErrorBudgetExceeded,
    SchemaError,
    ShardReadError,
)
from .loader import Loader
from .mix import Mix, Source
from .options import Bucketing, OnError, Shuffle, Storage, Workers
from .samples import BadRow, Key, RawSample, Sample
from .shards import IcebergTable, Retry, ShardDataset, SourceNotFoundError
from .shards.writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AddNoise",
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
    "Loader",
    "MelSpectrogramConfig",
    "Mix",
    "Mixup",
    "OnError",
    "RawSample",
    "Retry",
    "Reverb",
    "Sample",
    "SchemaError",
    "Segments",
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
]
