"""Counter-based randomness: every random choice is a pure function of its inputs.

The library never draws from a thread's or a worker's RNG. A crop offset, an
augmentation, the order of splits in a pass and the shuffle buffer's picks all
come from `mix(seed, ...)`, a chain of splitmix64 steps, so that the same
arguments give the same numbers on any machine, thread count or timing.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1

# Salts keep the streams for different purposes independent.
SALT_CROP = 0x43524F50  # "CROP"
SALT_AUGMENT = 0x41554753  # "AUGS"
SALT_SPLIT_ORDER = 0x53504C54  # "SPLT"
SALT_SHUFFLE = 0x53485546  # "SHUF"
SALT_DITHER = 0x44495448  # "DITH"
# Mixing and augmentation (audioloader.mix, audioloader.dsp.augment): one salt per choice.
SALT_MIX = 0x4D495853  # "MIXS": which source the next draw of a mix takes
SALT_SOURCE = 0x53524345  # "SRCE": a source's own seed (its split order per pass)
SALT_APPLY = 0x4150504C  # "APPL": whether an augmentation applies to a sample (its probability p)
SALT_GAIN = 0x4741494E  # "GAIN"
SALT_NOISE_ROW = 0x4E524F57  # "NROW": which noise row
SALT_NOISE_OFFSET = 0x4E4F4646  # "NOFF": where in the noise row
SALT_NOISE_SNR = 0x4E534E52  # "NSNR"
SALT_SPEED = 0x53504544  # "SPED"
SALT_REVERB_ROW = 0x52524F57  # "RROW": which impulse response
SALT_FREQ_MASK = 0x464D534B  # "FMSK"
SALT_TIME_MASK = 0x544D534B  # "TMSK"
SALT_MIXUP = 0x4D495855  # "MIXU": the mixup weight
SALT_MIXUP_PAIR = 0x4D585052  # "MXPR": the mixup partner
SALT_ELASTIC = 0x454C4153  # "ELAS"
SALT_INTERLEAVE = 0x494C5645  # "ILVE": the order of an interleaving reader's lanes in each round
SALT_SYNC = 0x53594E43  # "SYNC": the order of the buckets ranks in step take their batches from, each round


def splitmix64(x: int) -> int:
    """One splitmix64 step (Steele, Lea & Flood 2014): a 64-bit mixing bijection."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix(*parts: int) -> int:
    """Hash any number of integers (negative ones too) to one uniform 64-bit integer."""
    h = 0
    for part in parts:
        h = splitmix64(h ^ (int(part) & MASK64))
    return h


def uniform_int(n: int, *parts: int) -> int:
    """An integer in ``[0, n)`` that is a pure function of ``parts`` (bias < n / 2**64)."""
    if n <= 0:
        raise ValueError(f"uniform_int needs n > 0, got {n}")
    return mix(*parts) % n


def uniform(*parts: int) -> float:
    """A float in ``[0, 1)`` that is a pure function of ``parts`` (53 random bits)."""
    return (mix(*parts) >> 11) * (1.0 / (1 << 53))


def salt_at(salt: int, position: int) -> int:
    """``salt`` for the item at ``position`` of a list (e.g. of augmentations).

    Position 0 is ``salt`` itself; the position sits above the 32-bit salts, so
    two items of one kind in a list draw independently.
    """
    return salt | (int(position) << 32)


def generator(*parts: int) -> np.random.Generator:
    """A numpy Generator seeded by ``mix(*parts)``, for user augmentations."""
    return np.random.Generator(np.random.PCG64(mix(*parts)))


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """Vectorised `splitmix64` over a uint64 array (wrap-around arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permutation(n: int, *parts: int) -> np.ndarray:
    """A permutation of ``range(n)`` that is a pure function of ``parts``.

    Sorts the items by a per-item hash, so it does not depend on numpy's
    Generator algorithms (which may change between numpy versions).
    """
    base = np.uint64(mix(*parts))
    hashes = splitmix64_array(np.arange(n, dtype=np.uint64) ^ base)
    return np.argsort(hashes, kind="stable")


#: Bytes at each end of a row's audio that `audio_checksum` reads.
CHECKSUM_EDGE_BYTES = 1024


def audio_checksum(audio: Any) -> int:
    """A 32-bit checksum of encoded audio: CRC-32 of its first and last KiB, seeded by its length (0 for None).

    It identifies the row's content when a checkpoint's buffered rows are read
    back (`ShuffleBuffer`, `DurationBucketer`). Only the ends are read: the reader
    takes it for every row it reads, and a whole-clip CRC costs ~4 us per 16 KB
    (~75 us per 320 KB) where this costs ~1 us; a rewritten clip differs in its
    header (a FLAC header holds the audio's MD5), its length, or its first or
    last samples.
    """
    if audio is None:
        return 0
    view = memoryview(audio)
    n = view.nbytes
    if n <= 2 * CHECKSUM_EDGE_BYTES:
        return zlib.crc32(view, n & 0xFFFFFFFF)
    return zlib.crc32(view[n - CHECKSUM_EDGE_BYTES:], zlib.crc32(view[:CHECKSUM_EDGE_BYTES], n & 0xFFFFFFFF))


def item_checksum(item: Any) -> int:
    """The `audio_checksum` an item carries (a raw row's, taken when it was read; a decoded sample's,
    from its row), else the checksum of its ``audio``."""
    checksum = getattr(item, "checksum", 0)
    if checksum:
        return int(checksum)
    return audio_checksum(getattr(item, "audio", None))
