"""Sizes written as the CLI writes them ("256M", "4 GiB", 1048576)."""

from __future__ import annotations

import re

from .errors import InvalidArgument

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, name: str = "size") -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise InvalidArgument(f"{name}: {text!r} is not a size (like 256M or 4GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
