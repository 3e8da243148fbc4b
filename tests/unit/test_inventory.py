"""Nodes that come and go (issue 6) in the head, without Ray: a hand-driven inventory, the fake
executor, a real store. A lost node's jobs are killed at once and requeued as a preemption (no
restart spent), nothing is placed on a down node, a node's address and port reach MASTER_ADDR and
MASTER_PORT; Ray's node records become gpucluster nodes; presence survives a reopen."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.executors.base import Exited, Lost
from gpucluster.executors.ray_nodes import node_from_ray
from gpucluster.store import JobRecord, Store
from gpucluster.store.presence import Presence, PresenceStore

from .builders import node
from .headkit import T0, Cluster, make_cluster

SIGKILL = int(signal.SIGKILL)


class HandInventory:
    """The NodeInventory protocol, driven by the test."""

    def __init__(self, store: Store) -> None:
        self.presence_store = PresenceStore(store)
        self.gone: set[str] = set()

    def refresh(self, now: float) -> bool:
        for name in self.gone:
            self.presence_store.set_down(name, "its Ray node died", now)
        return False

    def down(self) -> frozenset[str]:
        return frozenset(self.gone)

    def lost_nodes(self, job: JobRecord) -> list[str]:
        return [s.node for s in job.allocation.slices if s.node in self.gone] if job.allocation else []

    def address(self, node: str) -> str | None:
        return {"n1": "10.0.0.1", "n2": "10.0.0.2"}.get(node)

    def free_port(self, node: str) -> int:
        return 29500 if node == "n1" else 29600

    def presence(self) -> dict[str, Presence]:
        return self.presence_store.all()


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    c = make_cluster(tmp_path, gpus=2, default_command=["python", "train.py"], grace_period_s=30.0)
    c.store.put_node(node("n2").gpus(2, "H100").build(), virtual=True, now=T0)
    inv = HandInventory(c.store)
    for name, ip in (("n1", "10.0.0.1"), ("n2", "10.0.0.2")):
        inv.presence_store.set_up(name, ip, f"ray-{name}", T0)
    c.head.inventory = inv
    return c


def _inv(c: Cluster) -> HandInventory:
    assert isinstance(c.head.inventory, HandInventory)
    return c.head.inventory


def test_a_lost_node_kills_the_job_everywhere_and_requeues_it_without_spending_a_restart(cluster: Cluster) -> None:
    c = cluster
    job = c.submit(gpus=2, nodes=2, per_gpu=True, max_restarts=0)
    c.tick_at(T0 + 1)
    assert c.state(job) is JobState.RUNNING
    env0 = c.proc(job).spec.processes[1].env  # rank 1 dials rank 0's node
    assert (env0["MASTER_ADDR"], env0["MASTER_PORT"]) == ("10.0.0.1", "29500")

    _inv(c).gone.add("n2")
    c.tick_at(T0 + 2)
    r = c.record(job)
    assert c.proc(job).signals == [SIGKILL]  # no grace period: its peer is gone
    assert (r.stop_reason, r.stop_message, r.kill_sent) == ("preempt", "node n2 is down", True)

    c.fake.end_rank(job, 0, Exited(128 + SIGKILL, SIGKILL))
    c.fake.end_rank(job, 1, Lost("node n2 is down"))
    c.tick_at(T0 + 3)
    r = c.record(job)
    assert r.state is JobState.QUEUED and r.restarts == 0
    (attempt,) = c.store.attempts(job)
    assert attempt.outcome == "preempted" and attempt.reason.startswith("node n2 is down")
    assert c.fake.running() == []  # a two-node job cannot start on n1 alone: nothing goes to n2
    c.tick_at(T0 + 5)
    assert c.state(job) is JobState.QUEUED

    _inv(c).gone.clear()  # n2 rejoins
    c.tick_at(T0 + 6)
    assert c.state(job) is JobState.RUNNING and c.record(job).attempt == 2


def test_a_job_on_the_surviving_node_runs_on(cluster: Cluster) -> None:
    c = cluster
    on_n1 = c.submit(gpus=2)
    c.tick_at(T0 + 1)
    assert c.record(on_n1).allocation.slices[0].node == "n1"  # type: ignore[union-attr]
    _inv(c).gone.add("n2")
    c.tick_at(T0 + 2)
    assert c.proc(on_n1).signals == [] and c.state(on_n1) is JobState.RUNNING
    waiting = c.submit(gpus=2)
    c.tick_at(T0 + 3)
    assert c.state(waiting) is JobState.QUEUED  # n2's GPUs are free but down


def test_nodes_show_down_with_why_and_since(cluster: Cluster) -> None:
    c = cluster
    _inv(c).gone.add("n2")
    c.tick_at(T0 + 7)
    nodes = {n.name: n for n in c.service.nodes()}
    assert nodes["n1"].up and nodes["n1"].address == "10.0.0.1"
    assert not nodes["n2"].up
    assert (nodes["n2"].down_reason, nodes["n2"].down_since) == ("its Ray node died", T0 + 7)


def test_presence_is_durable_and_changes_only_when_it_changes(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    p = PresenceStore(store)
    assert p.set_up("a", "10.0.0.1", "id1", 1.0)
    assert not p.set_up("a", "10.0.0.1", "id1", 2.0)
    assert p.set_down("a", "gone", 3.0)
    assert not p.set_down("a", "gone again", 4.0)  # the first why and when are kept
    assert p.set_up("a", "10.0.0.1", "id2", 5.0)  # rejoined: a new incarnation
    assert p.set_down("b", "never seen up", 6.0)
    store.close()
    again = PresenceStore(Store(tmp_path / "state.db")).all()
    assert again["a"] == Presence("a", "10.0.0.1", "id2", True, "", 5.0)
    assert (again["b"].up, again["b"].reason) == (False, "never seen up")


def _ray_node(
    resources: dict[str, float], labels: dict[str, str] | None = None, name: str = "gpu07"
) -> dict[str, object]:
    return {
        "NodeID": "abc123",
        "Alive": True,
        "NodeName": name,
        "NodeManagerAddress": "10.1.2.3",
        "Resources": {"CPU": 16.0, **resources},
        "Labels": labels or {},
    }


@pytest.mark.parametrize(
    ("resources", "labels", "want"),
    [
        ({"GPU": 8.0, "gpu_model:H100-80GB": 8.0}, {}, (8, "H100-80GB", 80 * 1024, True)),
        ({"gpu_model:A100": 4.0}, {"gpu_memory": "40GiB"}, (4, "A100", 40 * 1024, True)),
        ({"GPU": 2.0, "accelerator_type:H100": 1.0}, {}, (2, "H100", 16 * 1024, False)),  # Ray saw real GPUs
        ({"GPU": 2.0}, {"gpu_model": "L40S-48GB"}, (2, "L40S-48GB", 48 * 1024, True)),
        ({"GPU": 1.0}, {"gpu_memory": "lots"}, (1, "GPU", 16 * 1024, True)),  # unreadable: from the model
    ],
)
def test_a_ray_node_becomes_a_gpucluster_node(
    resources: dict[str, float], labels: dict[str, str], want: tuple[int, str, int, bool]
) -> None:
    n = node_from_ray(_ray_node(resources, labels))
    assert n is not None
    assert (n.name, n.address, n.node_id) == ("gpu07", "10.1.2.3", "abc123")
    assert (len(n.gpus), n.gpus[0].model, n.gpus[0].memory_mb, n.virtual) == want
    assert [g.index for g in n.gpus] == list(range(want[0]))


def test_a_ray_nodes_cpu_and_memory_resources_become_its_cpus_and_memory() -> None:
    """`ray start --num-cpus 32 --memory 256GiB` -> Ray's `CPU` (cores) and `memory` (bytes)
    resources -> the node's CPUs and host memory in MiB, what `--cpus`/`--mem` are placed against;
    a node where Ray reports neither accounts none (any request fits there)."""
    n = node_from_ray(_ray_node({"GPU": 8.0, "CPU": 32.0, "memory": 256 * 1024**3}))
    assert n is not None
    assert (n.cpus, n.memory_mb) == (32.0, 256 * 1024)
    odd = node_from_ray(_ray_node({"GPU": 1.0, "CPU": 7.5, "memory": 3 * 1024**3 + 12345}))
    assert odd is not None and (odd.cpus, odd.memory_mb) == (7.5, 3 * 1024)  # whole MiB, rounded down
    bare = node_from_ray({**_ray_node({"GPU": 1.0}), "Resources": {"GPU": 1.0}})
    assert bare is not None and (bare.cpus, bare.memory_mb) == (None, None)


def test_a_ray_node_without_gpus_is_not_a_gpucluster_node() -> None:
    assert node_from_ray(_ray_node({})) is None
    unnamed = node_from_ray(_ray_node({"GPU": 1.0}, name=""))
    assert unnamed is not None and unnamed.name == "10.1.2.3"  # Ray's default name: the address


def test_a_ray_nodes_labels_become_its_node_labels() -> None:
    """`ray start --labels ib=true,rack=r1` -> the labels jobs select it by (submit --constraint);
    Ray's own labels are left out, and one --constraint could not name is skipped."""
    labels = {"ib": "true", "rack": "r1", "ray.io/node-id": "abc123", "note": "two words", "gpu_model": "H100-80GB"}
    n = node_from_ray(_ray_node({"GPU": 2.0}, labels))
    assert n is not None
    assert n.labels == frozenset({"ib", "ib=true", "rack=r1", "gpu_model=H100-80GB"})
