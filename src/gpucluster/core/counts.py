"""Counts of values kept up to date as items come and go (the kept indexes' bounds)."""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

_K = TypeVar("_K")


def bump(counter: Counter[_K], value: _K, sign: int) -> None:
    """Count `value` once more (sign 1) or less (-1); a value counted zero times is no key, so
    `min(counter)` and `max(counter)` are over the values present."""
    counter[value] += sign
    if not counter[value]:
        del counter[value]
