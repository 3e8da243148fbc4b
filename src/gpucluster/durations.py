"""Human durations ("2h", "1h30m", "90s", "1d", "45") to seconds and back."""

from __future__ import annotations

import calendar
import re
import time

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


_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def parse_since(text: str, now: float) -> float | None:
    """A moment for `--since`/`since=`: `30d` (that long ago), `2025-01-01` (UTC midnight) or `all`
    (None); ValueError says what is allowed. Here, not in head/, so every command reads the same."""
    s = text.strip().lower()
    if s == "all":
        return None
    m = _DATE.fullmatch(s)
    if m:
        try:
            return float(calendar.timegm(time.strptime(s, "%Y-%m-%d")))
        except ValueError:
            raise ValueError(f"{text!r} is not a date") from None
    try:
        ago = parse_duration(s)
    except ValueError:
        raise ValueError(f"cannot read {text!r}; give a duration (30d, 12h), a date (2025-01-31) or all") from None
    return now - ago
