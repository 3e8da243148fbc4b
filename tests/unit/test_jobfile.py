"""jobfile.read_job_file + spec_from_fields: errors name the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.jobfile import MAX_JOB_FILE_BYTES, JobFileError, read_job_file, spec_from_fields


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def load(path: Path) -> object:
    return spec_from_fields(read_job_file(path), path)


def error(path: Path) -> str:
    with pytest.raises(JobFileError) as e:
        load(path)
    return str(e.value)


def test_a_valid_job_file(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "name: train\n"
        "command: [python, train.py, --lr, '0.1']\n"
        "gpus: 4\n"
        "gpu_type: H100\n"
        "priority: high\n"
        "time_limit: 1h30m\n"
        "env:\n"
        "  SEED: '7'\n"
        "workdir: /data/run\n",
    )
    s = spec_from_fields(read_job_file(p), p)
    assert s.name == "train"
    assert s.command == ["python", "train.py", "--lr", "0.1"]
    assert s.gpu_count == 4 and s.gpu_type == "H100" and s.priority == "high"
    assert s.time_limit == 5400.0
    assert s.env == {"SEED": "7"}
    assert s.workdir == "/data/run"


def test_read_keeps_positions_and_spec_from_fields_consumes_them(tmp_path: Path) -> None:
    p = write(tmp_path, "# a comment\n\ncommand: [run.sh]\ngpus: 2\n")
    fields = read_job_file(p)
    assert spec_from_fields(dict(fields), p).gpu_count == 2
    assert "__node__" not in spec_from_fields(fields, p).model_dump()
    bad = read_job_file(write(tmp_path, "# a comment\n\ncommand: [run.sh]\ngpus: -1\n"))
    with pytest.raises(JobFileError, match=r":4: gpus"):
        spec_from_fields(bad, p)


def test_overrides_merged_before_validation(tmp_path: Path) -> None:
    p = write(tmp_path, "command: [run.sh]\ngpus: 1.5\n")
    fields = read_job_file(p)
    fields["gpus"] = 2  # e.g. a CLI flag that overrides the file
    assert spec_from_fields(fields, p).gpu_count == 2


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("command: [python, train.py]\ngpus: 2\n  bad: indent\n", ":3:6:"),
        ("command: [python, train.py\ngpus: 2\n", ":2:"),
        ("command: [run.sh]\n\tgpus: 2\n", ":2:1:"),
        ("command: [run.sh]\n---\ncommand: [false]\n", ":2:1:"),
    ],
)
def test_malformed_yaml_reports_file_line_col(tmp_path: Path, text: str, where: str) -> None:
    p = write(tmp_path, text)
    msg = error(p)
    assert msg.startswith(f"{p}{where}"), msg
    assert "not valid YAML" in msg


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("command: [python]\nname: ok\ngpus: 1.5\n", 3, "gpus", "whole number"),
        ("command: [python]\n\n\ntime_limit: forever\n", 4, "time_limit", "cannot read duration"),
        ("gpus: 1\ncommand: [python]\nenv:\n  GPUCLUSTER_JOB_ID: '3'\n", 3, "env", "set by the cluster"),
        ("command: [python]\nworkdir: data\n", 2, "workdir", "absolute path"),
        ("command: [python]\ngpus: 1\ngpu: 2\n", 3, "gpu", "unknown field; did you mean gpus?"),
        ("command: []\n", 1, "command", "command is empty"),
    ],
)
def test_a_wrong_field_reports_the_line_of_its_key(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    p = write(tmp_path, text)
    msg = error(p)
    assert msg.startswith(f"{p}:{line}: {field}"), msg
    assert words in msg


def test_every_wrong_field_is_reported(tmp_path: Path) -> None:
    p = write(tmp_path, "command: [python]\ngpus: -1\npriority: urgent\n")
    lines = error(p).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{p}:2: gpus")
    assert lines[1].startswith(f"{p}:3: priority")


def test_a_whole_spec_error_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "command: [echo, hi]\nshell: true\n")
    msg = error(p)
    assert msg.startswith(f"{p}: ")
    assert "single command line" in msg


def test_string_command_without_shell_is_refused_with_a_hint(tmp_path: Path) -> None:
    p = write(tmp_path, "name: x\ngpus: 1\ncommand: python train.py\n")
    with pytest.raises(JobFileError) as e:
        read_job_file(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:3: command:")
    assert "[python, train.py]" in msg
    assert "shell: true" in msg


def test_string_command_with_shell_becomes_one_command_line(tmp_path: Path) -> None:
    p = write(tmp_path, "command: echo hi && sleep 1\nshell: true\n")
    s = spec_from_fields(read_job_file(p), p)
    assert s.command == ["echo hi && sleep 1"]
    assert s.argv == ["/bin/sh", "-c", "echo hi && sleep 1"]


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just a string\n", "str"), ("", "NoneType")])
def test_a_job_file_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(JobFileError, match=f"not {kind}$"):
        read_job_file(p)


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.yaml"
    with pytest.raises(JobFileError, match="cannot read job file"):
        read_job_file(p)


def test_oversized_file(tmp_path: Path) -> None:
    p = write(tmp_path, "command: [run.sh]\n# " + "x" * MAX_JOB_FILE_BYTES + "\n")
    with pytest.raises(JobFileError, match="larger than"):
        read_job_file(p)


def test_without_a_source_errors_still_name_the_field() -> None:
    with pytest.raises(JobFileError) as e:
        spec_from_fields({"command": ["x"], "gpus": -1})
    assert str(e.value) == "gpus: gpus must be at least 1, a share of one GPU, or 0 for a CPU-only job"


def test_infinite_gpus_in_a_job_file_is_a_job_file_error(tmp_path: Path) -> None:
    p = write(tmp_path, "command: [run.sh]\ngpus: .inf\n")
    assert error(p).startswith(f"{p}:2: gpus")


def test_numbers_in_a_command_list_become_arguments_but_booleans_must_be_quoted(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text("command: [python, train.py, --epochs, 10, --lr, 0.5]\n")
    assert spec_from_fields(read_job_file(ok), ok).command == ["python", "train.py", "--epochs", "10", "--lr", "0.5"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [python, train.py, --flag, true]\n")
    with pytest.raises(JobFileError, match=r"bad.yaml:1: command.3"):
        spec_from_fields(read_job_file(bad), bad)


def test_a_cpu_only_job_file(tmp_path: Path) -> None:
    """`gpus: 0` with `cpus:`/`mem:` is a CPU-only job (issue 26); without them, one error naming both."""
    p = write(tmp_path, "command: [python, etl.py]\ngpus: 0\ncpus: 4\nmem: 8GiB\n")
    s = spec_from_fields(read_job_file(p), p)
    assert s.cpu_only and (s.cpus, s.mem_mb) == (4, 8192)
    msg = error(write(tmp_path, "command: [python]\ngpus: 0\n", "bare.yaml"))
    assert "gpus 0 is a CPU-only job: ask for CPU cores (cpus, --cpus 4) and/or host memory" in msg, msg
