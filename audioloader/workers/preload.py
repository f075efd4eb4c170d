"""Imported once by the fork server that starts worker processes, so each worker starts in milliseconds.

(A worker started from a fresh interpreter spends ~1.5 s importing torch.)
"""

import numpy  # noqa: F401
import pyarrow  # noqa: F401
import soundfile  # noqa: F401
import soxr  # noqa: F401
import torch  # noqa: F401

import audioloader  # noqa: F401
from audioloader.workers import pool  # noqa: F401
