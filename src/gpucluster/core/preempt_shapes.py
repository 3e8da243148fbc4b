"""Victims for every job shape, counted GPU by GPU: shared GPUs, gangs over M nodes, big jobs.

`preempt.choose_victims` keeps its fast paths for the common case (a whole-GPU job on one node,
no shared GPU among the candidates), where a GPU held by a victim is one GPU freed. Everywhere
else what a victim frees depends on who else is on its GPUs: a GPU shared by four quarter-GPU
jobs comes back whole only once all four are victims, stopping, or gone; a half-GPU job needs a
GPU with half of it and enough of its memory left once its victims go. `Room` keeps that count
exactly (released shares and memory per GPU, on top of the cycle's `Capacity`), and the searches
here ask it, one shape each:

- a fractional job: on each GPU its candidates hold, the cheapest of them whose going leaves
  the share and memory it asks (`for_fraction`);
- `n` whole GPUs on one node: GPUs freed one at a time, each time the GPU needing the fewest
  further victims, then the cheapest (`on_node`);
- a gang over exactly M nodes: the M nodes whose `gpus/M` GPUs come cheapest (`for_gang`);
- a job larger than any node: nodes emptied whole (those giving the most GPUs first) and the
  remainder on the node that gives it cheapest, so it lands on the fewest nodes, weighed against
  the cheapest victims in cost order across all nodes (`for_spread`).

Every set is then pruned of victims not needed (most expensive first): a victim is needed when
without it the job would not fit, or (a job larger than a node) would span more nodes. Candidate
sets are compared by (fewest victims, fewest nodes the job spans, cheapest victims, node name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from gpucluster.core.placement import EPS, Capacity
from gpucluster.core.types import RunningJob

if TYPE_CHECKING:
    from gpucluster.core.preempt import CostKey, Guarantees

Key = tuple[str, int]


class Room:
    """What one GPU model has free once some running jobs are gone (released), GPU by GPU.

    Reads the cycle's `Capacity` (running jobs and this cycle's starts) and keeps only what is
    released on top of it, so adding and removing a job costs O(its GPUs) and nothing is copied.
    """

    def __init__(self, cap: Capacity, model: str, gone: Iterable[RunningJob] = ()) -> None:
        self.cap = cap
        self.model = model
        self.share: dict[Key, float] = {}  # GPU -> share released
        self.mem: dict[Key, int] = {}  # GPU -> memory released
        self.extra: dict[str, int] = {}  # node -> GPUs made wholly free by releases
        for j in gone:
            self.add(j)

    def slices(self, job: RunningJob) -> Iterable[tuple[Key, float, int]]:
        """(GPU, share, memory) the job holds on this model."""
        gpus, model = self.cap.gpus, self.model
        for s in job.allocation.slices:
            for i in s.gpu_indices:
                g = gpus.get((s.node, i))
                if g is not None and g.model == model:
                    yield (s.node, i), s.share, s.memory_mb if s.memory_mb is not None else g.memory_mb

    def used(self, key: Key) -> float:
        return self.cap.used_share.get(key, 0.0) - self.share.get(key, 0.0)

    def add(self, job: RunningJob) -> None:
        self._change(job, 1)

    def remove(self, job: RunningJob) -> None:
        self._change(job, -1)

    def _change(self, job: RunningJob, sign: int) -> None:
        for key, share, mem in self.slices(job):
            was = self.cap.used_share.get(key, 0.0) > EPS and self.used(key) <= EPS
            self.share[key] = self.share.get(key, 0.0) + sign * share
            self.mem[key] = self.mem.get(key, 0) + sign * mem
            now = self.cap.used_share.get(key, 0.0) > EPS and self.used(key) <= EPS
            if now != was:
                self.extra[key[0]] = self.extra.get(key[0], 0) + (1 if now else -1)

    def free_on(self, node: str) -> int:
        """Whole GPUs of the model free on `node` once the released jobs are gone."""
        return len(self.cap.free[self.model].get(node, ())) + self.extra.get(node, 0)

    def fits_fraction(self, key: Key, share: float, mem: int) -> bool:
        g = self.cap.gpus[key]
        mem_used = self.cap.used_mem.get(key, 0) - self.mem.get(key, 0)
        return 1.0 - self.used(key) >= share - EPS and g.memory_mb - mem_used >= mem

    def total_free(self) -> int:
        return self.cap.total_free[self.model] + sum(self.extra.values())

    def span(self, n: int) -> int | None:
        """The fewest nodes `n` whole GPUs fit on, largest free first (as `Capacity` places a
        job larger than a node); None when fewer than `n` are free."""
        hist = self.cap.free_histogram(self.model)
        free = self.cap.free[self.model]
        for node, more in self.extra.items():
            if more:
                base = len(free.get(node, ()))
                hist[base] -= 1
                hist[base + more] += 1
        need, nodes = n, 0
        for k in range(len(hist) - 1, 0, -1):
            while hist[k] and need > 0:
                hist[k] -= 1
                need -= k
                nodes += 1
            if need <= 0:
                return nodes
        return None

    def share_on(self, job: RunningJob, key: Key) -> float:
        """The share of GPU `key` that `job` holds."""
        return sum(share for k, share, _ in self.slices(job) if k == key)


def occupants(room: Room, candidates: Iterable[RunningJob]) -> dict[Key, list[RunningJob]]:
    """GPU -> the candidates on it, in candidate (cost) order."""
    out: dict[Key, list[RunningJob]] = {}
    for j in candidates:
        for key, _, _ in room.slices(j):
            out.setdefault(key, []).append(j)
    return out


def _allowed(victims: Sequence[RunningJob], guarantees: Guarantees | None) -> bool:
    if guarantees is None:
        return True
    taken: dict[str, float] = {}
    for v in victims:
        if not guarantees.allows(v, taken):
            return False
        taken[v.team] = taken.get(v.team, 0.0) + guarantees.holds(v)
    return True


def _prune(room: Room, chosen: list[RunningJob], ok: Callable[[], bool], rank: dict[int, int]) -> list[RunningJob]:
    """Drop victims not needed, most expensive first; `room` holds `chosen` released on entry
    and on exit holds the pruned set released."""
    for v in sorted(chosen, key=lambda j: rank[j.job_id], reverse=True):
        room.remove(v)
        if ok():
            chosen = [j for j in chosen if j is not v]
        else:
            room.add(v)
    return chosen


def on_node(
    room: Room,
    node: str,
    want: int,
    occupants: dict[Key, list[RunningJob]],
    cost: Callable[[RunningJob], CostKey],
    rank: dict[int, int],
    guarantees: Guarantees | None,
) -> list[RunningJob] | None:
    """The victims that leave `want` whole GPUs free on `node`, or None; `room` unchanged."""
    if room.free_on(node) >= want:
        return []
    chosen: list[RunningJob] = []
    ids: set[int] = set()
    keys = [k for k in occupants if k[0] == node]
    while room.free_on(node) < want:
        best: tuple[int, list[CostKey], Key, list[RunningJob]] | None = None
        for key in keys:
            if room.used(key) <= EPS:
                continue
            need = [v for v in occupants[key] if v.job_id not in ids]
            if room.used(key) - sum(room.share_on(v, key) for v in need) > EPS:
                continue  # a job that may not be taken holds part of it
            if not _allowed([*chosen, *need], guarantees):
                continue
            cand = (len(need), sorted(cost(v) for v in need), key, need)
            if best is None or cand[:3] < best[:3]:
                best = cand
        if best is None:
            for v in chosen:
                room.remove(v)
            return None
        for v in best[3]:
            room.add(v)
            ids.add(v.job_id)
            chosen.append(v)
    chosen = _prune(room, chosen, lambda: room.free_on(node) >= want, rank)
    for v in chosen:
        room.remove(v)
    return chosen


def for_fraction(
    room: Room,
    share: float,
    mem: int,
    occupants: dict[Key, list[RunningJob]],
    cost: Callable[[RunningJob], CostKey],
    rank: dict[int, int],
    guarantees: Guarantees | None,
) -> tuple[list[RunningJob], str] | None:
    """(victims, node) that leave one GPU of the model with `share` and `mem` to spare, or None.

    A GPU free or shared with room already (the stopping jobs gone) needs no victim. Otherwise,
    on each GPU the candidates hold, the cheapest prefix of them that makes room, pruned."""
    for key in room.share:
        if room.fits_fraction(key, share, mem):
            return [], key[0]
    best: tuple[int, list[CostKey], Key, list[RunningJob]] | None = None
    for key, occ in occupants.items():
        if room.cap.gpus[key].memory_mb < mem:
            continue
        chosen: list[RunningJob] = []
        for v in occ:
            if not _allowed([*chosen, v], guarantees):
                continue
            chosen.append(v)
            room.add(v)
            if room.fits_fraction(key, share, mem):
                break
        if room.fits_fraction(key, share, mem):
            chosen = _prune(room, chosen, _fits_on(room, key, share, mem), rank)
            cand = (len(chosen), sorted(cost(v) for v in chosen), key, chosen)
            if best is None or cand[:3] < best[:3]:
                best = cand
        for v in chosen:
            room.remove(v)
    return None if best is None else (best[3], best[2][0])


def _fits_on(room: Room, key: Key, share: float, mem: int) -> Callable[[], bool]:
    return lambda: room.fits_fraction(key, share, mem)


def for_gang(
    room: Room,
    per: int,
    count: int,
    occupants: dict[Key, list[RunningJob]],
    cost: Callable[[RunningJob], CostKey],
    rank: dict[int, int],
    guarantees: Guarantees | None,
) -> tuple[list[RunningJob], frozenset[str]] | None:
    """(victims, nodes) that leave `per` whole GPUs free on `count` nodes, or None: each node's
    own cheapest victims (`on_node`), the `count` nodes needing the fewest, cheapest."""
    cap, model = room.cap, room.model
    nodes = {k[0] for k in occupants} | {n for n, more in room.extra.items() if more}
    nodes |= {n for n, idxs in cap.free[model].items() if len(idxs) >= per}
    options: list[tuple[int, list[CostKey], str, list[RunningJob]]] = []
    for node in sorted(nodes):
        if cap.node_model_count.get((node, model), 0) < per:
            continue
        got = on_node(room, node, per, occupants, cost, rank, guarantees)
        if got is not None:
            options.append((len(got), sorted(cost(v) for v in got), node, got))
            if len([o for o in options if not o[0]]) >= count:
                break  # enough nodes need no victim at all
    if len(options) < count:
        return None
    options.sort(key=lambda o: o[:3])
    picked = options[:count]
    victims: list[RunningJob] = []
    seen: set[int] = set()
    for o in picked:
        for v in o[3]:
            if v.job_id not in seen:
                seen.add(v.job_id)
                victims.append(v)
    if not _allowed(sorted(victims, key=lambda j: rank[j.job_id]), guarantees):
        return None
    where = [o[2] for o in picked]
    for v in victims:
        room.add(v)

    def enough() -> bool:
        return sum(1 for nd in where if room.free_on(nd) >= per) >= count

    victims = _prune(room, victims, enough, rank)
    for v in victims:
        room.remove(v)
    return victims, frozenset(where)


def for_spread(
    room: Room,
    n: int,
    ranked: Sequence[RunningJob],
    occupants: dict[Key, list[RunningJob]],
    cost: Callable[[RunningJob], CostKey],
    rank: dict[int, int],
    guarantees: Guarantees | None,
) -> list[RunningJob] | None:
    """Victims that leave `n` whole GPUs free over the fewest nodes, or None (see the module
    docstring): the better of emptying nodes and taking the cheapest in cost order."""
    plans = [
        p
        for p in (_by_nodes(room, n, occupants, cost, rank, guarantees), _in_order(room, n, ranked, rank, guarantees))
        if p is not None
    ]
    if not plans:
        return None
    best: tuple[int, int, list[CostKey], list[RunningJob]] | None = None
    for victims in plans:
        for v in victims:
            room.add(v)
        span = room.span(n)
        for v in victims:
            room.remove(v)
        assert span is not None
        cand = (len(victims), span, sorted(cost(v) for v in victims), victims)
        if best is None or cand[:3] < best[:3]:
            best = cand
    assert best is not None
    return best[3]


def _in_order(
    room: Room, n: int, ranked: Sequence[RunningJob], rank: dict[int, int], guarantees: Guarantees | None
) -> list[RunningJob] | None:
    """The cheapest prefix in cost order that frees `n` GPUs, pruned (the span it gives kept)."""
    chosen: list[RunningJob] = []
    for v in ranked:
        if room.total_free() >= n:
            break
        if not _allowed([*chosen, v], guarantees):
            continue
        chosen.append(v)
        room.add(v)
    if room.total_free() < n:
        for v in chosen:
            room.remove(v)
        return None
    span = room.span(n)
    chosen = _prune(room, chosen, lambda: (s := room.span(n)) is not None and span is not None and s <= span, rank)
    for v in chosen:
        room.remove(v)
    return chosen


def _by_nodes(
    room: Room,
    n: int,
    occupants: dict[Key, list[RunningJob]],
    cost: Callable[[RunningJob], CostKey],
    rank: dict[int, int],
    guarantees: Guarantees | None,
) -> list[RunningJob] | None:
    """Empty whole nodes, those giving the most GPUs first (then the fewest, cheapest victims),
    until the rest fits on one node, then take the rest where it comes cheapest; pruned.
    Each node's victims are worked out at most twice (emptied, and for the rest)."""
    cap, model = room.cap, room.model
    nodes = sorted({k[0] for k in occupants} | {nd for nd, idxs in cap.free[model].items() if idxs})
    emptied: list[tuple[int, int, list[CostKey], str, list[RunningJob]]] = []
    for node in nodes:
        size = cap.node_model_count.get((node, model), 0)
        got = on_node(room, node, size, occupants, cost, rank, guarantees)
        if got is not None:
            emptied.append((-size, len(got), sorted(cost(v) for v in got), node, got))
    emptied.sort(key=lambda o: o[:4])
    chosen: list[RunningJob] = []
    ids: set[int] = set()
    used: set[str] = set()

    def take(victims: Iterable[RunningJob]) -> None:
        for v in victims:
            if v.job_id not in ids:
                ids.add(v.job_id)
                chosen.append(v)
                room.add(v)

    need = n
    for neg_size, _, _, node, got in emptied:
        if -neg_size >= need:
            break
        take(got)
        used.add(node)
        need += neg_size
    if need > 0:
        rest: tuple[int, list[CostKey], str, list[RunningJob]] | None = None
        for node in nodes:
            if node in used or cap.node_model_count.get((node, model), 0) < need:
                continue
            got = on_node(room, node, need, occupants, cost, rank, guarantees)
            if got is not None:
                cand = (len(got), sorted(cost(v) for v in got), node, got)
                if rest is None or cand[:3] < rest[:3]:
                    rest = cand
        if rest is not None:
            take(rest[3])
    span = room.span(n)
    if span is None or not _allowed(sorted(chosen, key=lambda j: rank[j.job_id]), guarantees):
        for v in chosen:
            room.remove(v)
        return None
    chosen = _prune(room, chosen, lambda: (s := room.span(n)) is not None and s <= span, rank)
    for v in chosen:
        room.remove(v)
    return chosen
