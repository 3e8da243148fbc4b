"""Human durations ("2h", "1h30m", "90s", "1d", "45") to seconds and back."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(text: str) -> float:
    """Seconds in `text`; a bare number means seconds. Raises ValueError with the allowed forms."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"cannot read duration {text!r}; use forms like 90s, 30m, 2h, 1h30m, 1d or seconds")
    return total


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    parts: list[str] = []
    for unit, size in _UNITS.items():
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)
