"""durations.parse_duration / format_duration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucluster.durations import format_duration, parse_duration


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
