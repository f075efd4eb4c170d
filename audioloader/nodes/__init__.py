"""The composable torchdata nodes of audioloader.

Build the default chain by hand (or reorder it, or add your own nodes)::

    reader = ArrowShardReader("shards/", seed=0)
    decode = DecodeSpectrogram(reader, MelSpectrogramConfig(), seed=0, num_workers=4)
    shuffle = ShuffleBuffer(decode, capacity=1000, min_size=500, seed=0)
    batches = Batcher(shuffle, batch_size=64)
    loader = audioloader.Loader(batches)

Each node also takes its settings as one checked group: ``ArrowShardReader(dataset, plan=ReadPlan.of(dataset,
seed=0, rank=..., world_size=...))``, ``ShuffleBuffer(source, limits=BufferLimits(1000, 500))``,
``DurationBucketer(source, limits=BucketLimits(...))``, ``Batcher(source, layout=BatchLayout(64))``.
"""

from .arrow_shard_reader import ArrowShardReader
from .batch_augment import BatchAugment
from .batch_features import BatchFeatures
from .batcher import Batcher
from .batcher import BatchLayout as BatchLayout
from .catch_failures import CatchFailures
from .decode_spectrogram import DecodeSpectrogram
from .duration_bucketer import BucketLimits as BucketLimits
from .duration_bucketer import DurationBucketer
from .parallel_map import ParallelMap
from .prefetcher import Prefetcher
from .read_order import ReadPlan as ReadPlan
from .shuffle_buffer import BufferLimits as BufferLimits
from .shuffle_buffer import ShuffleBuffer
from .weighted_mix import WeightedMix

# The nodes; their settings groups (ReadPlan, BufferLimits, BucketLimits, BatchLayout) are importable here too.
__all__ = ["ArrowShardReader", "BatchAugment", "BatchFeatures", "Batcher", "CatchFailures", "DecodeSpectrogram",
           "DurationBucketer", "ParallelMap", "Prefetcher", "ShuffleBuffer", "WeightedMix"]
