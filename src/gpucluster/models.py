"""The wire format: pydantic models shared by the HTTP API, the typed client, the CLI and the SDK.

Validation of user input lives here once, so the API, job files and the SDK reject the same
things with the same words. Field limits keep one request from exhausting the head.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from gpucluster import containers, labels
from gpucluster.clientbase import DEFAULT_QUEUE_PAGE as DEFAULT_QUEUE_PAGE
from gpucluster.core.arrays import (
    MAX_ARRAY_ELEMENTS,
    ArraySpec,
    ArraySyntaxError,
    check_size,
    parse_array,
    parse_sweep,
)
from gpucluster.core.selection import Selection, label_error, parse_constraint, selection_of
from gpucluster.core.states import JobState
from gpucluster.durations import parse_duration
from gpucluster.sizes import parse_mib

# The largest training runs use 16,000+ GPUs (Llama 3) and planners simulate 100,000-GPU
# clusters: the bound only catches typos, not real jobs.
MAX_GPUS_PER_JOB = 131_072
MAX_NODES_PER_JOB = 16_384
MAX_CPUS_PER_JOB = 1_048_576
MAX_RESTARTS = 1000
MAX_SQL_INT = 2**63 - 1  # the largest integer the store can hold (SQLite INTEGER, PostgreSQL BIGINT)
GPU_RANGE = re.compile(r"\s*(\d+)\s*\.\.\s*(\d+)\s*")
MAX_TIME_LIMIT_S = 366 * 86400
MAX_COMMAND_ARGS = 4096
MAX_ARG_BYTES = 65536
MAX_ENV_VARS = 512
MAX_ENV_VALUE = 32768
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_METRICS = 32
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_DEPENDENCIES = 1000
MAX_SELECTED_NODES = 1024  # names in a job's nodelist or exclude
MAX_NODE_LABELS = 64
DependencyId = Annotated[int, Field(ge=1, le=2**63 - 1)]
RESERVED_ENV_PREFIXES = ("GPUCLUSTER_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

PriorityName = Literal["low", "normal", "high", "serving", "critical"]


def parse_memory_mb(value: str | int | float) -> int:
    """'80GiB' / '16384MiB' / a number of MiB -> MiB (sizes.py: the one size parser)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        mb = float(value)
    else:
        try:
            mb = float(parse_mib(str(value)))
        except ValueError:
            raise ValueError(f"cannot read memory size {value!r}; use e.g. 10GiB or 16384MiB") from None
    if math.isnan(mb) or mb <= 0 or mb > 16 * 1024 * 1024:
        raise ValueError(f"memory size {value!r} is out of range")
    return int(mb)


def check_cpus(v: float | None) -> float | None:
    """A CPU count as a job may ask for it: above 0, at most MAX_CPUS_PER_JOB, in hundredths."""
    if v is None:
        return None
    if math.isnan(v) or v < 0.01:
        raise ValueError(f"cpus must be at least 0.01 (got {v}); leave it out for the policy's default")
    if v > MAX_CPUS_PER_JOB:
        raise ValueError(f"cpus must be at most {MAX_CPUS_PER_JOB} (got {v:g})")
    return round(v, 2)


def unstorable(value: object) -> str | None:
    """What makes text unstorable, or None: a lone surrogate (JSON's "\\ud800" reads as one, and
    no UTF-8 encoder, the store's or a log's, can write it) or a NUL byte (no argv, environment
    or path can hold one). Looked for in strings, and in the items of lists and values of dicts
    (the only dict, `env`, checks its names itself, with the rule for names)."""
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character (\\u0000), which cannot be stored or passed to a process"
        try:
            value.encode()
        except UnicodeEncodeError as e:
            return (
                f"contains a lone surrogate ({value[e.start]!r} at character {e.start}), which is not text "
                "and cannot be stored; send valid Unicode (a pair of surrogates makes one character)"
            )
        return None
    if isinstance(value, dict):
        items: list[object] = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return None
    for item in items:
        problem = unstorable(item)
        if problem is not None:
            return problem
    return None


class Model(BaseModel):
    """Every wire model's base: its validator is built at its first use, not at import.

    Why: the CLI imports these ~40 models on every command and uses two or three of them;
    building all their schemas up front cost ~30 ms of CPU per command (issue 19).
    """

    model_config = ConfigDict(defer_build=True)


class StorableText(Model):
    """Refuses, at the field, text the head could not store (see `unstorable`): one bad
    submission is a 422 naming its field, never a failed commit for it and the others batched
    with it."""

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, v: object) -> object:
        problem = unstorable(v)
        if problem is not None:
            raise ValueError(problem)
        return v


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]

# What the validators below accept, said in the OpenAPI document too (JSON Schema keywords apply
# only to values of their type: `pattern` to the string form of a field, `minimum` to its number).
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?|(\d+(\.\d+)?[dhmsDHMS])+)\s*$"
_MEMORY_SCHEMA: JsonDict = {
    "minimum": 1,
    "maximum": 16 * 1024 * 1024,
    "pattern": r"^\s*\d+(\.\d+)?\s*([KkMmGgTt]([Ii]?[Bb])?|[Bb])?\s*$",  # sizes.py
}
_GPU_TYPE: JsonDict = {"minLength": 1, "maxLength": 64, "pattern": r"\S"}


def _not_a_bool(v: object) -> object:
    """A number field given true/false is refused: pydantic would read it as 1/0 GPUs or seconds.
    One rule for a submit (JobSpec) and a change (JobUpdate), which validate the same fields."""
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


