"""The head tells its cluster state nodes and drains as events (head/node_feed.py, issue 15), as
the simulator does, and sees another process's drain. Real store (SQLite file and PostgreSQL),
the fake executor, a real second process for the other writer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from gpucluster.core.cluster_state import StateMismatch
from gpucluster.core.types import Drain
from gpucluster.store import schema
from gpucluster.store.telemetry import NodeState

from .builders import node
from .headkit import T0, Cluster, make_cluster
from .test_full_reads import other_process

STORE_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, store_target=store_target, nodes=2)
    try:
        yield c
    finally:
        c.close()


def placed_on(c: Cluster, job_id: int, at: float | None = None) -> set[str]:
    """Where the job runs, after a cycle at `at` if given."""
    if at is not None:
        c.tick_at(at)
    a = c.record(job_id).allocation
    assert a is not None, f"job {job_id} did not start"
    return {s.node for s in a.slices}


def test_drains_and_new_nodes_are_told_once_and_the_plan_reads_them_from_the_state(cluster: Cluster) -> None:
    state = cluster.head.cluster
    cluster.tick_at(T0)
    assert sorted(state.nodes) == ["n1", "n2"]
    told = state.applied
    cluster.tick_at(T0 + 1)
    assert state.applied == told  # nothing changed: nothing told again

    assert cluster.head.telemetry.set_drained("n1", True, "new cables", "user", T0 + 2, until=T0 + 3600)
    cluster.tick_at(T0 + 2)
    assert state.drained == {"n1"} and state.drains == {"n1": Drain("new cables", T0 + 3600)}
    assert placed_on(cluster, cluster.submit(gpus=8), T0 + 2.5) == {"n2"}  # admission read the told drain
    second = cluster.submit(gpus=8)
    cluster.tick_at(T0 + 3)
    assert cluster.record(second).allocation is None  # n1 is drained, n2 is full

    assert cluster.head.telemetry.set_drained("n1", False, "undrained by user", "user", T0 + 4)
    cluster.tick_at(T0 + 4)
    assert state.drained == set() and state.drains == {}
    assert placed_on(cluster, second) == {"n1"}

    cluster.store.put_node(node("n3").gpus(4, "A100").build(), virtual=True, now=T0 + 5)
    cluster.tick_at(T0 + 5)
    assert sorted(state.nodes) == ["n1", "n2", "n3"]
    assert [n.name for n in cluster.head.snapshot().nodes] == ["n1", "n2", "n3"]
    assert placed_on(cluster, cluster.submit(gpus=4, gpu_type="A100"), T0 + 6) == {"n3"}


def test_a_drain_written_by_another_process_is_seen_at_the_next_check(cluster: Cluster) -> None:
    cluster.tick_at(T0)
    other_process(
        cluster.store,
        "from gpucluster.store.telemetry import TelemetryStore\n"
        f"TelemetryStore(store).set_drained('n1', True, 'maintenance', 'user', {T0 + 1})",
    )
    cluster.tick_at(T0 + 6)  # the store said another process wrote: nodes and drains read again
    assert cluster.head.cluster.drains == {"n1": Drain("maintenance", None)}
    assert placed_on(cluster, cluster.submit(gpus=8), T0 + 7) == {"n2"}


def test_check_mode_names_a_drain_written_past_the_cache(cluster: Cluster) -> None:
    """A write of this process that did not tell the cache is a missed event: check mode
    (on in tests) finds it by the fresh build, rather than plans going on stale drains."""
    assert cluster.head.check_state
    cluster.head.telemetry.set_drained("n1", True, "maintenance", "user", T0)
    cluster.tick_at(T0)
    with cluster.store._write() as c:  # behind the telemetry store's back
        c.execute(update(schema.node_states).values(drained=False))
    with pytest.raises(StateMismatch, match="drained node"):
        cluster.tick_at(T0 + 1)


def test_a_drain_committed_while_the_states_were_read_is_not_hidden_by_the_cache(cluster: Cluster) -> None:
    """Another thread's drain (the API's) that commits and invalidates the cache while a read of
    the old states runs: that read is answered but not cached, so the next one sees the drain."""
    telemetry = cluster.head.telemetry
    telemetry.forget_states()
    real = telemetry.read_states

    def read_then_a_drain_lands() -> dict[str, NodeState]:
        old = real()
        telemetry.read_states = real  # type: ignore[method-assign]
        telemetry.set_drained("n1", True, "maintenance", "user", T0)  # commits, then invalidates
        return old

    telemetry.read_states = read_then_a_drain_lands  # type: ignore[method-assign]
    assert "n1" not in telemetry.drains()  # the read that overlapped the drain
    assert telemetry.drains() == {"n1": Drain("maintenance", None)}
