"""Drained nodes stay visible to the scheduler as unavailable (core/admission.py, core/estimate.py).

A job that only drained nodes could host waits DRAINED, naming the drain and its end, and its
estimated start counts from that end; on main it was told "no set of nodes can host it (no GPUs)".
"""

from __future__ import annotations

import time
from dataclasses import replace

from gpucluster.core.admission import admit
from gpucluster.core.estimate import estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.types import Drain
from gpucluster.waits_text import sentence

from .builders import job, node, snapshot

NOW = 1_000_000.0
HOUR = 3600.0


def test_a_job_only_a_drained_node_could_host_waits_for_the_drains_end() -> None:
    end = NOW + 2 * HOUR
    snap = replace(
        snapshot([node("n1").gpus(8)], queued=[job(1).gpus(4)]),
        drained=frozenset({"n1"}),
        drains={"n1": Drain("maintenance", end)},
    )
    plan = decide(snap, Policy(), NOW)
    wait = plan.waiting[1]
    assert not plan.starts
    assert (wait.reason, wait.facts.drains, wait.estimated_start) == (
        WaitReason.DRAINED,
        (("n1", "maintenance", end),),
        end,
    )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end))
    assert sentence(wait) == f"node n1 is drained (maintenance), until {when}"
    admitted, _ = admit(snap)
    assert estimate_starts(admitted, Policy(), NOW, plan)[1].start == end  # the replay counts from it too


def test_a_drain_without_an_end_is_named_and_gives_no_estimate() -> None:
    snap = replace(
        snapshot([node("n1").gpus(8)], queued=[job(1).gpus(4)]),
        drained=frozenset({"n1"}),
        drains={"n1": Drain("ECC errors on GPU 3")},
    )
    plan = decide(snap, Policy(), NOW)
    wait = plan.waiting[1]
    assert (wait.reason, sentence(wait), wait.estimated_start) == (
        WaitReason.DRAINED,
        "node n1 is drained (ECC errors on GPU 3) with no end set",
        None,
    )
    admitted, _ = admit(snap)
    assert estimate_starts(admitted, Policy(), NOW, plan)[1].start is None


def test_only_the_drains_a_job_needs_are_named_the_last_back_first() -> None:
    """Two 8-GPU nodes drained until +1 h and +3 h, one left: a 16-GPU job needs one drained
    node back (the first, +1 h); a 24-GPU job needs both (from +3 h)."""
    snap = replace(
        snapshot(
            [node("n1").gpus(8), node("n2").gpus(8), node("n3").gpus(8)],
            queued=[job(1).gpus(16), job(2).gpus(24), job(3).gpus(32)],
        ),
        drained=frozenset({"n1", "n2"}),
        drains={"n1": Drain("a", NOW + 3 * HOUR), "n2": Drain("b", NOW + HOUR)},
    )
    plan = decide(snap, Policy(), NOW)
    assert plan.waiting[1].reason is WaitReason.DRAINED and sentence(plan.waiting[1]).startswith(
        "node n2 is drained (b)"
    )
    assert plan.waiting[1].estimated_start == NOW + HOUR
    assert sentence(plan.waiting[2]).startswith("node n1 is drained (a), until ")
    assert "; node n2 is drained (b), until " in sentence(plan.waiting[2])
    assert plan.waiting[2].estimated_start == NOW + 3 * HOUR
    assert plan.waiting[3].reason is WaitReason.NO_FIT  # 32 GPUs: not even with every node back
