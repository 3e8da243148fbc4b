"""The CLI's light paths print and accept exactly what rich and Typer's pydantic coercion would.

Why: `gpucluster jobs` got under 150 ms of CPU (issue 19) by writing plain text itself where
rich would write the same bytes (cli/console.py), and by coercing plain option values without
pydantic where pydantic would return the same value (cli/fastparams.py). Each shortcut is only
right if it is indistinguishable from what it skips, so here both sides run on generated input
and must agree; where the shortcut declines, the real thing runs, so declining is always safe.
"""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console as RichConsole

from gpucluster.cli import fastparams
from gpucluster.cli.console import PIPE_WIDTH, Console, Table
from gpucluster.connection import Head, View

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text like the CLI's cells and lines, with the characters rich treats specially mixed in.
PLAIN_CHARS = "abcXYZ019 -_.,:/()"
cell = st.text(alphabet=PLAIN_CHARS, max_size=12) | st.text(
    alphabet=st.sampled_from([*PLAIN_CHARS, "[", "]", ":", "\\", "é", "—", "\t", "中"]), max_size=12
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
        try:
            said = _ours(mp, text, markup=markup)[0]
        except Exception as e:  # bad markup: rich's to refuse, the same way on both paths
            said = type(e).__name__
    try:
        expected = _rich(text, markup=markup)
    except Exception as e:
        expected = type(e).__name__
    assert said == expected


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


# What decides how rich prints: is it a terminal, which, how wide (see Console._plain).
terminals = st.fixed_dictionaries(
    {},
    optional={
        "TTY_COMPATIBLE": st.sampled_from(["0", "1", ""]),
        "FORCE_COLOR": st.sampled_from(["", "1"]),
        "TERM": st.sampled_from(["xterm-256color", "dumb", "vt100", "unknown"]),
        "COLUMNS": st.sampled_from(["30", "120", "300"]),
        "LINES": st.sampled_from(["25", ""]),  # with $COLUMNS, rich's width even on a dumb terminal
        "NO_COLOR": st.just("1"),
        "COLORTERM": st.just("truecolor"),
    },
)


@SETTINGS
@given(env=terminals, tty=st.booleans(), headers=st.lists(cell, min_size=1, max_size=5), data=st.data())
def test_terminals_get_what_rich_gives_them(env: dict[str, str], tty: bool, headers: list[str], data: Any) -> None:
    rows = data.draw(st.lists(st.lists(cell, min_size=len(headers), max_size=len(headers)), max_size=4))
    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    text = data.draw(line)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "TERM", "COLUMNS", "LINES", "NO_COLOR", "COLORTERM"):
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        for obj in (table, text):
            ours, theirs = _Stream(tty), _Stream(tty)
            mp.setattr("sys.stdout", ours)
            said = _outcome(Console().print, obj)
            mp.setattr("sys.stdout", theirs)
            expected = _outcome(Console().real().print, obj.rich() if isinstance(obj, Table) else obj)
            assert (said, ours.getvalue()) == (expected, theirs.getvalue()), (env, tty)


@pytest.mark.parametrize("lines", ["25", None])
@pytest.mark.parametrize("tty", [True, False])
def test_a_dumb_terminal_with_columns_and_lines_is_as_wide_as_rich_makes_it(
    monkeypatch: pytest.MonkeyPatch, lines: str | None, tty: bool
) -> None:
    """With $LINES set, rich takes $COLUMNS (or the pipe's width) even on a dumb terminal, where
    it otherwise prints 80 wide: a table wider than 30 is squeezed, not printed plain (found by
    the property test above with $LINES leaked into its process)."""
    for name in ("FORCE_COLOR", "COLUMNS", "LINES", "NO_COLOR", "COLORTERM"):
        monkeypatch.delenv(name, raising=False)
    env = {"TERM": "dumb", "TTY_COMPATIBLE": "1", "COLUMNS": "30", **({"LINES": lines} if lines else {})}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    table = Table("000000", "00000000", "00000000000")
    ours, theirs = _Stream(tty), _Stream(tty)
    monkeypatch.setattr("sys.stdout", ours)
    Console().print(table)
    monkeypatch.setattr("sys.stdout", theirs)
    Console().real().print(table.rich())
    assert ours.getvalue() == theirs.getvalue()


def _outcome(act: Any, obj: object) -> str:
    """'ok', or the error rich raised (bad markup is rich's to refuse, the same way on both paths)."""
    try:
        act(obj)
    except Exception as e:
        return type(e).__name__
    return "ok"


