"""Wire telemetry into a running head: the local node's source and the monitor thread."""

from __future__ import annotations

import threading

from gpucluster.core.types import Node
from gpucluster.head.service import ClusterService
from gpucluster.telemetry.monitor import Source, TelemetryMonitor
from gpucluster.telemetry.nvml import NvmlSource
from gpucluster.telemetry.synthetic import LoadBook, SyntheticSource

DEFAULT_INTERVAL_S = 5.0


def start_telemetry(
    service: ClusterService, node: Node, virtual: bool, interval_s: float = DEFAULT_INTERVAL_S
) -> tuple[TelemetryMonitor, threading.Thread]:
    """Sample the local node (NVML, or synthetic for virtual GPUs) on a thread of its own."""
    loads = LoadBook()
    source: Source = SyntheticSource(node, loads) if virtual else NvmlSource(node.name)
    flush_s = max(10.0, interval_s)
    monitor = TelemetryMonitor(service.head, [source], interval_s=interval_s, flush_s=flush_s, loads=loads)
    service.telemetry = monitor
    return monitor, monitor.start()
