"""Job files (YAML) -> JobSpec, with errors that name the file, the line and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpucluster.models import JobSpec

MAX_JOB_FILE_BYTES = 1024 * 1024


class JobFileError(ValueError):
    pass


def _key_lines(text: str) -> dict[str, int]:
    """1-based line of each top-level key, to point validation errors at the right line."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def read_job_file(path: Path) -> dict[str, Any]:
    """The raw fields of a job file; validation happens once all overrides are merged."""
    try:
        if path.stat().st_size > MAX_JOB_FILE_BYTES:
            raise JobFileError(f"{path}: job file is larger than {MAX_JOB_FILE_BYTES} bytes")
        text = path.read_text()
    except OSError as e:
        raise JobFileError(f"{path}: cannot read job file: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise JobFileError(f"{path}{where}: not valid YAML: {e.problem}") from None
    except yaml.YAMLError as e:
        raise JobFileError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise JobFileError(f"{path}: a job file is a mapping of fields (command, gpus, ...), not {type(data).__name__}")
    if isinstance(data.get("command"), str) and not data.get("shell"):
        line = _key_lines(text).get("command", 0)
        raise JobFileError(
            f"{path}:{line}: command: give a list of arguments, e.g. [python, train.py], "
            "or set shell: true to run the string through /bin/sh"
        )
    if isinstance(data.get("command"), str):
        data["command"] = [data["command"]]
    elif isinstance(data.get("command"), list):
        # YAML reads `--epochs, 10` as a number; an argv is text. true/false stay an error:
        # their spelling in the file is lost, so the user must quote them.
        data["command"] = [
            str(a) if isinstance(a, int | float) and not isinstance(a, bool) else a for a in data["command"]
        ]
    data["__lines__"] = _key_lines(text)
    return data


def spec_from_fields(fields: dict[str, Any], source: Path | None = None) -> JobSpec:
    lines: dict[str, int] = fields.pop("__lines__", {})
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "job"
            top = str(err["loc"][0]) if err["loc"] else ""
            where = f"{source}:{lines[top]}: " if source and top in lines else (f"{source}: " if source else "")
            problems.append(f"{where}{field}: {str(err['msg']).removeprefix('Value error, ')}")
        raise JobFileError("\n".join(problems)) from None
