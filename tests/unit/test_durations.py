"""durations.parse_duration / format_duration."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucluster.durations import begin_time, format_duration, parse_begin, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("45", 45.0),
        ("2.5", 2.5),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1.5h", 5400.0),
        ("  10M  ", 600.0),
        ("90m", 5400.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "   ", "h", "10x", "1h 30m", "-5", "-5m", "m10", "1e3", "inf", "nan", "1h30", "1.h"]
)
def test_parse_errors_name_the_allowed_forms(text: str) -> None:
    with pytest.raises(ValueError, match="use forms like 90s, 30m, 2h, 1h30m, 1d") as e:
        parse_duration(text)
    assert repr(text) in str(e.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (1, "1s"),
        (59, "59s"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "1d"),
        (93784, "1d2h3m4s"),
        (86401, "1d1s"),
        (59.6, "1m"),  # rounded to whole seconds
        (0.4, "0s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10 * 366 * 86400))
def test_parse_of_format_is_identity_on_whole_seconds(n: int) -> None:
    assert parse_duration(format_duration(n)) == n


@given(
    st.integers(0, 400),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
)
def test_format_is_canonical(d: int, h: int, m: int, s: int) -> None:
    seconds = d * 86400 + h * 3600 + m * 60 + s
    text = format_duration(seconds)
    expected = "".join(f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if v) or "0s"
    assert text == expected
    assert format_duration(parse_duration(text)) == text


# ---- --begin ------------------------------------------------------------------------------------

NOON = datetime(2026, 11, 25, 12, 0, tzinfo=UTC).timestamp()  # a Wednesday noon, UTC


@pytest.mark.parametrize(
    ("text", "after_noon"),
    [
        ("now", 0.0),
        ("+30m", 1800.0),
        ("now+2h", 7200.0),
        ("22:00", 10 * 3600.0),  # later today
        ("12:00", 24 * 3600.0),  # now exactly: the next one, tomorrow (sbatch's reading)
        ("08:15:30", 20 * 3600.0 + 15 * 60 + 30),  # passed today: tomorrow
        ("2026-11-26T08:00", 20 * 3600.0),  # in the submitter's zone (UTC here)
        ("2026-11-26T08:00+01:00", 19 * 3600.0),  # its own offset wins
        ("2026-11-26", 12 * 3600.0),  # midnight
    ],
)
def test_begin_reads_what_sbatch_reads(text: str, after_noon: float) -> None:
    assert parse_begin(text, NOON, UTC) - NOON == after_noon


def test_a_time_of_day_is_the_submitters_not_the_heads() -> None:
    tokyo = timezone(timedelta(hours=9))  # 12:00 UTC is 21:00 in Tokyo: 22:00 there is 1 h away
    assert parse_begin("22:00", NOON, tokyo) - NOON == 3600.0


@pytest.mark.parametrize("text", ["25:00", "12:61", "tomorrow", "", "now+", "+2x", "2026-13-01"])
def test_an_unreadable_begin_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=r"time of day|cannot read"):
        parse_begin(text, NOON, UTC)


def test_a_yaml_date_or_datetime_is_a_begin_too() -> None:
    aware = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
    assert begin_time(aware, NOON) == aware.timestamp()
    assert begin_time(date(2026, 11, 26), NOON) == datetime(2026, 11, 26).astimezone().timestamp()
    assert begin_time("+1h", NOON) == NOON + 3600
