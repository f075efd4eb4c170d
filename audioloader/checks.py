"""Argument checks shared by the whole library: one vocabulary, one message format.

Every check names the argument and the value it got, says what it must be, and
returns the value converted (an ``int`` for an integer check), so call sites
read ``self.rows = checks.integer("rows", rows, minimum=1)``. Messages have the
form ``name=value: must be ...``; an option group's field is named
``Group.field`` (e.g. ``Workers.num_workers=-1: must be an integer >= 0``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np


def bad(name: str, value: Any, why: str) -> ValueError:
    """The ``ValueError`` of a bad argument: ``name=value: why``."""
    return ValueError(f"{name}={value!r}: {why}")


def field_error(group: Any, name: str, why: str) -> ValueError:
    """The ``ValueError`` of a bad field of an option group or config: ``Group.field=value: why``."""
    return bad(f"{type(group).__name__}.{name}", getattr(group, name), why)


def is_integer(value: Any) -> bool:
    """True for Python and numpy integers, False for bools (``True`` is not a count)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False,
            hint: str = "") -> int | None:
    """``value`` as an ``int``; ``TypeError`` unless it is one, ``ValueError`` when below ``minimum``."""
    if value is None and allow_none:
        return None
    or_none = " or None" if allow_none else ""
    if not is_integer(value):
        raise TypeError(f"{name} must be an int{or_none}, got {type(value).__name__} {value!r}{hint}")
    if minimum is not None and value < minimum:
        raise bad(name, value, f"must be an integer >= {minimum}{or_none}{hint}")
    return int(value)


def count(name: str, value: Any, *, minimum: int = 1, allow_none: bool = False, hint: str = "") -> int | None:
    """An integer ``>= minimum`` where a wrong type is as much a bad value as a small one (``ValueError``).

    For the fields of option groups, whose users pass ``2.0`` or ``"2"`` as often as ``-1``.
    """
    if value is None and allow_none:
        return None
    if not is_integer(value) or value < minimum:
        raise bad(name, value, f"must be an integer >= {minimum}" + (" or None" if allow_none else "") + hint)
    return int(value)


def field_count(group: Any, name: str, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """`count` of a field of an option group or config, named ``Group.field``."""
    return count(f"{type(group).__name__}.{name}", getattr(group, name), minimum=minimum, allow_none=allow_none)


def positive_integer(name: str, value: Any, *, unit: str = "") -> int:
    """An integer ``> 0`` (``unit``: what it counts, e.g. "Hz"): ``name=value: must be a positive integer``."""
    if not is_integer(value) or value <= 0:
        raise bad(name, value, "must be a positive integer" + (f" ({unit})" if unit else ""))
    return int(value)


def positive_number(name: str, value: Any, *, allow_none: bool = False, unit: str = "") -> float | None:
    """A finite number ``> 0`` (``unit`` names what it counts, e.g. "seconds")."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        what = f"a positive number of {unit}" if unit else "a positive finite number"
        raise bad(name, value, f"must be {what}" + (" or None" if allow_none else ""))
    return float(value)


def one_of(name: str, value: Any, choices: Collection[Any], *, allow_none: bool = False) -> Any:
    """``value`` if it is one of ``choices`` (or None when allowed); ``ValueError`` listing them."""
    if (value is None and allow_none) or value in choices:
        return value
    raise bad(name, value, f"must be one of {tuple(choices)}" + (" or None" if allow_none else ""))


def instance(name: str, value: Any, cls: type, *, default: Any = None) -> Any:
    """An option group: ``value``, or ``default`` when it is None; ``TypeError`` naming ``name`` otherwise."""
    if value is None:
        return default
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be an audioloader.{cls.__name__}, got {type(value).__name__}")
    return value


def node_fields(node: str, groups: str, given: Collection[str]) -> TypeError:
    """The ``TypeError`` of a node built with its settings one by one: a node takes its settled ``groups``; the
    fields go to its factory, ``node.of(...)``, which builds them."""
    fields = f" ({', '.join(f'{name}=' for name in given)})" if given else ""
    return TypeError(f"{node}(...) takes {groups}; to give the settings one by one{fields}, use {node}.of(...), "
                     "which builds them")
