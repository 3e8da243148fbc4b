"""The head's inventory of a Ray cluster: each alive Ray node with GPUs is a gpucluster node.

What a Ray node declares (`ray start ...`), and what the head makes of it:
- name: the Ray node name (`--node-name`, which defaults to the node's IP address);
- GPUs: Ray's `GPU` resource (`--num-gpus`, or detected), else the sum of `gpu_model:*` resources;
- model: a custom resource `gpu_model:H100-80GB`, else a label `gpu_model`, else Ray's detected
  `accelerator_type:*`, else "GPU";
- memory per GPU: a label `gpu_memory` (e.g. 80GiB), else from the model's name (H100-80GB);
- node labels (what `submit --constraint` selects by): every Ray label `k=v` (`--labels`) but
  Ray's own (`ray.io/...`) as `k=v`, and one whose value is `true` or empty also as the flag `k`.
A node whose GPUs Ray detected (`accelerator_type:*`) is real; one that only declares them is
virtual (its jobs get GPUCLUSTER_VIRTUAL_GPUS=1).

A node becomes schedulable once its agent (`ray_agent.NodeAgent`) answers, and stops being so
the moment Ray reports it dead (Ray's health checks: a few seconds with the settings in the
README). A node that rejoins gets a new Ray node id and a new agent under the same name. The
inventory is refreshed by the head loop (`refresh`, throttled), so the loop sees one view per
cycle: a node's jobs are stopped as "node down" before any of their processes reads as lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpucluster.core.selection import label_error
from gpucluster.core.types import Gpu, Node
from gpucluster.discovery.gpus import memory_from_type
from gpucluster.executors.ray_agent import NodeAgent
from gpucluster.launch.ranks import pick_free_port
from gpucluster.models import parse_memory_mb
from gpucluster.store import JobRecord, Store
from gpucluster.store.presence import Presence, PresenceStore

log = logging.getLogger("gpucluster.ray")

NAMESPACE = "gpucluster"
REFRESH_EVERY_S = 0.5
RETRY_AGENT_S = 5.0  # after an agent failed to start on a node that is still alive
CALL_TIMEOUT_S = 10.0

_RemoteAgent = ray.remote(NodeAgent)


@dataclass(frozen=True)
class RayNode:
    """A Ray node as gpucluster sees it."""

    node_id: str
    name: str
    address: str
    gpus: tuple[Gpu, ...]
    virtual: bool
    labels: frozenset[str] = frozenset()
    # Ray's own `CPU` and `memory` resources of the node (ray start --num-cpus/--memory): what
    # jobs there may ask for with --cpus/--mem; None where Ray reports none.
    cpus: float | None = None
    memory_mb: int | None = None


@dataclass(frozen=True)
class Agent:
    node: str
    node_id: str
    address: str
    actor: Any  # ray.actor.ActorHandle of a NodeAgent
    root: str  # the agent's directory on its node
    gpus: tuple[Gpu, ...] = ()  # as declared to Ray (what telemetry samples there)
    virtual: bool = True  # no GPU Ray detected: telemetry there is synthetic


def node_from_ray(info: Mapping[str, Any]) -> RayNode | None:
    """One entry of `ray.nodes()` as a gpucluster node; None for a node without GPUs."""
    resources: Mapping[str, float] = info.get("Resources") or {}
    labels: Mapping[str, str] = info.get("Labels") or {}
    declared = {k.split(":", 1)[1]: int(v) for k, v in resources.items() if k.startswith("gpu_model:") and v >= 1}
    count = int(resources.get("GPU", 0)) or sum(declared.values())
    if count <= 0:
        return None
    detected = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
    model = (
        (sorted(declared)[0] if declared else None) or labels.get("gpu_model") or (detected[0] if detected else "GPU")
    )
    name = str(info.get("NodeName") or info["NodeManagerAddress"])
    memory = labels.get("gpu_memory")
    try:
        memory_mb = parse_memory_mb(memory) if memory else memory_from_type(model)
    except ValueError:
        log.warning("node %s: cannot read its gpu_memory label %r; taking it from the model", name, memory)
        memory_mb = memory_from_type(model)
    gpus = tuple(Gpu(index=i, model=model, memory_mb=memory_mb, uuid=f"RAY-{name}-{i}") for i in range(count))
    cpus = resources.get("CPU")
    host_memory = resources.get("memory")  # bytes
    return RayNode(
        str(info["NodeID"]),
        name,
        str(info["NodeManagerAddress"]),
        gpus,
        not detected,
        node_labels(name, labels),
        float(cpus) if cpus else None,
        int(host_memory) // (1024 * 1024) if host_memory else None,
    )


def node_labels(name: str, labels: Mapping[str, str]) -> frozenset[str]:
    """A Ray node's labels as gpucluster node labels (see the module docstring); one that is
    not a valid label (a space, a character `--constraint` reserves) is left out with a warning."""
    out: set[str] = set()
    for key, value in labels.items():
        if key.startswith("ray.io/"):
            continue
        value = str(value)
        found = ([f"{key}={value}"] if value else []) + ([key] if value.lower() in ("", "true") else [])
        for label in found:
            why = label_error(label)
            if why is None:
                out.add(label)
            else:
                log.warning("node %s: Ray label %s=%r is not usable by --constraint: %s", name, key, value, why)
    return frozenset(out)


def actor_name(cluster: str, node_id: str) -> str:
    return f"gpucluster-{cluster}-agent-{node_id}"


@dataclass
class _Pending:
    node: RayNode
    actor: Any
    ready: Any  # ObjectRef of actor.ready()


class RayInventory:
    """Nodes from Ray into the store; the agents on them. Implements head.inventory.NodeInventory."""

    def __init__(
        self,
        store: Store,
        cluster: str,
        list_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes,
        refresh_every_s: float = REFRESH_EVERY_S,
    ) -> None:
        self.store = store
        self.presence_store = PresenceStore(store)
        self.cluster = cluster
        self._list_nodes = list_nodes
        self._every = refresh_every_s
        self._agents: dict[str, Agent] = {}  # node name -> its answering agent (replaced, never mutated)
        self._pending: dict[str, _Pending] = {}  # Ray node id -> an agent starting there
        self._failed: dict[str, float] = {}  # Ray node id -> when its agent failed to start
        self._alive: dict[str, RayNode] = {}  # Ray node id -> node, as of the last refresh
        self._last = -1e18
        self._lock = threading.Lock()

    # ---- the head loop's view ---------------------------------------------------------------

    def refresh(self, now: float, force: bool = False) -> bool:
        mono = time.monotonic()
        if not force and mono - self._last < self._every:
            return False
        self._last = mono
        alive = {}
        for info in self._list_nodes():
            if info.get("Alive"):
                n = node_from_ray(info)
                if n is not None:
                    alive[n.node_id] = n
        self._alive = alive
        changed = False
        agents = dict(self._agents)
        for name, a in list(agents.items()):
            if a.node_id not in alive:
                del agents[name]
                log.warning("node %s (Ray node %s) is gone from the Ray cluster", name, a.node_id[:12])
                changed |= self.presence_store.set_down(name, "its Ray node died or left the cluster", now)
        for node_id in [k for k in self._pending if k not in alive]:
            del self._pending[node_id]
        mine = {a.node_id for a in agents.values()}
        for node_id, n in alive.items():
            if node_id in mine or node_id in self._pending or mono - self._failed.get(node_id, -1e18) < RETRY_AGENT_S:
                continue
            self._pending[node_id] = self._start_agent(n)
        for node_id, p in list(self._pending.items()):
            agent = self._agent_if_ready(p)
            if agent is None:
                continue
            del self._pending[node_id]
            if agent is False:
                self._failed[node_id] = mono
                continue
            assert isinstance(agent, Agent)
            agents[agent.node] = agent
            self.store.put_node(
                Node(agent.node, p.node.gpus, p.node.labels, p.node.cpus, p.node.memory_mb), p.node.virtual, now
            )
            self.presence_store.set_up(agent.node, agent.address, agent.node_id, now)
            log.info(
                "node %s joined: %d GPU(s) %s at %s", agent.node, len(p.node.gpus), p.node.gpus[0].model, agent.address
            )
            changed = True
        with self._lock:
            self._agents = agents
        starting = {p.node.name for p in self._pending.values()}
        for r in self.store.nodes():
            name = r.node.name
            if name not in agents and name not in starting:
                changed |= self.presence_store.set_down(name, "not in the Ray cluster", now)
        return changed

    def wait_ready(self, timeout_s: float) -> None:
        """Refresh until every GPU node's agent answers (or `timeout_s`): the first view at start."""
        deadline = time.monotonic() + timeout_s
        self.refresh(time.time(), force=True)
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh(time.time(), force=True)

    def down(self) -> frozenset[str]:
        """Stored nodes without an answering agent: dead, gone, or still starting."""
        agents = self._agents
        return frozenset(r.node.name for r in self.store.nodes() if r.node.name not in agents)

    def lost_nodes(self, job: JobRecord) -> list[str]:
        if job.allocation is None:
            return []
        incarnation = {e["node"]: e["node_id"] for e in (job.launch or {}).get("ray", [])}
        lost = []
        for s in job.allocation.slices:
            alive_id = self._alive_id(s.node)
            if alive_id is None or (s.node in incarnation and incarnation[s.node] != alive_id):
                lost.append(s.node)
        return lost

    def address(self, node: str) -> str | None:
        a = self._agents.get(node)
        if a is not None:
            return a.address
        p = self.presence_store.all().get(node)
        return p.address if p is not None else None

    def free_port(self, node: str) -> int:
        a = self._agents.get(node)
        if a is not None:
            try:
                return int(ray.get(a.actor.free_port.remote(), timeout=CALL_TIMEOUT_S))
            except ray.exceptions.RayError as e:
                log.warning("node %s: could not pick a port there (%s); picking one here", node, e)
        return pick_free_port()

    def presence(self) -> dict[str, Presence]:
        return self.presence_store.all()

    # ---- for the executor -------------------------------------------------------------------

    def agent(self, node: str) -> Agent | None:
        return self._agents.get(node)

    def agents(self) -> list[Agent]:
        """Every answering agent now (what telemetry samples)."""
        return list(self._agents.values())

    def starting(self, node_id: str) -> bool:
        """Whether the Ray node is alive and its agent not answering yet (after a head restart)."""
        return node_id in self._pending

    def _alive_id(self, name: str) -> str | None:
        a = self._agents.get(name)
        if a is not None:
            return a.node_id
        return next((p.node.node_id for p in self._pending.values() if p.node.name == name), None)

    # ---- agents ------------------------------------------------------------------------------

    def _start_agent(self, n: RayNode) -> _Pending:
        """Start (or find, after a head restart) the node's agent; it answers `ready` when up."""
        actor = _RemoteAgent.options(
            name=actor_name(self.cluster, n.node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=8,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False),
        ).remote(self.cluster, n.node_id)
        return _Pending(n, actor, actor.ready.remote())  # type: ignore[attr-defined]

    def _agent_if_ready(self, p: _Pending) -> Agent | bool | None:
        """The agent once it answered; False if it failed to start; None while it starts."""
        done, _ = ray.wait([p.ready], timeout=0)
        if not done:
            return None
        try:
            info = ray.get(p.ready)
        except ray.exceptions.RayError as e:
            log.warning("node %s: its gpucluster agent did not start (%s); retrying", p.node.name, e)
            return False
        name = p.node.name
        if name in self._agents and self._agents[name].node_id != p.node.node_id:
            name = f"{name}-{p.node.node_id[:8]}"  # two Ray nodes of one name at once
        return Agent(name, p.node.node_id, p.node.address, p.actor, str(info["root"]), p.node.gpus, p.node.virtual)
