"""A one-node reservation (`backfill.reserve`) is the node a naive search finds: each node of the
model asked in turn when it has the GPUs free, by its running jobs' ends and the cycle's, sorted
afresh. `reserve` reads the kept book's sorted ends instead, stops a node's walk at the best end
found so far, and clamps ends before `now`: this checks all three over random clusters (nodes of
two sizes, whole-GPU jobs on one or two nodes ending before, at and after `now`, ties included),
with and without a kept book of ends, with ends the cycle adds, and with node selections.

(A walk over the model's ends in time order instead of node by node was tried and measured
slower on whole Philly: the first node with a whole node's GPUs free lies deep in that order.)
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.backfill import EndBook, EndTimes, raw_end, reserve
from gpucluster.core.placement import Capacity
from gpucluster.core.types import RunningJob
from tests.unit.builders import job, node, running, spread

NOW = 100.0
DEFAULT_LIMIT = 500.0
# The capacity, its ends as `reserve` reads them and per node as the search does, GPUs asked,
# the nodes allowed (None: all).
Case = tuple[Capacity, EndTimes, dict[str, list[tuple[float, int]]], int, frozenset[str] | None]


def _naive(n: int, cap: Capacity, ends: dict[str, list[tuple[float, int]]], allowed: frozenset[str] | None) -> object:
    """The search as it was: every node with fewer than `n` free, ready at the end that brings
    it to `n` (never before NOW); the soonest, then the first name."""
    best: tuple[float, str] | None = None
    for name, idxs in cap.free["H100"].items():
        if allowed is not None and name not in allowed:
            continue
        free = len(idxs)
        if free >= n:
            continue
        for end, gpus in sorted(ends.get(name, [])):
            free += gpus
            if free >= n:
                ready = (max(end, NOW), name)
                best = ready if best is None or ready < best else best
                break
    return best


@st.composite
def _cluster(
    draw: st.DrawFn,
) -> tuple[Capacity, EndTimes, dict[str, list[tuple[float, int]]], int, frozenset[str] | None]:
    sizes = draw(st.lists(st.sampled_from((4, 8)), min_size=1, max_size=6))
    nodes = tuple(node(f"n{i}").gpus(size).build() for i, size in enumerate(sizes))
    jobs: list[RunningJob] = []
    used = {f"n{i}": 0 for i in range(len(sizes))}
    # Ends drawn from a few values, so that ties (and ends before NOW) are common.
    for job_id in range(1, draw(st.integers(0, 14)) + 1):
        i = draw(st.integers(0, len(sizes) - 1))
        name = f"n{i}"
        take = draw(st.integers(1, 4))
        if used[name] + take > sizes[i]:
            continue
        started = draw(st.sampled_from((0.0, 40.0, 90.0)))
        limit = draw(st.sampled_from((None, 10.0, 60.0, 200.0)))
        other = f"n{(i + 1) % len(sizes)}"
        if other != name and draw(st.booleans()) and used[other] + take <= sizes[(i + 1) % len(sizes)]:
            gpus = {name: range(used[name], used[name] + take), other: range(used[other], used[other] + take)}
            jobs.append(spread(job_id, gpus, started_at=started, limit=limit))
            used[other] += take
        else:
            jobs.append(running(job_id, name, *range(used[name], used[name] + take), started_at=started, limit=limit))
        used[name] += take
    cap = Capacity(nodes, tuple(jobs))
    ends_of: dict[str, list[tuple[float, int]]] = {}
    for j in jobs:
        for s in j.allocation.slices:
            ends_of.setdefault(s.node, []).append((raw_end(j, DEFAULT_LIMIT), len(s.gpu_indices)))
    if draw(st.booleans()):  # a caller that keeps a book of the running jobs' ends (the head, the simulator)
        ends = EndTimes(EndBook.of(jobs, cap.gpus, DEFAULT_LIMIT))
    else:
        ends = EndTimes()
        for j in jobs:
            for s in j.allocation.slices:
                ends.add("H100", s.node, raw_end(j, DEFAULT_LIMIT), len(s.gpu_indices))
    for _ in range(draw(st.integers(0, 3))):  # what the cycle adds (its starts, jobs stopping)
        name = f"n{draw(st.integers(0, len(sizes) - 1))}"
        item = (draw(st.sampled_from((NOW, 150.0, 300.0))), draw(st.integers(1, 2)))
        ends.add("H100", name, *item)
        ends_of.setdefault(name, []).append(item)
    n = draw(st.integers(1, 8))
    allowed = None
    if draw(st.booleans()):
        allowed = frozenset(f"n{i}" for i in range(len(sizes)) if draw(st.booleans()))
    return cap, ends, ends_of, n, allowed


@settings(max_examples=400, deadline=None)
@given(_cluster())
def test_a_one_node_reservation_is_the_node_a_search_of_every_node_finds(case: Case) -> None:
    cap, ends, ends_of, n, allowed = case
    if n > cap.node_size["H100"]:
        return  # a job over several nodes: not a one-node reservation
    got = reserve(job(7).gpus(n).build(), "H100", cap, ends, NOW, allowed)
    want = _naive(n, cap, ends_of, allowed)
    assert (None if got is None else (got.shadow, min(got.nodes))) == want
    if got is not None:
        assert len(got.nodes) == 1


def _naive_bound(items: list[tuple[float, int, int]], size: int, n: int) -> float:
    """The earliest end at which the book's jobs on a node of `size` GPUs hold at most size - n."""
    held = sum(g for _, g, _ in items)
    if held <= size - n:
        return float("-inf")
    for end, gpus, _ in sorted(items):
        held -= gpus
        if held <= size - n:
            return end
    raise AssertionError("the book holds more GPUs than the node has")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_books_bounds_follow_starts_ends_and_stops(data: st.DataObject) -> None:
    """`EndBook.ready_of` (per GPUs asked, each node's earliest possible time, sorted: the order
    `reserve` walks nodes in and stops early by) is what the book's lists say after any history
    of jobs added, removed and stopping, ties of ends included, on nodes of two sizes. A bound
    left stale or too late would make `reserve` stop before the node that is ready first (the
    test above then finds another node)."""
    sizes = (8, 4, 8)
    nodes = tuple(node(f"n{i}").gpus(size).build() for i, size in enumerate(sizes))
    book = EndBook(Capacity(nodes, ()).gpus, DEFAULT_LIMIT)
    live: dict[int, RunningJob] = {}
    used: dict[tuple[str, int], int] = {}
    stopped: set[int] = set()
    for job_id in range(1, data.draw(st.integers(1, 30)) + 1):
        what = data.draw(st.sampled_from(("add", "add", "remove", "stop")))
        if what == "add" or not live:
            i = data.draw(st.integers(0, 2))
            free = [g for g in range(sizes[i]) if (f"n{i}", g) not in used]
            if not free:
                continue
            gpus = free[: data.draw(st.integers(1, len(free)))]
            started = data.draw(st.sampled_from((0.0, 40.0, 90.0)))
            limit = data.draw(st.sampled_from((None, 10.0, 60.0)))
            j = running(job_id, f"n{i}", *gpus, started_at=started, limit=limit)
            for g in gpus:
                used[(f"n{i}", g)] = job_id
            live[job_id] = j
            book.add(j)
        else:
            victim = data.draw(st.sampled_from(sorted(live)))
            if what == "remove":
                book.remove(victim)
                del live[victim]
                stopped.discard(victim)
                used = {k: v for k, v in used.items() if v != victim}
            else:
                book.stop(live[victim])
                stopped.add(victim)
        _check_bounds(book, sizes)
    # The same of a book built at once (`EndBook.of`, bounds made at the end) from the jobs not stopping.
    _check_bounds(EndBook.of([j for i, j in live.items() if i not in stopped], book.gpus, DEFAULT_LIMIT), sizes)


def _check_bounds(book: EndBook, sizes: tuple[int, ...]) -> None:
    for n in range(1, 9):
        want = sorted(
            (_naive_bound(items, sizes[int(name[1:])], n), name)
            for (_, name), items in book.on_node.items()
            if sizes[int(name[1:])] >= n
        )
        assert book.ready_of.get("H100", {}).get(n, []) == want, n
