"""Checks of the numbers a caller passes, made where the caller called.

pybind11 answers an integer its C++ parameter cannot hold with ``TypeError: incompatible
function arguments``, which names neither the argument nor the cause, and a value checked
only in a worker fails far from the call. Every public call that takes a count, an offset,
a step or a seed checks it here first and raises :class:`InvalidArgument` naming it.
"""

from __future__ import annotations

import numbers
from typing import Any

from .errors import InvalidArgument

U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
U32_MAX = (1 << 32) - 1  # ranks, world sizes and keep_last are `unsigned` in the core


def check_int(value: Any, name: str, *, lo: int = 0, hi: int = I64_MAX) -> int:
    """``value`` as an int in [lo, hi]; InvalidArgument naming ``name`` otherwise.

    bool is refused (``True`` is an int to Python, never a count or a step to a caller).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name}: {value!r} is not an integer")
    v = int(value)
    if v < lo:
        raise InvalidArgument(f"{name}: {v} is below {lo}")
    if v > hi:
        raise InvalidArgument(f"{name}: {v} is above {hi}, the largest it can be")
    return v


def check_optional_int(value: Any, name: str, *, lo: int = 0, hi: int = I64_MAX) -> int | None:
    """As :func:`check_int`, with None passed through (a parameter whose default is None)."""
    return None if value is None else check_int(value, name, lo=lo, hi=hi)
