"""YAML documents that remember the line of every key and list item.

Why: a planning team edits cluster specs by hand; "node_groups[2].count: must be at least 1" is
only useful with the file and line in front of it, the way job files report errors
(`gpucluster.jobfile`). PyYAML's safe_load drops positions, so the document is composed once
(`gpucluster.yamlfile`, shared with job and policy files, which keeps them) and converted here
into plain data plus a line for every key path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpucluster.sim.errors import SimInputError
from gpucluster.yamlfile import YamlFileError, compose_file, construct

Path_ = tuple[str | int, ...]
MAX_SPEC_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Located:
    """A parsed document plus the 1-based line of each key path, to point errors at."""

    source: Path
    data: Any
    lines: dict[Path_, int]

    def where(self, path: Path_) -> str:
        """`file:line` of the nearest enclosing key that has a line."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(path[:cut])
            if line is not None:
                return f"{self.source}:{line}"
        return str(self.source)

    def error(self, path: Path_, message: str) -> SimInputError:
        return SimInputError(f"{self.where(path)}: {dotted(path)}{': ' if path else ''}{message}")


def dotted(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def load(path: Path) -> Located:
    """Read and parse `path`; unreadable files and YAML syntax errors become SimInputError."""
    try:
        node = compose_file(path, "cluster spec", MAX_SPEC_BYTES)
    except YamlFileError as e:
        raise SimInputError(str(e)) from None
    lines: dict[Path_, int] = {}
    data = _convert(node, (), lines) if node is not None else None
    return Located(path, data, lines)


def _convert(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            lines[(*path, key)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, (*path, key), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), lines) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    return construct(node)
