"""Telemetry of Ray nodes: what the head sends each node's agent, and where its readings go.

The head cannot read a remote node's GPUs, and the agent there cannot know which jobs hold
them or what load those jobs reported (both live in the head). So the Ray executor's monitor
round, at the telemetry interval, sends each agent a `SampleAsk` built here, the agent samples
its GPUs with the head's own readers (`NodeAgent.sample`), and the reading comes back to
`TelemetryMonitor.ingest`, judged at its next step like a local one.

A reading is stamped with the head's clock on arrival: silence and energy (`power_w x seconds`
between readings) are then measured on one clock, whatever the nodes' clocks say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpucluster.core.types import Gpu
from gpucluster.executors.ray_agent import SampleAsk
from gpucluster.telemetry.attribution import job_groups
from gpucluster.telemetry.monitor import TelemetryMonitor
from gpucluster.telemetry.readings import NodeReading


class RemoteFeed:
    """Between the Ray executor (which calls the agents) and the monitor (which judges)."""

    def __init__(self, monitor: TelemetryMonitor) -> None:
        self.monitor = monitor
        self.interval_s = monitor.interval_s

    def asks(self, nodes: Iterable[tuple[str, tuple[Gpu, ...], bool]]) -> dict[str, SampleAsk]:
        """One ask per (node name, GPUs, virtual): who holds each GPU, loads, process groups."""
        holders: dict[str, dict[int, list[tuple[int, float]]]] = {}
        groups: dict[str, dict[int, int]] = {}
        loads: dict[int, tuple[float | None, float | None]] = {}
        for j in self.monitor.store.holdings():
            for s in j.allocation.slices:
                for i in s.gpu_indices:
                    holders.setdefault(s.node, {}).setdefault(i, []).append((j.id, s.share))
            for e in (j.launch or {}).get("ray", []):
                groups.setdefault(e["node"], {}).update(job_groups([(j.id, e.get("handle"))]))
            load = self.monitor.loads.get(j.id)
            if load is not None:
                loads[j.id] = (load.utilization, load.memory_mb)
        out = {}
        for name, gpus, virtual in nodes:
            mine = holders.get(name, {})
            jobs = {job for held in mine.values() for job, _ in held}
            out[name] = SampleAsk(
                name,
                gpus,
                virtual,
                mine,
                {j: v for j, v in loads.items() if j in jobs},
                groups.get(name, {}),
            )
        return out

    def deliver(self, node: str, reading: NodeReading) -> None:
        """A node's reading, under the node's gpucluster name and the head's clock."""
        self.monitor.ingest(replace(reading, node=node, at=self.monitor.clock()))
