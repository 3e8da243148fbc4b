"""The wire format: pydantic models shared by the HTTP API, the typed client, the CLI and the SDK.

Validation of user input lives here once, so the API, job files and the SDK reject the same
things with the same words. Field limits keep one request from exhausting the head.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpucluster.core.states import JobState
from gpucluster.durations import parse_duration

MAX_GPUS_PER_JOB = 4096
MAX_TIME_LIMIT_S = 366 * 86400
MAX_COMMAND_ARGS = 4096
MAX_ARG_BYTES = 65536
MAX_ENV_VARS = 512
MAX_ENV_VALUE = 32768
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("GPUCLUSTER_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

PriorityName = Literal["low", "normal", "high", "critical"]
MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(GiB|GB|G|MiB|MB|M)\s*", re.IGNORECASE)


def parse_memory_mb(value: str | int | float) -> int:
    """'80GiB' / '16384MiB' / a number of MiB -> MiB."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        mb = float(value)
    else:
        m = MEMORY.fullmatch(str(value))
        if not m:
            raise ValueError(f"cannot read memory size {value!r}; use e.g. 10GiB or 16384MiB")
        mb = float(m.group(1)) * (1024 if m.group(2).upper().startswith("G") else 1)
    if math.isnan(mb) or mb <= 0 or mb > 16 * 1024 * 1024:
        raise ValueError(f"memory size {value!r} is out of range")
    return int(mb)


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class JobSpec(BaseModel):
    """What a user submits. Unknown fields are rejected so a typo never silently does nothing."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(
        ...,
        description="argv list, run without a shell; with shell=true a single shell command line",
        max_length=MAX_COMMAND_ARGS,
    )
    gpus: float = Field(1, description="whole GPUs (1 or more), or a share of one GPU (0 < gpus < 1)")
    gpu_type: str | list[str] | None = Field(
        None, description="GPU model (e.g. H100-80GB), or a list of acceptable models, most preferred first"
    )
    gpu_memory: str | int | None = Field(
        None, description="share one GPU by memory, e.g. 10GiB (a number means MiB); implies a fraction"
    )
    min_gpu_memory: str | int | None = Field(None, description="only GPUs with at least this much memory")
    nodes: int | None = Field(None, ge=1, le=1024, description="spread over exactly this many nodes, evenly")
    name: Name | None = None
    team: Name = "default"
    priority: PriorityName = "normal"
    time_limit: float | str | None = Field(None, description="seconds, or a duration such as 90s, 30m, 2h, 1h30m, 1d")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(None, max_length=4096, description="absolute path")
    shell: bool = Field(False, description="run command[0] through /bin/sh -c")

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

    @field_validator("gpus", "time_limit", mode="before")
    @classmethod
    def _no_bools(cls, v: object) -> object:
        if isinstance(v, bool):
            raise ValueError("must be a number, not true/false")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: float) -> float:
        if math.isnan(v) or v <= 0:
            raise ValueError("gpus must be at least 1")
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
        if self.gpu_memory is not None and self.gpus > 1:
            raise ValueError("gpu_memory shares one GPU; it cannot be combined with gpus above 1")
        if self.nodes is not None:
            if self.gpus < 1 or self.gpu_memory is not None:
                raise ValueError("nodes needs whole GPUs")
            if int(self.gpus) % self.nodes:
                raise ValueError(f"gpus ({int(self.gpus)}) must divide evenly over nodes ({self.nodes})")
        return self

    @property
    def gpu_types(self) -> tuple[str, ...]:
        if self.gpu_type is None:
            return ()
        return (self.gpu_type,) if isinstance(self.gpu_type, str) else tuple(self.gpu_type)

    @property
    def fractional(self) -> bool:
        return self.gpus < 1 or self.gpu_memory is not None

    @property
    def gpu_memory_mb(self) -> int | None:
        return None if self.gpu_memory is None else parse_memory_mb(self.gpu_memory)

    @property
    def min_gpu_memory_mb(self) -> int | None:
        return None if self.min_gpu_memory is None else parse_memory_mb(self.min_gpu_memory)

    @property
    def gpu_count(self) -> float:
        """GPUs the job holds: a whole number, or its share of one GPU."""
        return self.gpus if self.fractional else float(int(self.gpus))

    @property
    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command[0]] if self.shell else list(self.command)


class SliceOut(BaseModel):
    node: str
    gpu_indices: list[int]
    share: float = 1.0
    memory_mb: int | None = None


class JobEvent(BaseModel):
    at: float
    state: JobState
    reason: str


class Job(BaseModel):
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
    estimated_start: float | None = None
    attempt: int = 0
    allocation: list[SliceOut] = Field(default_factory=list)
    events: list[JobEvent] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[Job]


class GpuOut(BaseModel):
    index: int
    model: str
    memory_mb: int
    uuid: str
    job_id: int | None = None


class NodeOut(BaseModel):
    name: str
    virtual: bool
    gpus: list[GpuOut]


class NodeList(BaseModel):
    nodes: list[NodeOut]


class ErrorBody(BaseModel):
    error: str
    detail: list[dict[str, object]] = Field(default_factory=list)


class QueueEntry(BaseModel):
    position: int
    job: Job


class QueueOut(BaseModel):
    entries: list[QueueEntry]


class TeamOut(BaseModel):
    name: str
    org: str | None
    weight: float
    share: float
    quota: dict[str, float]
    max_borrow: float | None
    max_lend: float | None
    usage_gpu_hours: float
    running_gpus: float


class PolicyOut(BaseModel):
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
