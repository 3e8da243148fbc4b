"""A Ray node's agent samples its own GPUs (`NodeAgent.sample`), without Ray: the agent is a plain
class. NVML there is the fake pynvml; attribution walks this machine's real /proc, as the agent
does on its node, since a pid means nothing on the head's machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpucluster.core.types import Gpu
from gpucluster.executors.ray_agent import NodeAgent, SampleAsk
from gpucluster.telemetry.nvml import NvmlSource
from gpucluster.telemetry.readings import ProcessUse

from .telemetrykit import load_fake_nvml

GPUS = tuple(Gpu(index=i, model="H100-80GB", memory_mb=81920, uuid=f"RAY-n-{i}") for i in range(2))


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeAgent:
    monkeypatch.setenv("GPUCLUSTER_NODE_DIR", str(tmp_path))
    return NodeAgent("c1", "f" * 32)


def test_real_gpus_are_read_through_nvml_and_processes_attributed_on_the_node(agent: NodeAgent) -> None:
    nvml = load_fake_nvml()
    me = os.getpid()
    nvml.reset([nvml.gpu(util=70, processes=[{"pid": me, "memory_mb": 500}]), nvml.gpu(util=0, temp=95)])
    agent._nvml = NvmlSource("whatever-nvml-calls-it", nvml)
    # This test's process group stands for job 42's shim group.
    r = agent.sample(SampleAsk("gpu07", GPUS, virtual=False, groups={os.getpgid(0): 42}))
    assert r.node == "gpu07" and r.error is None
    assert [(g.index, g.utilization, g.temperature_c) for g in r.gpus] == [(0, 70, 45), (1, 0, 95)]
    assert r.gpus[0].processes == (ProcessUse(pid=me, memory_mb=500, job_id=42),)
    # No job's group: the process stays unattributed (the head's health rules still see the GPU).
    r = agent.sample(SampleAsk("gpu07", GPUS, virtual=False))
    assert r.gpus[0].processes == (ProcessUse(pid=me, memory_mb=500, job_id=None),)
    nvml.STATE = {"gpus": [], "fail": "driver gone"}
    failed = agent.sample(SampleAsk("gpu07", GPUS, virtual=False))
    assert failed.node == "gpu07" and failed.gpus == () and "driver gone" in (failed.error or "")


def test_virtual_gpus_are_synthetic_from_what_the_head_sends(agent: NodeAgent) -> None:
    ask = SampleAsk("gpu08", GPUS, virtual=True, holders={1: [(7, 0.5)]}, loads={7: (80.0, 2000.0)})
    r = agent.sample(ask)
    idle, held = r.gpus
    assert (idle.utilization, idle.power_w, idle.processes) == (0, 60, ())
    # A half share at 80%: 40% busy, 60 + 640 x 0.4 W, and the job's memory as its process.
    assert (held.utilization, held.power_w, held.memory_used_mb) == (40, 316, 2000)
    assert held.processes == (ProcessUse(pid=None, memory_mb=2000, job_id=7),)
