"""What telemetry adds to the API's answers: node drain state and health, GPU readings, a job's
flags and live GPU use. Reads the store (durable facts) and the monitor (latest readings, which
exist only while the head samples: without a monitor the readings are simply absent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.models import GpuUseOut, Job, JobFlagOut, NodeOut
from gpucluster.store.telemetry import NODE_WIDE, TelemetryStore

if TYPE_CHECKING:
    from gpucluster.telemetry.monitor import TelemetryMonitor


def describe_nodes(nodes: list[NodeOut], store: TelemetryStore, monitor: TelemetryMonitor | None) -> list[NodeOut]:
    states = store.node_states()
    problems = store.problems()
    out = []
    for n in nodes:
        st = states.get(n.name)
        gpus = []
        for g in n.gpus:
            p = problems.get((n.name, g.index))
            now = monitor.gpus.get((n.name, g.index)) if monitor is not None else None
            r = now.reading if now is not None else None
            gpus.append(
                g.model_copy(
                    update={
                        "healthy": p is None,
                        "problem": p.problem if p else None,
                        "utilization": r.utilization if r else None,
                        "memory_used_mb": r.memory_used_mb if r else None,
                        "temperature_c": r.temperature_c if r else None,
                        "power_w": r.power_w if r else None,
                    }
                )
            )
        node_problem = problems.get((n.name, NODE_WIDE))
        drained = st is not None and st.drained
        out.append(
            n.model_copy(
                update={
                    "gpus": gpus,
                    "drained": drained,
                    "drain_reason": st.reason if st is not None and drained else None,
                    "drained_by": st.source if st is not None and drained else None,
                    "drained_since": st.since if st is not None and drained else None,
                    "drained_until": st.until if st is not None and drained else None,
                    "problem": node_problem.problem if node_problem else None,
                    "last_report_at": monitor.last_ok.get(n.name) if monitor is not None else None,
                }
            )
        )
    return out


def describe_job(job: Job, store: TelemetryStore, monitor: TelemetryMonitor | None) -> Job:
    flags = [JobFlagOut(flag=f.flag, since=f.since, message=f.message) for f in store.flags(job.id)]
    usage = monitor.jobs.get(job.id) if monitor is not None and job.state.value == "running" else None
    uses = (
        [
            GpuUseOut(node=u.node, gpu=u.gpu, utilization=u.utilization, memory_mb=u.memory_mb, at=usage.at)
            for u in usage.gpus
        ]
        if usage is not None
        else []
    )
    if not flags and not uses:
        return job
    return job.model_copy(update={"flags": flags, "gpu_usage": uses})
