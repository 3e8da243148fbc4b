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
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from heapq import merge

from gpucluster.core.placement import Capacity
from gpucluster.core.types import Gpu, JobRequest, RunningJob

# (expected end, GPUs back then[, job id]): ordered by end first; the rest never decides a
# reservation (the GPU count reached at an end does not depend on the order of equal ends).
EndItem = tuple[float, int] | tuple[float, int, int]


@dataclass(frozen=True)
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
        self.on_model: dict[str, list[tuple[float, int, int]]] = {}
        self.aside: dict[int, RunningJob] = {}  # stopping or sharing a GPU: worked out per cycle
        self._placed: dict[int, list[tuple[str, str, tuple[float, int, int]]]] = {}

    @classmethod
    def of(cls, running: Iterable[RunningJob], gpus: Mapping[tuple[str, int], Gpu], default: float) -> EndBook:
        book = cls(gpus, default)
        for j in running:
            book.add(j)
        return book

    def add(self, job: RunningJob) -> None:
        if job.stopping or shares_a_gpu(job):
            self.aside[job.job_id] = job
            return
        end = raw_end(job, self.default)
        placed = self._placed[job.job_id] = []
        for s in job.allocation.slices:
            node = s.node
            model = self.gpus[(node, s.gpu_indices[0])].model
            item = (end, len(s.gpu_indices), job.job_id)
            insort(self.on_node.setdefault((model, node), []), item)
            insort(self.on_model.setdefault(model, []), item)
            placed.append((model, node, item))

    def remove(self, job_id: int) -> None:
        if self.aside.pop(job_id, None) is not None:
            return
        for model, node, item in self._placed.pop(job_id, ()):
            _drop(self.on_node[(model, node)], item)
            _drop(self.on_model[model], item)

    def stop(self, job: RunningJob) -> None:
        """`job` (the stopping object) has begun to stop: its GPUs come back after the grace
        period, whatever its time limit says."""
        self.remove(job.job_id)
        self.aside[job.job_id] = job


def _drop(items: list[tuple[float, int, int]], item: tuple[float, int, int]) -> None:
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

    def add(self, model: str, node: str, end: float, gpus: int) -> None:
        self.by_node.setdefault((model, node), []).append((end, gpus))
        self._by_model = None

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
                model = gpus[(node, s.gpu_indices[0])].model
                items = by_node.get((model, node))
                if items is None:
                    by_node[(model, node)] = [(end, len(s.gpu_indices))]
                else:
                    items.append((end, len(s.gpu_indices)))
        self._by_model = None
        return shared

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
    if allowed is not None and (job.nodes or n > cap.node_size[model]):
        return _reserve_across(job, model, cap, ends, now, allowed)
    if job.nodes or n > cap.node_size[model]:
        free = cap.free_count(model)
        for item in ends.for_model(model):
            free += item[1]
            if free >= n:
                nodes = frozenset(nd for nd, models in cap.node_models.items() if model in models)
                return Reservation(job.job_id, model, max(item[0], now), nodes)
        return None
    best: tuple[float, str] | None = None
    # `ends.on_node` inlined: this loop runs over every node of the model once per cycle that
    # makes a reservation, and most nodes hold only the book's sorted ends.
    extra = ends.by_node
    base = ends.book.on_node if ends.book is not None else {}
    for node, idxs in cap.free[model].items():
        if allowed is not None and node not in allowed:
            continue
        free = len(idxs)
        if free >= n:
            continue  # excluded by another reservation, or refused by quota: not a place to hold
        key = (model, node)
        items = _in_order(base.get(key), extra.get(key)) if key in extra else base.get(key, ())
        for item in items:
            free += item[1]
            if free >= n:
                end = item[0] if item[0] > now else now
                if best is None or (end, node) < best:
                    best = (end, node)
                break
    if best is None:
        return None
    return Reservation(job.job_id, model, best[0], frozenset({best[1]}))


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
