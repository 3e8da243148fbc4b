"""models.JobSpec: what a submission may say, and the words used to refuse it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gpucluster.models import MAX_GPUS_PER_JOB, MAX_TIME_LIMIT_S, JobSpec


def make(**fields: Any) -> JobSpec:
    fields.setdefault("command", ["python", "train.py"])
    return JobSpec.model_validate(fields)


def refused(**fields: Any) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        make(**fields)
    return e.value


def test_defaults() -> None:
    s = make()
    assert s.gpus == 1 and s.gpu_count == 1
    assert s.gpu_type is None and s.name is None
    assert s.team == "default" and s.priority == "normal"
    assert s.time_limit is None and s.env == {} and s.workdir is None and s.shell is False
    assert s.argv == ["python", "train.py"]


# ---- gpus --------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 8.0, "4", MAX_GPUS_PER_JOB])
def test_whole_gpu_counts_are_accepted(gpus: Any) -> None:
    s = make(gpus=gpus)
    assert s.gpu_count == int(float(gpus))
    assert float(s.gpu_count).is_integer()  # a whole count (a float since fractions exist)
    assert not s.fractional


@pytest.mark.parametrize("gpus", [0.01, 0.25, 0.5, "0.75", 0.999])
def test_a_share_of_one_gpu_is_accepted(gpus: Any) -> None:
    s = make(gpus=gpus)
    assert s.gpu_count == float(gpus)
    assert s.fractional


@pytest.mark.parametrize(
    ("gpus", "words"),
    [
        (-1, "at least 1"),
        (-0.5, "at least 1"),
        (float("nan"), "at least 1"),
        (float("-inf"), "at least 1"),
        (0.005, "at least 0.01"),
        (0.0099, "at least 0.01"),
        (1.5, "whole number"),
        (2.25, "whole number"),
        (MAX_GPUS_PER_JOB + 1, f"at most {MAX_GPUS_PER_JOB}"),
        (1e300, f"at most {MAX_GPUS_PER_JOB}"),
        ("two", "valid number"),
        (None, "valid number"),
    ],
)
def test_bad_gpu_counts_are_refused(gpus: Any, words: str) -> None:
    err = refused(gpus=gpus)
    assert err.errors()[0]["loc"] == ("gpus",)
    assert words in str(err)


def test_gpus_0_is_a_cpu_only_job_that_must_ask_for_cpus_or_memory() -> None:
    """Issue 26: `gpus: 0` with CPUs and/or memory is a CPU-only job (no GPU, no fraction); without
    either it is refused naming both, and with a GPU option naming the option."""
    for host in ({"cpus": 4}, {"mem": "8GiB"}, {"cpus": 1, "mem": 512}):
        spec = JobSpec(command=["x"], gpus=0, **host)
        assert spec.cpu_only and not spec.fractional and spec.gpu_count == 0 and spec.gpus_label == "0"
    assert "gpus 0 is a CPU-only job: ask for CPU cores" in str(refused(gpus=0))
    for extra, name in (
        ({"gpu_type": "H100"}, "gpu_type"),
        ({"gpu_memory": "1GiB"}, "gpu_memory"),
        ({"nodes": 2}, "nodes"),
        ({"per_gpu": True}, "per_gpu"),
        ({"exclusive": True}, "exclusive"),
    ):
        assert f"leave out {name}" in str(refused(gpus=0, cpus=1, **extra)), extra


@pytest.mark.parametrize("gpus", [float("inf"), "inf", "Infinity"])
def test_infinite_gpus_are_refused_with_a_validation_error(gpus: Any) -> None:
    err = refused(gpus=gpus)
    assert err.errors()[0]["loc"] == ("gpus",)


# ---- GPU type, memory, nodes -------------------------------------------------------------------


def test_gpu_type_is_one_model_or_a_preference_list() -> None:
    assert make().gpu_types == ()
    assert make(gpu_type="H100").gpu_types == ("H100",)
    assert make(gpu_type=["H100", "A100"]).gpu_types == ("H100", "A100")


@pytest.mark.parametrize("gpu_type", [[], [""], ["  "], ["x" * 65], [f"M{i}" for i in range(17)]])
def test_bad_gpu_type_lists_are_refused(gpu_type: Any) -> None:
    assert refused(gpu_type=gpu_type).errors()[0]["loc"] == ("gpu_type",)


@pytest.mark.parametrize(
    ("given", "mb"), [("10GiB", 10240), ("10G", 10240), ("16384MiB", 16384), ("512M", 512), (2048, 2048)]
)
def test_gpu_memory_forms(given: Any, mb: int) -> None:
    s = make(gpu_memory=given, min_gpu_memory=given)
    assert s.gpu_memory_mb == mb and s.min_gpu_memory_mb == mb
    assert s.fractional  # a memory share is a fraction of one GPU
    assert not make(min_gpu_memory=given).fractional  # a minimum only filters GPUs


@pytest.mark.parametrize("given", ["ten gigs", "100TB", "10PB", "0GiB", -1, 0, "99999999GiB"])
def test_bad_gpu_memory_is_refused(given: Any) -> None:
    assert refused(gpu_memory=given).errors()[0]["loc"] == ("gpu_memory",)
    assert refused(min_gpu_memory=given).errors()[0]["loc"] == ("min_gpu_memory",)


def test_gpu_memory_with_several_gpus_is_refused() -> None:
    assert "cannot be combined" in str(refused(gpus=2, gpu_memory="10GiB"))
    assert make(gpus=1, gpu_memory="10GiB").fractional


def test_nodes_split_whole_gpus_evenly() -> None:
    assert make(gpus=16, nodes=2).nodes == 2
    assert "divide evenly" in str(refused(gpus=4, nodes=3))
    assert "whole GPUs" in str(refused(gpus=0.5, nodes=1))
    assert "whole GPUs" in str(refused(gpu_memory="1GiB", nodes=1))
    assert refused(nodes=0).errors()[0]["loc"] == ("nodes",)


# ---- command -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], [""], ["   "], ["", "train.py"]])
def test_empty_command_is_refused(command: list[str]) -> None:
    assert "command is empty" in str(refused(command=command))


def test_command_must_be_a_list() -> None:
    err = refused(command="python train.py")
    assert err.errors()[0]["loc"] == ("command",)


def test_command_with_nul_byte_is_refused() -> None:
    assert "NUL" in str(refused(command=["python", "a\x00b"]))


def test_overlong_argument_is_refused() -> None:
    assert "longer than" in str(refused(command=["echo", "x" * 65537]))
    assert make(command=["echo", "x" * 65536]).command[1] == "x" * 65536


def test_shell_with_one_command_line() -> None:
    s = make(command=["echo hi | tee out"], shell=True)
    assert s.argv == ["/bin/sh", "-c", "echo hi | tee out"]


def test_shell_with_several_args_is_refused() -> None:
    err = refused(command=["echo", "hi"], shell=True)
    assert "single command line" in str(err)


# ---- env ---------------------------------------------------------------------------------------


def test_valid_env() -> None:
    assert make(env={"SEED": "1", "_x9": "", "NCCL_DEBUG": "INFO"}).env["SEED"] == "1"


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "É", "A=B", "PATH\x00"])
def test_bad_env_names_are_refused(name: str) -> None:
    err = refused(env={name: "1"})
    assert "is not valid" in str(err)


def test_env_name_with_trailing_newline_is_refused() -> None:
    refused(env={"FOO\n": "1"})


@pytest.mark.parametrize(
    "name",
    ["GPUCLUSTER_JOB_ID", "GPUCLUSTER_ANYTHING", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"],
)
def test_reserved_env_names_are_refused(name: str) -> None:
    assert "set by the cluster" in str(refused(env={name: "0"}))


def test_env_value_limits() -> None:
    assert "NUL" in str(refused(env={"A": "x\x00y"}))
    assert "too long" in str(refused(env={"A": "x" * 32769}))
    assert "at most 512" in str(refused(env={f"V{i}": "" for i in range(513)}))


# ---- workdir, names, priority, unknown fields --------------------------------------------------


@pytest.mark.parametrize("workdir", ["data/run", "./x", "~/x", ""])
def test_relative_workdir_is_refused(workdir: str) -> None:
    assert "absolute path" in str(refused(workdir=workdir))


def test_absolute_workdir_is_kept() -> None:
    assert make(workdir="/data/run").workdir == "/data/run"


@pytest.mark.parametrize("name", ["my job", "-x", "", "a/b", "x" * 129])
def test_bad_names_are_refused(name: str) -> None:
    assert refused(name=name).errors()[0]["loc"] == ("name",)
    assert refused(team=name).errors()[0]["loc"] == ("team",)


def test_priority_must_be_known() -> None:
    assert make(priority="high").priority == "high"
    assert make(priority="critical").priority == "critical"
    assert refused(priority="urgent").errors()[0]["loc"] == ("priority",)


@pytest.mark.parametrize("field", ["gpu", "time-limit", "node", "timelimit", "gpu-type", "memory"])
def test_unknown_fields_are_refused(field: str) -> None:
    err = refused(**{field: 1})
    assert err.errors()[0]["loc"] == (field,)
    assert err.errors()[0]["type"] == "extra_forbidden"


# ---- time_limit --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (60, 60.0),
        (1.0, 1.0),
        ("45", 45.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        (" 2H ", 7200.0),
        ("366d", float(MAX_TIME_LIMIT_S)),
        (MAX_TIME_LIMIT_S, float(MAX_TIME_LIMIT_S)),
    ],
)
def test_time_limit_forms(given: Any, seconds: float) -> None:
    s = make(time_limit=given)
    assert s.time_limit == seconds
    assert isinstance(s.time_limit, float)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (0, "between 1s and 366d"),
        ("0s", "between 1s and 366d"),
        (-5, "between 1s and 366d"),
        (float("nan"), "between 1s and 366d"),
        (float("inf"), "between 1s and 366d"),
        (MAX_TIME_LIMIT_S + 1, "between 1s and 366d"),
        ("367d", "between 1s and 366d"),
        ("ten minutes", "cannot read duration"),
        ("1h 30m", "cannot read duration"),
        ("-5m", "cannot read duration"),
        ("", "cannot read duration"),
    ],
)
def test_bad_time_limits_are_refused(given: Any, words: str) -> None:
    err = refused(time_limit=given)
    assert err.errors()[0]["loc"] == ("time_limit",)
    assert words in str(err)


def test_time_limit_below_one_second_is_refused() -> None:
    refused(time_limit=0.5)


def test_spec_round_trips_through_json_like_the_store_does() -> None:
    s = make(time_limit="1h30m", env={"A": "1"}, gpus=2, gpu_type="H100", name="n", priority="low", workdir="/w")
    again = JobSpec.model_validate_json(s.model_dump_json())
    assert again == s
    assert again.time_limit == 5400.0
    assert json.loads(s.model_dump_json())["time_limit"] == 5400.0
