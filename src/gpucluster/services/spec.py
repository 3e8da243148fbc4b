"""What a user asks for when they create a service, and what the API answers about one."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from gpucluster.models import JobSpec, Model, Name, PriorityName, StorableText

MAX_REPLICAS = 64
# A service's name: room left for its replicas' job names (`<name>.r<id>`, a job name's 128 chars).
ServiceName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
REPLICA_PORT_BASE = 20000  # replicas listen from here up, unless the spec names a port
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class ServiceSpec(StorableText):
    """A service: the job each replica runs, how many, and how to tell one is ready."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "clf", "command": ["python", "server.py"], "gpus": 1, "replicas": "1..4"}]
        },
    )

    name: ServiceName
    command: list[str] = Field(min_length=1, max_length=4096)
    gpus: float = Field(1, gt=0, le=64, description="GPUs per replica, or a share of one such as 0.25")
    gpu_type: str | list[str] | None = None
    cpus: float | None = Field(None, description="CPU cores per replica [default: the policy's per GPU]")
    mem: str | int | None = Field(None, description="host memory per replica, e.g. 16G [default: the policy's]")
    team: Name = "default"
    # Replicas' class: serving by default, above batch work, so a scale-up goes first in line
    # and may preempt checkpointed training (the policy's `preemption.serving_victims`).
    priority: PriorityName = "serving"
    env: dict[str, str] = Field(default_factory=dict)
    exported_env: dict[str, str] | None = None
    workdir: str | None = Field(None, max_length=4096)
    shell: bool = False
    image: str | None = Field(None, max_length=1024)
    mounts: list[str] = Field(default_factory=list, max_length=64)
    port: int | None = Field(
        None, ge=1024, le=65000, description="the first port the head tries for replicas (each gets its own in $PORT)"
    )
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    readiness: str = Field("/", max_length=1024, description="GET this path; 200-399 means ready")
    startup_timeout_s: float = Field(120.0, gt=0, le=86400, description="a replica not ready by then is replaced")
    target_concurrency: float = Field(
        4.0, gt=0, le=10000, description="in-flight requests per replica the autoscaler aims at"
    )
    target_rps: float | None = Field(
        None, gt=0, le=1e6, description="requests per second per replica; scales on it too (whichever wants more)"
    )
    scale_down_delay_s: float = Field(30.0, ge=0, le=86400, description="low load this long before a scale-down")
    public: bool = Field(False, description="anyone may call it through the gateway, without a token")

    @field_validator("readiness")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be a path starting with /, e.g. /health")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if "PORT" in v:
            raise ValueError("PORT is set by the cluster: each replica gets its own")
        return JobSpec._env(v)  # the jobs' own rules: names, sizes, the cluster's variables

    @model_validator(mode="after")
    def _range(self) -> ServiceSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        try:
            self.replica_job(0, REPLICA_PORT_BASE)  # what a job may not be, a replica may not be: 422 now
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise ValueError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
        return self

    def replica_job(self, replica_id: int, port: int) -> JobSpec:
        """The job one replica runs: the service's command with $PORT set, named `<service>.r<id>`."""
        env = {**self.env, "PORT": str(port)}
        return JobSpec.model_validate(
            dict(
                command=self.command,
                gpus=self.gpus,
                gpu_type=self.gpu_type,
                cpus=self.cpus,
                mem=self.mem,
                name=replica_name(self.name, replica_id),
                team=self.team,
                priority=self.priority,
                env=env,
                exported_env=self.exported_env,
                workdir=self.workdir,
                shell=self.shell,
                image=self.image,
                mounts=self.mounts,
            )
        )


def replica_name(service: str, replica_id: int) -> str:
    return f"{service}.r{replica_id}"


def parse_replicas(text: str) -> tuple[int, int]:
    """`2` or `1..4` (min..max), as the CLI and service files write it."""
    lo, sep, hi = text.strip().partition("..")
    try:
        low = int(lo)
        high = int(hi) if sep else low
    except ValueError:
        raise ValueError(f"replicas {text!r}: write a count such as 2 or a range such as 1..4") from None
    if low < 0 or high < 1 or low > high:
        raise ValueError(f"replicas {text!r}: need 0 <= min <= max and max >= 1")
    return low, high


class ServiceUpdate(StorableText):
    """A rolling update: what changes; replicas are replaced one by one."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(None, min_length=1, max_length=4096)
    image: str | None = Field(None, max_length=1024)
    env: dict[str, str] | None = None
    min_replicas: int | None = Field(None, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)
    public: bool | None = None


ReplicaPhase = Literal["queued", "starting", "ready", "unready", "draining"]


class ReplicaOut(Model):
    id: int
    job_id: int | None
    port: int
    revision: int
    phase: ReplicaPhase
    in_flight: int = 0


class ServiceStats(Model):
    requests: int = 0
    errors: int = 0
    requests_per_s: float = 0.0
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None


class ServiceUsage(Model):
    """What the service's replica jobs have used so far, all replicas ever (issue 23)."""

    gpu_hours: float = 0.0
    cost: float = 0.0  # in the cluster's price units (`prices:` per GPU model)
    energy_kwh: float = 0.0


class ServiceOut(Model):
    name: str
    team: str
    owner: str | None
    state: str
    reason: str
    revision: int
    created_at: float
    spec: ServiceSpec
    desired_replicas: int
    replicas: list[ReplicaOut]
    stats: ServiceStats
    usage: ServiceUsage = ServiceUsage()
    url_path: str


class ServiceList(Model):
    services: list[ServiceOut]
