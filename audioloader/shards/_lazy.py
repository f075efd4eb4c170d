"""PEP 562 module attributes for a package whose names are imported on first use.

Used by ``audioloader/__init__.py`` and ``audioloader/shards/__init__.py`` so that
``import audioloader`` does not import torch and ``audioloader pack --help`` does
not import the reading machinery. It lives here, not at the package root, because
the root is kept to a few modules and this package must stay light to import.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, path: Iterable[str], names: Mapping[str, str],
                    computed: Mapping[str, Callable[[], Any]] | None = None,
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``; ``path``: its ``__path__``).

    ``names`` maps each lazy name to the module defining it, relative to the package (``".errors"``);
    ``computed`` maps names to functions that make their value. A sub-module is also an attribute, as it was
    when the package imported everything eagerly (``import audioloader as al; al.nodes.Batcher``). A value is
    kept in the package's namespace once made, so later lookups do not come here.
    """
    computed = dict(computed or {})

    def submodules() -> set[str]:
        return {info.name for info in pkgutil.iter_modules(path) if not info.name.startswith("_")}

    def __getattr__(name: str) -> Any:
        if name in computed:
            value = computed[name]()
        elif name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        elif name in submodules():
            value = importlib.import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names, *computed, *submodules()})

    return __getattr__, __dir__
