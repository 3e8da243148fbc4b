"""An estimated start for every queued job: the queue replayed against a reservation profile.

`decide` gives an estimate only to the job first in line per GPU model (its backfill
reservation). Users want one for every job ("when will mine start?"), so after a plan is made
the queue is replayed in the plan's scheduling order against when GPUs come back: running jobs
end at their time limit (the policy's default without one; jobs stopping or being preempted
after the grace period), jobs the plan starts run from now for their limit. Job by job, each
is given the earliest time enough GPUs of a model it accepts are free on a node (or on the
fewest nodes, for jobs larger than a node) and those GPUs are reserved for its time limit.

This is conservative backfill over a simplified profile, so no reserved job is ever delayed by
a later one: each GPU is free from one moment on (a heap per model and GPU count finds the node
whose k-th GPU frees first in O(log nodes)), and the gaps a reservation leaves before it (GPUs
idle until the reserved job can start) are kept per node, so a short single-node job further
back can start in them, as backfill would start it. What it leaves out, knowingly: quotas and
borrowing limits (the wait reason says when a quota holds a job), jobs that end before their
limit (unless the caller passes predicted run times, `runs`: then the estimate is a most-likely
start rather than an upper bound), and sharing: a fractional job is counted
as one whole GPU.

CPU cores and host memory count where nodes account them (`Node.cpus`, `Node.memory_mb`): per
node, chunks of each free from a moment on (what is free now, and what each running job or start
gives back at its end), kept like the GPUs' free times (`_HostProfile`). A job asking for them
(`JobRequest.host`) starts on a node when its GPUs there and its part of the CPUs and memory are
all free: nodes are taken from the heap by when their GPUs free, each checked for its host
resources, until no later node could be sooner (at most HOST_SCAN beyond the first that serves,
so then an upper bound). Such jobs are not backfilled into gaps (an upper bound on that account).
A job asking for neither is replayed exactly as before, and the chunks are built only when the
first job asking for them is replayed.

A job with a node selection (`--nodelist`, `--exclude`, `--constraint`, `--exclusive`) or kept
off nodes by the policy's pools is replayed only on the nodes it may use (`_replay_on`): an
exclusive job waits for a whole node's GPUs. Such jobs are few, so theirs is a plain scan of the
allowed nodes, without the heaps, and they are not backfilled into gaps (their estimate is then an
upper bound on that account).

Drained nodes whose drain has a planned end (`Snapshot.unavailable`, `Snapshot.drains`) are in
the profile, each GPU free from that end: a job only they can host, or one they would serve
sooner, is estimated from it.

Only the first `limit` jobs in line are replayed; for the rest the replay's final state gives
a lower bound ("not before"), because reservations only ever push free times later.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from operator import attrgetter

from gpucluster.core.placement import EPS, Capacity, acceptable_models
from gpucluster.core.policy import Policy
from gpucluster.core.pools import closed_nodes, restrict
from gpucluster.core.reasons import WaitReason
from gpucluster.core.selection import Selection
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, Plan, Priority

DEFAULT_LIMIT = 10_000


@dataclass(frozen=True)
class Latency:
    """How long the cluster's own machinery takes, learned by the caller from its history (the
    head: head/latency.py) and passed in as numbers, so the replay stays pure.

    Why: every job ahead in line that runs to its time limit is not stopped at that instant (the
    limit is noticed at the next cycle, then SIGTERM, the exit, the exit noticed), and the job
    behind it is not started at the instant its GPUs free (the next cycle commits it). Left out,
    each job ahead made an estimate 0.3-0.4 s early on a local head; these add up along a queue."""

    start_s: float = 0.0  # from GPUs freed to the next job's start committed on them
    stop_s: float = 0.0  # from a time limit reached to its job ended (GPUs free)


NO_LATENCY = Latency()


@dataclass(frozen=True)
class Estimate:
    start: float | None  # None: no set of nodes can ever host the job as asked
    exact: bool = True  # False: the job is past the replayed part of the queue; `start` is a lower bound


# (free-from time, node, version of that node's times when pushed)
_Entry = tuple[float, str, int]
GAP_SCAN = 32  # gaps looked at per job at most, earliest first: bounds the cost per job
HOST_SCAN = 64  # nodes looked at beyond the first that serves a job asking for CPUs or memory


@dataclass(slots=True)
class _Gap:
    """`gpus` GPUs of one node idle from `start` until a reservation takes them at `until`."""

    start: float
    until: float
    gpus: int
    node: str


_GAP_START = attrgetter("start")


class _Profile:
    """For each GPU model and node, when each GPU is free from, sorted; and per model and
    count k a heap of nodes by the time their k-th GPU is free (stale entries skipped)."""

    def __init__(self, snapshot: Snapshot, free_from: dict[tuple[str, int], float]) -> None:
        self.times: dict[tuple[str, str], list[float]] = {}
        self.version: dict[tuple[str, str], int] = {}
        self.model_memory: dict[str, int] = {}
        self.node_size: dict[str, int] = {}
        self.nodes = (*snapshot.nodes, *_returning(snapshot))
        self.labels: dict[str, frozenset[str]] = {}  # node -> its labels (node selections)
        self.model_nodes: dict[str, list[str]] = {}  # model -> its nodes, by name
        for node in self.nodes:
            self.labels[node.name] = node.labels
            for g in node.gpus:
                if (g.model, node.name) not in self.times:
                    self.model_nodes.setdefault(g.model, []).append(node.name)
                self.times.setdefault((g.model, node.name), []).append(free_from[(node.name, g.index)])
                mem = self.model_memory.get(g.model)
                self.model_memory[g.model] = g.memory_mb if mem is None else min(mem, g.memory_mb)
        self.models_by_memory = sorted(self.model_memory, key=lambda m: (self.model_memory[m], m))
        for names in self.model_nodes.values():
            names.sort()
        self._allowed: dict[Selection, frozenset[str]] = {}
        self.heaps: dict[str, list[list[_Entry]]] = {}
        self.gaps: dict[str, list[_Gap]] = {}  # per model, by `start`
        for (model, name), ts in self.times.items():
            ts.sort()
            self.version[(model, name)] = 0
            self.node_size[model] = max(self.node_size.get(model, 0), len(ts))
        for model, size in self.node_size.items():
            self.heaps[model] = [[] for _ in range(size + 1)]
        for (model, name), ts in self.times.items():
            levels = self.heaps[model]
            for k in range(1, len(ts) + 1):
                levels[k].append((ts[k - 1], name, 0))
        for levels in self.heaps.values():
            for h in levels:
                heapq.heapify(h)

    def allowed(self, selection: Selection) -> frozenset[str]:
        """The nodes `selection` allows, once per distinct selection."""
        got = self._allowed.get(selection)
        if got is None:
            got = self._allowed[selection] = frozenset(n for n, lb in self.labels.items() if selection.allows(n, lb))
        return got

    def _valid(self, model: str, entry: _Entry) -> bool:
        return self.version[(model, entry[1])] == entry[2]

    def peek(self, model: str, k: int) -> _Entry | None:
        """The node whose k-th GPU of `model` is free soonest."""
        h = self.heaps[model][k]
        while h and not self._valid(model, h[0]):
            heapq.heappop(h)
        return h[0] if h else None

    def pop(self, model: str, k: int, count: int) -> list[_Entry]:
        """The `count` nodes (fewer if there are not so many) whose k-th GPU is free soonest."""
        h = self.heaps[model][k]
        out: list[_Entry] = []
        while h and len(out) < count:
            e = heapq.heappop(h)
            if self._valid(model, e):
                out.append(e)
        return out

    def find_gap(self, model: str, n: int, duration: float, earliest: float, before: float) -> _Gap | None:
        """The gap, starting before `before`, where `n` GPUs of one node are idle for
        `duration` soonest; None if none of the first GAP_SCAN looked at serves."""
        gaps = self.gaps.get(model)
        if not gaps:
            return None
        if gaps[0].until <= earliest:  # stretches over before anyone could use them
            gaps[:] = [g for g in gaps if g.until > earliest]
        for scanned, g in enumerate(gaps):
            start = g.start if g.start > earliest else earliest
            if start >= before or scanned >= GAP_SCAN:
                return None
            if g.gpus >= n and start + duration <= g.until:
                return g
        return None

    def take_gap(self, model: str, gap: _Gap, n: int) -> None:
        gap.gpus -= n  # the rest of the gap stays open for others
        if gap.gpus == 0:
            self.gaps[model].remove(gap)

    def push_back(self, model: str, k: int, entries: list[_Entry]) -> None:
        for e in entries:
            heapq.heappush(self.heaps[model][k], e)

    def reserve(self, model: str, node: str, gpus: int, start: float, end: float) -> None:
        """Hold `gpus` GPUs of the node from `start` to `end`: those free latest by `start`,
        so GPUs free earlier stay open for jobs further back."""
        key = (model, node)
        ts = self.times[key]
        j = bisect_right(ts, start)
        idle: dict[float, int] = {}
        for t in ts[j - gpus : j]:
            if t < start:
                idle[t] = idle.get(t, 0) + 1
        gaps = self.gaps.setdefault(model, [])
        for t, count in idle.items():
            insort(gaps, _Gap(t, start, count, node), key=_GAP_START)
        del ts[j - gpus : j]
        for _ in range(gpus):
            ts.insert(bisect_right(ts, end), end)
        ver = self.version[key] = self.version[key] + 1
        levels = self.heaps[model]
        for k in range(1, len(ts) + 1):
            heapq.heappush(levels[k], (ts[k - 1], node, ver))


class _HostProfile:
    """Per node that accounts them, the CPUs and host memory (MiB) free from each moment on:
    sorted [time, amount] chunks, summed up to a moment to say what is free then."""

    def __init__(self, nodes: tuple[Node, ...], now: float, held: list[tuple[Allocation, float]]) -> None:
        self.cpus: dict[str, list[list[float]]] = {}
        self.mem: dict[str, list[list[float]]] = {}
        used_cpus: dict[str, float] = {}
        used_mem: dict[str, float] = {}
        back_cpus: dict[str, list[list[float]]] = {}
        back_mem: dict[str, list[list[float]]] = {}
        for allocation, end in held:
            for sl in allocation.slices:
                if sl.cpus:
                    used_cpus[sl.node] = used_cpus.get(sl.node, 0.0) + sl.cpus
                    back_cpus.setdefault(sl.node, []).append([end, sl.cpus])
                if sl.host_memory_mb:
                    used_mem[sl.node] = used_mem.get(sl.node, 0.0) + sl.host_memory_mb
                    back_mem.setdefault(sl.node, []).append([end, float(sl.host_memory_mb)])
        for node in nodes:
            name = node.name
            if node.cpus is not None:
                self.cpus[name] = sorted([[now, node.cpus - used_cpus.get(name, 0.0)], *back_cpus.get(name, ())])
            if node.memory_mb is not None:
                self.mem[name] = sorted([[now, node.memory_mb - used_mem.get(name, 0.0)], *back_mem.get(name, ())])

    def ready(self, node: str, cpus: float, mem: int) -> float | None:
        """When `node` has `cpus` CPUs and `mem` MiB free (-inf: now or it does not account
        them); None: never."""
        t = float("-inf")
        for chunks, want in ((self.cpus.get(node), cpus), (self.mem.get(node), float(mem))):
            if not want or chunks is None:
                continue
            have = 0.0
            for when, amount in chunks:
                have += amount
                if have + EPS >= want:
                    t = max(t, when)
                    break
            else:
                return None
        return t

    def reserve(self, node: str, cpus: float, mem: int, start: float, end: float) -> None:
        """Hold `cpus` and `mem` of the node from `start` to `end`: from the chunks free latest
        by `start` (as `_Profile.reserve` takes GPUs), given back at `end`."""
        for chunks, want in ((self.cpus.get(node), cpus), (self.mem.get(node), float(mem))):
            if not want or chunks is None:
                continue
            j = bisect_right(chunks, [start, float("inf")])
            left = want
            while left > EPS and j > 0:
                j -= 1
                take = min(left, chunks[j][1])
                chunks[j][1] -= take
                left -= take
            chunks[:] = [c for c in chunks if c[1] > EPS]
            insort(chunks, [end, want])


def _demand(job: JobRequest) -> int:
    """Whole GPUs the job waits for: its minimum size if elastic; one for a fraction."""
    if job.min_gpus is not None and job.min_gpus < job.gpus:
        return job.min_gpus
    return max(1, int(job.gpus))


def _free_from(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    plan: Plan,
    latency: Latency = NO_LATENCY,
    runs: Mapping[int, float] | None = None,
) -> dict[tuple[str, int], float]:
    """When each GPU is expected back: running jobs' ends and the plan's starts' ends (a time
    limit plus the time a stop at it takes; with `runs`, a job's expected run time instead)."""
    free = {(n.name, g.index): now for n in snapshot.nodes for g in n.gpus}
    for n in _returning(snapshot):  # a drained node with an end: free from then on
        until = snapshot.drains[n.name].until
        assert until is not None
        free.update({(n.name, g.index): max(now, until) for g in n.gpus})
    # A job being stopped ends within the grace period; sooner, as this cluster's stops go, once
    # its stop latency is known (a SIGTERM usually ends a job well before the grace is up).

    def hold(allocation: Allocation, until: float) -> None:
        for s in allocation.slices:
            for i in s.gpu_indices:
                key = (s.node, i)
                if key in free and until > free[key]:
                    free[key] = until

    for allocation, end in _held(snapshot, policy, now, plan, latency, runs):
        hold(allocation, end)
    return free


