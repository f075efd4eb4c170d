"""Imported once by the fork server that starts worker processes, so each worker starts in milliseconds.

(A worker started from a fresh interpreter spends ~1.5 s importing torch.)
"""

import numpy  # noqa: F401
import pyarrow  # noqa: F401
import soundfile  # noqa: F401
import soxr  # noqa: F401
import torch  # noqa: F401

import audioloader
from audioloader.workers import pool  # noqa: F401

# `import audioloader` loads its public names on first use; the fork server loads them all here, once, as the
# eager import used to, so that workers find the decode path, the nodes and the features already imported.
for _name in audioloader.__all__:
    getattr(audioloader, _name)
