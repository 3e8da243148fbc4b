"""The core's two additions for issue 4, pure: elastic jobs (JobRequest.min_gpus) start at the
largest size that fits now, and a restart waiting out its backoff (JobRequest.not_before) is
not considered before its time. Plus the wire format of distributed jobs (JobSpec)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.models import JobSpec
from gpucluster.waits_text import sentence

from .builders import job, node, policy, preemption, running, snapshot

NOW = 10_000.0


def elastic(job_id: int, lo: int, hi: int, **kw: object):  # type: ignore[no-untyped-def]
    return replace(job(job_id).gpus(hi).build(), min_gpus=lo, **kw)


def started(plan) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {s.job_id: int(s.allocation.gpu_count) for s in plan.starts}


def test_an_elastic_job_takes_all_it_asks_for_when_free() -> None:
    plan = decide(snapshot([node("n1").gpus(8)], queued=[elastic(1, 2, 8)]), now=NOW)
    assert started(plan) == {1: 8}


def test_an_elastic_job_takes_the_largest_size_that_fits_now() -> None:
    snap = snapshot([node("n1").gpus(8)], running=[running(9, "n1", 0, 1, 2, 3, 4)], queued=[elastic(1, 2, 8)])
    plan = decide(snap, now=NOW)
    assert started(plan) == {1: 3}
    assert plan.starts[0].allocation.slices[0].gpu_indices == (5, 6, 7)


def test_an_elastic_job_spans_nodes_at_its_largest_size() -> None:
    snap = snapshot([node("n1").gpus(4), node("n2").gpus(4)], running=[running(9, "n1", 0)], queued=[elastic(1, 4, 8)])
    assert started(decide(snap, now=NOW)) == {1: 7}


def test_an_elastic_job_below_its_minimum_waits_for_its_minimum() -> None:
    snap = snapshot([node("n1").gpus(8)], running=[running(9, "n1", *range(7))], queued=[elastic(1, 2, 8)])
    plan = decide(snap, now=NOW)
    assert plan.starts == ()
    assert plan.waiting[1].reason is WaitReason.RESERVED
    assert "2 H100 GPUs" in sentence(plan.waiting[1])


def test_an_elastic_job_preempts_only_what_its_minimum_needs() -> None:
    snap = snapshot(
        [node("n1").gpus(8)],
        running=[running(9, "n1", 0, 1, 2, 3, priority="low"), running(8, "n1", 4, 5, 6, 7, priority="low")],
        queued=[replace(elastic(1, 4, 8), priority=job(1).priority("high").build().priority)],
    )
    plan = decide(snap, policy(preemption=preemption(min_runtime_s=0)), now=NOW)
    assert len(plan.preemptions) == 1  # one 4-GPU job, not both


def test_elastic_jobs_do_not_pass_a_reservation() -> None:
    """A full-size job first in line holds n1; an elastic job behind it may not take its GPUs."""
    snap = snapshot(
        [node("n1").gpus(8)],
        running=[running(9, "n1", 0, 1, 2, 3, limit=600, started_at=NOW)],
        queued=[job(1).gpus(8).at(1).build(), replace(elastic(2, 2, 4), submitted_at=2.0)],
    )
    plan = decide(snap, now=NOW)
    assert plan.starts == ()
    assert plan.waiting[2].reason is WaitReason.BEHIND_RESERVATION


def test_a_job_waiting_out_its_backoff_is_held_back_until_then() -> None:
    queued = [replace(job(1).gpus(2).build(), not_before=NOW + 5), job(2).gpus(2).build()]
    plan = decide(snapshot([node("n1").gpus(8)], queued=queued), now=NOW)
    assert started(plan) == {2: 2}
    wait = plan.waiting[1]
    assert (wait.reason, wait.estimated_start) == (WaitReason.BACKOFF, NOW + 5)
    assert "held back until" in sentence(wait)
    assert started(decide(snapshot([node("n1").gpus(8)], queued=queued[:1]), now=NOW + 5)) == {1: 2}


# ---- JobSpec -----------------------------------------------------------------------------------


def test_a_gpu_range_is_an_elastic_job() -> None:
    s = JobSpec(command=["x"], gpus="4..8")  # type: ignore[arg-type]
    assert (s.gpus, s.min_gpus, s.gpus_label) == (8, 4, "4..8")
    assert JobSpec.model_validate(s.model_dump()) == s
    assert JobSpec(command=["x"], gpus="4..4").min_gpus is None  # type: ignore[arg-type]
    assert JobSpec(command=["x"], gpus=8, min_gpus=2).gpus_label == "2..8"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"gpus": "4..x"}, "write MIN..MAX in whole GPUs"),
        ({"gpus": "4..8", "min_gpus": 2}, "either a range"),
        ({"gpus": "8..4"}, "min_gpus (8) must be at most gpus (4)"),
        ({"gpus": 0.5, "min_gpus": 1}, "needs whole GPUs"),
        ({"gpus": "2..4", "nodes": 2}, "cannot be combined with nodes"),
        ({"gpus": 2, "per_gpu": True, "launcher": "torchrun"}, "choose one"),
        ({"gpus": 0.5, "per_gpu": True}, "need whole GPUs"),
        ({"gpus": 2, "launcher": "mpirun"}, "launcher"),
        ({"gpus": 2, "launcher": "torchrun", "shell": True, "command": ["a b"]}, "shell"),
        ({"max_restarts": -1}, "max_restarts"),
    ],
)
def test_distributed_fields_are_validated(fields: dict[str, object], words: str) -> None:
    fields.setdefault("command", ["x"])
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        JobSpec.model_validate(fields)
