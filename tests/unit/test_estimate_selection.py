"""Estimated starts for jobs with a node selection or kept off nodes by pools (issue 16): the
replay counts only the nodes a job may use, and an exclusive job waits for a whole node. Before,
every job was replayed on every node, so a job held to busy nodes was promised the first GPUs
free anywhere."""

from __future__ import annotations

from gpucluster.core.estimate import estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.pools import Pool
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot

from .builders import job, node, running, snapshot

# n1 (no label) frees at +10; n2 (ib) half at +50 and wholly at +100.
CLUSTER = [node("n1").gpus(2), node("n2").gpus(2).labels("ib")]
RUNNING = [running(90, "n1", 0, 1, limit=10), running(91, "n2", 0, limit=50), running(92, "n2", 1, limit=100)]


def _estimates(snap: Snapshot, policy: Policy | None = None) -> dict[int, float | None]:
    policy = policy or Policy()
    plan = decide(snap, policy, now=0.0)
    return {k: e.start for k, e in estimate_starts(snap, policy, 0.0, plan).items()}


def test_a_constraint_is_estimated_on_matching_nodes_only() -> None:
    snap = snapshot(nodes=CLUSTER, running=RUNNING, queued=[job(1).gpus(2).select(constraint="ib")])
    assert _estimates(snap)[1] == 100.0


def test_a_nodelist_and_an_exclude_are_estimated_on_their_nodes() -> None:
    snap = snapshot(
        nodes=CLUSTER,
        running=RUNNING,
        queued=[job(1).gpus(1).select(nodelist=["n2"]), job(2).gpus(2).select(exclude=["n1"])],
    )
    got = _estimates(snap)
    assert got[1] == 50.0
    assert got[2] == 3650.0  # once job 1 (from +50, its default 3600 s limit) ends on n2


def test_an_exclusive_job_waits_for_a_whole_node() -> None:
    snap = snapshot(
        nodes=[node("n2").gpus(2)],
        running=[running(91, "n2", 0, limit=50), running(92, "n2", 1, limit=100)],
        queued=[job(1).gpus(1).exclusive()],
    )
    assert _estimates(snap)[1] == 100.0


def test_a_pool_closed_to_the_team_is_left_out_of_its_estimate() -> None:
    snap = snapshot(nodes=CLUSTER, running=RUNNING, queued=[job(1).gpus(2).team("b")])
    policy = Policy(pools=(Pool("fast", nodes=frozenset({"n1"}), teams=frozenset({"a"})),))
    assert _estimates(snap, policy)[1] == 100.0
    assert _estimates(snap)[1] == 10.0  # without the pool: n1 first


def test_a_gang_over_allowed_nodes_starts_when_the_last_of_them_frees() -> None:
    cluster = [node("n1").gpus(2), node("n2").gpus(2).labels("ib"), node("n3").gpus(2).labels("ib")]
    run = [running(90, "n1", 0, 1, limit=10), running(91, "n2", 0, 1, limit=40), running(92, "n3", 0, 1, limit=70)]
    snap = snapshot(nodes=cluster, running=run, queued=[job(1).gpus(4).nodes(2).select(constraint="ib")])
    assert _estimates(snap)[1] == 70.0


def test_a_selection_no_node_can_host_has_no_estimate() -> None:
    snap = snapshot(nodes=CLUSTER, running=RUNNING, queued=[job(1).gpus(4).select(constraint="ib")])
    assert _estimates(snap)[1] is None
