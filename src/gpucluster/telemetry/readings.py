"""What one telemetry sample of a node holds, whatever the source (NVML, synthetic, a report)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcessUse:
    """A process using a GPU, and how much of its memory. `job_id` when the source knows it
    (synthetic readings do); otherwise attribution maps the pid to a job."""

    pid: int | None
    memory_mb: float
    job_id: int | None = None


@dataclass(frozen=True)
class GpuReading:
    index: int
    utilization: float | None = None  # percent, 0-100
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    ecc_uncorrectable: int | None = None  # volatile (since the last driver load); None: not supported
    xids: tuple[int, ...] = ()  # XID events seen since the previous reading
    processes: tuple[ProcessUse, ...] = ()
    error: str | None = None  # this GPU could not be read (NVML error), with why


@dataclass(frozen=True)
class NodeReading:
    node: str
    at: float
    gpus: tuple[GpuReading, ...] = field(default_factory=tuple)
    error: str | None = None  # the whole node could not be read
