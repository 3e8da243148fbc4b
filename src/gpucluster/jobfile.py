"""Job files (YAML) -> JobSpec, with errors that name the file, the line and the field."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucluster.yamlfile import MAX_FILE_BYTES, YamlFileError, line_of, read_yaml, validate

if TYPE_CHECKING:
    from gpucluster.models import JobSpec

MAX_JOB_FILE_BYTES = MAX_FILE_BYTES
JobFileError = YamlFileError


def read_job_file(path: Path) -> dict[str, Any]:
    """The raw fields of a job file; validation happens once all overrides are merged."""
    from gpucluster.models import JobSpec  # a job file's field names; only when there is one (issue 19)

    data, node = read_yaml(path, "job file")
    if not isinstance(data, dict):
        raise JobFileError(f"{path}: a job file is a mapping of fields (command, gpus, ...), not {type(data).__name__}")
    unknown = [k for k in data if k not in JobSpec.model_fields]
    if unknown:
        # Before anything else: `comand:` must be named as the typo it is, not reported as
        # "no command given".
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(JobSpec.model_fields), n=1)
        hint = f"did you mean {close[0]}?" if close else f"the fields are {', '.join(JobSpec.model_fields)}"
        raise JobFileError(f"{path}:{line_of(node, [key]) or 0}: {key}: unknown field; {hint}")
    if isinstance(data.get("command"), str) and not data.get("shell"):
        raise JobFileError(
            f"{path}:{line_of(node, ['command']) or 0}: command: give a list of arguments, e.g. [python, train.py], "
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
    data["__node__"] = node
    return data


def spec_from_fields(fields: dict[str, Any], source: Path | None = None) -> JobSpec:
    from gpucluster.models import JobSpec

    node = fields.pop("__node__", None)
    spec: JobSpec = validate(JobSpec, fields, source, node)
    return spec
