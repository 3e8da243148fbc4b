"""Choosing preemption victims so that the preempting job loses others the least.

Candidates are preemptible jobs past their minimum runtime that either have a lower priority
class, or belong to a team borrowing GPUs that the preempting job's team is guaranteed; whole-GPU
and fractional jobs alike. A team's guaranteed quota protects its jobs (`Guarantees`): from
another team, only a job of a higher class whose own team stays within its guarantee may take a
team below its quota; any other preemptor takes only what the team holds beyond it. They are
ranked lowest class first, then furthest over fair share, then least work since their last
checkpoint (`CostKey`). Jobs already stopping count as free first, so a job never asks for more
victims while earlier ones are exiting.

Among the sets of victims that make room for the job's shape, the one chosen has, in this
order: the fewest victims; then the fewest nodes the job will span (a gang spread over more
nodes than it needs is slower for its whole run); then the cheapest victims (their cost keys,
sorted, compared in turn); then the first node by name. Every set is pruned of any victim not
needed, most expensive first.

Shapes: a whole-GPU job that fits on one node, with no shared GPU among the candidates or the
stopping jobs (the common case, and the fast one): when one victim is enough, a scan in cost
order stops at the cheapest that frees enough on its node; otherwise, on each node the cheapest
prefix that frees enough GPUs is taken and then pruned. Every other shape (a fractional job,
`--nodes M`, a job larger than any node, or shared GPUs among the victims) is counted GPU by GPU
in `preempt_shapes` (a GPU is free for a whole-GPU job only once every share on it is a victim,
stopping, or free; a fractional job needs one GPU with its share and memory left).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpucluster.core import preempt_shapes as shapes
from gpucluster.core.placement import Capacity
from gpucluster.core.types import JobRequest, RunningJob

# (class, -usage share, work since the last checkpoint, -start, job id): the id last, so two
# jobs alike in all else are ranked the same whatever order the caller lists its running jobs
# in (the head by id, the simulator by start: tests/sim/test_live_head.py found them choosing
# different victims of one plan's twin starts).
CostKey = tuple[int, float, float, float, int]


# Float slack on a team's room: shares summed in another order may land a hair above it.
_SLACK = 1e-9


@dataclass(frozen=True)
class Guarantees:
    """What guaranteed quotas let a preemptor take from each team, on one GPU model.

    `beyond`: team -> GPUs of the model it holds beyond its quota (teams with a quota of it,
    the preemptor's own team left out: a team may reorder its own work). `limited(job)`: whether
    taking the job counts against its team's `beyond` (the scheduler says which: every job of
    another team, but the lower-class ones when the preemptor's team stays within its own
    guarantee). Why: a victim whose team falls below its quota goes back in line before the
    preemptor (guaranteed demand is served first) and, if its team could then reclaim, would
    stop the preemptor in turn; limited to what its team borrows, it comes back as a borrower.
    """

    beyond: dict[str, float]
    limited: Callable[[RunningJob], bool]
    holds: Callable[[RunningJob], float]  # the job's GPUs of the model (what its team's quota counts)

    def allows(self, job: RunningJob, taken: dict[str, float]) -> bool:
        """Whether `job` may be taken after `taken` (team -> GPUs of its jobs taken already)."""
        room = self.beyond.get(job.team)
        if room is None or not self.limited(job):
            return True
        return taken.get(job.team, 0.0) + self.holds(job) <= room + _SLACK

    def limits(self) -> dict[str, float]:
        """Team -> the most GPUs of the model its limited jobs taken may hold in all: the bound
        `allows` compares with, for callers that test many jobs at once (the victim pool's
        columns, `scheduler._Cycle._left_by_guarantees`)."""
        return {team: room + _SLACK for team, room in self.beyond.items()}


@dataclass(frozen=True)
class VictimChoice:
    victims: tuple[RunningJob, ...]  # empty: enough GPUs are already being released
    node: str | None  # the one node the job will start on, when it fits on one
    nodes: frozenset[str] | None = None  # a gang's nodes (`--nodes M`); None with `node`: every node


def choose_victims(
    job: JobRequest,
    model: str,
    cap: Capacity,
    candidates: Sequence[RunningJob],
    stopping: Sequence[RunningJob],
    cost: Callable[[RunningJob], CostKey],
    ranked: bool = False,
    guarantees: Guarantees | None = None,
    shared: bool = False,
    allowed: frozenset[str] | None = None,
) -> VictimChoice | None:
    """The victims that make room for `job` on `model`, or None if no set of candidates does.

    `candidates` must already be limited to jobs on `model`; only nodes holding candidates,
    stopping jobs or free GPUs are looked at, so the cost is O(candidates + such nodes).
    `ranked`: the candidates are already in `cost` order (the caller ranks its pool once a cycle).
    `guarantees`: what quotas protect; each candidate alone must already be allowed by it (the
    scheduler filters them), so only sets of several victims are checked against it.
    `shared`: some candidate or stopping job holds a share of a GPU (then every shape is
    counted GPU by GPU, `_by_shape`).
    `allowed`: the only nodes the job may land on (its node selection and pools); None: any.
    Victims are then sought only there, every shape alike (`_by_shape`): a victim elsewhere
    frees nothing the job could use.
    """
    ranked_jobs = list(candidates) if ranked else sorted(candidates, key=cost)
    exclusive = job.selection is not None and job.selection.exclusive
    if (
        job.fractional
        or job.nodes
        or shared
        or allowed is not None
        or exclusive
        or int(job.gpus) > cap.node_size[model]
    ):
        return _by_shape(job, model, cap, ranked_jobs, stopping, guarantees, not shared, allowed)
    n = int(job.gpus)
    releasing: dict[str, int] = {}
    for j in stopping:
        for s in j.allocation.slices:
            if s.share >= 1 and cap.gpus[(s.node, s.gpu_indices[0])].model == model:
                releasing[s.node] = releasing.get(s.node, 0) + len(s.gpu_indices)
    single = _single_victim(n, model, cap, ranked_jobs, releasing, cost)
    if single is not None:
        return single
    # Each candidate's whole GPUs of `model` per node, worked out once (not once per node tried).
    by_node: dict[str, list[tuple[RunningJob, int]]] = {}
    freed: dict[str, int] = {}  # node -> the GPUs all its candidates free
    for j in ranked_jobs:
        for s in j.allocation.slices:
            if s.share >= 1 and cap.gpus[(s.node, s.gpu_indices[0])].model == model:
                by_node.setdefault(s.node, []).append((j, len(s.gpu_indices)))
                freed[s.node] = freed.get(s.node, 0) + len(s.gpu_indices)
    best: tuple[int, list[CostKey], str, list[RunningJob]] | None = None
    for node in sorted(set(by_node) | set(releasing)):
        if cap.node_model_count.get((node, model), 0) < n:
            continue
        have = len(cap.free[model].get(node, [])) + releasing.get(node, 0)
        if have >= n:
            return VictimChoice((), node)
        if have + freed.get(node, 0) < n:
            continue  # not even all its candidates are enough: `prefix` would find no set
        chosen = shapes.prefix(by_node.get(node, []), have, n, guarantees)
        if chosen is None or (best is not None and len(chosen) > best[0]):
            continue
        key = (len(chosen), sorted(cost(j) for j in chosen), node, chosen)
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else VictimChoice(tuple(best[3]), best[2])


def _by_shape(
    job: JobRequest,
    model: str,
    cap: Capacity,
    ranked: Sequence[RunningJob],
    stopping: Sequence[RunningJob],
    guarantees: Guarantees | None,
    whole: bool,
    allowed: frozenset[str] | None = None,
) -> VictimChoice | None:
    """Every shape but the fast one, counted GPU by GPU (`preempt_shapes`). Victim sets are
    compared by their places in `ranked` (the cost order), not by their cost keys again.
    `whole`: no candidate or stopping job shares a GPU (a node's victims are then a prefix).
    `allowed`: the room counts only these nodes (None: all)."""
    room = shapes.Room(cap, model, stopping, allowed)
    # A running exclusive job frees more than its own GPUs (its nodes' others): GPU by GPU then.
    whole = whole and not any(j.exclusive for j in ranked) and not any(j.exclusive for j in stopping)
    search = shapes.Search(room, ranked, guarantees, whole)
    if job.selection is not None and job.selection.exclusive:
        alone = shapes.for_exclusive(search, int(job.gpus), job.nodes)
        if alone is None:
            return None
        return VictimChoice(tuple(alone[0]), next(iter(alone[1])) if len(alone[1]) == 1 else None, alone[1])
    if job.fractional:
        share, mem = cap.fraction(job, model)
        got = shapes.for_fraction(search, share, mem)
        return None if got is None else VictimChoice(tuple(got[0]), got[1])
    n = int(job.gpus)
    if job.nodes:
        gang = shapes.for_gang(search, n // job.nodes, job.nodes)
        return None if gang is None else VictimChoice(tuple(gang[0]), None, gang[1])
    if n > cap.node_size[model]:
        if room.total_free() >= n:
            return VictimChoice((), None)
        spread = shapes.for_spread(search, n)
        return None if spread is None else VictimChoice(tuple(spread), None)
    one = shapes.on_one_node(search, n)
    return None if one is None else VictimChoice(tuple(one[0]), one[1])


def _single_victim(
    n: int,
    model: str,
    cap: Capacity,
    ranked: Sequence[RunningJob],
    releasing: dict[str, int],
    cost: Callable[[RunningJob], CostKey],
) -> VictimChoice | None:
    """The answer when no victim or one victim is enough, found without grouping every
    candidate by node: a scan in cost order stops at the first victim that frees enough.

    Gives what the full search would: no victims beats one; among single victims the cheapest,
    then the first node by name. None: the full search must decide (two or more victims).
    """
    free = cap.free[model]
    ready = [nd for nd, r in releasing.items() if len(free.get(nd, ())) + r >= n]
    if any(cap.buckets[model][k] for k in range(n, len(cap.buckets[model]))):
        return None  # a node has room without victims (quota kept the job off it): full search
    if ready:
        return VictimChoice((), min(ready))
    # A candidate's cost is worked out only once one victim was found (to stop at the first
    # that costs more) or when it is the one: until then it decides nothing. Why: most scans
    # find no single victim, and costing each candidate (its team's share, a tuple) was most
    # of this loop on whole Philly under `las` (~21 candidates a scan).
    found: tuple[CostKey, str, RunningJob] | None = None
    for j in ranked:
        c: CostKey | None = None
        if found is not None:
            c = cost(j)
            if c != found[0]:
                break
        for s in j.allocation.slices:
            nd = s.node
            # The count first: most candidates free too few on their node alone, and it reads
            # no GPU (a (node, index) key made and hashed per slice).
            if (
                s.share >= 1
                and len(free.get(nd, ())) + releasing.get(nd, 0) + len(s.gpu_indices) >= n
                and (found is None or nd < found[1])
                and cap.gpus[(nd, s.gpu_indices[0])].model == model
                and cap.node_model_count.get((nd, model), 0) >= n
            ):
                if c is None:
                    c = cost(j)
                found = (c, nd, j)
    return None if found is None else VictimChoice((found[2],), found[1])
