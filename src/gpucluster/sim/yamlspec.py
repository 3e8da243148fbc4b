"""YAML documents that remember the line of every key and list item.

Why: a planning team edits cluster specs by hand; "node_groups[2].count: must be at least 1" is
only useful with the file and line in front of it, the way job files report errors
(`gpucluster.jobfile`). PyYAML's safe_load drops positions, so the document is composed once
(`gpucluster.yamlfile`, shared with job and policy files, which keeps them) and converted here
into plain data plus a line for every key path.
"""

from __future__ import annotations

import copy
import itertools
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


def lay_over(data: Any, overrides: tuple[tuple[Path_, Any], ...], source: Path, prefix: str = "") -> dict[Any, Any]:
    """A copy of the mapping `data` with each (key path, value) of `overrides` set: what
    `--sweep KEY=...` lays over a cluster spec (or, `prefix` "policy.", a policy file) before the
    file's own loader validates it. Missing mappings on the way are created (the loader then
    refuses a key it does not know, naming it); a list item must exist. Errors name the swept key
    as written (`prefix` + the path)."""
    out: dict[Any, Any] = copy.deepcopy(data) if isinstance(data, dict) else {}
    for path, value in overrides:
        swept = prefix + dotted(path)
        node: Any = out
        for k, (part, nxt) in enumerate(itertools.pairwise(path)):
            if isinstance(node, list) and not (isinstance(part, int) and part < len(node)):
                raise SimInputError(
                    f"--sweep {swept}: no such item: {dotted(path[:k]) or 'the file'} has {len(node)} "
                    f"item(s) in {source}, numbered from 0"
                )
            child = node[part] if isinstance(node, list) and isinstance(part, int) else None
            if isinstance(node, dict):
                child = node.get(part)
                if child is None:
                    child = node[part] = [] if isinstance(nxt, int) else {}
            if not isinstance(child, dict | list):
                raise SimInputError(f"--sweep {swept}: {dotted(path[: k + 1])} is not a mapping or list in {source}")
            node = child
        last = path[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last >= len(node):
                raise SimInputError(
                    f"--sweep {swept}: no such item: {dotted(path[:-1])} has {len(node)} item(s) in "
                    f"{source}, numbered from 0"
                )
            node[last] = value
        elif isinstance(last, int):
            raise SimInputError(f"--sweep {swept}: {dotted(path[:-1])} is not a list in {source}")
        else:
            node[last] = value
    return out