class JobSpec(StorableText):
    """What a user submits. Unknown fields are rejected so a typo never silently does nothing."""

    model_config = ConfigDict(
        extra="forbid",
        # Shown in /docs, and sent as is by API fuzzers (tests/fuzz): one submission known to be valid.
        json_schema_extra={"examples": [{"command": ["python", "train.py"], "gpus": 1, "name": "train"}]},
    )

    command: list[str] = Field(
        ...,
        description="argv list, run without a shell; with shell=true a single shell command line",
        max_length=MAX_COMMAND_ARGS,
        json_schema_extra={"minItems": 1},
    )
    gpus: float = Field(
        1,
        description="whole GPUs (1 or more), a share of one GPU (0 < gpus < 1), or 0: a CPU-only job, "
        "which must ask for cpus and/or mem",
        json_schema_extra={"minimum": 0, "maximum": MAX_GPUS_PER_JOB},
    )
    gpu_type: str | list[str] | None = Field(
        None,
        description="GPU model (e.g. H100-80GB), or a list of acceptable models, most preferred first",
        json_schema_extra={
            **_GPU_TYPE,
            "minItems": 1,
            "maxItems": 16,
            "items": {"type": "string", **_GPU_TYPE},
        },
    )
    gpu_memory: str | int | None = Field(
        None,
        description="share one GPU by memory, e.g. 10GiB (a number means MiB); implies a fraction",
        json_schema_extra=_MEMORY_SCHEMA,
    )
    min_gpu_memory: str | int | None = Field(
        None, description="only GPUs with at least this much memory", json_schema_extra=_MEMORY_SCHEMA
    )
    nodes: int | None = Field(
        None, ge=1, le=MAX_NODES_PER_JOB, description="spread over exactly this many nodes, evenly"
    )
    # ---- node selection (issue 16; README "Choosing nodes") ----
    nodelist: list[Name] | None = Field(
        None,
        max_length=MAX_SELECTED_NODES,
        description="run only on these nodes (sbatch --nodelist); a list, or one comma-separated string",
        json_schema_extra={"minItems": 1},
    )
    exclude: list[Name] = Field(
        default_factory=list,
        max_length=MAX_SELECTED_NODES,
        description="never run on these nodes (sbatch --exclude); a list, or one comma-separated string",
    )
    constraint: str | None = Field(
        None,
        max_length=1024,
        description="node labels its nodes must have (sbatch --constraint): a label (ib) or key=value "
        "(rack=r1); A&B all of, A|B any of (& binds tighter)",
        json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9._/:=&| -]*$"},
    )
    exclusive: bool = Field(
        False, description="its nodes run no other job while it runs, and it starts only on idle nodes"
    )
    # ---- host resources (issue 16; README "CPUs and host memory") ----
    cpus: float | None = Field(
        None,
        description="CPU cores in all, split over its nodes like its GPUs (sbatch --cpus-per-gpu x gpus); "
        "left out: the policy's cpus_per_gpu x gpus",
        json_schema_extra={"minimum": 0.01, "maximum": MAX_CPUS_PER_JOB},
    )
    mem: str | int | None = Field(
        None,
        description="host memory in all, e.g. 64G or 512MiB (a number means MiB), split like its GPUs; "
        "left out: the policy's mem_per_gpu x gpus",
        json_schema_extra=_MEMORY_SCHEMA,
    )
    name: Name | None = None
    team: Name = "default"
    priority: PriorityName = "normal"
    time_limit: float | str | None = Field(
        None,
        description="seconds, or a duration such as 90s, 30m, 2h, 1h30m, 1d",
        json_schema_extra={"minimum": 1, "maximum": MAX_TIME_LIMIT_S, "pattern": DURATION_PATTERN},
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={"maxProperties": MAX_ENV_VARS, "propertyNames": {"pattern": f"^{ENV_NAME.pattern}$"}},
    )
    exported_env: dict[str, str] | None = Field(
        None,
        description="the submitter's environment (sbatch --export=ALL), sent by the CLI and SDK: under `env` "
        "(which wins) and the cluster's variables; shown only to the job's owner and cluster admins",
        json_schema_extra={"maxProperties": MAX_ENV_VARS, "propertyNames": {"pattern": f"^{ENV_NAME.pattern}$"}},
    )
    workdir: str | None = Field(None, max_length=4096, description="absolute path", json_schema_extra={"pattern": "^/"})
    shell: bool = Field(False, description="run command[0] through /bin/sh -c")
    min_gpus: int | None = Field(
        None,
        ge=1,
        le=MAX_GPUS_PER_JOB,
        description="elastic: start on as few as this many GPUs when `gpus` are not free "
        "(the largest size that fits now is used); `gpus: 4..8` says the same",
    )
    per_gpu: bool = Field(
        False,
        description="run one process per GPU with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, "
        "MASTER_ADDR, MASTER_PORT, ...)",
    )
    launcher: Literal["torchrun"] | None = Field(
        None, description="run one launcher per node (torchrun with --nnodes/--node-rank/... filled in)"
    )
    max_restarts: int = Field(
        0, ge=0, le=MAX_RESTARTS, description="after a failure, restart the job up to this many times, with backoff"
    )
    begin: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="do not start before this Unix time (sbatch --begin); the CLI and job files also read "
        "22:00, now+2h or 2026-11-26T08:00 in the submitter's zone",
    )
    image: str | None = Field(
        None,
        max_length=1024,
        description="run the command in this container image (podman on the node): a registry reference "
        "(python:3.11, ghcr.io/org/img:tag) or a local archive (docker-archive:/abs/env.tar, oci-archive:/abs/env.tar)",
    )
    mounts: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="with image: SRC:DST[:ro] bind mounts (absolute paths; SRC under the policy's containers: "
        "mount_roots:); the workdir and the checkpoint dir are mounted at their own paths anyway",
    )
    interactive: bool = Field(
        False,
        description="an interactive session (`gpucluster run`): the command runs on a terminal that the owner "
        "attaches to through the head; one process, never restarted, subject to the policy's `interactive:` class",
    )
    max_cost: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="stop the job (failed) before its cost over all its attempts would exceed this much money "
        "(prices per GPU-hour are the head's)",
    )

    # ---- holds, dependencies, arrays and sweeps (issue 20; README "Sweeps and pipelines") ----
    hold: bool = Field(False, description="submit held: it never starts until `gpucluster release`")
    after: list[DependencyId] = Field(
        default_factory=list, max_length=MAX_DEPENDENCIES, description="start once these jobs (or arrays) have started"
    )
    afterok: list[DependencyId] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="start once these jobs (or every element of these arrays) succeeded; cancelled if one cannot",
    )
    afternotok: list[DependencyId] = Field(
        default_factory=list, max_length=MAX_DEPENDENCIES, description="start once these jobs failed or were cancelled"
    )
    afterany: list[DependencyId] = Field(
        default_factory=list, max_length=MAX_DEPENDENCIES, description="start once these jobs ended, however"
    )
    aftercorr: DependencyId | None = Field(
        None, description="an array's element i starts once element i of this array succeeded"
    )
    array: str | None = Field(
        None,
        max_length=1024,
        description="submit an array: indices such as 0-199, 0-99:2 or 1,5,7, and an optional %N throttle "
        "(at most N elements run at once)",
    )
    sweep: dict[str, Any] | None = Field(
        None,
        description="a parameter sweep, as an array: {lr: [0.001, 0.0003], batch: [32, 64]} (every combination), "
        "or with random: N and seed: S (N points drawn); each element gets its values as environment variables "
        "and in {name} placeholders of its command",
    )
    throttle: int | None = Field(None, ge=1, le=1_000_000, description="an array's or sweep's most elements at once")
    allow_large_array: bool = Field(False, description=f"allow an array of more than {MAX_ARRAY_ELEMENTS:,} elements")

    @field_validator("nodelist", "exclude", mode="before")
    @classmethod
    def _node_names(cls, v: object) -> object:
        """`n1,n2` as the CLI and job files may write it -> [n1, n2]."""
        if isinstance(v, str):
            return [n.strip() for n in v.split(",") if n.strip()]
        return v

    @field_validator("nodelist")
    @classmethod
    def _nodelist(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("nodelist is empty; leave it out to run on any node")
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None:
            parse_constraint(v)  # raises ValueError naming the bad label
        return v

    @property
    def selection(self) -> Selection | None:
        """Where it may run (core/selection.py); None: any node, shared."""
        return selection_of(self.nodelist, self.exclude, self.constraint, self.exclusive)

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_array(v)
            except ArraySyntaxError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                parse_sweep(v)
            except ArraySyntaxError as e:
                raise ValueError(str(e)) from None
        return v

    @property
    def array_spec(self) -> ArraySpec | None:
        """The array this spec submits (from `array` or `sweep`), or None for a single job."""
        if self.sweep is not None:
            return ArraySpec(tuple(range(parse_sweep(self.sweep).count)), self.throttle)
        if self.array is not None:
            parsed = parse_array(self.array)
            return ArraySpec(parsed.indices, self.throttle or parsed.throttle)
        return None

    @model_validator(mode="after")
    def _array_consistent(self) -> JobSpec:
        if self.sweep is not None and self.array is not None:
            raise ValueError("a sweep makes its own array; leave out array (set throttle: N to limit it)")
        if self.throttle is not None and self.sweep is None and self.array is None:
            raise ValueError("throttle is for an array or a sweep")
        if self.aftercorr is not None and self.sweep is None and self.array is None:
            raise ValueError("aftercorr is for an array: element i waits for element i of another array")
        shape = self.array_spec
        if shape is not None:
            try:
                check_size(len(shape.indices), self.allow_large_array)
            except ArraySyntaxError as e:
                raise ValueError(str(e)) from None
        return self

    @model_validator(mode="before")
    @classmethod
    def _gpu_range(cls, data: object) -> object:
        """`gpus: "4..8"` -> gpus 8, min_gpus 4."""
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), str):
            return data
        m = GPU_RANGE.fullmatch(data["gpus"])
        if m is None or data.get("min_gpus") is not None:
            return data  # the field validator below says what is wrong, at the field
        return {**data, "gpus": int(m.group(2)), "min_gpus": int(m.group(1))}

    @field_validator("gpus", mode="before")
    @classmethod
    def _not_a_range(cls, v: object) -> object:
        if isinstance(v, str) and ".." in v:
            if GPU_RANGE.fullmatch(v):
                raise ValueError("give either a range (4..8) or min_gpus, not both")
            raise ValueError(f"cannot read the range {v!r}; write MIN..MAX in whole GPUs, e.g. 4..8")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v or not v[0].strip():
            raise ValueError("command is empty; give the program and its arguments")
        for arg in v:
            if len(arg.encode()) > MAX_ARG_BYTES:
                raise ValueError(f"a command argument is longer than {MAX_ARG_BYTES} bytes")
            if "\x00" in arg:
                raise ValueError("command arguments cannot contain NUL bytes")
        return v

    @field_validator("gpus", "time_limit", "cpus", mode="before")
    @classmethod
    def _no_bools(cls, v: object) -> object:
        return _not_a_bool(v)

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, v: float | None) -> float | None:
        return check_cpus(v)

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            try:
                parse_memory_mb(v)
            except ValueError as e:
                raise ValueError(f"{e} (host memory: e.g. 64G, 512M or 16384)") from None
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: float) -> float:
        if v == 0:
            return 0.0  # a CPU-only job: `_consistent` checks it asks for CPUs or memory
        if math.isnan(v) or v < 0:
            raise ValueError("gpus must be at least 1, a share of one GPU, or 0 for a CPU-only job")
        if math.isinf(v):
            raise ValueError(f"gpus must be at most {MAX_GPUS_PER_JOB}")
        if v > 1 and v != int(v):
            raise ValueError(f"gpus above 1 must be a whole number (got {v}); a fraction is for one shared GPU")
        if v < 1 and v < 0.01:
            raise ValueError(f"a GPU share must be at least 0.01 (got {v})")
        if v > MAX_GPUS_PER_JOB:
            raise ValueError(f"gpus must be at most {MAX_GPUS_PER_JOB} (got {int(v)})")
        return v

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if isinstance(v, list) and not v:
            raise ValueError("gpu_type list is empty; leave it out to accept any GPU")
        if len(items) > 16 or any(not t.strip() or len(t) > 64 for t in items):
            raise ValueError("gpu_type names are 1-64 characters, at most 16 of them")
        return v

    @field_validator("gpu_memory", "min_gpu_memory")
    @classmethod
    def _memory(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            parse_memory_mb(v)
        return v

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, v: float | str | None) -> float | None:
        if v is None:
            return None
        seconds = parse_duration(v) if isinstance(v, str) else float(v)
        if math.isnan(seconds) or seconds < 1 or seconds > MAX_TIME_LIMIT_S:
            raise ValueError(f"time_limit must be between 1s and {MAX_TIME_LIMIT_S // 86400}d")
        return seconds

    @field_validator("exported_env")
    @classmethod
    def _exported_env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return None if v is None else cls._env(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"at most {MAX_ENV_VARS} environment variables")
        for key, value in v.items():
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"environment variable name {key!r} is not valid (A-Z, 0-9, _)")
            if key.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"environment variable {key} is set by the cluster")
            if len(value) > MAX_ENV_VALUE or "\x00" in value:
                raise ValueError(f"environment variable {key} is too long or has a NUL byte")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else containers.check_image(v)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        return [str(m) for m in containers.check_mounts(v)]

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"workdir must be an absolute path (got {v!r})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.shell and len(self.command) != 1:
            raise ValueError("with shell=true, command must be a single command line")
        if self.gpus == 0:
            self._check_cpu_only()
        if self.gpu_memory is not None and self.gpus > 1:
            raise ValueError("gpu_memory shares one GPU; it cannot be combined with gpus above 1")
        if self.nodes is not None:
            if self.gpus < 1 or self.gpu_memory is not None:
                raise ValueError("nodes needs whole GPUs")
            if int(self.gpus) % self.nodes:
                raise ValueError(f"gpus ({int(self.gpus)}) must divide evenly over nodes ({self.nodes})")
        if self.min_gpus is not None:
            if self.fractional:
                raise ValueError("an elastic GPU range (min_gpus) needs whole GPUs")
            if self.min_gpus > self.gpus:
                raise ValueError(f"min_gpus ({self.min_gpus}) must be at most gpus ({int(self.gpus)})")
            if self.nodes is not None:
                raise ValueError("an elastic GPU range (min_gpus) cannot be combined with nodes")
            if self.min_gpus == self.gpus:
                self.min_gpus = None
        if self.per_gpu and self.launcher is not None:
            raise ValueError("per_gpu and launcher are two ways to start a distributed job; choose one")
        if (self.per_gpu or self.launcher is not None) and self.fractional:
            raise ValueError("per_gpu and launcher need whole GPUs (one process per GPU)")
        both = sorted(set(self.nodelist or ()) & set(self.exclude))
        if both:
            raise ValueError(f"node {both[0]} is both in nodelist and in exclude; name it in one")
        if self.exclusive and self.fractional:
            raise ValueError("exclusive holds whole nodes; it needs whole GPUs (gpus 1 or more, no gpu_memory)")
        if self.mounts and self.image is None:
            raise ValueError("mounts are for a container job; give an image too (--image)")
        if self.launcher is not None and self.shell:
            raise ValueError("launcher runs the command under torchrun; it cannot be combined with shell")
        if self.interactive:
            if self.distributed or (self.nodes or 1) > 1 or self.min_gpus is not None:
                raise ValueError(
                    "an interactive session is one process on one node: no per_gpu, launcher, "
                    "nodes above 1 or GPU range"
                )
            if self.max_restarts:
                raise ValueError("an interactive session is never restarted: leave max_restarts out")
        return self

    def _check_cpu_only(self) -> None:
        """A CPU-only job (gpus 0) asks for CPUs or host memory, and for nothing about GPUs."""
        if not self.cpus and not self.mem_mb:
            raise ValueError(
                "gpus 0 is a CPU-only job: ask for CPU cores (cpus, --cpus 4) and/or host memory (mem, --mem 8GiB)"
            )
        gpu_only = {
            "gpu_type": self.gpu_type is not None,
            "gpu_memory": self.gpu_memory is not None,
            "min_gpu_memory": self.min_gpu_memory is not None,
            "nodes": (self.nodes or 1) > 1,
            "min_gpus": self.min_gpus is not None,
            "per_gpu": self.per_gpu,
            "launcher": self.launcher is not None,
            "exclusive": self.exclusive,
        }
        asked = [name for name, given in gpu_only.items() if given]
        if asked:
            raise ValueError(f"a CPU-only job (gpus 0) runs on one node without GPUs: leave out {', '.join(asked)}")

    @property
    def cpu_only(self) -> bool:
        """Asks for no GPU: placed by its CPUs and host memory alone."""
        return self.gpus == 0

    @property
    def kind(self) -> str:
        """What sort of work: `batch`, or `session` (interactive); stored in jobs.kind."""
        return "session" if self.interactive else "batch"

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return labels.gpu_types(self.gpu_type)

    @property
    def fractional(self) -> bool:
        return 0 < self.gpus < 1 or self.gpu_memory is not None

    @property
    def gpu_memory_mb(self) -> int | None:
        return None if self.gpu_memory is None else parse_memory_mb(self.gpu_memory)

    @property
    def min_gpu_memory_mb(self) -> int | None:
        return None if self.min_gpu_memory is None else parse_memory_mb(self.min_gpu_memory)

    @property
    def mem_mb(self) -> int | None:
        """Host memory asked for in all (MiB); None: the policy's default."""
        return None if self.mem is None else parse_memory_mb(self.mem)

    @property
    def gpu_count(self) -> float:
        """GPUs the job holds: a whole number, or its share of one GPU."""
        return labels.gpu_count(self.gpus, self.gpu_memory)

    @property
    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command[0]] if self.shell else list(self.command)

    @property
    def gpus_label(self) -> str:
        """'2', '0.25', or '4..8' for an elastic job."""
        return labels.gpus_label(self.gpus, self.min_gpus, self.gpu_memory)

    @property
    def distributed(self) -> bool:
        """Several processes per attempt (one per GPU, or one launcher per node)."""
        return self.per_gpu or self.launcher is not None


