"""Structured waits (issue 15): the core gives a wait's code and numbers, never a sentence; the
one renderer (gpucluster/waits_text.py) makes the sentence, saying the numbers and naming the
time zone; the store keeps the numbers and still reads rows that hold a sentence."""

from __future__ import annotations

from dataclasses import replace
from zoneinfo import ZoneInfo

from gpucluster.core.eligibility import Target, eligible
from gpucluster.core.limits import within_limits
from gpucluster.core.policy import Limit, Limits
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.states import JobState
from gpucluster.core.types import Dependency, DependencyKind, Wait
from gpucluster.waits_text import from_json, render_stored, sentence, stored, to_json

from .builders import job, node, policy, running, snapshot

NOW = 100_000.0  # 1970-01-02 03:46:40 UTC
TOKYO = ZoneInfo("Asia/Tokyo")


def crowded() -> dict[int, Wait]:
    """n1 has 2 GPUs free until job 1 ends at NOW + 3000 (its limit); n2 is full."""
    snap = snapshot(
        [node("n1").gpus(8), node("n2").gpus(8)],
        [
            running(1, "n1", 0, 1, 2, 3, 4, 5, started_at=NOW - 600, limit=3600),
            running(2, "n2", *range(8), started_at=NOW - 600, limit=7200),
        ],
        [job(10).gpus(4).at(NOW - 60), job(11).gpus(4).at(NOW - 30)],
    )
    plan = decide(snap, policy(), NOW)
    assert not plan.starts
    return plan.waiting


def test_the_core_gives_numbers_and_no_sentence() -> None:
    waits = crowded()
    first, second = waits[10], waits[11]
    assert not hasattr(first, "message")
    assert first.reason is WaitReason.RESERVED
    assert first.facts == WaitFacts(model="H100", gpus=4, nodes=("n1",), nodes_count=1, reserved_at=NOW + 3000)
    assert first.estimated_start == NOW + 3000
    assert second.reason is WaitReason.RESOURCES
    assert (second.facts.gpus, second.facts.free, second.facts.most_on_node) == (4, 2, 2)


def test_the_sentence_says_the_numbers_and_names_the_zone() -> None:
    waits = crowded()
    assert sentence(waits[10]) == "first in line: 4 H100 GPUs on n1 are held for it from 1970-01-02 04:36 UTC"
    assert sentence(waits[10], TOKYO) == "first in line: 4 H100 GPUs on n1 are held for it from 1970-01-02 13:36 JST"
    assert sentence(waits[11]) == "needs 4 free H100 GPU(s) on one node; 2 free now (at most 2 on one node)"


def test_a_begin_time_is_a_number_and_said_with_its_zone() -> None:
    later = replace(job(20).gpus(2).build(), not_before=NOW + 3600, begin=NOW + 3600)
    wait = decide(snapshot([node("n1").gpus(8)], [], [later]), policy(), NOW).waiting[20]
    assert (wait.reason, wait.facts.until, wait.estimated_start) == (WaitReason.BEGIN, NOW + 3600, NOW + 3600)
    assert sentence(wait) == "waits for its begin time 1970-01-02 04:46:40 UTC"


def test_a_limit_wait_carries_the_limit_and_the_use() -> None:
    alice = replace(running(1, "n1", *range(6), started_at=NOW - 600, limit=3600), user="alice")
    queued = replace(job(10).gpus(4).at(NOW - 60).build(), user="alice")
    snap = snapshot([node("n1").gpus(8), node("n2").gpus(8)], [alice], [queued])
    _, waits = within_limits(snap, policy(limits=Limits(per_user=Limit(max_running_gpus=8))), NOW)
    f = waits[10].facts
    assert waits[10].reason is WaitReason.USER_GPUS
    assert (f.user, f.used, f.limit, f.asks, f.path) == ("alice", 6, 8, 4, "limits.per_user.max_running_gpus")
    assert sentence(waits[10]).startswith(
        "alice runs 6 GPUs, the per-user limit (limits.per_user.max_running_gpus) is 8"
    )


def test_a_dependency_wait_names_the_job_and_when_it_ends() -> None:
    dependent = replace(job(42).build(), after=(Dependency(DependencyKind.AFTEROK, 41),))
    target = Target(JobState.RUNNING, True, False, NOW - 60, NOW + 600)
    result = eligible([dependent], {(41, False): target}, {}, {}, NOW, 3600.0)
    wait = result.waits[42]
    assert (wait.reason, wait.facts.job, wait.facts.kind, wait.facts.at) == (
        WaitReason.DEPENDENCY,
        41,
        "afterok",
        NOW + 600,
    )
    assert sentence(wait) == "waits for job 41 (running, expected to end 1970-01-02 03:56 UTC)"


def test_the_stored_form_round_trips_and_old_sentences_stay_readable() -> None:
    for wait in crowded().values():
        data = to_json(wait)
        assert data["code"] == wait.reason.value
        assert from_json(data) == (wait.reason, wait.facts)
        assert render_stored(data) == sentence(wait)
    # Rows written before waits were structured hold a sentence: shown as it is.
    assert stored("needs 4 free H100 GPU(s) on one node; 2 free now") is None
    assert stored('{"code": "held"}') == {"code": "held"}
    assert render_stored({"code": "from-a-newer-head", "gpus": 3}) == "from-a-newer-head"
