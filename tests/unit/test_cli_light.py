"""The CLI's light paths print and accept exactly what rich and Typer's pydantic coercion would.

Why: `gpucluster jobs` got under 150 ms of CPU (issue 19) by writing plain text itself where
rich would write the same bytes (cli/console.py), and by coercing plain option values without
pydantic where pydantic would return the same value (cli/fastparams.py). Each shortcut is only
right if it is indistinguishable from what it skips, so here both sides run on generated input
and must agree; where the shortcut declines, the real thing runs, so declining is always safe.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console as RichConsole

from gpucluster.cli import fastparams
from gpucluster.cli.console import PIPE_WIDTH, Console, Table
from gpucluster.cli.transport import Head

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text like the CLI's cells and lines, with the characters rich treats specially mixed in.
cell = st.text(
    alphabet=st.sampled_from([*"abcXYZ019 -_.,:/()", "[", "]", ":", "\\", "é", "—", "\t", "中"]), max_size=12
)
line = st.text(max_size=60)


def _rich(*objects: Any, **kwargs: Any) -> str:
    buf = io.StringIO()  # not a terminal: what a pipe gets
    RichConsole(file=buf, highlight=False, soft_wrap=True, width=PIPE_WIDTH).print(*objects, **kwargs)
    return buf.getvalue()


def _ours(monkeypatch: pytest.MonkeyPatch, *objects: Any, **kwargs: Any) -> tuple[str, bool]:
    """What our Console prints to a pipe, and whether it did so without rich."""
    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    console = Console()
    console.print(*objects, **kwargs)
    return buf.getvalue(), console._rich is None


@SETTINGS
@given(headers=st.lists(cell, min_size=1, max_size=6), data=st.data())
def test_a_table_prints_as_rich_prints_it(headers: list[str], data: st.DataObject) -> None:
    rows = data.draw(st.lists(st.lists(cell, min_size=len(headers), max_size=len(headers)), max_size=5))
    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    lines = table.plain_lines(PIPE_WIDTH)
    if lines is not None:
        assert "".join(ln + "\n" for ln in lines) == _rich(table.rich())


@SETTINGS
@given(text=line, markup=st.booleans())
def test_a_line_prints_as_rich_prints_it(text: str, markup: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        printed, _ = _ours(mp, text, markup=markup)
    assert printed == _rich(text, markup=markup)


def test_the_common_outputs_take_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table("ID", "NAME", "SUBMITTED", "WHERE / WHY")
    table.add_row("1", "train", "2026-11-25 15:28:41", "node0:0,1")
    table.add_row("2", "eval", "2026-11-25 15:29:02", "exit code 0")
    for obj in (table, "submitted job 3 (x): queued", "  state:      succeeded — exit code 0"):
        printed, plain = _ours(monkeypatch, obj)
        assert plain and printed == _rich(obj.rich() if isinstance(obj, Table) else obj), obj
    printed, plain = _ours(monkeypatch, "[red]error:[/red] x")  # markup: rich's job
    assert not plain and printed == "error: x\n"


# ---- Typer's coercion --------------------------------------------------------------------------


def _typer_value(annotation: Any, value: Any, **bounds: Any) -> tuple[str, Any]:
    """('ok', value) or ('error', message) from the adapter Typer builds for this parameter."""
    from pydantic import ValidationError
    from typer._adapters import try_build_adapter
    from typer.models import OptionInfo

    adapter = try_build_adapter(annotation, OptionInfo(**bounds))
    assert adapter is not None
    try:
        return "ok", adapter.validate_python(value)
    except ValidationError as e:
        return "error", str(e)


ints = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.text(alphabet="0123456789 +-_.e", max_size=8),
    st.integers(-5, 10**6),
)


@SETTINGS
@given(value=ints, low=st.none() | st.integers(0, 3), high=st.none() | st.integers(5, 10**5))
def test_plain_ints_are_what_typer_makes_of_them(value: Any, low: int | None, high: int | None) -> None:
    from typer.models import OptionInfo

    plain = fastparams.plain_value(int, OptionInfo(min=low, max=high), value)
    if plain is not fastparams._NOT_PLAIN:
        assert ("ok", plain) == _typer_value(int, value, min=low, max=high)
        assert type(plain) is int


@SETTINGS
@given(value=st.text(max_size=20) | st.lists(st.text(max_size=8), max_size=3).map(tuple))
def test_plain_text_is_what_typer_makes_of_it(value: Any) -> None:
    from typer.models import OptionInfo

    annotation: Any = list[str] if isinstance(value, tuple) else str
    plain = fastparams.plain_value(annotation, OptionInfo(), value)
    if plain is not fastparams._NOT_PLAIN:
        assert ("ok", plain) == _typer_value(annotation, value)


def test_undecodable_argv_and_bad_numbers_go_to_typer() -> None:
    from typer.models import OptionInfo

    assert fastparams.plain_value(str, OptionInfo(), "caf\udce9") is fastparams._NOT_PLAIN
    assert fastparams.plain_value(int, OptionInfo(min=1), "0") is fastparams._NOT_PLAIN
    assert fastparams.plain_value(int, OptionInfo(), "abc") is fastparams._NOT_PLAIN
    assert fastparams.plain_value(Path, OptionInfo(), "x.yaml") is fastparams._NOT_PLAIN
    assert fastparams.install()  # Typer's internals are where it expects them (else it is only slower)


def test_a_head_url_with_a_path_and_no_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    h = Head("https://head.example/prefix/")
    assert h._headers["Host"] == "head.example" and h._port == 443
    assert h._target("/v1/jobs", {"state": ["queued", "running"], "follow": True}) == (
        "/prefix/v1/jobs?state=queued&state=running&follow=true"
    )
    assert Head("http://[::1]:9000")._headers["Host"] == "[::1]:9000"