class SliceOut(Model):
    node: str
    gpu_indices: list[int]
    share: float = 1.0
    memory_mb: int | None = None
    cpus: float = 0.0  # CPU cores it holds on this node (its request's part here)
    host_memory_mb: int = 0  # host memory it holds on this node, MiB


class JobEvent(Model):
    at: float
    state: JobState
    reason: str


class ProgressIn(Model):
    """What a running job reports (POST /v1/jobs/{id}/progress), e.g. from gpucluster.train."""

    model_config = ConfigDict(extra="ignore")  # newer reporters may send more

    step: int | None = Field(None, ge=0, le=MAX_SQL_INT, description="the training step reached")
    checkpoint_at: float | None = Field(None, ge=0, description="Unix time of the newest complete checkpoint")
    checkpoint_step: int | None = Field(None, ge=0, le=MAX_SQL_INT, description="the step the newest checkpoint holds")
    # Its load, for virtual GPUs' synthetic telemetry (real GPUs are read through NVML).
    gpu_utilization: float | None = Field(None, ge=0, le=100, description="percent of its GPUs it keeps busy")
    gpu_memory_mb: float | None = Field(None, ge=0, le=1e9, description="MiB of GPU memory used on each of its GPUs")
    # What the script reports (gpucluster.train.report): stored per attempt, charted, on /metrics.
    metrics: dict[str, float] | None = Field(
        None,
        description=f"training metrics at `metrics_step`, e.g. {{'loss': 0.31, 'accuracy': 0.97}} "
        f"(at most {MAX_METRICS}, names of letters, digits and _)",
        json_schema_extra={"maxProperties": MAX_METRICS, "propertyNames": {"pattern": f"^{METRIC_NAME.pattern}$"}},
    )
    metrics_step: int | None = Field(None, ge=0, le=MAX_SQL_INT, description="the step the metrics are of")

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return None
        if len(v) > MAX_METRICS:
            raise ValueError(f"at most {MAX_METRICS} metrics per report")
        for name, value in v.items():
            if not METRIC_NAME.fullmatch(name):
                raise ValueError(
                    f"metric name {name!r} is not valid (a letter or _, then letters, digits, _; 64 at most)"
                )
            if not math.isfinite(value):
                raise ValueError(f"metric {name} must be a finite number")
        return v

    @field_validator("checkpoint_at")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("checkpoint_at must be a finite Unix time")
        return v


