"""Human durations ("2h", "1h30m", "90s", "1d", "45") to seconds and back."""

from __future__ import annotations

import calendar
import re
import time
from datetime import date, datetime, timedelta, tzinfo

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


_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
MAX_BEGIN_AHEAD_S = 366 * 86400  # a begin time further off is a typo (a year), not a plan


def parse_begin(text: str, now: float, zone: tzinfo | None = None) -> float:
    """The Unix time of `--begin`, as sbatch reads it: `HH:MM[:SS]` (its next occurrence in
    `zone`, the submitter's local time by default: today, or tomorrow if it has passed), a date
    or date and time (`2026-11-26`, `2026-11-26T08:00`, in `zone` unless it names its own offset),
    `now+DURATION` or `+DURATION` (`now+2h`, `+30m`), or `now`. ValueError says what is allowed.

    Resolved where the person is (the CLI), with their clock and zone: "22:00" means their 22:00,
    whatever zone the head runs in; the API takes the resulting Unix time."""
    s = text.strip().lower()
    here = datetime.fromtimestamp(now, zone).astimezone(zone)
    if s == "now":
        return now
    if s.startswith(("now+", "+")):
        return now + parse_duration(s.split("+", 1)[1])
    m = _CLOCK.fullmatch(s)
    if m:
        hour, minute, second = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise ValueError(f"{text!r} is not a time of day; write HH:MM or HH:MM:SS, e.g. 22:00")
        at = here.replace(hour=hour, minute=minute, second=second, microsecond=0)
        if at.timestamp() <= now:
            at = (here + timedelta(days=1)).replace(hour=hour, minute=minute, second=second, microsecond=0)
        return at.timestamp()
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"cannot read the begin time {text!r}; give a time of day (22:00), a date and time "
            "(2026-11-26T08:00), now+DURATION (now+2h) or +DURATION (+30m)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=here.tzinfo)
    return when.timestamp()


def begin_time(value: str | date, now: float) -> float:
    """`parse_begin` for what a person wrote, also a YAML job file's date or timestamp (which the
    YAML reader hands over as a date or datetime; one without a zone is the submitter's local)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.astimezone()).timestamp()
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day).astimezone().timestamp()
    return parse_begin(value, now)
