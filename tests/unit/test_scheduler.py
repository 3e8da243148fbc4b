"""core.scheduler.decide: the first issue's table-driven cases, ported to the issue-3 scheduler.

What changed on purpose, and how the cases follow it:
- A blocked job no longer holds back every later job of its GPU models: the first one in line
  gets a reservation (EASY backfill) and later jobs wait `behind_reservation` only if they would
  delay it; a job of another model, or one that keeps off the reserved node, passes.
- The default policy preempts: a blocked higher-priority job stops lower-priority running jobs.
- A job larger than one node may span nodes (fewest nodes); one that no set of nodes can ever host
  waits with `no_fit` (the API refuses it at submit).
- Wait reasons are `Wait(reason, facts, estimated_start)`: a code and its numbers, never a sentence
  (the sentence is waits_text's; these tests read it through `sentence`).

The rules of issue 3 have their own tables in test_scheduler_rules.py; the random-cluster
properties (which replace this file's old strict-order property) are in test_scheduler_properties.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpucluster.core.policy import Policy
from gpucluster.core.queueing import TeamQueues
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.waits_text import sentence

from .builders import job, no_preemption, node, policy, running, snapshot

R = WaitReason
NOW = 1000.0
NO_PREEMPT = policy(preemption=no_preemption())

# ---- table-driven cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    snap: Snapshot
    # job id -> (node, GPU indices) for every job that must start, and nothing else
    starts: dict[int, tuple[str, tuple[int, ...]]]
    # job id -> (reason, substrings of its message); every other queued job must start
    waits: dict[int, tuple[WaitReason, tuple[str, ...]]] = field(default_factory=dict)
    preempted: frozenset[int] = frozenset()
    policy: Policy | None = None


CASES = [
    Case(
        "higher priority first even if submitted later",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            queued=[job(1).gpus(8).at(1.0), job(2).gpus(8).priority("high").at(2.0)],
        ),
        starts={2: ("n1", (0, 1, 2, 3, 4, 5, 6, 7))},
        waits={1: (R.RESERVED, ("first in line: 8 H100 GPUs on n1",))},
    ),
    Case(
        "low priority goes after normal",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            queued=[job(1).gpus(4).priority("low").at(0.0), job(2).gpus(4).priority("normal").at(9.0)],
        ),
        starts={2: ("n1", (0, 1, 2, 3))},
        waits={1: (R.RESERVED, ("4 H100 GPUs on n1",))},
    ),
    Case(
        "same priority: first come first served",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            queued=[job(1).gpus(8).at(5.0), job(2).gpus(8).at(1.0)],
        ),
        starts={2: ("n1", tuple(range(8)))},
        waits={1: (R.RESERVED, ())},
    ),
    Case(
        "same priority and submit time: lower id first",
        snapshot(
            nodes=[node("n1").gpus(2, "H100")],
            queued=[job(9).gpus(2).at(3.0), job(4).gpus(2).at(3.0)],
        ),
        starts={4: ("n1", (0, 1))},
        waits={9: (R.RESERVED, ())},
    ),
    Case(
        "a job that does not fit holds back later jobs that would delay it, not jobs of another model",
        snapshot(
            nodes=[node("h").gpus(4, "H100"), node("a").gpus(4, "A100")],
            running=[running(100, "h", 0, 1)],
            queued=[
                job(1).gpus(4).gpu_type("H100").at(1.0),  # 2 H100 free: does not fit, gets h reserved
                job(2).gpus(1).gpu_type("H100").at(2.0),  # would fit, but would delay job 1
                job(3).gpus(2).gpu_type("A100").at(3.0),  # other model: passes
            ],
        ),
        starts={3: ("a", (0, 1))},
        waits={
            1: (R.RESERVED, ("first in line: 4 H100 GPUs on h",)),
            2: (R.BEHIND_RESERVATION, ("would delay job 1", "H100")),
        },
    ),
    Case(
        "a blocked high-priority job holds back lower-priority jobs of the same model (no preemption)",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            running=[running(100, "n1", 0)],
            queued=[job(1).gpus(1).at(0.0), job(2).gpus(8).priority("high").at(5.0)],
        ),
        starts={},
        waits={2: (R.RESERVED, ("8 H100 GPUs on n1",)), 1: (R.BEHIND_RESERVATION, ("would delay job 2",))},
        policy=NO_PREEMPT,
    ),
    Case(
        "a blocked high-priority job preempts the lower-priority one in its way (the default policy)",
        snapshot(
            nodes=[node("n1").gpus(8, "H100")],
            running=[running(100, "n1", 0)],
            queued=[job(2).gpus(8).priority("high").at(5.0)],
        ),
        starts={},
        waits={2: (R.PREEMPTING, ("preempting job(s) 100",))},
        preempted=frozenset({100}),
    ),
    Case(
        "a blocked untyped job reserves one model and holds back only the jobs that would delay it",
        snapshot(
            nodes=[node("h").gpus(8, "H100"), node("a").gpus(8, "A100")],
            running=[running(100, "h", 0), running(101, "a", 0)],
            queued=[
                job(1).gpus(8).at(1.0),
                job(2).gpus(1).gpu_type("A100").at(2.0),
                job(3).gpus(1).gpu_type("H100").at(3.0),
            ],
        ),
        # models of equal memory are tried by name: A100 first, so the A100 node is held
        starts={3: ("h", (1,))},
        waits={1: (R.RESERVED, ("8 A100 GPUs on a",)), 2: (R.BEHIND_RESERVATION, ("would delay job 1",))},
        policy=NO_PREEMPT,
    ),
    Case(
        "an untyped job passes a blocked typed job on a model nobody reserved",
        snapshot(
            nodes=[node("h").gpus(2, "H100"), node("a").gpus(2, "A100")],
            running=[running(100, "h", 0, priority="high")],
            queued=[job(1).gpus(2).gpu_type("H100").at(1.0), job(2).gpus(1).at(2.0)],
        ),
        starts={2: ("a", (0,))},
        waits={1: (R.RESERVED, ("2 H100 GPUs on h",))},
    ),
    Case(
        "an untyped job that fits only on the reserved model waits behind the reservation",
        snapshot(
            nodes=[node("h").gpus(2, "H100"), node("a").gpus(2, "A100")],
            running=[running(100, "h", 0, priority="high"), running(101, "a", 0, 1, priority="high")],
            queued=[job(1).gpus(2).gpu_type("H100").at(1.0), job(2).gpus(1).at(2.0)],
        ),
        starts={},
        waits={1: (R.RESERVED, ()), 2: (R.BEHIND_RESERVATION, ("would delay job 1",))},
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
        waits={1: (R.NO_FIT, ("can host 3 GPUs of any model", "A100: 2 per node, 2 in all"))},
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
        "a GPU type no node has can never run (and holds nothing back)",
        snapshot(
            nodes=[node("a").gpus(8, "A100")],
            queued=[job(1).gpus(1).gpu_type("B200").at(1.0), job(2).gpus(1).gpu_type("A100").at(2.0)],
        ),
        starts={2: ("a", (0,))},
        waits={1: (R.NO_FIT, ("of B200", "A100: 8 per node"))},
    ),
    Case(
        "no GPU is handed out twice in one cycle",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            queued=[job(i).gpus(1).at(float(i)) for i in range(1, 6)],
        ),
        starts={1: ("n1", (0,)), 2: ("n1", (1,)), 3: ("n1", (2,)), 4: ("n1", (3,))},
        waits={5: (R.RESERVED, ("1 H100 GPUs on n1",))},
    ),
    Case(
        "GPUs held by running jobs are not handed out",
        snapshot(
            nodes=[node("n1").gpus(4, "H100")],
            running=[running(100, "n1", 0, 2)],
            queued=[job(1).gpus(2).at(1.0), job(2).gpus(1).at(2.0)],
        ),
        starts={1: ("n1", (1, 3))},
        waits={2: (R.RESERVED, ())},
    ),
    Case(
        "an empty queue starts nothing",
        snapshot(nodes=[node("n1").gpus(4, "H100")]),
        starts={},
    ),
    Case(
        "no nodes: every job waits, and says nothing could ever host it",
        snapshot(queued=[job(1).gpus(1).at(1.0), job(2).gpus(1).gpu_type("H100").at(2.0)]),
        starts={},
        waits={1: (R.NO_FIT, ("no GPUs",)), 2: (R.NO_FIT, ("of H100",))},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    plan = decide(case.snap, case.policy, now=NOW)
    got = {s.job_id: s.allocation for s in plan.starts}
    assert set(got) == set(case.starts), f"started {sorted(got)}, expected {sorted(case.starts)}: {plan.waiting}"
    for job_id, (node_name, indices) in case.starts.items():
        slices = got[job_id].slices
        assert [(s.node, s.gpu_indices) for s in slices] == [(node_name, indices)]
    assert set(plan.waiting) == set(case.waits)
    for job_id, (reason, needles) in case.waits.items():
        wait = plan.waiting[job_id]
        assert wait.reason is reason, wait
        for needle in needles:
            assert needle in sentence(wait), wait
    assert {p.job_id for p in plan.preemptions} == case.preempted


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
    assert [s.job_id for s in decide(snap, now=0.0).starts] == [3, 4, 2, 1]


def test_decide_does_not_depend_on_input_order() -> None:
    queued = [
        job(i).gpus(1 + i % 3).gpu_type(("H100", "A100", None)[i % 3]).at(float(i % 4)).team(("a", "b")[i % 2]).build()
        for i in range(12)
    ]
    nodes = [node("h").gpus(4, "H100").build(), node("a").gpus(4, "A100").build()]
    runs = [running(100, "h", 0, started_at=-10.0), running(101, "a", 3, started_at=-20.0, priority="low")]
    a = decide(Snapshot(tuple(nodes), tuple(runs), tuple(queued)), now=0.0)
    b = decide(Snapshot(tuple(reversed(nodes)), tuple(reversed(runs)), tuple(reversed(queued))), now=0.0)
    assert a.starts == b.starts
    assert a.preemptions == b.preemptions
    assert a.waiting == b.waiting


def test_queue_order_without_fair_share_is_priority_then_submission_then_id() -> None:
    jobs = [
        job(5).priority("normal").at(1.0).build(),
        job(2).priority("high").at(7.0).build(),
        job(3).priority("normal").at(1.0).build(),
        job(1).priority("low").at(0.0).build(),
        job(4).priority("critical").at(9.0).build(),
    ]
    queues = TeamQueues(jobs, Policy(fair_share=False), {}, now=10.0)
    order = []
    while (j := queues.pop()) is not None:
        order.append(j.job_id)
        queues.done(j, started=False)
    assert order == [4, 2, 3, 5, 1]