class Progress(Model):
    step: int | None = None
    reported_at: float | None = None  # when the head last heard from the job
    checkpoint_at: float | None = None
    checkpoint_step: int | None = None


class Attempt(Model):
    """One run of a job: every start is a new attempt (after a preemption, requeue or failure)."""

    attempt: int
    started_at: float | None = None
    ended_at: float | None = None  # None while it runs
    allocation: list[SliceOut] = Field(default_factory=list)
    gpus: float = 0  # GPUs it ran on (an elastic job's size as launched)
    outcome: str = "running"  # running, succeeded, failed, preempted, cancelled, not_started
    reason: str = ""
    exit_codes: list[int | None] = Field(default_factory=list)  # per process (rank); None: lost
    work_lost_s: float | None = None  # time since its last checkpoint (or start) at the interruption
    cpu_s: float | None = None  # CPU seconds of all its processes (their cgroups); None: not measured
    memory_peak_bytes: int | None = None  # peak memory, each process's cgroup's peak summed
    pull_s: float | None = None  # a container job's image pull (the longest rank's); None: no pull


class JobFlagOut(Model):
    flag: str  # idle
    since: float
    message: str


class GpuUseOut(Model):
    """One GPU of a running job, as telemetry last read it."""

    node: str
    gpu: int
    utilization: float | None = None  # percent, the whole GPU's
    memory_mb: float | None = None  # the job's own processes on it, where attributable
    at: float


