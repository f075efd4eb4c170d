"""The composable torchdata nodes of audioloader.

Build the default chain by hand (or reorder it, or add your own nodes), the settings one by one::

    reader = ArrowShardReader.of("shards/", seed=0)
    decode = DecodeSpectrogram.of(reader, MelSpectrogramConfig(), seed=0, num_workers=4)
    shuffle = ShuffleBuffer.of(decode, capacity=1000, min_size=500, seed=0)
    batches = Batcher.of(shuffle, batch_size=64)
    loader = audioloader.Loader(batches)

A node's constructor takes its settings as checked groups, as `AudioLoader` builds its chain (each ``.of`` builds
them): ``ArrowShardReader(dataset, ReadPlan.of(dataset, seed=0, rank=..., world_size=...))``,
``ShuffleBuffer(source, BufferLimits(1000, 500))``, ``DurationBucketer(source, BucketLimits(...))``,
``DecodeSpectrogram(source, DecodeConfig(features, seed=0), Workers(num_workers=4, kind="thread"))``,
``Batcher(source, BatchLayout(64))``, ``ParallelMap(source, job, MapPool(2))``.
"""

from .arrow_shard_reader import ArrowShardReader
from .batch_augment import BatchAugment
from .batch_features import BatchFeatures
from .batcher import Batcher
from .batcher import BatchLayout as BatchLayout
from .catch_failures import CatchFailures
from .decode_config import DecodeConfig as DecodeConfig
from .decode_spectrogram import DecodeSpectrogram
from .duration_bucketer import BucketLimits as BucketLimits
from .duration_bucketer import DurationBucketer
from .held import ItemFns as ItemFns
from .parallel_map import MapPool as MapPool
from .parallel_map import ParallelMap
from .prefetcher import Prefetcher
from .read_order import ReadPlan as ReadPlan
from .shuffle_buffer import BufferLimits as BufferLimits
from .shuffle_buffer import ShuffleBuffer
from .weighted_mix import WeightedMix

# The nodes; their settings groups (ReadPlan, BufferLimits, BucketLimits, BatchLayout, DecodeConfig, ItemFns, MapPool)
# are importable here too.
__all__ = ["ArrowShardReader", "BatchAugment", "BatchFeatures", "Batcher", "CatchFailures", "DecodeSpectrogram",
           "DurationBucketer", "ParallelMap", "Prefetcher", "ShuffleBuffer", "WeightedMix"]
