"""Human sizes ("80GiB", "80GB", "1TiB", "100MiB", "16384") to bytes or MiB: the one parser.

Why one: three parsers used to disagree (the job spec read "80GB" but not "1TiB", the
simulator's cluster files "1TiB" but not a bare "16384", `up --max-log-size` neither "80GB" nor
"1T"). Units are binary whatever the spelling: "GB" and "GiB" both mean 2**30 bytes, as NVML and
GPU vendors mix them (an "80GB" H100 reports 81,559 MiB). A bare number is in the caller's unit
(MiB for GPU memory, bytes for file sizes). Range checks are the callers'.
"""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|(b))?\s*", re.IGNORECASE)
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}
MIB = 1024**2


def parse_bytes(text: str, bare_unit: int = 1, examples: str = "100MiB, 80GiB or 1TiB") -> int:
    """Bytes in `text`: a number with B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB (any case,
    binary), or a bare number of `bare_unit` bytes. Raises ValueError naming `examples`."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"cannot read size {text!r}; use e.g. {examples}")
    number = float(m.group(1))
    unit = 1024 ** _POWER[m.group(2).lower()] if m.group(2) else 1 if m.group(3) else bare_unit
    value = number * unit
    if math.isinf(value):
        raise ValueError(f"size {text!r} is out of range")
    return int(value)


def parse_mib(text: str) -> int:
    """MiB in `text` (a bare number is MiB): GPU memory, "80GiB" -> 81920."""
    return parse_bytes(text, MIB, "80GiB or 16384MiB") // MIB