class MetricSeries(Model):
    """One metric of one attempt as the script reported it, oldest first."""

    attempt: int
    name: str
    steps: list[int | None]
    at: list[float]
    reported: list[float]  # the values, in report order (not `values`: the CLI reads wire objects as dicts)


class ExpectedRun(Model):
    """How long a queued or running job is expected to run, learned from similar finished jobs
    (core/runtime_predict.py); what its estimates plan with. Never above its time limit."""

    seconds: float  # the median of similar jobs' run times (the time limit when none are known)
    low_s: float  # 10% of similar jobs ran less
    high_s: float  # 10% ran more (never above the time limit)
    samples: int  # similar finished jobs it comes from; 0: no history, the time limit
    basis: str  # which similarity answered: "same user and workload", ..., or "time limit"
    sentence: str  # "expected to run ~2 h 10 m (from 37 similar jobs: same user and workload)"


class Job(Model):
    id: int
    name: str
    state: JobState
    spec: JobSpec
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    wait_reason: str | None = None  # why a queued job waits, as a code; `reason` has the sentence
    # The same wait with its numbers: {"code": wait_reason, "gpus": 8, "free": 3, "reserved_at": ...}
    # (core/reasons.py WaitFacts: times in epoch seconds, memory in MiB), for programs.
    wait: dict[str, Any] | None = None
    estimated_start: float | None = None
    # 80% interval around estimated_start: run times drawn from similar finished jobs (issue 24)
    start_low: float | None = None
    start_high: float | None = None
    attempt: int = 0
    allocation: list[SliceOut] = Field(default_factory=list)
    events: list[JobEvent] = Field(default_factory=list)
    restarts: int = 0  # restarts after failures so far (of spec.max_restarts)
    not_before: float | None = None  # a queued restart waits out its backoff until then
    progress: Progress | None = None
    attempts: list[Attempt] = Field(default_factory=list)  # filled by GET /v1/jobs/{id}, as events
    owner: str | None = None  # the user who submitted it (jobs from before identities: none)
    kind: str = "batch"  # batch, or session (interactive: `gpucluster run`, `attach`, `forward`)
    flags: list[JobFlagOut] = Field(default_factory=list)  # telemetry's findings (idle), in GET /v1/jobs/{id}
    gpu_usage: list[GpuUseOut] = Field(default_factory=list)  # its GPUs now, in GET /v1/jobs/{id}
    # Seconds its ended attempts ran, summed; a running job's current attempt adds the time since
    # started_at. Not ended_at - started_at: that counts a requeued job's wait in the queue.
    ran_s: float = 0
    metrics: list[MetricSeries] = Field(default_factory=list)  # gpucluster.train.report's, in GET /v1/jobs/{id}
    held: bool = False  # held by its user: never started until released
    array_id: int | None = None  # an array's element: the array's id (its first element's job id)
    array_index: int | None = None
    # In a collapsed listing (GET /v1/jobs?collapse=true) an array is one entry, its first
    # element, with every element counted by state here; also on a submitted array's answer.
    array_counts: dict[str, int] | None = None
    expected_run: ExpectedRun | None = None  # a queued or running job's, in GET /v1/jobs/{id}


