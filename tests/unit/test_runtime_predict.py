"""The run-time predictor (core/runtime_predict.py): quantiles, similarity keys, the fallback
to the time limit, and never a prediction above the limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.runtime_predict import (
    FinishedRun,
    JobShape,
    RuntimePredictor,
    duration_words,
    quantile,
    workload_of,
)

H = 3600.0


def shape(
    user: str = "alice",
    team: str = "vision",
    workload: str = "name:resnet",
    gpus: float = 2,
    model: str = "H100",
    limit: float | None = 8 * H,
) -> JobShape:
    return JobShape(user=user, team=team, workload=workload, gpus=gpus, model=model, time_limit_s=limit)


def test_quantile_is_linear_between_neighbours() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert quantile([10.0], 0.9) == 10.0
    assert quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_median_and_range_of_the_same_users_workload() -> None:
    p = RuntimePredictor()
    for minutes in (110, 120, 130, 140, 150):
        p.add(FinishedRun(shape(), minutes * 60))
    got = p.predict(shape(), default_limit_s=H)
    assert got.run_s == 130 * 60
    assert got.samples == 5
    assert got.basis == "same user, workload, GPUs and model"
    assert 110 * 60 <= got.low_s < got.run_s < got.high_s <= 150 * 60
    assert got.sentence() == "expected to run ~2 h 10 m (from 5 similar jobs: same user, workload, GPUs and model)"


def test_no_history_falls_back_to_the_time_limit_or_the_default() -> None:
    p = RuntimePredictor()
    got = p.predict(shape(limit=2 * H), default_limit_s=H)
    assert (got.run_s, got.samples, got.basis, got.learned) == (2 * H, 0, "time limit", False)
    assert "no similar finished jobs" in got.sentence()
    assert p.predict(shape(limit=None), default_limit_s=H).run_s == H


def test_too_few_similar_runs_fall_back() -> None:
    p = RuntimePredictor(min_samples=3)
    p.add(FinishedRun(shape(), 600))
    p.add(FinishedRun(shape(), 600))
    assert not p.predict(shape(), H).learned
    p.add(FinishedRun(shape(), 600))
    assert p.predict(shape(), H).run_s == 600


def test_never_above_the_limit() -> None:
    p = RuntimePredictor()
    for _ in range(5):
        p.add(FinishedRun(shape(limit=None), 10 * H))
    got = p.predict(shape(limit=2 * H), default_limit_s=H)
    assert got.learned and got.run_s == got.high_s == 2 * H


def test_a_different_gpu_count_falls_to_the_users_workload() -> None:
    p = RuntimePredictor()
    for _ in range(4):
        p.add(FinishedRun(shape(gpus=8), 1800))
    got = p.predict(shape(gpus=2), H * 8)
    assert (got.run_s, got.basis) == (1800, "same user and workload")


def test_a_teammate_running_the_same_workload_counts_but_another_team_does_not() -> None:
    p = RuntimePredictor()
    for _ in range(3):
        p.add(FinishedRun(shape(user="bob"), 900))
    assert p.predict(shape(user="carol"), H).basis == "same team, workload and GPUs"
    other = p.predict(shape(user="dave", team="nlp"), H)
    assert not other.learned


def test_other_workloads_answer_as_a_share_of_the_limit() -> None:
    p = RuntimePredictor()
    for w in ("name:a", "name:b", "name:c"):  # each ran a quarter of its 4 h limit
        p.add(FinishedRun(shape(workload=w, limit=4 * H), H))
    got = p.predict(shape(workload="name:new", limit=8 * H), H)
    assert (got.run_s, got.basis) == (2 * H, "same user and GPUs")


def test_unknown_user_or_workload_is_never_similar() -> None:
    p = RuntimePredictor()
    for _ in range(5):
        p.add(FinishedRun(shape(user="", workload="", limit=None), 60))
    got = p.predict(shape(user="", workload="", limit=None), 3 * H)
    assert got.basis == "same team and GPUs"  # not "same user ..." between two unknowns


def test_window_keeps_the_latest_runs() -> None:
    p = RuntimePredictor(min_samples=2, window=4)
    for _ in range(10):
        p.add(FinishedRun(shape(), 5000))
    for _ in range(4):
        p.add(FinishedRun(shape(), 100))
    assert p.predict(shape(), H).run_s == 100


def test_expected_total_of_a_running_job() -> None:
    p = RuntimePredictor()
    for _ in range(3):
        p.add(FinishedRun(shape(limit=4 * H), H))
    assert p.expected_total(shape(limit=4 * H), 0.5 * H, H) == H
    assert p.expected_total(shape(limit=4 * H), 2 * H, H) == 3 * H  # outlived them: halfway to the limit
    assert p.expected_total(shape(limit=4 * H), 5 * H, H) == 4 * H


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        RuntimePredictor(min_samples=0)
    with pytest.raises(ValueError, match="run_s"):
        RuntimePredictor().add(FinishedRun(shape(), -1))


def test_workload_from_name_or_command() -> None:
    assert workload_of("resnet", ["python", "train.py"]) == "name:resnet"
    assert workload_of("job-17", ["/usr/bin/python", "/home/a/src/train.py", "--lr", "1"]) == "cmd:python train.py"
    assert workload_of("", []) == ""


def test_duration_words() -> None:
    assert duration_words(30) == "30 s"
    assert duration_words(45 * 60) == "45 m"
    assert duration_words(2 * H + 600) == "2 h 10 m"
    assert duration_words(3 * 86400 + 4 * H) == "3 d 4 h"


@given(
    runs=st.lists(st.tuples(st.floats(0, 1e6), st.sampled_from([None, 60.0, 3600.0, 86400.0])), max_size=30),
    limit=st.sampled_from([None, 1.0, 600.0, 7200.0]),
    default=st.floats(1, 1e5),
)
def test_property_never_above_the_limit_and_ordered(
    runs: list[tuple[float, float | None]], limit: float | None, default: float
) -> None:
    p = RuntimePredictor(min_samples=1)
    for run_s, run_limit in runs:
        p.add(FinishedRun(shape(limit=run_limit), run_s))
    got = p.predict(shape(limit=limit), default)
    cap = limit or default
    assert 0 <= got.low_s <= got.run_s <= got.high_s <= cap


@given(
    st.lists(
        st.tuples(st.sampled_from(["alice", "bob", ""]), st.sampled_from([1, 2, 8]), st.sampled_from([None, 8 * H])),
        max_size=40,
    )
)
def test_kept_lookups_answer_as_the_shape_does(runs: list[tuple[str, float, float | None]]) -> None:
    """`lookups` taken before any run was learned stay right as runs come (sim/learned.py keeps
    them per shape): `distribution_from` is `distribution`, the very object, after every run."""
    p = RuntimePredictor()
    shapes = [
        shape(user=u, gpus=g, limit=lim) for u in ("alice", "bob", "") for g in (1, 2, 8) for lim in (None, 8 * H)
    ]
    kept = {s: p.lookups(s) for s in shapes}
    for i, (user, gpus, limit) in enumerate(runs):
        p.add(FinishedRun(shape(user=user, gpus=gpus, limit=limit), 60.0 * (i % 7 + 1)))
        for s in shapes:
            got, want = p.distribution_from(kept[s]), p.distribution(s)
            assert got is want or (
                got is not None and want is not None and got.values == want.values and got.scale == want.scale
            )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(0.0, 1e6), st.sampled_from([0.0, 1.0, 60.0])),
        max_size=40,
    ),
    st.sampled_from([3, 5, 256]),
    st.sets(st.integers(0, 40)),
)
def test_the_window_kept_sorted_is_a_fresh_sort(runs: list[float], window: int, asked: set[int]) -> None:
    """A key's sorted window, kept across runs (one value in, one out), is `sorted` of the window,
    whenever its distribution was asked for before."""
    predictor = RuntimePredictor(min_samples=1, window=window)
    shape = JobShape("ann", "vision", "train", 1.0, "H100", None)
    for i, r in enumerate(runs):
        predictor.add(FinishedRun(shape, r))
        if i in asked:
            dist = predictor.distribution(shape)
            assert dist is not None
            assert list(dist.values) == sorted(runs[max(0, i + 1 - window) : i + 1])
