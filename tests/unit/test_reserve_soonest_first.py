"""`reserve` with an `EndBook` looks at nodes by their soonest end and stops once no node can
be ready sooner than the best one found (`backfill._soonest_first`); without a book it looks at
every node. Both must name the same node at the same time, ties (by node name) included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.backfill import EndBook, EndTimes, reserve
from gpucluster.core.placement import Capacity
from gpucluster.core.types import Allocation, NodeSlice, RunningJob

from .builders import job, node, running, spread

NOW = 1000.0
GRACE, DEFAULT = 30.0, 600.0
# Few distinct ends, so that nodes tie; node names out of the order the book finds them in.
NAMES = ("n5", "n1", "n4", "n0", "n3", "n2")

# One running job: (node, GPU count, second node or -1, start, time limit index, stopping, share).
_RUN = st.tuples(
    st.integers(0, 5),
    st.integers(1, 3),
    st.integers(-1, 5),
    st.sampled_from([0.0, 300.0, 700.0, 900.0]),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
)


def _running(spec: list[tuple[int, int, int, float, int, bool, bool]]) -> list[RunningJob]:
    """Jobs on the first free GPUs of 4 per node, skipping any that no longer fit."""
    free = {name: [0, 1, 2, 3] for name in NAMES}
    out: list[RunningJob] = []
    for i, (at, gpus, other, started, limit, stopping, share) in enumerate(spec):
        name = NAMES[at]
        limit_s = (None, 100.0, 400.0, 1000.0)[limit]
        if share and free[name]:  # a share of a GPU: kept aside by the book
            idx = free[name].pop(0)
            alloc = Allocation((NodeSlice(name, (idx,), 0.5, 1024),))
            out.append(RunningJob(i, alloc, started_at=started, time_limit_s=limit_s, stopping=stopping))
            continue
        if len(free[name]) < gpus:
            continue
        mine = [free[name].pop(0) for _ in range(gpus)]
        second = NAMES[other] if other >= 0 else None
        if second is not None and second != name and len(free[second]) >= gpus:
            theirs = [free[second].pop(0) for _ in range(gpus)]
            out.append(spread(i, {name: mine, second: theirs}, started_at=started, limit=limit_s, stopping=stopping))
        else:
            out.append(running(i, name, *mine, started_at=started, limit=limit_s, stopping=stopping))
    return out


@settings(max_examples=400, deadline=None)
@given(
    spec=st.lists(_RUN, max_size=14),
    starts=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 2), st.sampled_from([1100.0, 1300.0])), max_size=2),
    gpus=st.integers(1, 4),
    busy=st.lists(st.integers(0, 5), max_size=3),
)
def test_the_soonest_first_walk_reserves_as_the_walk_over_every_node(
    spec: list[tuple[int, int, int, float, int, bool, bool]],
    starts: list[tuple[int, int, float]],
    gpus: int,
    busy: list[int],
) -> None:
    """Mutations it catches: stopping at a node whose soonest end equals the best one's (a tie
    won by a later node of a smaller name), and leaving out the nodes only this cycle's ends
    are on (its starts, the jobs stopping or sharing a GPU)."""
    nodes = tuple(node(name).gpus(4).build() for name in NAMES)
    jobs = _running(spec)
    cap = Capacity(nodes, jobs)
    # Nodes fully taken since the capacity was built: still looked at by both walks.
    for k in busy:
        for idx in list(cap.free["H100"].get(NAMES[k], ())):
            cap.take(Allocation((NodeSlice(NAMES[k], (idx,)),)))
    book = EndBook.of(jobs, cap.gpus, DEFAULT)
    kept, fresh = EndTimes(book), EndTimes()
    for ends, of in ((kept, book.aside.values()), (fresh, jobs)):
        for j, end in ends.add_running(of, cap.gpus, NOW, GRACE, DEFAULT):
            ends.add("H100", j.allocation.slices[0].node, end, 1)  # a shared GPU: back whole
        for at, n, end in starts:  # this cycle's own starts
            ends.add("H100", NAMES[at], end, n)
    asked = job(99).gpus(gpus).build()
    want = reserve(asked, "H100", cap, fresh, NOW)
    assert reserve(asked, "H100", cap, kept, NOW) == want