def _held(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    plan: Plan,
    latency: Latency = NO_LATENCY,
    runs: Mapping[int, float] | None = None,
) -> list[tuple[Allocation, float]]:
    """Each running job's and each start's allocation with when it is expected back (never
    before `now`): a time limit plus the stop at it, a stop's grace, or a predicted run."""
    grace = policy.preemption.grace_period_s
    if latency.stop_s > 0:
        grace = min(grace, latency.stop_s)
    stopping = {p.job_id for p in plan.preemptions}
    out: list[tuple[Allocation, float]] = []
    for j in snapshot.running:
        if j.stopping or j.job_id in stopping:
            end = now + grace
        else:
            end = j.started_at + _run_s(j.job_id, j.time_limit_s, policy, latency, runs)
        out.append((j.allocation, max(end, now)))
    limits = {q.job_id: q.time_limit_s for q in snapshot.queued}
    for st in plan.starts:
        out.append((st.allocation, now + _run_s(st.job_id, limits.get(st.job_id), policy, latency, runs)))
    return out


def _run_s(
    job_id: int, limit_s: float | None, policy: Policy, latency: Latency, runs: Mapping[int, float] | None
) -> float:
    """How long a job is planned to hold its GPUs: its expected run time when the caller
    predicted one (core/runtime_predict.py; never above the limit), else its time limit and the
    stop at it. A predicted end is a normal exit, so no stop latency is added to it."""
    limit = limit_s or policy.default_time_limit_s
    if runs is not None:
        run = runs.get(job_id)
        if run is not None and run < limit:
            return run
    return limit + latency.stop_s


