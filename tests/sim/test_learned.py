"""The replay's learned run times (sim/learned.py) kept incrementally: after any sequence of
arrivals, finished runs and departures, the map the snapshot carries is exactly the predictor's
answer for every job still in the system (what rebuilding it whole would give)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.types import Priority
from gpucluster.sim.learned import LearnedRuntimes, trace_shape
from gpucluster.sim.workload import TraceJob


def _trace(job_id: int, team: str, user: str, name: str, gpus: float, limit: float | None) -> TraceJob:
    return TraceJob(job_id, 0.0, 60.0, gpus, team, Priority.NORMAL, (), name, 0, limit, "spec", user=user)


Step = tuple[str, int, str, str, str, float, float | None, float]
ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "finish", "leave", "look"]),
        st.integers(0, 12),  # job id
        st.sampled_from(["a", "b"]),  # team
        st.sampled_from(["", "ann", "bob"]),  # user ("": the trace names none)
        st.sampled_from(["train", "job-3"]),  # a workload's name, or a generated one
        st.sampled_from([1.0, 8.0]),
        st.sampled_from([None, 3600.0]),
        st.floats(1.0, 1e5),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_kept_map_is_the_rebuilt_one(steps: list[Step]) -> None:
    learned = LearnedRuntimes({"H100"})
    present: dict[int, TraceJob] = {}
    for step in steps:
        if _apply(learned, present, step):
            _check(learned, present)
    _check(learned, present)


def _apply(learned: LearnedRuntimes, present: dict[int, TraceJob], step: Step) -> bool:
    """Apply one step to `learned` and `present` (the jobs in the system); whether it is a "look"."""
    op, job_id, team, user, name, gpus, limit, run_s = step
    trace = _trace(job_id, team, user, name, gpus, limit)
    if op == "arrive" and job_id not in present:
        present[job_id] = trace
        learned.arrived(trace)
    elif op == "finish":
        learned.finished(trace, run_s, "H100")
    elif op == "leave" and job_id in present:
        del present[job_id]
        learned.left(job_id)
    return op == "look"


def _check(
    learned: LearnedRuntimes, present: dict[int, TraceJob], now: float = 0.0, every_s: float = 0.0, whole: bool = True
) -> None:
    """The map's entries of `present` are the predictor's whole look-up; `whole`: it names no
    other job (`present` is every job in the system)."""
    got = learned.distributions(now, every_s)
    want = {j: learned.predictor.distribution(trace_shape(t, "", "H100")) for j, t in present.items()}
    named = set(got) if whole else set(got) & present.keys()
    assert named == {j for j, d in want.items() if d is not None}
    got = {j: d for j, d in got.items() if j in present}
    for j, d in got.items():
        w = want[j]
        assert w is not None and (d.values, d.scale) == (w.values, w.scale)


def test_a_run_elsewhere_in_the_users_name_teaches_the_users_jobs() -> None:
    """Keys that name a user and no team: ann's runs in team b give ann's waiting job in team a a
    distribution (same user and workload), though team a learned nothing."""
    learned = LearnedRuntimes({"H100"})
    learned.arrived(_trace(1, "a", "ann", "train", 8.0, None))
    assert learned.distributions() == {}
    for i, run_s in enumerate((100.0, 200.0, 300.0)):
        learned.finished(_trace(10 + i, "b", "ann", "train", 8.0, None), run_s, "H100")
    got = learned.distributions()
    assert got[1].values == (100.0, 200.0, 300.0)


@settings(max_examples=100, deadline=None)
@given(ops, st.lists(st.sampled_from([0.0, 100.0, 599.0, 601.0]), min_size=80, max_size=80))
def test_runs_learned_between_relearns_lag_only_their_kinds(steps: list[Step], gaps: list[float]) -> None:
    """With `relearn_every_s` (600 s here) the map takes in learned runs only at a call 600 s
    after the last relearn: meanwhile every job whose kind is not `waiting` (its team and user
    learned nothing since) still has the whole look-up's distribution, and a call once 600 s
    have passed gives every job its whole look-up again."""
    learned = LearnedRuntimes({"H100"})
    present: dict[int, TraceJob] = {}
    now = 0.0
    for step, gap in zip(steps, gaps, strict=False):
        now += gap
        if _apply(learned, present, step):
            settled = {j: t for j, t in present.items() if not learned.waiting(j)}
            _check(learned, settled, now, 600.0, whole=False)
    _check(learned, present, now + 600.0, 600.0)


def test_a_run_waits_for_the_relearn_then_reaches_its_kinds_jobs() -> None:
    learned = LearnedRuntimes({"H100"})
    waiting = _trace(1, "a", "ann", "train", 8.0, None)
    learned.arrived(waiting)
    for i, run_s in enumerate((100.0, 200.0, 300.0)):
        learned.finished(_trace(10 + i, "a", "ann", "train", 8.0, None), run_s, "H100")
    assert learned.distributions(0.0, 600.0)[1].values == (100.0, 200.0, 300.0)  # the first: at once
    learned.finished(_trace(13, "a", "ann", "train", 8.0, None), 400.0, "H100")
    assert learned.waiting(1)
    assert learned.distributions(599.0, 600.0)[1].values == (100.0, 200.0, 300.0)
    new = _trace(2, "a", "ann", "train", 1.0, None)  # a kind first seen meanwhile: looked up at once
    learned.arrived(new)
    assert learned.distributions(599.0, 600.0)[2].values == (100.0, 200.0, 300.0, 400.0)
    assert learned.distributions(600.0, 600.0)[1].values == (100.0, 200.0, 300.0, 400.0)
    assert not learned.waiting(1)
    learned.finished(_trace(14, "b", "ann", "train", 8.0, None), 500.0, "H100")  # ann's, in another team
    assert learned.waiting(1)  # a key that names her and no team may change