class DryRunOut(Model):
    """Where and when a job would start if submitted now (`POST /v1/jobs/dry-run`); nothing is
    queued or written. Planned on the head's last view with the same scheduler and estimates."""

    starts_now: bool
    estimated_start: float | None = None
    start_low: float | None = None
    start_high: float | None = None
    allocation: list[SliceOut] = Field(default_factory=list)  # where, when it would start now
    expected_run: ExpectedRun | None = None
    wait_reason: str | None = None
    wait: dict[str, Any] | None = None  # as Job.wait
    reason: str = ""  # why it would wait
    # `POST /v1/jobs/{id}/what-if`: the job's own estimated start now, to compare with
    current_start: float | None = None


class HoldOut(Model):
    """What a hold or release changed (queued jobs only): how many, and which (listed for a job
    or an element; not for a whole array, which may have 100,000)."""

    count: int = 0
    changed: list[int] = Field(default_factory=list)


class PipelineJob(Model):
    """One job (or array, by its id) of a pipeline, as the dashboard draws it."""

    id: int
    name: str
    state: JobState
    depth: int  # 0: the job asked about; -1: what it waits for; 1: what waits for it; ...
    array_counts: dict[str, int] | None = None  # an array: its elements by state
    started_at: float | None = None
    ended_at: float | None = None
    expected_start: float | None = None  # while it waits: its estimated start (through the chain)
    expected_end: float | None = None  # while it waits or runs: its start plus its time limit


class PipelineEdge(Model):
    source: int  # the job (or array) waited for
    target: int  # the job (or array) that waits
    kind: str  # after, afterok, afternotok, afterany, aftercorr


class PipelineOut(Model):
    """The chain of jobs before and after one job: what it waits for and what waits for it,
    through dependencies, only of teams the caller may see; `truncated` past MAX_PIPELINE_JOBS."""

    jobs: list[PipelineJob] = Field(default_factory=list)
    edges: list[PipelineEdge] = Field(default_factory=list)
    truncated: bool = False


class ArrayUpdate(Model):
    model_config = ConfigDict(extra="forbid")
    throttle: int | None = Field(..., ge=1, le=1_000_000, description="most elements at once; null: no limit")