def _returning(snapshot: Snapshot) -> list[Node]:
    """The drained nodes whose drain has a planned end: back for new jobs from then on.

    Their running jobs' slices were left out at admission, so a job still running there past
    the drain's end is not seen: the estimate is then early by that much."""
    out = []
    for n in snapshot.unavailable:
        drain = snapshot.drains.get(n.name)
        if drain is not None and drain.until is not None:
            out.append(n)
    return out


def estimate_starts(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    plan: Plan,
    limit: int = DEFAULT_LIMIT,
    latency: Latency = NO_LATENCY,
    runs: Mapping[int, float] | None = None,
) -> dict[int, Estimate]:
    """An estimate for every job `plan` has waiting, replaying at most `limit` of them exactly.
    `latency`: the cluster's own start and stop delays, added to every start after GPUs free
    and to every end at a time limit. `runs`: job id -> expected run time in seconds, for
    running jobs their whole run from `started_at` (core/runtime_predict.py); a job not in it,
    or predicted at its limit, is planned to its time limit as before. Only these estimates
    use predictions: `decide`'s reservations stay bounded by time limits, so no guarantee the
    scheduler gives depends on a prediction being right.

    Pure: the same snapshot, policy, time, plan and latency always give the same estimates.
    """
    profile = _Profile(snapshot, _free_from(snapshot, policy, now, plan, latency, runs))
    queued: Mapping[int, JobRequest] = {q.job_id: q for q in snapshot.queued}
    out: dict[int, Estimate] = {}
    bounds: dict[tuple[object, ...], float | None] = {}
    kinds: dict[tuple[object, ...], list[str]] = {}  # models a kind of request accepts
    replayed = 0
    closed: dict[tuple[str, Priority], Selection] = {}  # pools, per (team, class)
    accounts = any(nd.cpus is not None or nd.memory_mb is not None for nd in profile.nodes)
    host: _HostProfile | None = None  # built when the first job asking for CPUs or memory is replayed
    for job_id, wait in plan.waiting.items():
        job = queued.get(job_id)
        if job is None:
            continue
        if policy.pools:
            key_tp = (job.team, job.priority)
            shut = closed.get(key_tp)
            if shut is None:
                shut = closed[key_tp] = closed_nodes(policy.pools, profile.nodes, job.team, job.priority)
            job = restrict(job, shut)
        if wait.reason is WaitReason.NO_FIT:
            out[job_id] = Estimate(None)
            continue
        # A backoff, a begin time or a drain's end is a floor; a reservation's shadow is not:
        # the replay makes the same reservation itself, with the latencies `decide` leaves out.
        floor = wait.estimated_start if wait.reason is not WaitReason.RESERVED else None
        earliest = max(now, job.not_before or now, floor or now)
        if job.gpus == 0:  # CPU-only: no GPU to replay; when a node it may use has its CPUs back
            if host is None:
                host = _HostProfile(profile.nodes, now, _held(snapshot, policy, now, plan, latency, runs))
            sel = job.selection
            on = profile.allowed(sel) if sel is not None and sel.filters else None
            out[job_id] = Estimate(_cpu_only_start(host, job, profile.nodes, earliest, on), exact=False)
            continue
        kind = (job.gpu_types, job.gpu_memory_mb, job.min_gpu_memory_mb)
        models = kinds.get(kind)
        if models is None:
            models = kinds[kind] = acceptable_models(job, profile.model_memory, profile.models_by_memory)
        n = _demand(job)
        if replayed >= limit:
            key = (tuple(models), n, job.nodes)
            if key not in bounds:
                bounds[key] = _lower_bound(profile, models, n, job.nodes)
            bound = bounds[key]
            out[job_id] = Estimate(None if bound is None else max(bound, earliest), exact=False)
            continue
        replayed += 1
        hp: _HostProfile | None = None
        if job.host and accounts:
            if host is None:
                host = _HostProfile(profile.nodes, now, _held(snapshot, policy, now, plan, latency, runs))
            hp = host
        sel = job.selection
        if sel is not None and (sel.filters or sel.exclusive):
            on = profile.allowed(sel)
            out[job_id] = Estimate(_replay_on(profile, job, models, n, earliest, policy, now, latency, on, runs, hp))
            continue
        if hp is not None:
            out[job_id] = Estimate(_replay_host(profile, hp, job, models, n, earliest, policy, now, latency, runs))
            continue
        out[job_id] = Estimate(_replay(profile, job, models, n, earliest, policy, now, latency, runs))
    return out


