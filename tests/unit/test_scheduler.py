"""core.scheduler.decide: table-driven cases, then a property test over random clusters."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.scheduler import decide, queue_order
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Node, Priority, RunningJob

from .builders import job, node, running, snapshot

# ---- table-driven cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    snap: Snapshot
    # job id -> (node, GPU indices) for every job that must start, and nothing else
    starts: dict[int, tuple[str, tuple[int, ...]]]
    # job id -> substrings its wait reason must contain; every other queued job must start
    waits: dict[int, tuple[str, ...]] = field(default_factory=dict)


CASES = [
    Case(
        "higher priority first even if submitted later",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            queued=[job(1).gpus(8).at(1.0), job(2).gpus(8).priority("high").at(2.0)],
        ),
        starts={2: ("n1", (0, 1, 2, 3, 4, 5, 6, 7))},
        waits={1: ("waiting for 8 free", "0 free now")},
    ),
    Case(
        "low priority goes after normal",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            queued=[job(1).gpus(4).priority("low").at(0.0), job(2).gpus(4).priority("normal").at(9.0)],
        ),
        starts={2: ("n1", (0, 1, 2, 3))},
        waits={1: ("waiting for 4 free",)},
    ),
    Case(
        "same priority: first come first served",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            queued=[job(1).gpus(8).at(5.0), job(2).gpus(8).at(1.0)],
        ),
        starts={2: ("n1", tuple(range(8)))},
        waits={1: ("waiting for 8 free",)},
    ),
    Case(
        "same priority and submit time: lower id first",
        snapshot(
            nodes=[node("n1").gpus(2, "H100")],
            queued=[job(9).gpus(2).at(3.0), job(4).gpus(2).at(3.0)],
        ),
        starts={4: ("n1", (0, 1))},
        waits={9: ("waiting for 2 free",)},
    ),
    Case(
        "a job that does not fit holds back later jobs of its GPU model, not of another model",
        snapshot(
            nodes=[node("h").gpus(4, "H100"), node("a").gpus(4, "A100")],
            running=[running(100, "h", 0, 1)],
            queued=[
                job(1).gpus(4).gpu_type("H100").at(1.0),  # 2 H100 free: does not fit
                job(2).gpus(1).gpu_type("H100").at(2.0),  # would fit, but must not overtake job 1
                job(3).gpus(2).gpu_type("A100").at(3.0),  # other model: passes
            ],
        ),
        starts={3: ("a", (0, 1))},
        waits={1: ("waiting for 4 free H100", "2 free now"), 2: ("waiting behind job 1",)},
    ),
    Case(
        "a blocked high-priority job holds back lower-priority jobs of the same model",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            running=[running(100, "n1", 0)],
            queued=[job(1).gpus(1).at(0.0), job(2).gpus(8).priority("high").at(5.0)],
        ),
        starts={},
        waits={2: ("waiting for 8 free", "7 free now"), 1: ("waiting behind job 2",)},
    ),
    Case(
        "a blocked untyped job holds back jobs of every model",
        snapshot(
            nodes=[node("h").gpus(8, "H100"), node("a").gpus(8, "A100")],
            running=[running(100, "h", 0), running(101, "a", 0)],
            queued=[job(1).gpus(8).at(1.0), job(2).gpus(1).gpu_type("A100").at(2.0)],
        ),
        starts={},
        waits={1: ("waiting for 8 free same-model GPU(s)", "14 free now"), 2: ("waiting behind job 1",)},
    ),
    Case(
        "a blocked typed job holds back a later untyped job, which could take that model",
        snapshot(
            nodes=[node("h").gpus(2, "H100"), node("a").gpus(2, "A100")],
            queued=[job(1).gpus(3).gpu_type("H100").at(1.0), job(2).gpus(1).at(2.0)],
        ),
        starts={},
        waits={1: ("waiting for 3 free H100",), 2: ("waiting behind job 1",)},
    ),
    Case(
        "best fit: a small job goes to the fullest node that still fits, keeping a whole node free",
        snapshot(
            nodes=[node("empty").gpus(8, "H100"), node("busy").gpus(8, "H100")],
            running=[running(100, "busy", 0, 1, 2, 3, 4, 5)],
            queued=[job(1).gpus(2).at(1.0), job(2).gpus(8).at(2.0)],
        ),
        starts={1: ("busy", (6, 7)), 2: ("empty", tuple(range(8)))},
    ),
    Case(
        "best fit prefers the node left with fewest free GPUs among several that fit",
        snapshot(
            nodes=[node("n3").gpus(4, "H100"), node("n2").gpus(4, "H100"), node("n1").gpus(4, "H100")],
            running=[running(100, "n2", 0), running(101, "n1", 0, 1)],
            queued=[job(1).gpus(2).at(1.0)],
        ),
        starts={1: ("n1", (2, 3))},
    ),
    Case(
        "best fit ties go to the first node by name",
        snapshot(
            nodes=[node("b").gpus(4, "H100"), node("a").gpus(4, "H100")],
            queued=[job(1).gpus(1).at(1.0)],
        ),
        starts={1: ("a", (0,))},
    ),
    Case(
        "an untyped job never mixes GPU models on one node",
        snapshot(
            nodes=[node("mixed").gpus(2, "H100").gpus(2, "A100")],
            queued=[job(1).gpus(3).at(1.0)],
        ),
        starts={},
        waits={1: ("waiting for 3 free same-model GPU(s)", "4 free now")},
    ),
    Case(
        "an untyped job takes GPUs of a single model when it fits",
        snapshot(
            nodes=[node("mixed").gpus(1, "H100").gpus(3, "A100")],
            queued=[job(1).gpus(3).at(1.0)],
        ),
        starts={1: ("mixed", (1, 2, 3))},  # the three A100s, never H100 0 + two A100s
    ),
    Case(
        "gpu_type filters GPUs on a mixed node",
        snapshot(
            nodes=[node("mixed").gpus(4, "H100").gpus(4, "A100")],
            running=[running(100, "mixed", 4)],
            queued=[job(1).gpus(2).gpu_type("A100").at(1.0), job(2).gpus(4).gpu_type("H100").at(2.0)],
        ),
        starts={1: ("mixed", (5, 6)), 2: ("mixed", (0, 1, 2, 3))},
    ),
    Case(
        "gpu_type filters nodes",
        snapshot(
            nodes=[node("a").gpus(8, "A100"), node("l").gpus(2, "L4")],
            queued=[job(1).gpus(2).gpu_type("L4").at(1.0)],
        ),
        starts={1: ("l", (0, 1))},
    ),
    Case(
        "a GPU type no node has waits (and only holds back that type)",
        snapshot(
            nodes=[node("a").gpus(8, "A100")],
            queued=[job(1).gpus(1).gpu_type("B200").at(1.0), job(2).gpus(1).gpu_type("A100").at(2.0)],
        ),
        starts={2: ("a", (0,))},
        waits={1: ("waiting for 1 free B200", "0 free now")},
    ),
    Case(
        "no GPU is handed out twice in one cycle",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            queued=[job(i).gpus(1).at(float(i)) for i in range(1, 6)],
        ),
        starts={1: ("n1", (0,)), 2: ("n1", (1,)), 3: ("n1", (2,)), 4: ("n1", (3,))},
        waits={5: ("waiting for 1 free", "0 free now")},
    ),
    Case(
        "GPUs held by running jobs are not handed out",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            running=[running(100, "n1", 0, 2)],
            queued=[job(1).gpus(2).at(1.0), job(2).gpus(1).at(2.0)],
        ),
        starts={1: ("n1", (1, 3))},
        waits={2: ("waiting for 1 free", "0 free now")},
    ),
    Case(
        "an empty queue starts nothing",
        snapshot(nodes=[node("n1").gpus(4, "H100")]),
        starts={},
    ),
    Case(
        "no nodes: every job waits",
        snapshot(queued=[job(1).gpus(1).at(1.0), job(2).gpus(1).gpu_type("H100").at(2.0)]),
        starts={},
        waits={1: ("waiting for 1 free",), 2: ("waiting for 1 free H100",)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    plan = decide(case.snap, now=1000.0)
    got = {s.job_id: s.allocation for s in plan.starts}
    assert set(got) == set(case.starts), f"started {sorted(got)}, expected {sorted(case.starts)}"
    for job_id, (node_name, indices) in case.starts.items():
        slices = got[job_id].slices
        assert [(s.node, s.gpu_indices) for s in slices] == [(node_name, indices)]
    assert set(plan.waiting) == set(case.waits)
    for job_id, needles in case.waits.items():
        for needle in needles:
            assert needle in plan.waiting[job_id], plan.waiting[job_id]


def test_starts_come_out_in_queue_order() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(8, "H100")],
        queued=[
            job(1).gpus(1).priority("low").at(0.0),
            job(2).gpus(1).at(5.0),
            job(3).gpus(1).priority("high").at(9.0),
            job(4).gpus(1).at(1.0),
        ],
    )
    assert [s.job_id for s in decide(snap, 0.0).starts] == [3, 4, 2, 1]


def test_decide_does_not_depend_on_now_or_input_order() -> None:
    queued = [job(i).gpus(1 + i % 3).gpu_type(("H100", "A100", None)[i % 3]).at(float(i % 4)).build() for i in range(9)]
    nodes = [node("h").gpus(4, "H100").build(), node("a").gpus(4, "A100").build()]
    a = decide(Snapshot(tuple(nodes), (), tuple(queued)), now=0.0)
    b = decide(Snapshot(tuple(reversed(nodes)), (), tuple(reversed(queued))), now=1e9)
    assert a.starts == b.starts
    assert a.waiting == b.waiting


def test_queue_order_key() -> None:
    jobs = [
        job(5).priority("normal").at(1.0).build(),
        job(2).priority("high").at(7.0).build(),
        job(3).priority("normal").at(1.0).build(),
        job(1).priority("low").at(0.0).build(),
    ]
    assert [j.job_id for j in sorted(jobs, key=queue_order)] == [2, 3, 5, 1]


# ---- property test -----------------------------------------------------------------------------

MODELS = ("H100", "A100", "L4")


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    nodes: list[Node] = []
    for n in range(draw(st.integers(0, 4))):
        b = node(f"n{n}")
        for _ in range(draw(st.integers(1, 3))):
            b.gpus(draw(st.integers(1, 8)), draw(st.sampled_from(MODELS)))
        nodes.append(b.build())

    # Running jobs: disjoint groups of GPUs, one node each.
    runs: list[RunningJob] = []
    next_id = 1000
    for nd in nodes:
        idxs = [g.index for g in nd.gpus]
        used = draw(st.lists(st.sampled_from(idxs), unique=True, max_size=len(idxs)))
        while used:
            k = draw(st.integers(1, len(used)))
            runs.append(running(next_id, nd.name, *used[:k]))
            used = used[k:]
            next_id += 1

    queued: list[JobRequest] = []
    for jid in range(1, draw(st.integers(0, 12)) + 1):
        queued.append(
            JobRequest(
                job_id=jid,
                gpus=draw(st.integers(1, 10)),
                gpu_type=draw(st.sampled_from((*MODELS, None, "B200"))),
                priority=draw(st.sampled_from(list(Priority))),
                submitted_at=float(draw(st.integers(0, 5))),  # small range: plenty of ties
            )
        )
    return Snapshot(tuple(nodes), tuple(runs), tuple(draw(st.permutations(queued))))


def _model(nd: Node, index: int) -> str:
    return next(g.model for g in nd.gpus if g.index == index)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_decide_invariants(snap: Snapshot) -> None:
    plan = decide(snap, now=0.0)
    nodes = {n.name: n for n in snap.nodes}
    queued = {j.job_id: j for j in snap.queued}
    all_models = frozenset(g.model for n in snap.nodes for g in n.gpus)

    def wanted(j: JobRequest) -> frozenset[str]:
        return frozenset({j.gpu_type}) if j.gpu_type else all_models

    # Every queued job is either started or told why it waits, never both.
    started = [s.job_id for s in plan.starts]
    assert len(started) == len(set(started))
    assert set(started).isdisjoint(plan.waiting)
    assert set(started) | set(plan.waiting) == set(queued)
    assert all(reason for reason in plan.waiting.values())

    # No GPU is in two allocations, counting running jobs and new starts.
    taken: set[tuple[str, int]] = set()
    for r in snap.running:
        taken |= r.allocation.gpu_keys()
    for s in plan.starts:
        j = queued[s.job_id]
        keys = s.allocation.gpu_keys()
        # gang: all or nothing, on one node
        assert s.allocation.gpu_count == j.gpus == len(keys)
        assert len(s.allocation.slices) == 1
        for name, idx in keys:
            assert name in nodes, f"job {j.job_id} placed on unknown node {name}"
            assert idx in {g.index for g in nodes[name].gpus}, f"GPU {name}:{idx} does not exist"
        assert not keys & taken, f"job {j.job_id} got GPUs already in use: {sorted(keys & taken)}"
        taken |= keys
        models = {_model(nodes[n], i) for n, i in keys}
        assert len(models) == 1, f"job {j.job_id} mixes GPU models {models}"
        if j.gpu_type is not None:
            assert models == {j.gpu_type}

    # A job that waits for resources really cannot fit in what is left after this cycle.
    free_left: dict[str, list[int]] = {
        n.name: [g.index for g in n.gpus if (n.name, g.index) not in taken] for n in snap.nodes
    }
    resource_waiters = {jid for jid, r in plan.waiting.items() if not r.startswith("waiting behind job")}
    for jid in resource_waiters:
        j = queued[jid]
        for name, idxs in free_left.items():
            for m in wanted(j):
                fit = sum(1 for i in idxs if _model(nodes[name], i) == m)
                assert fit < j.gpus, f"job {jid} waits but {fit} free {m} on {name} would fit it"

    # Strict order within a GPU pool: no started job overtook an earlier job that could not fit
    # and wants some of the same GPU models.
    for s in plan.starts:
        x = queued[s.job_id]
        for jid in resource_waiters:
            y = queued[jid]
            if queue_order(y) < queue_order(x):
                assert not wanted(x) & wanted(y), f"job {x.job_id} overtook job {y.job_id}"

    # A held-back job names an earlier blocker that could not fit and competes for its models.
    for jid, reason in plan.waiting.items():
        if reason.startswith("waiting behind job"):
            blocker = int(reason.removeprefix("waiting behind job ").split(",")[0])
            assert blocker in resource_waiters
            assert queue_order(queued[blocker]) < queue_order(queued[jid])
            assert wanted(queued[blocker]) & wanted(queued[jid])
