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
    for op, job_id, team, user, name, gpus, limit, run_s in steps:
        trace = _trace(job_id, team, user, name, gpus, limit)
        if op == "arrive" and job_id not in present:
            present[job_id] = trace
            learned.arrived(trace)
        elif op == "finish":
            learned.finished(trace, run_s, "H100")
        elif op == "leave" and job_id in present:
            del present[job_id]
            learned.left(job_id)
        elif op == "look":
            _check(learned, present)
    _check(learned, present)


def _check(learned: LearnedRuntimes, present: dict[int, TraceJob]) -> None:
    got = learned.distributions()
    want = {j: learned.predictor.distribution(trace_shape(t, "", "H100")) for j, t in present.items()}
    assert set(got) == {j for j, d in want.items() if d is not None}
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