def _cpu_only_start(
    host: _HostProfile, job: JobRequest, nodes: tuple[Node, ...], earliest: float, on: Collection[str] | None
) -> float | None:
    """The first moment from `earliest` a node (of `on`, when given) that accounts what the
    CPU-only job asks has its CPUs and memory free by the running jobs' ends: a lower bound
    (jobs ahead of it in line, and GPU jobs asking CPUs, may take them first), so not exact."""
    best: float | None = None
    for nd in nodes:
        if on is not None and nd.name not in on:
            continue
        if not ((job.cpus and nd.cpus is not None) or (job.mem_mb and nd.memory_mb is not None)):
            continue
        t = host.ready(nd.name, job.cpus, job.mem_mb)
        if t is not None and (best is None or t < best):
            best = t
    return None if best is None else max(best, earliest)


def _lower_bound(profile: _Profile, models: list[str], n: int, nodes: int | None) -> float | None:
    best: float | None = None
    for model in models:
        k = _level(profile, model, n, nodes)
        e = None if k is None else profile.peek(model, k)
        if e is not None and (best is None or e[0] < best):
            best = e[0]
    return best


def _level(profile: _Profile, model: str, n: int, nodes: int | None) -> int | None:
    """Which per-node GPU count the job's shape is looked up by on `model`; None: never fits."""
    size = profile.node_size[model]
    if nodes:
        per = n // nodes
        return per if 1 <= per <= size else None
    return n if n <= size else size