class JobUpdate(StorableText):
    """A change to a queued job (or a running job's time limit): `gpucluster update`.

    Why so loose here: the head merges these fields into the job's stored spec and validates the
    result as a whole `JobSpec`, so a change is refused by the very rules (and words) a submit
    is. A field sent as null goes back to the submit default (no begin time, no time limit, any
    GPU type); a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"priority": "low", "time_limit": "2h"}]})

    priority: PriorityName | None = None
    time_limit: float | str | None = Field(
        None,
        description="seconds, or a duration such as 30m or 2h; a running job's owner or team admin may only "
        "shorten it (a cluster admin may set any)",
        json_schema_extra={"minimum": 1, "maximum": MAX_TIME_LIMIT_S, "pattern": DURATION_PATTERN},
    )
    gpus: float | str | None = Field(
        None,
        description="as at submit: whole GPUs, a share of one, or a range 4..8",
        json_schema_extra={"minimum": 0.01},
    )
    gpu_type: str | list[str] | None = Field(
        None,
        description="GPU model, or a list of acceptable models, most preferred first",
        json_schema_extra={**_GPU_TYPE, "minItems": 1, "maxItems": 16, "items": {"type": "string", **_GPU_TYPE}},
    )
    name: Name | None = None
    begin: float | None = Field(None, ge=0, allow_inf_nan=False, description="do not start before this Unix time")
    nodes: int | None = Field(None, ge=1, le=MAX_NODES_PER_JOB, description="spread over exactly this many nodes")
    cpus: float | None = Field(None, description="CPU cores in all", json_schema_extra={"minimum": 0.01})
    mem: str | int | None = Field(None, description="host memory in all, e.g. 64G", json_schema_extra=_MEMORY_SCHEMA)
    max_restarts: int | None = Field(None, ge=0, le=MAX_RESTARTS, description="restart after a failure up to N times")

    @field_validator("gpus", "time_limit", mode="before")
    @classmethod
    def _no_bools(cls, v: object) -> object:
        return _not_a_bool(v)


class JobList(Model):
    jobs: list[Job]
    # With `limit`: how many jobs match the filters in all, for "51-100 of 1,234"; else None.
    total: int | None = None


class GpuOut(Model):
    index: int
    model: str
    memory_mb: int
    uuid: str
    domain: str | None = None
    job_id: int | None = None
    healthy: bool = True
    problem: str | None = None  # why telemetry found it unhealthy
    utilization: float | None = None  # percent, from the latest telemetry
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None


class NodeOut(Model):
    name: str
    virtual: bool
    gpus: list[GpuOut]
    # What jobs select it by (submit --constraint): flags (ib) and key=value pairs (rack=r1).
    labels: list[str] = Field(default_factory=list)
    # Host resources jobs ask for with --cpus/--mem, and what running jobs hold of them now;
    # None: this node does not account them (any request fits).
    cpus: float | None = None
    memory_mb: int | None = None
    cpus_used: float = 0.0
    memory_used_mb: int = 0
    drained: bool = False  # no new jobs go there; running ones go on
    drain_reason: str | None = None
    drained_by: str | None = None  # user or health
    drained_since: float | None = None
    drained_until: float | None = None  # the drain's planned end (drain --until); it ends by itself then
    problem: str | None = None  # a problem of the whole node (it stopped reporting)
    last_report_at: float | None = None  # its latest telemetry
    # Nodes from a Ray cluster (`gpucluster up --ray`) come and go; the local node is always up.
    up: bool = True
    down_reason: str | None = None
    down_since: float | None = None
    address: str | None = None  # where its processes listen (MASTER_ADDR for rank 0 there)


class DrainIn(StorableText):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=500, description="why, shown by `gpucluster nodes`")
    until: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="when the drain ends by itself (Unix time, in the future): waiting jobs' estimates count from it",
    )


class GpuSampleOut(Model):
    """A telemetry sample: covers [at, at + seconds); level 0 raw, 1 minute means, 2 hour means."""

    node: str
    gpu: int
    at: float
    seconds: float
    level: int
    jobs: list[int]
    utilization: float | None = None
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None


class GpuSampleList(Model):
    samples: list[GpuSampleOut]


class NodeList(Model):
    nodes: list[NodeOut]


class ErrorBody(Model):
    error: str
    detail: list[dict[str, object]] = Field(default_factory=list)


class HealthOut(Model):
    """GET /v1/health: 200 when the scheduling loop runs, 503 with the problem when not."""

    status: Literal["ok", "degraded"]
    problem: str | None
    version: str
    jobs: dict[str, int] = Field(description="jobs by state")
    last_cycle_age_s: float | None
    last_decide_s: float | None


class QueueEntry(Model):
    position: int
    job: Job


# The queue is listed from the front, a page at a time: nobody reads 10,000 rows, and building
# them all cost the head a second of CPU per call (bench/bench_load.py).
MAX_QUEUE_PAGE = 100_000


class QueueOut(Model):
    entries: list[QueueEntry]
    # How many queued jobs the caller may see, listed or not (a `limit` lists the front only).
    total: int = 0


class TeamOut(Model):
    name: str
    org: str | None
    weight: float
    share: float
    quota: dict[str, float]
    max_borrow: float | None
    max_lend: float | None
    # What the team used: shown to its members and cluster admins, None to everyone else.
    usage_gpu_hours: float | None
    running_gpus: float | None


class PoolOut(Model):
    """A node pool of the policy: which nodes (by name, or all with these labels) and who may use
    them (None: every team, every class)."""

    name: str
    nodes: list[str]
    labels: list[str]
    teams: list[str] | None
    classes: list[str] | None
    quotas: dict[str, float] = Field(default_factory=dict, description="team -> GPUs it may hold on the pool's nodes")


class GrantOut(Model):
    """Who may submit one priority class above normal (besides cluster admins, who may use all)."""

    teams: list[str]  # every member of these teams
    roles: list[str]  # callers with one of these roles in the team they submit to
    users: list[str]
    holders: str  # the same, in words


class LimitOut(Model):
    """One set of limits on a user's jobs (None: no such limit); see core/limits.py."""

    max_running_gpus: float | None = None
    max_queued_jobs: int | None = None
    max_gpu_hours_in_flight: float | None = None  # GPUs x time limit left, over the user's running jobs


