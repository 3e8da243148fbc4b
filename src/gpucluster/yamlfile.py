"""YAML files users write (job files, policies, cluster specs): parse errors and validation errors
that name the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpucluster.errors import GpuclusterError

if TYPE_CHECKING:  # pydantic is imported where a file is validated: `gpucluster submit` without
    # a job file, and one the head accepts, never needs it (issue 19)
    from pydantic import BaseModel, ValidationError

MAX_FILE_BYTES = 1024 * 1024


class YamlFileError(ValueError, GpuclusterError):
    pass


def read_yaml(path: Path, what: str) -> tuple[Any, yaml.Node | None]:
    """The parsed document and its node tree (for line numbers); errors say file:line:col."""
    node = compose_file(path, what)
    return (construct(node) if node is not None else None), node


def compose_file(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> yaml.Node | None:
    """The YAML node tree of `path` (None for an empty file), which keeps every line number.

    Reading, size limit and syntax errors live here once, for every YAML file users write.
    """
    try:
        if path.stat().st_size > max_bytes:
            raise YamlFileError(f"{path}: {what} is larger than {max_bytes} bytes; is this the right file?")
        text = path.read_text()
    except OSError as e:
        raise YamlFileError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise YamlFileError(f"{path}: {what} is not a text file") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise YamlFileError(f"{path}{where}: not valid YAML: {e.problem}") from None
    except yaml.YAMLError as e:
        raise YamlFileError(f"{path}: not valid YAML: {e}") from None
    if node is not None:
        _check_tags(node, path, what)
    return node


def _check_tags(root: yaml.Node, path: Path, what: str) -> None:
    """Refuse tags the safe loader does not build (`!!python/object/apply:os.system`, `!custom`)
    with the file and line, here where every reader passes, rather than as a constructor's
    traceback later: nothing but plain YAML values ever belongs in these files."""
    known = yaml.SafeLoader.yaml_constructors
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # an alias shares its anchor's node
            continue
        seen.add(id(node))
        if node.tag not in known:
            mark = node.start_mark
            raise YamlFileError(
                f"{path}:{mark.line + 1}:{mark.column + 1}: {what} has the tag {node.tag!r}, which is not "
                "allowed: only plain YAML values (text, numbers, true/false, lists, mappings)"
            )
        if isinstance(node, yaml.MappingNode):
            stack.extend(x for kv in node.value for x in kv)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def construct(node: yaml.Node) -> Any:
    """Python values of a composed node, with YAML's own typing of scalars (safe types only)."""
    return yaml.SafeLoader(stream="").construct_document(node)


def line_of(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest node on `loc` that exists in the document."""
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(
                (kv for kv in node.value if isinstance(kv[0], yaml.ScalarNode) and kv[0].value == str(key)), None
            )
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


def validation_message(err: ValidationError, source: Path | None, node: yaml.Node | None) -> str:
    problems = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        field = ".".join(str(p) for p in loc) or "file"
        line = line_of(node, loc)
        where = f"{source}:{line}: " if source and line else (f"{source}: " if source else "")
        problems.append(f"{where}{field}: {str(e['msg']).removeprefix('Value error, ')}")
    return "\n".join(problems)


def validate(model: type[BaseModel], data: Any, source: Path | None, node: yaml.Node | None) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise YamlFileError(validation_message(e, source, node)) from None
