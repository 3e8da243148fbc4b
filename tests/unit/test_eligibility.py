"""The eligibility rules (core/eligibility.py) and the array and sweep syntax (core/arrays.py)."""

from __future__ import annotations

import pytest

from gpucluster.core.arrays import (
    ArraySyntaxError,
    check_size,
    element_env,
    parse_array,
    parse_sweep,
    substitute,
)
from gpucluster.core.eligibility import Target, Verdict, eligible, verdict
from gpucluster.core.reasons import WaitReason
from gpucluster.core.states import JobState
from gpucluster.core.types import Dependency, DependencyKind, JobRequest
from gpucluster.waits_text import sentence

NOW = 1_000_000.0
LIMIT = 3600.0
OK, NOTOK, ANY, AFTER = (
    DependencyKind.AFTEROK,
    DependencyKind.AFTERNOTOK,
    DependencyKind.AFTERANY,
    DependencyKind.AFTER,
)


def job(job_id: int, **kw: object) -> JobRequest:
    return JobRequest(job_id=job_id, gpus=1, **kw)  # type: ignore[arg-type]


# ---- array syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "indices", "throttle"),
    [
        ("0-4", (0, 1, 2, 3, 4), None),
        ("0-9:3", (0, 3, 6, 9), None),
        ("1,5,7", (1, 5, 7), None),
        ("0-2,10-11%2", (0, 1, 2, 10, 11), 2),
        ("3", (3,), None),
        ("0-3,2-5", (0, 1, 2, 3, 4, 5), None),
    ],
)
def test_array_syntax(text: str, indices: tuple[int, ...], throttle: int | None) -> None:
    parsed = parse_array(text)
    assert parsed.indices == indices and parsed.throttle == throttle


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("0-", "cannot read"),
        ("a-b", "cannot read"),
        ("5-1", "ends before it starts"),
        ("0-9:0", "step"),
        ("0-9%0", "throttle of 0"),
        ("0-9%x", "throttle after %"),
        ("0-2000000", "more than"),
    ],
)
def test_bad_array_syntax_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ArraySyntaxError, match=words):
        parse_array(text)


def test_a_large_array_needs_confirmation() -> None:
    check_size(100_000, confirmed=False)
    with pytest.raises(ArraySyntaxError, match="--yes"):
        check_size(100_001, confirmed=False)
    check_size(100_001, confirmed=True)


def test_a_grid_sweep_varies_the_last_parameter_fastest() -> None:
    sweep = parse_sweep({"lr": [0.001, 0.0003], "batch": [32, 64]})
    assert sweep.count == 4
    assert [sweep.values(i) for i in range(4)] == sweep.all_values()
    assert sweep.values(1) == {"lr": 0.001, "batch": 64}
    assert sweep.values(2) == {"lr": 0.0003, "batch": 32}


def test_a_random_sweep_is_seeded_and_each_element_stands_alone() -> None:
    raw = {"lr": [1, 2, 3, 4, 5], "wd": [0, 1], "random": 10, "seed": 7}
    a, b = parse_sweep(raw), parse_sweep(raw)
    assert a.count == 10
    assert [a.values(i) for i in range(10)] == [b.values(i) for i in range(10)]
    assert parse_sweep({**raw, "seed": 8}).all_values() != a.all_values()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({}, "no parameters"),
        ({"lr": []}, "non-empty list"),
        ({"lr": "0.1"}, "non-empty list"),
        ({"bad-name": [1]}, "environment variable name"),
        ({"GPUCLUSTER_X": [1]}, "environment variable name"),
        ({"lr": [1], "random": 0}, "random"),
        ({"lr": [1], "seed": 3}, "add random"),
        ({"lr": [{"a": 1}]}, "numbers or text"),
    ],
)
def test_bad_sweeps_say_what_is_wrong(raw: dict[str, object], words: str) -> None:
    with pytest.raises(ArraySyntaxError, match=words):
        parse_sweep(raw)


def test_placeholders_and_element_env() -> None:
    assert substitute(["--lr={lr}", "{other}", "{b}{lr}"], {"lr": 0.1, "b": True}) == ["--lr=0.1", "{other}", "true0.1"]
    env = element_env(41, 7, 200, {"lr": 0.1})
    assert env["GPUCLUSTER_ARRAY_ID"] == "41" and env["GPUCLUSTER_ARRAY_INDEX"] == "7"
    assert env["GPUCLUSTER_ARRAY_COUNT"] == "200" and env["SLURM_ARRAY_TASK_ID"] == "7" and env["lr"] == "0.1"


# ---- dependency verdicts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "state", "started", "expected"),
    [
        (AFTER, JobState.QUEUED, False, Verdict.WAITING),
        (AFTER, JobState.RUNNING, True, Verdict.MET),
        (AFTER, JobState.CANCELLED, False, Verdict.MET),
        (OK, JobState.RUNNING, True, Verdict.WAITING),
        (OK, JobState.SUCCEEDED, True, Verdict.MET),
        (OK, JobState.FAILED, True, Verdict.NEVER),
        (OK, JobState.CANCELLED, False, Verdict.NEVER),
        (NOTOK, JobState.SUCCEEDED, True, Verdict.NEVER),
        (NOTOK, JobState.FAILED, True, Verdict.MET),
        (ANY, JobState.PREEMPTED, True, Verdict.WAITING),
        (ANY, JobState.FAILED, True, Verdict.MET),
    ],
)
def test_verdicts(kind: DependencyKind, state: JobState, started: bool, expected: Verdict) -> None:
    assert verdict(kind, Target(state, started)) is expected