def _replay(
    profile: _Profile,
    job: JobRequest,
    models: list[str],
    n: int,
    earliest: float,
    policy: Policy,
    now: float = 0.0,
    latency: Latency = NO_LATENCY,
    runs: Mapping[int, float] | None = None,
) -> float | None:
    """The earliest start of `job` on the models it accepts (earlier preference wins ties),
    reserving its GPUs there for its time limit and the stop at it; None if no model can host
    it. A start on GPUs that free later than now comes `latency.start_s` after they free."""
    best: tuple[float, str, int, list[tuple[str, int]], list[_Entry]] | None = None
    popped: list[tuple[str, int, list[_Entry]]] = []
    for model in models:
        k = _level(profile, model, n, job.nodes)
        if k is None:
            continue
        size = profile.node_size[model]
        if job.nodes is None and n <= size:
            e = profile.peek(model, k)
            if e is None:
                continue
            slot, picks, taken = e[0], [(e[1], n)], []
        else:
            count = job.nodes if job.nodes else -(-n // size)
            taken = profile.pop(model, k, count)
            popped.append((model, k, taken))
            if len(taken) < count:
                continue
            slot = max(e[0] for e in taken)
            picks = [(e[1], k) for e in taken]
            if not job.nodes:
                picks[-1] = (picks[-1][0], n - k * (count - 1))
        if best is None or slot < best[0]:
            best = (slot, model, k, picks, taken)
    for model, k, taken in popped:
        if best is None or taken is not best[4]:
            profile.push_back(model, k, taken)
    if best is None:
        return None
    start = max(_after(best[0], now, latency), earliest)
    duration = _run_s(job.job_id, job.time_limit_s, policy, latency, runs)
    if job.nodes is None:
        hole: tuple[float, str, _Gap] | None = None
        for model in models:
            if n <= profile.node_size[model]:
                gap = profile.find_gap(model, n, duration, earliest, start if hole is None else hole[0])
                if gap is not None:
                    hole = (max(_after(gap.start, now, latency), earliest), model, gap)
        if hole is not None:
            profile.take_gap(hole[1], hole[2], n)
            return hole[0]  # backfilled into a gap: nothing else to reserve
    end = start + duration
    for node, gpus in best[3]:
        profile.reserve(best[1], node, gpus, start, end)
    return start


def _replay_host(
    profile: _Profile,
    host: _HostProfile,
    job: JobRequest,
    models: list[str],
    n: int,
    earliest: float,
    policy: Policy,
    now: float = 0.0,
    latency: Latency = NO_LATENCY,
    runs: Mapping[int, float] | None = None,
) -> float | None:
    """`_replay` for a job asking for CPUs or host memory: on each model, nodes are taken from
    the heap of its GPU level in the order their GPUs free, each ready at the later of that and
    its host resources' time (`_HostProfile.ready`), until the next node's GPUs free no sooner
    than the nodes found already are ready (or HOST_SCAN more were looked at). The nodes ready
    first serve (one, `--nodes` of them, or enough for its GPUs); no gaps."""
    best: tuple[float, str, list[tuple[str, int]]] | None = None
    for model in models:
        k = _level(profile, model, n, job.nodes)
        if k is None:
            continue
        size = profile.node_size[model]
        count = job.nodes if job.nodes else (1 if n <= size else -(-n // size))
        cpus, mem = Capacity.host_part(job, k)
        h = profile.heaps[model][k]
        popped: list[_Entry] = []
        found: list[tuple[float, str]] = []  # (ready, node), sorted, at most `count`
        extra = 0
        while h:
            e = heapq.heappop(h)
            if not profile._valid(model, e):
                continue
            popped.append(e)
            if len(found) == count and (e[0] >= found[-1][0] or extra >= HOST_SCAN):
                break
            if len(found) == count:
                extra += 1
            t = host.ready(e[1], cpus, mem)
            if t is None:
                continue
            insort(found, (max(e[0], t), e[1]))
            del found[count:]
        profile.push_back(model, k, popped)
        if len(found) < count:
            continue
        slot = found[-1][0]
        picks = [(nd, k) for _, nd in found]
        if not job.nodes and count > 1:
            picks[-1] = (picks[-1][0], n - k * (count - 1))
        if best is None or slot < best[0]:
            best = (slot, model, picks)
    if best is None:
        return None
    start = max(_after(best[0], now, latency), earliest)
    end = start + _run_s(job.job_id, job.time_limit_s, policy, latency, runs)
    for node, gpus in best[2]:
        profile.reserve(best[1], node, gpus, start, end)
        host.reserve(node, *Capacity.host_part(job, gpus), start, end)
    return start


def _replay_on(
    profile: _Profile,
    job: JobRequest,
    models: list[str],
    n: int,
    earliest: float,
    policy: Policy,
    now: float,
    latency: Latency,
    allowed: frozenset[str],
    runs: Mapping[int, float] | None = None,
    host: _HostProfile | None = None,
) -> float | None:
    """`_replay` for a job that may use only `allowed` nodes: each node's GPUs free times read
    directly (no heaps, no gaps). An exclusive job needs every GPU of a node, and holds them all.
    `host`: the job asks for CPUs or memory, counted per node there. None if the allowed nodes
    can never host it."""
    exclusive = job.selection is not None and job.selection.exclusive
    best: tuple[float, str, list[tuple[str, int]]] | None = None
    host_ready: Callable[[str, int], float | None] | None = None
    if host is not None:
        hp = host

        def host_ready(nd: str, k: int) -> float | None:
            return hp.ready(nd, *Capacity.host_part(job, k))

    for model in models:
        ts_of = {nd: profile.times[(model, nd)] for nd in profile.model_nodes.get(model, ()) if nd in allowed}
        if not ts_of:
            continue
        got = _slot_on(ts_of, job, n, exclusive, host_ready)
        if got is None:
            continue
        slot, picks = got
        if best is None or slot < best[0]:
            best = (slot, model, picks)
    if best is None:
        return None
    start = max(_after(best[0], now, latency), earliest)
    end = start + _run_s(job.job_id, job.time_limit_s, policy, latency, runs)
    for node, gpus in best[2]:
        profile.reserve(best[1], node, gpus, start, end)
        if host is not None:
            host.reserve(node, *Capacity.host_part(job, n // job.nodes if job.nodes else min(gpus, n)), start, end)
    return start


def _slot_on(
    ts_of: dict[str, list[float]],
    job: JobRequest,
    n: int,
    exclusive: bool,
    host_ready: Callable[[str, int], float | None] | None = None,
) -> tuple[float, list[tuple[str, int]]] | None:
    """On one model's allowed nodes (node -> its GPUs' free times, sorted): when the job could
    start soonest and the (node, GPUs) it takes then; None if these nodes can never host it.
    `host_ready(node, GPUs there)`: when the job's CPUs and memory there are free (None: never)."""
    inf = float("inf")

    def ready(nd: str, k: int) -> float:
        """When `k` GPUs of `nd` are free (all of them for an exclusive job), and the job's CPUs
        and memory there (inf: never)."""
        ts = ts_of[nd]
        t = ts[-1] if exclusive else ts[k - 1]
        if host_ready is not None:
            h = host_ready(nd, k)
            if h is None:
                return inf
            if h > t:
                t = h
        return t

    def take(nd: str, k: int) -> tuple[str, int]:
        return (nd, len(ts_of[nd]) if exclusive else k)

    size = max(len(ts) for ts in ts_of.values())
    if job.nodes:
        per = n // job.nodes
        fit = sorted((ready(nd, per), nd) for nd, ts in ts_of.items() if 1 <= per <= len(ts))
        fit = [f for f in fit if f[0] < inf]
        if len(fit) < job.nodes:
            return None
        return fit[job.nodes - 1][0], [take(nd, per) for _, nd in fit[: job.nodes]]
    if n <= size:
        fit = [f for f in sorted((ready(nd, n), nd) for nd, ts in ts_of.items() if n <= len(ts)) if f[0] < inf]
        return (fit[0][0], [take(fit[0][1], n)]) if fit else None
    # Larger than a node: the nodes whose GPUs are all free soonest, until they hold `n`.
    slot, picks, need = 0.0, [], n
    for t, nd in sorted((ready(nd, len(ts)), nd) for nd, ts in ts_of.items()):
        if need <= 0 or t == inf:
            break
        picks.append((nd, len(ts_of[nd]) if exclusive else min(need, len(ts_of[nd]))))
        slot, need = t, need - len(ts_of[nd])
    return (slot, picks) if need <= 0 else None


def _after(freed: float, now: float, latency: Latency) -> float:
    """When a job may start on GPUs free from `freed`: then, plus the start latency if that is
    still to come (GPUs free now are taken by this very cycle's plan, or wait for other reasons)."""
    return freed + latency.start_s if freed > now else freed
