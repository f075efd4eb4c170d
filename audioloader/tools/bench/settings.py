"""The options of ``audioloader bench``: presets, arguments, targets."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from .dataset import default_cache_dir

#: Output format version of ``--json``.
RESULT_VERSION = 1

#: The targets: (name, description, comparison, threshold).
TARGETS = {
    "throughput_vs_baseline": ("train throughput / user baseline, same 44.1 kHz FLAC shards", ">=", 2.0),
    "packed_flac_vs_baseline": ("train throughput on shards packed at 32 kHz FLAC / baseline on originals",
                                ">=", 5.0),
    "packed_pcm16_vs_baseline": ("train throughput on shards packed at 32 kHz PCM16 / baseline on originals",
                                 ">=", 5.0),
    "throughput_vs_ceiling": ("train throughput / ceiling (one-thread decode() rate x cores)", ">=", 0.9),
    "first_batch_eval_vs_baseline": ("eval time to first batch / baseline's", "<=", 0.25),
    "peak_memory_vs_baseline": ("train peak memory (PSS) of the process tree / baseline's", "<=", 1.0),
    "checkpoint_bytes_10000": ("checkpoint bytes at buffer 10000 (largest of both compositions)", "<=",
                               256 * 1024),
}

#: CPU used by other processes (in cores) above which a figure is flagged as disturbed.
DISTURBED_CORES = 0.25

QUICK = {"clips": 256, "train_buffer": 256, "train_min": 64, "measure_seconds": 2.0, "ceiling_seconds": 2.0,
         "resume_buffers": "64,256", "workers": "2", "warmup_batches": 1, "repeat": 1}
FULL = {"clips": 1000, "train_buffer": 1000, "train_min": 64, "measure_seconds": 6.0, "ceiling_seconds": 6.0,
        "resume_buffers": "1000,10000", "workers": "2,4,8", "warmup_batches": 2, "repeat": 2}


# -- arguments ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``audioloader bench``."""
    size = parser.add_argument_group("size (quick mode by default: about a minute once the data is cached)")
    size.add_argument("--full", action="store_true",
                      help="the full comparison: 1000 clips, 6 s windows, 2 rounds, threads 2,4,8, buffers "
                           "1000,10000 (about 8 minutes once the data is cached); any option below overrides it")
    size.add_argument("--clips", type=int, default=None, help="clips in the dataset (quick 256, full 1000)")
    size.add_argument("--seconds", type=float, default=10.0, help="length of every clip in s (default 10)")
    size.add_argument("--sample-rate", type=int, default=44100, help="rate of the stored audio in Hz (44100)")
    size.add_argument("--codec", choices=("flac", "wav", "ogg", "mp3"), default="flac",
                      help="codec of the stored audio (default flac)")
    size.add_argument("--channels", type=int, choices=(1, 2), default=1, help="channels of the stored audio")
    size.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    size.add_argument("--workers", default=None, metavar="N[,N...]",
                      help="AudioLoader decode workers to try in train mode (quick 2; full 2,4,8); the "
                           "library's default (one process per core) is used for the packed runs and the targets "
                           "when it is among them, else the fastest")
    size.add_argument("--train-buffer", type=int, default=None,
                      help="train-mode shuffle buffer capacity (quick 256, full 1000)")
    size.add_argument("--train-min", type=int, default=None, help="train-mode shuffle min fill (default 64)")
    size.add_argument("--measure-seconds", type=float, default=None,
                      help="steady-state window per contender in s (quick 2, full 6)")
    size.add_argument("--warmup-batches", type=int, default=None, help="batches left out before the window")
    size.add_argument("--resume-buffers", default=None, metavar="B[,B...]",
                      help="shuffle buffer capacities for the checkpoint/resume runs (quick 64,256; "
                           "full 1000,10000)")
    size.add_argument("--repeat", type=int, default=None,
                      help="rounds of the throughput runs (quick 1, full 2); each figure is the median over "
                           "rounds, each ratio the median of the per-round ratios")
    what = parser.add_argument_group("what to run")
    what.add_argument("--skip", default="", metavar="GROUP[,GROUP...]",
                      help="leave out groups: eval, baseline, soxr, ceiling, packed, resume")
    what.add_argument("--experiments", action="store_true",
                      help="also run variants next to the defaults (heap trimming off / every 64 decodes, "
                           "shuffle_before_decode=False/True, the old eval buffer), each compared with its "
                           "plain self")
    what.add_argument("--cache-dir", default=None, metavar="DIR",
                      help=f"where generated datasets are kept, several hundred MB (default {default_cache_dir()}: "
                           "bench/ under $AUDIOLOADER_CACHE, else $XDG_CACHE_HOME/audioloader, else "
                           "~/.cache/audioloader)")
    what.add_argument("--clear-cache", action="store_true",
                      help="delete the generated datasets in the cache folder, say how much was freed, and exit")
    what.add_argument("--timeout", type=float, default=900.0, help="seconds before a contender is killed")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    out.add_argument("--output", default=None, metavar="FILE", help="also write the JSON results to FILE")


@dataclass
class Settings:
    """The resolved options (quick or full preset, then explicit overrides)."""

    clips: int
    seconds: float
    sample_rate: int
    codec: str
    channels: int
    batch_size: int
    workers: list[int]
    train_buffer: int
    train_min: int
    measure_seconds: float
    ceiling_seconds: float
    warmup_batches: int
    resume_buffers: list[int]
    repeat: int
    skip: set[str]
    cache_dir: str
    timeout: float
    experiments: bool = False
    mode: str = "quick"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        preset = FULL if args.full else QUICK

        def pick(name: str) -> Any:
            value = getattr(args, name, None)
            return preset[name] if value is None else value

        settings = cls(
            clips=int(pick("clips")), seconds=float(args.seconds), sample_rate=int(args.sample_rate),
            codec=args.codec, channels=int(args.channels), batch_size=int(args.batch_size),
            workers=_int_list("--workers", pick("workers")), train_buffer=int(pick("train_buffer")),
            train_min=int(pick("train_min")), measure_seconds=float(pick("measure_seconds")),
            ceiling_seconds=float(preset["ceiling_seconds"] if args.measure_seconds is None
                                  else args.measure_seconds),
            warmup_batches=int(pick("warmup_batches")),
            resume_buffers=_int_list("--resume-buffers", pick("resume_buffers")),
            repeat=int(pick("repeat")), skip={s.strip() for s in args.skip.split(",") if s.strip()},
            cache_dir=str(args.cache_dir if args.cache_dir is not None else default_cache_dir()),
            timeout=float(args.timeout), experiments=bool(args.experiments),
            mode="full" if args.full else "quick")
        settings.check()
        return settings

    def check(self) -> None:
        groups = {"eval", "baseline", "soxr", "ceiling", "packed", "resume"}
        if self.skip - groups:
            raise ValueError(f"--skip {','.join(sorted(self.skip - groups))}: unknown group; "
                             f"choose from {', '.join(sorted(groups))}")
        for name in ("clips", "batch_size", "train_buffer", "repeat"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be >= 1")
        if not 0 <= self.train_min <= self.train_buffer:
            raise ValueError(f"--train-min={self.train_min}: must be in [0, --train-buffer={self.train_buffer}]")
        if self.measure_seconds < 0 or self.warmup_batches < 0:
            raise ValueError("--measure-seconds and --warmup-batches must be >= 0")
        if not self.workers or min(self.workers) < 1:
            raise ValueError(f"--workers {self.workers}: give one or more worker counts >= 1")


def _int_list(option: str, text: Any) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated integers, e.g. 2,4") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{option} {text!r}: values must be >= 1")
    return values