def test_afterok_on_an_array_with_a_failed_element_can_never_be_met() -> None:
    assert verdict(OK, Target(JobState.RUNNING, any_failed=True)) is Verdict.NEVER
    assert verdict(ANY, Target(JobState.RUNNING, any_failed=True)) is Verdict.WAITING


# ---- eligibility --------------------------------------------------------------------------------


def test_nothing_to_check_passes_the_queue_through() -> None:
    queue = (job(1), job(2))
    result = eligible(queue, {}, {}, {}, NOW, LIMIT)
    assert result.eligible == queue and not result.waits and not result.doomed


def test_a_held_job_waits_with_its_reason() -> None:
    result = eligible((job(1, held=True), job(2)), {}, {}, {}, NOW, LIMIT)
    assert [r.job_id for r in result.eligible] == [2]
    assert result.waits[1].reason is WaitReason.HELD and sentence(result.waits[1]) == "held by user"


def test_a_dependency_waits_then_is_eligible_or_doomed() -> None:
    dep = (Dependency(OK, 41),)
    running = {(41, False): Target(JobState.RUNNING, True, expected_end=NOW + 600)}
    result = eligible((job(50, after=dep),), running, {}, {}, NOW, LIMIT)
    assert not result.eligible
    wait = result.waits[50]
    assert wait.reason is WaitReason.DEPENDENCY and wait.estimated_start == NOW + 600
    assert sentence(wait).startswith("waits for job 41 (running, expected to end ")
    done = {(41, False): Target(JobState.SUCCEEDED, True)}
    assert [r.job_id for r in eligible((job(50, after=dep),), done, {}, {}, NOW, LIMIT).eligible] == [50]
    failed = {(41, False): Target(JobState.FAILED, True)}
    doomed = eligible((job(50, after=dep),), failed, {}, {}, NOW, LIMIT).doomed
    assert doomed == {50: "dependency can never be met: job 41 failed (afterok)"}


def test_a_held_job_with_a_dependency_that_fails_is_still_cancelled() -> None:
    failed = {(41, False): Target(JobState.FAILED, True)}
    result = eligible((job(50, held=True, after=(Dependency(OK, 41),)),), failed, {}, {}, NOW, LIMIT)
    assert 50 in result.doomed


def test_a_chain_is_estimated_through_each_step() -> None:
    """40 runs until NOW+600; 41 (limit 1200) waits for it; 42 waits for 41."""
    targets = {
        (40, False): Target(JobState.RUNNING, True, expected_end=NOW + 600),
        (41, False): Target(JobState.QUEUED),  # no estimate of its own: it waits on 40
    }
    queue = (
        job(41, after=(Dependency(OK, 40),), time_limit_s=1200.0),
        job(42, after=(Dependency(ANY, 41),)),
    )
    result = eligible(queue, targets, {}, {}, NOW, LIMIT)
    assert result.waits[41].estimated_start == NOW + 600
    assert result.waits[42].estimated_start == NOW + 600 + 1200
    assert "waiting, expected to end" in sentence(result.waits[42])


def test_after_on_a_waiting_step_of_a_chain_is_estimated_from_its_start() -> None:
    """41 waits for 40 (running until NOW+600); 42 needs only 41 started: NOW+600, not 41's end."""
    targets = {
        (40, False): Target(JobState.RUNNING, True, expected_end=NOW + 600),
        (41, False): Target(JobState.QUEUED),
    }
    queue = (
        job(41, after=(Dependency(OK, 40),), time_limit_s=1200.0),
        job(42, after=(Dependency(AFTER, 41),)),
    )
    result = eligible(queue, targets, {}, {}, NOW, LIMIT)
    assert result.waits[42].estimated_start == NOW + 600
    assert "waiting, expected to start" in sentence(result.waits[42])


def test_an_unknown_end_gives_no_estimate() -> None:
    targets = {(40, False): Target(JobState.QUEUED)}
    result = eligible((job(41, after=(Dependency(OK, 40),)),), targets, {}, {}, NOW, LIMIT)
    assert result.waits[41].estimated_start is None and "end not estimated yet" in sentence(result.waits[41])


def test_a_missing_target_can_never_be_met() -> None:
    result = eligible((job(41, after=(Dependency(OK, 9),)),), {}, {}, {}, NOW, LIMIT)
    assert "job 9 no longer exists" in result.doomed[41]


def test_the_throttle_lets_through_only_the_room_left_lowest_ids_first() -> None:
    queue = tuple(job(i, array_id=10) for i in range(10, 20))
    result = eligible(queue, {}, {10: 2}, {10: 5}, NOW, LIMIT)
    assert [r.job_id for r in result.eligible] == [10, 11, 12]
    assert all(result.waits[i].reason is WaitReason.THROTTLE for i in range(13, 20))
    full = eligible(queue, {}, {10: 5}, {10: 5}, NOW, LIMIT)
    assert not full.eligible and "at most 5 elements at once (5 running)" in sentence(full.waits[10])
    assert "at most 5 elements at once (5 running)" in sentence(result.waits[13])  # 2 running, 3 starting


def test_held_or_blocked_elements_take_no_room_under_the_throttle() -> None:
    queue = (job(10, array_id=10, held=True), job(11, array_id=10), job(12, array_id=10))
    result = eligible(queue, {}, {}, {10: 1}, NOW, LIMIT)
    assert [r.job_id for r in result.eligible] == [11]
    assert result.waits[10].reason is WaitReason.HELD and result.waits[12].reason is WaitReason.THROTTLE


def test_an_array_without_a_throttle_is_not_limited() -> None:
    queue = tuple(job(i, array_id=10) for i in range(10, 15))
    assert len(eligible(queue, {}, {}, {}, NOW, LIMIT).eligible) == 5
