"""The hand-driven head (headkit) plus a telemetry monitor reading a fake NVML with scripted
readings: what the telemetry unit tests share."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from gpucluster.core.policy import HealthPolicy, IdlePolicy, Policy
from gpucluster.telemetry.monitor import TelemetryMonitor
from gpucluster.telemetry.nvml import NvmlSource

from .headkit import Cluster, make_cluster


def load_fake_nvml() -> ModuleType:
    """tests/fakenvml/pynvml.py under its own name, so the real pynvml stays importable."""
    path = Path(__file__).parent.parent / "fakenvml" / "pynvml.py"
    spec = importlib.util.spec_from_file_location("fake_pynvml", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class StaticResolver:
    """pid -> job as the test says (the /proc walk has its own test)."""

    def __init__(self) -> None:
        self.owners: dict[int, int] = {}

    def resolve(self, pids: Iterable[int], groups: Mapping[int, int]) -> dict[int, int]:
        return {p: self.owners[p] for p in pids if p in self.owners}


@dataclass
class Telemetry:
    cluster: Cluster
    nvml: ModuleType
    monitor: TelemetryMonitor
    resolver: StaticResolver

    def gpus(self, **per_gpu: Any) -> list[dict[str, Any]]:
        """The scripted GPUs: healthy defaults; `g3={"temp": 95}` changes GPU 3."""
        out = []
        for i in range(8):
            g = self.nvml.gpu()
            g.update(per_gpu.get(f"g{i}", {}))
            out.append(g)
        return out

    def script(self, **per_gpu: Any) -> None:
        assert self.nvml.STATE is not None
        self.nvml.STATE["gpus"] = self.gpus(**per_gpu)

    def step(self, dt: float = 5.0) -> None:
        """Time passes, the head cycles, telemetry samples, the head cycles again."""
        self.cluster.clock.advance(dt)
        self.cluster.head.tick()
        self.monitor.step()
        self.cluster.head.tick()

    def policy(self, idle: IdlePolicy | None = None, health: HealthPolicy | None = None) -> None:
        source = self.cluster.head.policy_source
        p: Policy = source.policy
        source.policy = replace(p, idle=idle or p.idle, health=health or p.health)

    def close(self) -> None:
        self.cluster.close()


def make_telemetry(tmp_path: Path, **monitor: Any) -> Telemetry:
    cluster = make_cluster(tmp_path, default_command=["sleep", "1000"], grace_period_s=5.0)
    nvml = load_fake_nvml()
    resolver = StaticResolver()
    t = Telemetry(cluster, nvml, None, resolver)  # type: ignore[arg-type]
    nvml.reset(t.gpus())
    monitor.setdefault("interval_s", 5.0)
    t.monitor = TelemetryMonitor(cluster.head, [NvmlSource("n1", nvml)], resolver=resolver, **monitor)
    return t
