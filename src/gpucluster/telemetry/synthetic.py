"""Synthetic telemetry for virtual GPUs: what the jobs on them say they do.

Virtual GPUs have no device to read, so their readings are computed from the jobs holding them:

- A running job may report its load through its progress report
  (`POST /v1/jobs/{id}/progress {"gpu_utilization": 85, "gpu_memory_mb": 30000}`): utilisation
  in percent of its GPUs, memory in MiB used on each of its GPUs. Until it reports, a job counts
  as `default_utilization` percent busy (100: a job is presumed to use what it holds, so virtual
  clusters raise no idle flags by themselves) and as using no GPU memory.
- A GPU's utilisation is the sum over its holders of utilisation x share (a 0.25 share at 100%
  makes 25%), at most 100; its memory is the sum of its holders' memory; each holder with a
  reported memory appears as one process of that job (so the memory-share rule applies).
- Temperature, power and clocks follow utilisation linearly between idle and full-load values
  of an H100 SXM (30-80 C, 60-700 W, SM 345-1980 MHz), so dashboards and energy accounting have
  plausible numbers. No ECC errors or XIDs, ever.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucluster.core.types import Node
from gpucluster.telemetry.readings import GpuReading, NodeReading, ProcessUse

DEFAULT_UTILIZATION = 100.0
IDLE_W, FULL_W = 60.0, 700.0
IDLE_C, FULL_C = 30.0, 80.0
SM_IDLE_MHZ, SM_FULL_MHZ = 345.0, 1980.0
MEM_CLOCK_MHZ = 2619.0


@dataclass(frozen=True)
class JobLoad:
    utilization: float | None  # percent of its GPUs it keeps busy
    memory_mb: float | None  # used on each of its GPUs
    at: float


class LoadBook:
    """The latest load each running job reported; safe to use from the API and the sampler."""

    def __init__(self) -> None:
        self._loads: dict[int, JobLoad] = {}
        self._lock = threading.Lock()

    def report(self, job_id: int, utilization: float | None, memory_mb: float | None, now: float) -> None:
        with self._lock:
            old = self._loads.get(job_id)
            self._loads[job_id] = JobLoad(
                utilization if utilization is not None else (old.utilization if old else None),
                memory_mb if memory_mb is not None else (old.memory_mb if old else None),
                now,
            )

    def get(self, job_id: int) -> JobLoad | None:
        with self._lock:
            return self._loads.get(job_id)

    def keep_only(self, job_ids: set[int]) -> None:
        with self._lock:
            for j in [j for j in self._loads if j not in job_ids]:
                del self._loads[j]


# gpu index -> (job id, share of the GPU) for each job holding it
Holders = Mapping[int, Sequence[tuple[int, float]]]


class SyntheticSource:
    def __init__(self, node: Node, loads: LoadBook, default_utilization: float = DEFAULT_UTILIZATION) -> None:
        self.node = node.name
        self.gpus = node.gpus
        self.loads = loads
        self.default_utilization = default_utilization

    def read(self, now: float, holders: Holders | None = None) -> NodeReading:
        holders = holders or {}
        out = []
        for g in self.gpus:
            util = 0.0
            mem = 0.0
            procs = []
            for job_id, share in holders.get(g.index, ()):
                load = self.loads.get(job_id)
                u = load.utilization if load is not None and load.utilization is not None else self.default_utilization
                util += u * share
                if load is not None and load.memory_mb is not None:
                    mem += load.memory_mb
                    procs.append(ProcessUse(pid=None, memory_mb=load.memory_mb, job_id=job_id))
            util = min(util, 100.0)
            f = util / 100.0
            out.append(
                GpuReading(
                    index=g.index,
                    utilization=util,
                    memory_used_mb=min(mem, float(g.memory_mb)),
                    memory_total_mb=float(g.memory_mb),
                    temperature_c=IDLE_C + (FULL_C - IDLE_C) * f,
                    power_w=IDLE_W + (FULL_W - IDLE_W) * f,
                    sm_clock_mhz=SM_IDLE_MHZ + (SM_FULL_MHZ - SM_IDLE_MHZ) * f,
                    memory_clock_mhz=MEM_CLOCK_MHZ,
                    ecc_uncorrectable=0,
                    processes=tuple(procs),
                )
            )
        return NodeReading(self.node, now, tuple(out))

    def close(self) -> None:
        pass
