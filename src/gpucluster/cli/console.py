"""The CLI's consoles and tables: rich's output, without importing rich where plain text is the same.

Why: importing rich costs ~25 ms of CPU per command (issue 19: a read command answers within
150 ms), and for the common case, a pipe (`watch`, loops, grep) and plain ASCII text, rich prints
exactly what `print` would: no colour, no wrapping (lines up to 250 columns), and a `box=None`
table is its cells padded to their column's width with one space each side. So `Console.print`
and `Table` write that text themselves when rich would write the same bytes, and hand over to
rich (imported then) for everything else: a terminal, colour forced by the environment, markup
(`[red]`), emoji codes (`:smile:`), non-ASCII or control characters, a table wider than the
line. tests/unit/test_cli_console.py checks the two agree on generated text.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

PIPE_WIDTH = 250  # a pipe gets full-width lines: wrapped table cells are unreadable to grep and to people

# What rich would change in a string: markup tags, emoji codes (`:name:` with no space inside;
# a time's `:28:` is none) and anything outside printable ASCII (wide characters, tabs, controls).
_PLAIN = re.compile(r"[ -~]*")
_EMOJI_LIKE = re.compile(r":(\S*?):")
_NOT_AN_EMOJI = re.compile(r"[0-9]{0,2}")
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"


def _terminal_width() -> int:
    """The width rich gives a terminal: the first of stdin, stdout, stderr that has a size, with
    $COLUMNS over it, else 80."""
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    columns = _digits("COLUMNS")
    if columns is not None:
        width = columns
    return width or 80


def _digits(name: str) -> int | None:
    """An environment variable's number, as rich reads $COLUMNS and $LINES (digits only)."""
    value = os.environ.get(name)
    return int(value) if value is not None and value.isdigit() else None


def _rich_width(isatty: bool, dumb: bool) -> int:
    """The width `Console.real()` prints at, as rich's Console.size works it out: the width it
    was given (the pipe's, or $COLUMNS on a terminal) where $LINES is set too, even on a dumb
    terminal; else 80 on a dumb terminal; else the width given, or the terminal's."""
    given = _digits("COLUMNS") if isatty else PIPE_WIDTH
    if given is not None and _digits("LINES") is not None:
        return given
    if dumb:
        return 80
    return given if given is not None else _terminal_width()


def _plain_text(text: str, markup: bool, ascii_only: bool = True) -> bool:
    """rich prints `text` unchanged: no markup, no emoji code, nothing it measures or strips (a table
    cell must be ASCII to have its width in characters; a line only printable)."""
    if not (_PLAIN.fullmatch(text) if ascii_only else text.isprintable()) or (markup and "[" in text):
        return False
    return all(_NOT_AN_EMOJI.fullmatch(m.group(1)) for m in _EMOJI_LIKE.finditer(text))


class Table:
    """rich.table.Table(*headers, box=None), as the CLI uses it: header cells, then rows of text."""

    def __init__(self, *headers: str, box: None = None) -> None:
        self.headers = list(headers)
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def plain_lines(self, width: int, bold_header: bool = False) -> list[str] | None:
        """The lines rich prints for this table at `width` (its header bold on a terminal), or None
        when rich would do more."""
        if any(len(r) != len(self.headers) for r in self.rows) or not all(self.headers):
            return None
        cells = [self.headers, *self.rows]
        if not all(_plain_text(c, markup=True) for row in cells for c in row):
            return None
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        if sum(widths) + 2 * len(widths) > width:
            return None  # rich would wrap or squeeze columns
        lines = ["".join(f" {c.ljust(w)} " for c, w in zip(row, widths, strict=True)) for row in cells]
        if bold_header:  # rich's "table.header" style, one SGR run per padding and per text
            lines[0] = "".join(f"{_BOLD} {_RESET}{_BOLD}{h.ljust(w)}{_RESET}{_BOLD} {_RESET}"
                               for h, w in zip(self.headers, widths, strict=True))  # fmt: skip
        return lines

    def rich(self) -> Any:
        from rich.table import Table as RichTable

        table = RichTable(*self.headers, box=None)
        for row in self.rows:
            table.add_row(*row)
        return table


class Console:
    """rich.console.Console(highlight=False, soft_wrap=True), created at the first print that needs it."""

    def __init__(self, stderr: bool = False) -> None:
        self.stderr = stderr
        self._rich: Any = None

    @property
    def file(self) -> Any:
        return sys.stderr if self.stderr else sys.stdout

    def _isatty(self) -> bool:
        isatty = getattr(self.file, "isatty", None)
        try:
            return isatty is not None and bool(isatty())
        except ValueError:  # a closed stream
            return False

    def _plain(self, obj: object, markup: bool) -> list[str] | None:
        """The lines rich would print for `obj` on stdout, when they are plain text (but a bold
        table header), or None. Decided as rich decides: a terminal (TTY_COMPATIBLE, else
        FORCE_COLOR, else isatty) gets escape codes unless TERM is dumb; the width is rich's
        (`_rich_width`)."""
        if isinstance(obj, str):  # unstyled text: no escape codes, even on a terminal; never wrapped
            return [obj] if _plain_text(obj.replace("\n", " "), markup, ascii_only=False) else None
        if not isinstance(obj, Table):
            return None
        env, isatty = os.environ, self._isatty()
        compatible = env.get("TTY_COMPATIBLE", "")
        if compatible in ("0", "1"):
            terminal = compatible == "1"
        elif "FORCE_COLOR" in env:
            terminal = env["FORCE_COLOR"] != ""
        else:
            terminal = isatty
        dumb = terminal and env.get("TERM", "").lower() in ("dumb", "unknown")
        return obj.plain_lines(_rich_width(isatty, dumb), bold_header=terminal and not dumb)

    def print(self, *objects: Any, markup: bool = True, **kwargs: Any) -> None:
        if len(objects) == 1 and set(kwargs) <= {"highlight", "soft_wrap"} and not self.stderr:
            lines = self._plain(objects[0], markup)
            if lines is not None:
                self.file.write("".join(line + "\n" for line in lines))
                self.file.flush()  # as rich does: what follows on stderr comes after it
                return
        objects = tuple(o.rich() if isinstance(o, Table) else o for o in objects)
        self.real().print(*objects, markup=markup, **kwargs)

    def real(self) -> Any:
        """The rich Console, built on first use with the settings the CLI always had."""
        if self._rich is None:
            from rich.console import Console as RichConsole

            if self.stderr:  # soft wrap: a file:line must stay on one line
                self._rich = RichConsole(stderr=True, highlight=False, soft_wrap=True)
            else:
                width = None if sys.stdout.isatty() else PIPE_WIDTH
                self._rich = RichConsole(highlight=False, soft_wrap=True, width=width)
        return self._rich


def escape(text: str) -> str:
    """rich.markup.escape, imported only when markup is printed."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
