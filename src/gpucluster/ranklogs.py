"""Every rank's output in one stream, each line prefixed `[rank N] `, as torchrun's `--tee`
with `--local-ranks-filter` unset shows it: shared by the API (all ranks at once) and the CLI
(`gpucluster logs --all-ranks --follow`, one follow per rank, lines as they come)."""

from __future__ import annotations


def prefix_lines(text: str, prefix: str) -> str:
    """`text` with `prefix` before each line, ending with a newline (a last partial line too)."""
    if not text:
        return ""
    lines = text.splitlines(keepends=True)
    out = "".join(prefix + line for line in lines)
    return out if out.endswith("\n") else out + "\n"


class LinePrefixer:
    """Prefixes a stream that arrives in chunks: only whole lines go out, a partial line waits
    for its end (so two ranks' lines never mix on one line), and `flush` gives what is left."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._partial = ""

    def feed(self, chunk: str) -> str:
        text = self._partial + chunk
        head, sep, self._partial = text.rpartition("\n")
        return prefix_lines(head + sep, self.prefix) if sep else ""

    def flush(self) -> str:
        rest, self._partial = self._partial, ""
        return prefix_lines(rest, self.prefix)