class LimitsOut(Model):
    """The policy's `limits:`: every user's, named users' (over per_user, field by field), and
    each user's per priority class."""

    per_user: LimitOut = Field(default_factory=LimitOut)
    users: dict[str, LimitOut] = Field(default_factory=dict)
    per_class: dict[str, LimitOut] = Field(default_factory=dict)


class OrderingOut(Model):
    """The order inside a team's line (`ordering:`, core/attained.py): `las` (the default) or `age`."""

    mode: str
    queues_gpu_s: list[float]  # attained-service thresholds, GPU-seconds
    promote_after_s: float | None
    preempt: bool  # whether a job may stop one of its class in a later queue (with preemption on)
    min_slice_s: float
    restart_cost_s: float
    runtime_model: str  # none, or gittins
    relearn_every_s: float = 600.0  # gittins: how often queued jobs take in newly finished runs


class PolicyOut(Model):
    source: str
    error: str | None
    preemption: bool
    grace_period_s: float
    min_runtime_s: float
    fair_share: bool
    half_life_s: float
    backfill: bool
    default_time_limit_s: float
    teams: list[TeamOut]
    priority_grants: dict[str, GrantOut] = Field(default_factory=dict)  # high, critical
    mount_roots: list[str] = Field(default_factory=list)  # where a container job's mounts may come from
    limits: LimitsOut = Field(default_factory=LimitsOut)
    pools: list[PoolOut] = Field(default_factory=list)  # nodes only some teams or classes may use
    # What a job that gives no --cpus/--mem gets per GPU (`resources:`); 0: nothing reserved.
    cpus_per_gpu: float = 0.0
    mem_per_gpu_mb: int = 0
    # The order inside a team's line and the starvation age (None: a head from before they were said).
    ordering: OrderingOut | None = None
    starvation_age_s: float | None = None


# ---- accounting (GET /v1/usage, GET /v1/budgets) ----------------------------------------------


class UsageRowOut(Model):
    """One group's use of the cluster in a window: GPU time, money, energy, how well it was used,
    and the work lost to failures and preemption (from the attempts' records)."""

    key: str  # the group: a team, a user, a job id or a GPU model ("total" for the sum)
    team: str | None = None
    user: str | None = None
    job_id: int | None = None
    name: str | None = None  # the job's name, grouping by job
    gpu_model: str | None = None
    gpu_hours: float  # GPU time held, fractions by their share
    # CPU core-hours held (`--cpus`; a CPU-only job's are all it holds: 0 GPU-hours, and no cost,
    # as prices are per GPU-hour)
    cpu_hours: float = 0.0
    cost: float  # money, at the prices per GPU-hour in force as it accrued
    energy_kwh: float  # integrated power of the GPUs held (telemetry), by share
    utilization: float | None  # percent: GPU-seconds used / allocated, where telemetry sampled them
    lost_gpu_hours_failures: float  # work lost (GPU-hours since the last checkpoint) to failed attempts
    lost_gpu_hours_preemption: float  # ... and to preemptions (requeues included)
    attempts: int
    jobs: int
    # Of gpu_hours, those held by interactive sessions, and of those the GPU-hours whose telemetry
    # found the GPUs idle (at or under 1% utilisation): what sessions hoard.
    session_gpu_hours: float = 0.0
    session_idle_gpu_hours: float = 0.0


class UsageOut(Model):
    by: str
    since: float | None
    until: float
    rows: list[UsageRowOut]
    total: UsageRowOut


class UsageSeriesOut(Model):
    """One group's GPU-hours, cost and energy in each bucket of `UsageSeries.buckets`."""

    key: str  # a team, a user, a job id or a GPU model
    gpu_hours: list[float]
    cost: list[float]
    energy_kwh: list[float]


class UsageSeries(Model):
    """Usage over time (GET /v1/usage/series): buckets of `step` seconds aligned on the Unix
    epoch (UTC days for 1d), the first and last clipped to [since, until]."""

    by: str
    since: float
    until: float
    step: float
    buckets: list[float]  # each bucket's start (clipped to since)
    series: list[UsageSeriesOut]  # largest cost over the window first


class BudgetOut(Model):
    team: str
    period: str  # as written in the policy file: 30d, month, ...
    period_start: float
    period_end: float  # when it rolls over and held jobs are released
    money_limit: float | None
    money_spent: float
    gpu_hours_limit: float | None
    gpu_hours_spent: float
    on_exceed: str  # finish | stop: what the team's running jobs do once over
    over: bool
    held: str | None  # why the team's new jobs are held, when over
    held_jobs: int


class BudgetList(Model):
    budgets: list[BudgetOut]


def check_node_labels(values: list[str]) -> list[str]:
    """Node labels as declared (`up --label`, a cluster file, Ray's node labels), checked and
    sorted; ValueError naming the first bad one."""
    if len(values) > MAX_NODE_LABELS:
        raise ValueError(f"at most {MAX_NODE_LABELS} labels per node")
    for v in values:
        why = label_error(v)
        if why is not None:
            raise ValueError(why)
    return sorted(set(values))
