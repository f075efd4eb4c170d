"""audioloader: fast, exact, resumable audio loading from Apache Arrow shards.

``AudioLoader`` is the DataLoader-shaped front; the nodes it composes are in
``audioloader.nodes``. torchaudio is not needed at run time.
"""

from .audio_loader import AudioLoader
from .config import FbankConfig, LengthPolicy, MelSpectrogramConfig, WaveformConfig
from .errors import (
    AudioLoaderError,
    CheckpointMismatchError,
    DecodeError,
    ErrorBudgetExceeded,
    SchemaError,
    ShardReadError,
)
from .loader import Loader
from .options import Bucketing, Shuffle, Workers
from .samples import BadRow, Key, RawSample, Sample
from .shards import Retry, ShardDataset, SourceNotFoundError
from .writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "AudioLoader",
    "AudioLoaderError",
    "BadRow",
    "Bucketing",
    "CheckpointMismatchError",
    "DecodeError",
    "ErrorBudgetExceeded",
    "FbankConfig",
    "Key",
    "LengthPolicy",
    "Loader",
    "MelSpectrogramConfig",
    "RawSample",
    "Retry",
    "Sample",
    "SchemaError",
    "ShardDataset",
    "ShardReadError",
    "ShardWriter",
    "Shuffle",
    "SourceNotFoundError",
    "WaveformConfig",
    "Workers",
    "__version__",
]
