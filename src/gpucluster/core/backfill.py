"""Reservations for EASY backfill: when the first job in line for a GPU model will start.

The job first in line that cannot start gets a reservation: the earliest time (its shadow
time) and the nodes on which enough GPUs will be free, from the running jobs' expected ends
(start + time limit, or the policy's default). A later job may start before it only if it
ends before the shadow time or keeps off the reserved nodes, so backfill never delays it.

Expected ends come from `EndTimes`, built per cycle. Built from scratch, it walks every running
job; a caller that keeps a `CapacityIndex(told=True)` keeps an `EndBook` there instead: the
whole-GPU ends of running jobs, sorted, updated per job that starts, ends or begins to stop,
so a cycle that needs a reservation only adds its own starts, the stopping jobs and the jobs
sharing a GPU. A reservation reads ends in time order and only until enough GPUs come back,
so with the book it no longer costs O(running jobs) a cycle.

A gang (`--nodes M`: gpus/M GPUs on each of exactly M nodes) is reserved per node, not from the
model's GPUs in all (`_over_nodes`): the M nodes where gpus/M GPUs are back first, held alone.

A job asking for CPU cores or host memory (`JobRequest.host`) on nodes that account them is
reserved by `reserve_host`: a node serves it once its GPUs *and* its part of the CPUs and
memory are back, each counted up from the ends of the jobs holding them (`EndBook.host_on_node`
and, for the cycle's own starts and the jobs kept aside, `EndTimes.host_by_node`, built only
when such a job first needs a reservation). The node's time is the latest of the three, since
each only grows with time. A job asking for neither takes `reserve` exactly as before.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from heapq import merge
from operator import itemgetter
from typing import Any, TypeVar

from gpucluster.core.placement import EPS, Capacity
from gpucluster.core.types import Allocation, Gpu, JobRequest, RunningJob

# (expected end, GPUs back then[, job id]): ordered by end first; the rest never decides a
# reservation (the GPU count reached at an end does not depend on the order of equal ends).
EndItem = tuple[float, int] | tuple[float, int, int]
# (expected end, CPUs back, host memory MiB back[, job id]) on one node.
HostItem = tuple[float, float, int] | tuple[float, float, int, int]
_GPUS_OF = itemgetter(1)
INF = float("inf")
_Sorted = TypeVar("_Sorted", tuple[float, int, int], tuple[float, str])


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: int
    model: str
    shadow: float  # estimated start of the reserved job
    nodes: frozenset[str]


def raw_end(job: RunningJob, default: float) -> float:
    """When a running job is expected to end by its own time limit (the policy's default for
    none or 0), before clamping at `now` and before a stop under way is taken into account."""
    return job.started_at + (job.time_limit_s or default)


def shares_a_gpu(job: RunningJob) -> bool:
    slices = job.allocation.slices
    return not (slices[0].share >= 1 if len(slices) == 1 else all(s.share >= 1 for s in slices))


class EndBook:
    """The expected ends of running jobs' whole GPUs, kept sorted across cycles per (model,
    node) and per model by a caller that is told every start, end and stop (`CapacityIndex`
    with `told=True`). Ends are raw (`raw_end`): clamping at the cycle's `now` changes values,
    not their order, so `reserve` clamps what it reads. Jobs stopping and jobs holding a share
    of a GPU are kept aside: their end depends on the cycle (`now` + grace) or on their sharers,
    and `EndTimes` adds them each cycle (they are few)."""

    def __init__(self, gpus: Mapping[tuple[str, int], Gpu], default: float) -> None:
        self.gpus = gpus
        self.default = default
        self.on_node: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
        # model -> node -> the very lists of `on_node`: `reserve` walks a model's nodes and
        # looks each up by its name, not by a (model, node) tuple made per node.
        self.nodes_of: dict[str, dict[str, list[tuple[float, int, int]]]] = {}
        self.on_model: dict[str, list[tuple[float, int, int]]] = {}
        # model -> GPUs asked n -> (the earliest a job of n could have the node, node) of every
        # node of at least n GPUs with an end in `on_node`, sorted (`_bound` says which time):
        # `reserve` walks nodes in that order and stops at the first that cannot beat the best.
        self.ready_of: dict[str, dict[int, list[tuple[float, str]]]] = {}
        self._bounds: dict[tuple[str, str], list[float]] = {}  # (model, node) -> its bound per n - 1
        self._sizes: dict[tuple[str, str], int] | None = None  # (model, node) -> its GPUs of the model
        self._bulk = False  # being built (`of`): bounds are made once at the end
        self.aside: dict[int, RunningJob] = {}  # stopping or sharing a GPU: worked out per cycle
        self._placed: dict[int, list[tuple[str, str, tuple[float, int, int]]]] = {}
        # Per node, the ends of the CPUs and host memory jobs hold there (jobs not aside).
        self.host_on_node: dict[str, list[tuple[float, float, int, int]]] = {}
        self._host_placed: dict[int, list[tuple[str, tuple[float, float, int, int]]]] = {}

    @classmethod
    def of(cls, running: Iterable[RunningJob], gpus: Mapping[tuple[str, int], Gpu], default: float) -> EndBook:
        book = cls(gpus, default)
        book._bulk = True  # each node's bounds once, at the end: see `_bound_all`
        for j in running:
            book.add(j)
        book._bulk = False
        book._bound_all()
        return book

    def add(self, job: RunningJob) -> None:
        if job.stopping or shares_a_gpu(job):
            self.aside[job.job_id] = job
            return
        end = raw_end(job, self.default)
        placed = self._placed[job.job_id] = []
        for s in job.allocation.slices:
            node = s.node
            if s.gpu_indices:  # none for a CPU-only job: only its host part comes back
                model = self.gpus[(node, s.gpu_indices[0])].model
                item = (end, len(s.gpu_indices), job.job_id)
                items = self.on_node.get((model, node))
                if items is None:
                    items = self.on_node[(model, node)] = []
                    self.nodes_of.setdefault(model, {})[node] = items
                insort(items, item)
                if not self._bulk:
                    self._bound(model, node, items)
                insort(self.on_model.setdefault(model, []), item)
                placed.append((model, node, item))
            if s.cpus or s.host_memory_mb:
                host = (end, s.cpus, s.host_memory_mb, job.job_id)
                insort(self.host_on_node.setdefault(node, []), host)
                self._host_placed.setdefault(job.job_id, []).append((node, host))

    def remove(self, job_id: int) -> None:
        if self.aside.pop(job_id, None) is not None:
            return
        for model, node, item in self._placed.pop(job_id, ()):
            items = self.on_node[(model, node)]
            _drop(items, item)
            self._bound(model, node, items)
            _drop(self.on_model[model], item)
        for node, host in self._host_placed.pop(job_id, ()):
            hosts = self.host_on_node[node]
            del hosts[bisect_left(hosts, host)]

    def _bound(self, model: str, node: str, items: list[tuple[float, int, int]]) -> None:
        """Keep `ready_of` for `node` after its ends changed to `items`. A job of n GPUs can have
        the node no sooner than the end at which the book's jobs there hold at most (its GPUs
        - n): the node's other GPUs at best all free (-inf when they are enough already). Other
        holders (a job stopping or sharing a GPU, the cycle's own starts) only make it later,
        and `reserve` looks at the nodes with any of those whatever their bound. Why kept:
        `reserve` looked at every node of the model each time, and nearly every call asks for
        a whole node (8 GPUs: 29,194 of 32,373 calls in the first 20,000 Philly jobs), so a
        bound by first end alone left every node to look at."""
        bounds = self._bounds_of(model, node, items)
        old = self._bounds.get((model, node))
        self._bounds[(model, node)] = bounds
        by_n = self.ready_of.setdefault(model, {})
        for n in range(1, len(bounds) + 1):
            bound = bounds[n - 1]
            if old is not None:
                if old[n - 1] == bound:
                    continue
                _drop(by_n[n], (old[n - 1], node))
            insort(by_n.setdefault(n, []), (bound, node))

    def _bound_all(self) -> None:
        """`_bound` for every node at once, each list sorted once (`of`). Why: at 10,000 nodes a
        sorted insert per job (60,000 of them) and size moved lists of 10,000 entries each."""
        for (model, node), items in self.on_node.items():
            bounds = self._bounds[(model, node)] = self._bounds_of(model, node, items)
            by_n = self.ready_of.setdefault(model, {})
            for n, bound in enumerate(bounds, 1):
                by_n.setdefault(n, []).append((bound, node))
        for by_n in self.ready_of.values():
            for entries in by_n.values():
                entries.sort()

    def _bounds_of(self, model: str, node: str, items: list[tuple[float, int, int]]) -> list[float]:
        """`node`'s bound (`_bound`) for each GPU count from 1 to its size, from its `items`."""
        sizes = self._sizes
        if sizes is None:
            sizes = self._sizes = {}
            for (nd, _), gpu in self.gpus.items():
                sizes[(gpu.model, nd)] = sizes.get((gpu.model, nd), 0) + 1
        size = sizes.get((model, node), 0)
        held = sum(map(_GPUS_OF, items))
        bounds = [-INF] * size
        for end, gpus, _ in items:  # by end: after each, `held` fewer GPUs are held
            ready = size - held  # jobs of up to this many GPUs could have the node now
            held -= gpus
            for n in range(max(ready, 0) + 1, min(size - held, size) + 1):
                bounds[n - 1] = end
        return bounds

    def stop(self, job: RunningJob) -> None:
        """`job` (the stopping object) has begun to stop: its GPUs come back after the grace
        period, whatever its time limit says."""
        self.remove(job.job_id)
        self.aside[job.job_id] = job


def _drop(items: list[_Sorted], item: _Sorted) -> None:
    """`item` out of the sorted list `items` that holds it."""
    del items[bisect_left(items, item)]


class EndTimes:
    """When each running job's GPUs are expected back, for one cycle: an `EndBook`'s sorted
    ends (if the caller keeps one) plus what this cycle adds (`add`: its own starts, stopping
    jobs, shared GPUs), read in time order per model (`for_model`) or per (model, node)
    (`reserve` reads `by_node` and the book's lists itself)."""

    def __init__(self, book: EndBook | None = None) -> None:
        self.book = book
        self.by_node: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self._by_model: dict[str, list[tuple[float, int]]] | None = None
        self._extra: dict[str, dict[str, list[tuple[float, int]]]] | None = None  # see `extra_of`
        # Per node, (end, CPUs, MiB) of host resources held by jobs the book does not hold (or
        # of every running job, without a book) and by the cycle's starts; None until a job
        # asking for CPUs or memory first needs a reservation (the caller fills it then).
        self.host_by_node: dict[str, list[tuple[float, float, int]]] | None = None

    def add(self, model: str, node: str, end: float, gpus: int) -> None:
        self.by_node.setdefault((model, node), []).append((end, gpus))
        self._by_model = self._extra = None

    def add_host(self, allocation: Allocation, end: float) -> None:
        """The CPUs and host memory of `allocation`'s slices come back at `end`."""
        assert self.host_by_node is not None
        for s in allocation.slices:
            if s.cpus or s.host_memory_mb:
                self.host_by_node.setdefault(s.node, []).append((end, s.cpus, s.host_memory_mb))

    def add_host_running(self, running: Iterable[RunningJob], now: float, grace: float, default: float) -> None:
        """`add_host` for running jobs, at the ends `add_running` gives their GPUs."""
        if self.host_by_node is None:
            self.host_by_node = {}
        by_node = self.host_by_node
        for j in running:  # one loop with no call per job: without a book it runs over all of them
            end = now + grace if j.stopping else j.started_at + (j.time_limit_s or default)
            if end < now:
                end = now
            for s in j.allocation.slices:
                if s.cpus or s.host_memory_mb:
                    items = by_node.get(s.node)
                    if items is None:
                        by_node[s.node] = [(end, s.cpus, s.host_memory_mb)]
                    else:
                        items.append((end, s.cpus, s.host_memory_mb))

    def host_items(self, node: str) -> Iterable[HostItem]:
        """Every (end, CPUs, MiB) of `node`, by end."""
        base = self.book.host_on_node.get(node) if self.book is not None else None
        extra = self.host_by_node.get(node) if self.host_by_node is not None else None
        if not extra:
            return base or ()
        if not base:
            return sorted(extra)
        it: Iterator[HostItem] = merge(base, sorted(extra))
        return it

    def add_running(
        self,
        running: Iterable[RunningJob],
        gpus: Mapping[tuple[str, int], Gpu],
        now: float,
        grace: float,
        default: float,
    ) -> list[tuple[RunningJob, float]]:
        """`add` for every whole GPU of the running jobs: expected back at start + time limit
        (`default` for none), or after the grace period for a job stopping, never before
        `now`. Returns the jobs holding a share of a GPU, with their end, for the caller (a
        shared GPU comes back when its last sharer ends). One loop with no call per job
        (`raw_end` and `shares_a_gpu` written out): without a book it runs over every running
        job each cycle a job is first in line."""
        by_node = self.by_node
        shared: list[tuple[RunningJob, float]] = []
        for j in running:
            end = now + grace if j.stopping else j.started_at + (j.time_limit_s or default)
            if end < now:
                end = now
            slices = j.allocation.slices
            if not (slices[0].share >= 1 if len(slices) == 1 else all(s.share >= 1 for s in slices)):
                shared.append((j, end))
                continue
            for s in slices:
                node = s.node
                if not s.gpu_indices:
                    continue  # a CPU-only job: no GPU comes back (its host part: `add_host_running`)
                model = gpus[(node, s.gpu_indices[0])].model
                items = by_node.get((model, node))
                if items is None:
                    by_node[(model, node)] = [(end, len(s.gpu_indices))]
                else:
                    items.append((end, len(s.gpu_indices)))
        self._by_model = self._extra = None
        return shared

    def extra_of(self, model: str) -> dict[str, list[tuple[float, int]]]:
        """`by_node`'s lists of `model`, by node (the very lists: a change to one shows)."""
        if self._extra is None:
            extra: dict[str, dict[str, list[tuple[float, int]]]] = {}
            for (m, node), items in self.by_node.items():
                extra.setdefault(m, {})[node] = items
            self._extra = extra
        return self._extra.get(model, _NONE)

    def for_model(self, model: str) -> Iterable[EndItem]:
        """Every (end, GPUs) of `model`, by end."""
        if self._by_model is None:
            by_model: dict[str, list[tuple[float, int]]] = {}
            for (m, _), items in self.by_node.items():
                by_model.setdefault(m, []).extend(items)
            self._by_model = by_model
        extra = self._by_model.get(model)
        base = self.book.on_model.get(model) if self.book is not None else None
        return _in_order(base, extra)


_NONE: dict[Any, Any] = {}  # no lists (never written)


def _in_order(base: list[tuple[float, int, int]] | None, extra: list[tuple[float, int]] | None) -> Iterable[EndItem]:
    if not extra:
        return base or ()
    if not base:
        return sorted(extra)
    it: Iterator[EndItem] = merge(base, sorted(extra))
    return it


def reserve(
    job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float, allowed: frozenset[str] | None = None
) -> Reservation | None:
    """The reservation for `job` on `model`, or None if running jobs alone never free enough.
    Ends before `now` count as `now` (a job past its limit is expected back at once).
    `allowed`: the only nodes the job may use (its node selection); None: any."""
    n = int(job.gpus)
    if job.selection is not None and job.selection.exclusive:
        return _reserve_exclusive(job, model, cap, ends, now, allowed)
    if job.nodes:
        return _over_nodes(job, model, cap, ends, now, _usable(cap, model, allowed), exclusive=False)
    if allowed is not None and n > cap.node_size[model]:
        return _reserve_across(job, model, cap, ends, now, allowed)
    if n > cap.node_size[model]:
        free = cap.free_count(model)
        for item in ends.for_model(model):
            free += item[1]
            if free >= n:
                nodes = frozenset(nd for nd, models in cap.node_models.items() if model in models)
                return Reservation(job.job_id, model, max(item[0], now), nodes)
        return None
    best: tuple[float, str] | None = None
    # `ends.on_node` inlined: this loop runs over nodes of the model once per cycle that makes a
    # reservation, and most nodes hold only the book's sorted ends. Both by node name
    # (`EndBook.nodes_of`, `EndTimes.extra_of`): a (model, node) key made and hashed per node
    # was ~1% of whole Philly.
    extra = ends.extra_of(model)
    book = ends.book
    base = book.nodes_of.get(model, _NONE) if book is not None else _NONE
    free_of = cap.free[model]
    bounds = book.ready_of.get(model, _NONE).get(n) if book is not None else None
    if bounds is None:  # no book (or no end of a node that size yet): every node
        for node in free_of:
            best = _ready_on(node, n, free_of, allowed, extra, base, now, best)
    else:
        # With the book, nodes by the earliest they could hold the job (`EndBook._bound`), and
        # only until one cannot beat the best found (ends are clamped at `now`, the bound is
        # no later); first the nodes with ends of this cycle's own, whatever their bound.
        # Why: this loop went over all 64 nodes of Philly each time (~6% of whole Philly
        # under `las-gittins`). Exact: `best` is the least (ready time, node) of all nodes,
        # and a node passed over could only have a larger one; a node the book holds no end
        # of and the cycle added none to never has the GPUs (`_ready_on` skips it either way).
        for node in extra:
            best = _ready_on(node, n, free_of, allowed, extra, base, now, best)
        for bound, node in bounds:
            if best is not None:
                if bound > best[0]:
                    break
                if node > best[1] and (bound if bound > now else now) == best[0]:
                    # Its time can only tie the best's and its name comes later. Most bounds
                    # clamp to `now` on a busy cluster (jobs outrun the default limit): the
                    # best is then `now`, and only a node of a smaller name can beat it.
                    continue
            if node not in extra:
                best = _ready_on(node, n, free_of, allowed, extra, base, now, best)
    if best is None:
        return None
    return Reservation(job.job_id, model, best[0], frozenset({best[1]}))


def _ready_on(
    node: str,
    n: int,
    free_of: Mapping[str, list[int]],
    allowed: frozenset[str] | None,
    extra: Mapping[str, list[tuple[float, int]]],
    base: Mapping[str, list[tuple[float, int, int]]],
    now: float,
    best: tuple[float, str] | None,
) -> tuple[float, str] | None:
    """`best`, or (when `node` could hold a job of `n` GPUs sooner, or as soon and is first by
    name) (that time, `node`): its free GPUs, then its ends in time order (the book's, `base`,
    and the cycle's, `extra`), each clamped at `now`."""
    idxs = free_of.get(node)
    if idxs is None or (allowed is not None and node not in allowed):
        return best
    free = len(idxs)
    if free >= n:
        return best  # excluded by another reservation, or refused by quota: not a place to hold
    more = extra.get(node)
    items = _in_order(base.get(node), more) if more is not None else base.get(node, ())
    for item in items:
        if best is not None and item[0] > best[0]:
            return best  # by end: this node is ready no sooner than the best one found
        free += item[1]
        if free >= n:
            end = item[0] if item[0] > now else now
            return (end, node) if best is None or (end, node) < best else best
    return best


def _reserve_across(
    job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float, allowed: frozenset[str]
) -> Reservation | None:
    """`reserve` of a job spanning nodes that may use only `allowed`: the ends of those nodes
    alone, merged in time order (jobs with a selection are few, so no index of their own)."""
    nodes = [nd for nd in cap.model_nodes(model) if nd in allowed]
    free = sum(len(cap.free[model].get(nd, ())) for nd in nodes)
    base = ends.book.on_node if ends.book is not None else {}
    items: list[tuple[float, int]] = []
    for nd in nodes:
        items.extend((e[0], e[1]) for e in base.get((model, nd), ()))
        items.extend(ends.by_node.get((model, nd), ()))
    for end, gpus in sorted(items):
        free += gpus
        if free >= int(job.gpus):
            return Reservation(job.job_id, model, max(end, now), frozenset(nodes))
    return None


def _reserve_exclusive(
    job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float, allowed: frozenset[str] | None
) -> Reservation | None:
    """`reserve` of an `--exclusive` job: a node serves it once every GPU of the model on it is
    back (nothing else may run there), so each allowed node is ready at the end that frees its
    last GPU; the job takes the nodes ready first (one node, its `--nodes` count, or as many as
    its GPUs need). Exclusive jobs are few: every node of the model is looked at.

    Left out, knowingly: the other GPUs a running exclusive job holds are not in the expected
    ends (only its own are), so a node it holds is never reserved (it waits, never wrongly)."""
    n = int(job.gpus)
    base = ends.book.on_node if ends.book is not None else {}
    ready: list[tuple[float, str, int]] = []  # (all GPUs back, node, its GPUs of the model)
    for nd in cap.model_nodes(model):
        if allowed is not None and nd not in allowed:
            continue
        size = cap.node_model_count.get((nd, model), 0)
        free = len(cap.free[model].get(nd, ()))
        if free >= size:
            ready.append((now, nd, size))
            continue
        key = (model, nd)
        items = sorted([*((e[0], e[1]) for e in base.get(key, ())), *ends.by_node.get(key, ())])
        for end, gpus in items:
            free += gpus
            if free >= size:
                ready.append((max(end, now), nd, size))
                break
    ready.sort()
    if job.nodes:
        per = n // job.nodes
        picked = [r for r in ready if r[2] >= per][: job.nodes]
        if len(picked) < job.nodes:
            return None
    elif n <= cap.node_size[model]:
        picked = [r for r in ready if r[2] >= n][:1]
        if not picked:
            return None
    else:
        picked, got = [], 0
        for r in ready:
            picked.append(r)
            got += r[2]
            if got >= n:
                break
        if got < n:
            return None
    return Reservation(job.job_id, model, max(r[0] for r in picked), frozenset(r[1] for r in picked))


def reserve_host(
    job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float, allowed: frozenset[str] | None = None
) -> Reservation | None:
    """`reserve` for a job asking for CPUs or host memory (`ends.host_by_node` filled): on each
    node it may use, the time its GPUs of `model` and its part of the CPUs and memory there are
    all back (`_node_ready`). One node: the node ready first (one with all of it free now is
    skipped, as `reserve` skips one with the GPUs: something else keeps the job off it). Over
    nodes (`--nodes`, or more GPUs than a node has) the nodes ready first until they hold the
    job, each node holding its part; `--exclusive` waits for all of a node's GPUs. The
    reservation holds the chosen nodes alone: a job passing it keeps off them or ends first.
    Nodes are looked at one by one (O(nodes of the model) a reservation, like `reserve`)."""
    n = int(job.gpus)
    exclusive = job.selection is not None and job.selection.exclusive
    nodes = _usable(cap, model, allowed)
    if not job.nodes and n <= cap.node_size[model]:
        cpus, mem = cap.host_part(job, n)
        best: tuple[float, str] | None = None
        for nd in nodes:
            have = cap.node_model_count[(nd, model)]
            if have < n:
                continue
            t = _node_ready(cap, ends, model, nd, have if exclusive else n, cpus, mem, now, best, skip_now=True)
            if t is not None and (best is None or (t, nd) < best):
                best = (t, nd)
        return None if best is None else Reservation(job.job_id, model, best[0], frozenset({best[1]}))
    return _over_nodes(job, model, cap, ends, now, nodes, exclusive)


def _usable(cap: Capacity, model: str, allowed: frozenset[str] | None) -> list[str]:
    """The nodes of `model` the job may use."""
    nodes = cap.model_nodes(model)
    return nodes if allowed is None else [nd for nd in nodes if nd in allowed]


def _over_nodes(
    job: JobRequest, model: str, cap: Capacity, ends: EndTimes, now: float, nodes: list[str], exclusive: bool
) -> Reservation | None:
    """The reservation of a job over several nodes (`--nodes M`: gpus/M on each of exactly M;
    or more GPUs than a node has): each node is ready when its part is back there, GPUs and
    CPUs and memory (`_node_ready`, its own ends only); the nodes ready first are taken until
    they hold the job, and it starts when the last of them is ready. Per node, not from the
    model's GPUs in all: 4 back over 3 nodes with 1 each is not 2 on each of 2. The reservation
    holds the chosen nodes alone: a job passing it keeps off them or ends first. O(nodes of
    the model) a reservation, like a one-node job's."""
    n = int(job.gpus)
    ready: list[tuple[float, str, int]] = []  # (ready, node, the job's GPUs there)
    per = n // job.nodes if job.nodes else 0
    for nd in nodes:
        have = cap.node_model_count[(nd, model)]
        take = per if job.nodes else min(have, n)
        if take < 1 or have < take:
            continue
        cpus, mem = cap.host_part(job, take)
        t = _node_ready(cap, ends, model, nd, have if exclusive else take, cpus, mem, now, None)
        if t is not None:
            ready.append((t, nd, take))
    ready.sort()
    picked: list[tuple[float, str, int]] = []
    got = 0
    for r in ready:
        picked.append(r)
        got += r[2]
        if (len(picked) == job.nodes) if job.nodes else got >= n:
            return Reservation(job.job_id, model, max(p[0] for p in picked), frozenset(p[1] for p in picked))
    return None


def _node_ready(
    cap: Capacity,
    ends: EndTimes,
    model: str,
    node: str,
    gpus: int,
    cpus: float,
    mem: int,
    now: float,
    best: tuple[float, str] | None,
    skip_now: bool = False,
) -> float | None:
    """When `node` has `gpus` free GPUs of `model`, `cpus` CPUs and `mem` MiB left, by the
    running jobs' expected ends (never before `now`); None if they never do, if it is no sooner
    than `best`, or (`skip_now`) if all of it is free now. Each resource only grows with time,
    so the node is ready at the latest of the three times."""
    free = len(cap.free[model].get(node, ()))
    t = now
    gpus_now = free >= gpus
    if not gpus_now:
        key = (model, node)
        base = ends.book.on_node.get(key) if ends.book is not None else None
        items = _in_order(base, ends.by_node.get(key))
        for item in items:
            free += item[1]
            if free >= gpus:
                t = item[0] if item[0] > now else now
                break
        else:
            return None
        if best is not None and (t, node) >= best:
            return None
    if not cpus and not mem:
        return None if skip_now and gpus_now else t
    left_cpus, left_mem = cap.free_host(node)
    short_cpus = bool(cpus) and left_cpus is not None and left_cpus + EPS < cpus
    short_mem = bool(mem) and left_mem is not None and left_mem < mem
    if not short_cpus and not short_mem:
        return None if skip_now and gpus_now else t
    for back in ends.host_items(node):
        if short_cpus:
            assert left_cpus is not None
            left_cpus += back[1]
            short_cpus = left_cpus + EPS < cpus
        if short_mem:
            assert left_mem is not None
            left_mem += back[2]
            short_mem = left_mem < mem
        if not short_cpus and not short_mem:
            return back[0] if back[0] > t else t
    return None
