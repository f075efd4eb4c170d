"""``audioloader demo``: make a synthetic dataset, train a small CNN, checkpoint, resume exactly, evaluate.

With no arguments the demo writes a ten-class synthetic sound dataset (train
and eval shard folders) into a cache folder, reused on later runs, then trains
a small CNN on log-mel spectrograms on the CPU. Half way it saves a checkpoint
(model + optimizer + ``loader.state_dict()``), builds a fresh loader, model and
optimizer from it, checks that the resumed loader yields exactly the batches
the original one would have (bit for bit), finishes training and reports the
accuracy on the eval split (every eval clip exactly once). About two minutes on
two cores; ``--quick`` takes a fraction of that.

``--data DIR`` trains on your own shards instead: DIR with ``train/`` and
``eval/`` sub-folders, or DIR plus ``--eval-data EVAL``, or a DIR of several
shard files of which the last ~20 % are held out for evaluation.

This module holds the options and the entry point only, so that ``audioloader demo --help``
answers without importing torch; the model and the run are in `audioloader.tools.demo_train`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from audioloader.shards.storage.machine_cache import cache_root

__all__ = ["add_arguments", "default_cache_dir", "main"]

#: Names defined in `audioloader.tools.demo_train` (torch), still importable from here, as before the split.
_TRAIN_NAMES = ("DemoPlan", "SmallCNN", "prepare_synthetic_data", "run_demo")


def __getattr__(name: str) -> Any:
    if name in _TRAIN_NAMES:
        from audioloader.tools import demo_train

        return getattr(demo_train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_cache_dir() -> Path:
    """The machine cache folder (`audioloader.shards.storage.machine_cache.cache_root`): ``$AUDIOLOADER_CACHE``, else
    ``$XDG_CACHE_HOME/audioloader``, else ``~/.cache/audioloader``."""
    return cache_root()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``audioloader demo``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--quick", action="store_true",
                        help="tiny dataset and few steps (about 20-30 s): a smoke test of the whole path")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="train on your own shards instead of the synthetic dataset: DIR with train/ and "
                             "eval/ sub-folders, or DIR with --eval-data, or DIR with several shard files "
                             "(the last ~20%% are held out for evaluation)")
    parser.add_argument("--eval-data", type=Path, default=None, metavar="DIR",
                        help="evaluation shards for --data")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help=f"where the synthetic dataset is kept (default: {default_cache_dir()}); "
                             "a complete one is reused")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default 400; 60 with --quick)")
    parser.add_argument("--batch-size", type=int, default=None, help="samples per batch (default 32; 16 with --quick)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the dataset, the model's initialization and the loader (default 0)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    parser.add_argument("--workers", type=int, default=None,
                        help="decode threads of the loader (default: half the CPU cores, at least 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for the model (default: the cores the decode threads "
                             "leave, at least 1)")
    parser.add_argument("--sample-rate", type=int, default=16000, help="feature sample rate in Hz (default 16000)")
    parser.add_argument("--clip-seconds", type=float, default=2.0, help="crop length in seconds (default 2.0)")
    parser.add_argument("--n-mels", type=int, default=64, help="mel bands (default 64)")
    parser.add_argument("--verify-batches", type=int, default=3,
                        help="resumed batches compared bit for bit with the original loader's (default 3)")
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="FILE",
                        help="where the mid-run checkpoint is written (default: a temporary file, removed)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``audioloader demo`` (the CLI parses with `add_arguments`). Exit status 1 on a resume mismatch."""
    from audioloader.tools.demo_train import run_demo

    result = run_demo(args)
    if not result["resume_identical"]:
        print("audioloader demo: the resumed loader did not reproduce the original batches", flush=True)
        return 1
    return 0