def test_the_common_outputs_take_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table("ID", "NAME", "SUBMITTED", "WHERE / WHY")
    table.add_row("1", "train", "2026-11-25 15:28:41", "node0:0,1")
    table.add_row("2", "eval", "2026-11-25 15:29:02", "exit code 0")
    for obj in (table, "submitted job 3 (x): queued", "  state:      succeeded — exit code 0"):
        printed, plain = _ours(monkeypatch, obj)
        assert plain and printed == _rich(obj.rich() if isinstance(obj, Table) else obj), obj
    printed, plain = _ours(monkeypatch, "[red]error:[/red] x")  # markup: rich's job
    assert not plain and printed == "error: x\n"
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "120")
    ours, theirs = _Stream(tty=True), _Stream(tty=True)
    monkeypatch.setattr("sys.stdout", ours)
    console = Console()
    console.print(table)  # an interactive `gpucluster jobs`: a bold header, without rich
    monkeypatch.setattr("sys.stdout", theirs)
    Console().real().print(table.rich())
    assert console._rich is None and ours.getvalue() == theirs.getvalue() and "\x1b[1m" in ours.getvalue()


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


def test_no_wire_field_reads_as_a_dict_method() -> None:
    """The CLI reads the head's JSON as Views, dicts whose keys read as attributes; a field named
    like a dict method (`items`, `keys`, `get`...) would read as the method instead."""
    from pydantic import BaseModel

    from gpucluster import models
    from gpucluster.auth import wire

    shadowed = set(dir(dict))
    for module in (models, wire):
        for model in vars(module).values():
            if isinstance(model, type) and issubclass(model, BaseModel):
                assert not shadowed & set(model.model_fields), (model.__name__, shadowed & set(model.model_fields))
    view = View({"items": 1, "team": "t"})
    assert view.team == "t" and view["items"] == 1


# ---- the CLI's HTTP/1.1 reader, against a real socket server with canned answers ---------------


def _serve(
    answers: list[bytes], close_after_each: bool = False, closed: threading.Semaphore | None = None
) -> tuple[str, list[bytes]]:
    """A one-thread TCP server answering each request (read up to its blank line) with the next
    canned answer; closing the connection after each when asked (a head that drops keep-alive),
    and releasing `closed` once it has."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def run() -> None:
        with server:
            while answers:
                conn, _ = server.accept()
                with conn, conn.makefile("rb") as reader:
                    while answers:
                        request = b"".join(iter(lambda: reader.readline(), b"\r\n"))
                        if not request:
                            break
                        seen.append(request)
                        conn.sendall(answers.pop(0))
                        if close_after_each:
                            break
                if closed is not None:
                    closed.release()

    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    threading.Thread(target=run, daemon=True).start()
    return url, seen


def test_the_http_reader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpucluster.clientbase import ApiError, ClusterUnreachable

    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.setenv("GPUCLUSTER_TOKEN", "gc_t")
    ok = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"jobs": 1}'
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab\xc3\xa9\r\n3\r\ncd\n\r\n0\r\n\r\n"
    refused = b'HTTP/1.1 403 Forbidden\r\nContent-Length: 20\r\n\r\n{"error": "not you"}'
    closed = threading.Semaphore(0)
    url, seen = _serve([ok, chunked, refused], close_after_each=True, closed=closed)  # one connection each
    with Head(url) as h:
        assert h.json("GET", "/v1/jobs", {"state": ["a", "b"]}).jobs == 1
        assert closed.acquire(timeout=60)  # the head dropped keep-alive (generous: a busy machine)
        assert h.request("GET", "/v1/jobs/1/logs") == "abécd\n"  # found closed before sending: reconnected
        assert closed.acquire(timeout=60)
        with pytest.raises(ApiError, match="not you"):  # a POST, so only a close found before sending
            h.json("POST", "/v1/jobs/1/cancel")
    assert seen[0].startswith(b"GET /v1/jobs?state=a&state=b HTTP/1.1\r\n") and b"Authorization: Bearer gc_t" in seen[0]
    assert b"Content-Length: 0" in seen[2]

    url, _ = _serve([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\xc3\r\n2\r\n\xa9\n\r\n0\r\n\r\n"])
    with Head(url) as h:
        assert list(h.stream("/v1/jobs/1/logs", {"follow": True})) == ["ab", "é\n"]  # a character split by chunks

    url, _ = _serve([b"SSH-2.0-OpenSSH\r\n\r\n"])
    with Head(url) as h, pytest.raises(ClusterUnreachable, match="RemoteProtocolError"):
        h.request("GET", "/v1/jobs")
    with socket.create_server(("127.0.0.1", 0)) as gone:
        closed = f"http://127.0.0.1:{gone.getsockname()[1]}"
    with Head(closed) as h, pytest.raises(ClusterUnreachable, match=r"\(ConnectError\); is `gpucluster up` running"):
        h.request("GET", "/v1/jobs")
