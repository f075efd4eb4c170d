"""This machine's cache folder: the one root under which audioloader keeps what it can make again.

``cache_root()`` is ``$AUDIOLOADER_CACHE`` when set, else ``$XDG_CACHE_HOME/audioloader``
(the XDG base directory rule), else ``~/.cache/audioloader``. Under it:

- ``index/``: cached metadata indexes of remote folders (`audioloader.shards.index`);
- ``demo-v1/``, ``demo-v1-quick/``: the demo's synthetic dataset (``audioloader demo``);
- ``bench/``: the benchmark datasets (``audioloader bench``; several hundred MB).

Everything there can be deleted at any time (``rm -rf ~/.cache/audioloader``): it is made again on
demand. The environment is read on every call, so a test or a job can point it elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The machine cache folder (not created here): see the module docstring for the order of precedence."""
    explicit = os.environ.get("AUDIOLOADER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    # XDG: an empty or relative XDG_CACHE_HOME is invalid and must be ignored.
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "audioloader"
