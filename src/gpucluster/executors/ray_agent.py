"""The gpucluster agent on one Ray node: a small actor that runs a job's processes there.

Why one agent per node (not one actor per job): a job then starts with one actor call (about a
millisecond) instead of an actor start (~0.3 s and ~75 MB each), and the head polls every job
on a node with one call. The agent holds no state the head needs: it is the local executor
(the same shim, sessions, signals, exit records) running on that node, and every handle it
returns is stored by the head. It is a detached actor, so it outlives a restart of the head,
which finds it again by name. Its shims run with --die-with-parent: when the agent dies (its
node's Ray died), the jobs die with it rather than hold GPUs unseen while the head requeues
them elsewhere.

Files live under the node's own directory (`root`): each attempt's run dir and logs. The head
pulls the logs by offset (`sync`), so `gpucluster logs` shows remote output live. The head's
`--max-log-size` comes with each launch: the shims here rotate their logs at it, as on the head's
own machine (`_shim.py`), and `sync` reads across the rotations (`logfile.read_log`); offsets
count every byte the process wrote, so the head's copy, capped the same way, keeps them.

Telemetry: the head's monitor round also asks each agent, at the telemetry interval, for one
reading of its node's GPUs (`sample`), taken here with the reader the head uses on its own
machine: NVML on real GPUs (a GPU process is attributed to its job here, where its pid means
something), the synthetic source on virtual ones (from the holders and job load reports the
head sends along, since jobs report their load to the head). The head feeds the readings to
its `TelemetryMonitor`, so health, draining, idle and memory-share checks, energy and /metrics
cover the node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpucluster.core.types import Gpu, Node
from gpucluster.executors.base import Handle, LaunchSpec, Status
from gpucluster.executors.cgroups import detect as detect_cgroups
from gpucluster.executors.local import LocalExecutor
from gpucluster.executors.logfile import read_log
from gpucluster.executors.podman import ContainerNode
from gpucluster.head.paths import DataDir
from gpucluster.launch.ranks import pick_free_port
from gpucluster.telemetry.attribution import PidResolver
from gpucluster.telemetry.nvml import NvmlSource
from gpucluster.telemetry.readings import NodeReading
from gpucluster.telemetry.synthetic import LoadBook, SyntheticSource

# At most this much of one log per sync: a chatty job cannot stall the head's monitor.
LOG_CHUNK = 1 << 20


def node_root(cluster: str, node_id: str) -> Path:
    """The agent's directory on its node: $GPUCLUSTER_NODE_DIR, else Ray's temp dir, else /tmp."""
    base = os.environ.get("GPUCLUSTER_NODE_DIR") or os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return Path(base) / "gpucluster-node" / f"{cluster}-{node_id[:16]}"


@dataclass(frozen=True)
class SampleAsk:
    """What the head sends with a telemetry pull: the node's name and GPUs, and what only the
    head knows about the jobs on them (who holds each GPU, their reported loads, their groups)."""

    node: str
    gpus: tuple[Gpu, ...]
    virtual: bool
    # GPU index -> (job id, share) of each job holding it
    holders: Mapping[int, Sequence[tuple[int, float]]] = field(default_factory=dict)
    # job id -> its last reported (utilization %, memory MiB): the synthetic source's input
    loads: Mapping[int, tuple[float | None, float | None]] = field(default_factory=dict)
    # process group id -> job id, of the job processes on this node (NVML pid attribution)
    groups: Mapping[int, int] = field(default_factory=dict)


class NodeAgent:
    """Runs as a Ray actor (see `gpucluster.executors.ray`); plain methods, so it is testable alone."""

    def __init__(self, cluster: str, node_id: str) -> None:
        self.root = node_root(cluster, node_id)
        # As the head's data dir (head/paths.py): passable to jobs, run/ the agent's alone.
        DataDir(self.root).secure()
        instance = "ray-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.local = LocalExecutor(die_with_parent=True, cgroup_support=detect_cgroups(), instance=instance)
        self._launching = threading.Lock()  # the log cap is set per launch (the actor runs calls in threads)
        self._nvml: NvmlSource | None = None  # opened at the first sample of a real node
        self._resolver = PidResolver()

    def ready(self) -> dict[str, object]:
        return {"root": str(self.root), "pid": os.getpid()}

    def free_port(self) -> int:
        """A port free on this node now: MASTER_PORT when rank 0 runs here."""
        return pick_free_port()

    def launch(self, spec: LaunchSpec, max_log_bytes: int = 0, container_config: str | None = None) -> Handle:
        """Start an attempt's processes here; > 0: each one's log is rotated past that size. A
        container job uses this node's podman config: $GPUCLUSTER_CONTAINER_CONFIG of `ray start`'s
        environment, else the head's --container-config path, else the system's (per launch: the
        agent outlives heads, which may be started with another config)."""
        with self._launching:
            self.local.max_log_bytes = max_log_bytes
            if spec.container is not None:
                config = os.environ.get("GPUCLUSTER_CONTAINER_CONFIG") or container_config
                self.local.container_node = ContainerNode.from_config_dir(Path(config) if config else None)
            return self.local.launch(spec)

    def recover(self, run_dir: str) -> Handle | None:
        return self.local.recover(Path(run_dir))

    def sync(
        self, items: list[tuple[Handle, list[tuple[str, int]]]]
    ) -> list[tuple[list[Status], list[tuple[int, bytes]]]]:
        """For each attempt: how each of its processes is, then its logs from the given offsets,
        each as (offset of its first byte, bytes): past the asked offset when the bytes there were
        rotated away before the head got them.

        Statuses are taken before the logs are read, so for a process seen ended its output is
        complete (a chunk of LOG_CHUNK bytes means there may be more: ask again).
        """
        out = []
        for handle, logs in items:
            statuses = self.local.poll_ranks(handle)
            out.append((statuses, [_read(path, offset) for path, offset in logs]))
        return out

    def sample(self, ask: SampleAsk) -> NodeReading:
        """One reading of this node's GPUs; a reader that fails gives a reading with its error
        (the head's health rules judge a node that keeps failing as silent)."""
        now = time.time()
        try:
            if ask.virtual:
                loads = LoadBook()
                for job_id, (util, mem) in ask.loads.items():
                    loads.report(job_id, util, mem, now)
                return SyntheticSource(Node(ask.node, ask.gpus), loads).read(now, ask.holders)
            if self._nvml is None:
                self._nvml = NvmlSource(ask.node)
            reading = self._nvml.read(now)
        except Exception as e:  # NVML missing or failing: reported, never raised into the head
            return NodeReading(ask.node, now, error=f"{type(e).__name__}: {e}")
        pids = [p.pid for g in reading.gpus for p in g.processes if p.pid is not None and p.job_id is None]
        owner = self._resolver.resolve(pids, ask.groups) if pids and ask.groups else {}
        gpus = tuple(
            replace(g, processes=tuple(replace(p, job_id=owner[p.pid]) if p.pid in owner else p for p in g.processes))
            for g in reading.gpus
        )
        return replace(reading, node=ask.node, gpus=gpus)

    def signal(self, handle: Handle, signum: int) -> None:
        self.local.signal(handle, signum)

    def cleanup(self, handle: Handle, run_dir: str) -> None:
        """Kill what is left of a finished attempt and delete its files here (the head has its logs)."""
        self.local.cleanup(handle)
        path = Path(run_dir)
        if path.is_relative_to(self.root / "run"):
            logs = self.root / "jobs" / path.relative_to(self.root / "run")  # jobs/<id>/attempt-N
            for done in (path, logs):
                shutil.rmtree(done, ignore_errors=True)  # fd-based: a link in the job's tree is not followed


def _read(path: str, offset: int) -> tuple[int, bytes]:
    chunk, end = read_log(Path(path), offset, LOG_CHUNK)
    return end - len(chunk), chunk
