"""`TeamQueues` copies a team's line into a deque of its own only when it first pops from it;
what it reads of a line (its head) must be the line as popped so far, not the caller's list."""

from __future__ import annotations

from dataclasses import replace

from gpucluster.core.policy import Policy
from gpucluster.core.queueing import TeamQueues

from .builders import job


def test_a_job_charged_out_of_turn_renews_its_teams_entry_with_the_line_as_popped() -> None:
    """Without fair share the teams' order is by the head of each line (its age). Team a's
    first job is popped, then team b's; a job of team a started out of turn (`charge`, a
    preempted job considered after its preemptor) renews a's entry in the heap. With a's
    head read from the caller's list (job 1, popped already) a would go first; its head is
    job 2 (t=10), so b's next job (t=7) comes first."""
    policy = replace(Policy(), fair_share=False)
    a1, a2 = job(1).team("a").at(0.0).build(), job(2).team("a").at(10.0).build()
    b1, b2 = job(3).team("b").at(5.0).build(), job(4).team("b").at(7.0).build()
    late = job(9).team("a").at(1.0).build()
    queues = TeamQueues([a1, a2, b1, b2], policy, {}, 100.0)
    assert queues.pop() is a1
    queues.done(a1, False)
    assert queues.pop() is b1  # a goes back to the heap with job 2 at its head
    queues.charge(late)
    queues.done(b1, False)
    assert [queues.pop(), queues.pop(), queues.pop()] == [b2, a2, None]
