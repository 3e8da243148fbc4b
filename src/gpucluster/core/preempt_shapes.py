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
Each search first asks whether no victim or one victim is enough (`Search.singles`, a scan in
cost order that stops at the first that frees enough): at 10,000 full nodes a 4x4 gang's cycle
took 100 s when every node was searched in full, 0.2 s so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from gpucluster.core.placement import EPS, Capacity
from gpucluster.core.types import RunningJob

if TYPE_CHECKING:
    from gpucluster.core.preempt import Guarantees

Key = tuple[str, int]


class Room:
    """What one GPU model has free once some running jobs are gone (released), GPU by GPU.

    Reads the cycle's `Capacity` (running jobs and this cycle's starts) and keeps only what is
    released on top of it, so adding and removing a job costs O(its GPUs) and nothing is copied.
    """

    def __init__(
        self, cap: Capacity, model: str, gone: Iterable[RunningJob] = (), allowed: frozenset[str] | None = None
    ) -> None:
        self.cap = cap
        self.model = model
        # The only nodes the preemptor may land on (its node selection, pools); None: any. A GPU
        # elsewhere is neither counted free nor released, so every search below looks only here.
        self.allowed = allowed
        self.share: dict[Key, float] = {}  # GPU -> share released
        self.mem: dict[Key, int] = {}  # GPU -> memory released
        self.extra: dict[str, int] = {}  # node -> GPUs made wholly free by releases
        self.released: set[int] = set()  # the jobs released
        for j in gone:
            self.add(j)
        self.gone = dict(self.share)  # GPU -> share the stopping jobs release

    def slices(self, job: RunningJob) -> Iterable[tuple[Key, float, int]]:
        """(GPU, share, memory) the job holds on this model (on the allowed nodes). A running
        exclusive job holds its nodes' other GPUs too (`Capacity.held`): they come back with it."""
        gpus, model, allowed = self.cap.gpus, self.model, self.allowed
        held = self.cap.held(job.allocation, True) if job.exclusive else job.allocation
        for s in held.slices:
            if allowed is not None and s.node not in allowed:
                continue
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
        if sign > 0:
            self.released.add(job.job_id)
        else:
            self.released.discard(job.job_id)
        for key, share, mem in self.slices(job):
            was = self.cap.used_share.get(key, 0.0) > EPS and self.used(key) <= EPS
            self.share[key] = self.share.get(key, 0.0) + sign * share
            self.mem[key] = self.mem.get(key, 0) + sign * mem
            now = self.cap.used_share.get(key, 0.0) > EPS and self.used(key) <= EPS
            if now != was:
                self.extra[key[0]] = self.extra.get(key[0], 0) + (1 if now else -1)

    def free_on(self, node: str) -> int:
        """Whole GPUs of the model free on `node` once the released jobs are gone."""
        if self.allowed is not None and node not in self.allowed:
            return 0
        return len(self.cap.free[self.model].get(node, ())) + self.extra.get(node, 0)

    def fits_fraction(self, key: Key, share: float, mem: int) -> bool:
        g = self.cap.gpus[key]
        mem_used = self.cap.used_mem.get(key, 0) - self.mem.get(key, 0)
        return 1.0 - self.used(key) >= share - EPS and g.memory_mb - mem_used >= mem

    def ok(self, node: str) -> bool:
        """Whether the preemptor may land on `node`."""
        return self.allowed is None or node in self.allowed

    def total_free(self) -> int:
        if self.allowed is not None:
            free = self.cap.free[self.model]
            return sum(len(free.get(nd, ())) for nd in self.allowed) + sum(self.extra.values())
        return self.cap.total_free[self.model] + sum(self.extra.values())

    def span(self, n: int) -> int | None:
        """The fewest nodes `n` whole GPUs fit on, largest free first (as `Capacity` places a
        job larger than a node); None when fewer than `n` are free."""
        free = self.cap.free[self.model]
        if self.allowed is None:
            hist = self.cap.free_histogram(self.model)
        else:
            hist = [0] * (self.cap.node_size[self.model] + 1)
            for nd in self.allowed:
                if (nd, self.model) in self.cap.node_model_count:
                    hist[len(free.get(nd, ()))] += 1
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


Occupants = dict[str, dict[Key, list[RunningJob]]]  # node -> GPU -> candidates on it, cheapest first


class Search:
    """One preemptor's search on one model: the room, the candidates in cost order (`ranked`;
    a victim set's cost is its victims' places in that order, sorted), who is on each GPU, and
    what guaranteed quotas allow. Every search first looks for a place needing no victim, then
    one victim (a scan in cost order that stops at the first that frees enough), and only then
    for several: at 10,000 nodes the first two answer at O(candidates) at most."""

    def __init__(
        self, room: Room, ranked: Sequence[RunningJob], guarantees: Guarantees | None, whole: bool = False
    ) -> None:
        self.room = room
        self.ranked = ranked
        self.guarantees = guarantees
        # No candidate or stopping job shares a GPU: a GPU a victim holds is a GPU freed, so a
        # node's cheapest victims are a prefix of its candidates in cost order (`prefix`).
        self.whole = whole

    @cached_property
    def rank(self) -> dict[int, int]:
        """Job id -> place in cost order. Built on first use, like `occ`: a search that one
        scan of `ranked` answers (no victim, or one) never needs either, and both are
        O(candidates)."""
        return {j.job_id: i for i, j in enumerate(self.ranked)}

    @cached_property
    def _index(self) -> tuple[Occupants, dict[Key, float]]:
        """Who is on each GPU (`occ`) and the share all candidates hold on it."""
        occ: Occupants = {}
        held: dict[Key, float] = {}
        for j in self.ranked:
            for key, share, _ in self.room.slices(j):
                occ.setdefault(key[0], {}).setdefault(key, []).append(j)
                held[key] = held.get(key, 0.0) + share
        return occ, held

    @property
    def occ(self) -> Occupants:
        return self._index[0]

    @cached_property
    def by_node(self) -> dict[str, list[tuple[RunningJob, int]]]:
        """Node -> (candidate, its GPUs of the model there), cheapest first (`whole` only)."""
        out: dict[str, list[tuple[RunningJob, int]]] = {}
        for node, gpus in self.occ.items():
            counts: dict[int, int] = {}
            jobs: dict[int, RunningJob] = {}
            for occ in gpus.values():
                for v in occ:
                    counts[v.job_id] = counts.get(v.job_id, 0) + 1
                    jobs[v.job_id] = v
            rank = self.rank
            out[node] = [(jobs[i], counts[i]) for i in sorted(counts, key=rank.__getitem__)]
        return out

    def freeable(self, key: Key) -> bool:
        """Whether GPU `key` comes wholly free once its candidates go: no one else (but the
        stopping jobs) holds any of it."""
        room = self.room
        return room.cap.used_share.get(key, 0.0) - room.gone.get(key, 0.0) - self._index[1].get(key, 0.0) <= EPS

    def cost(self, victims: Iterable[RunningJob]) -> list[int]:
        return sorted(self.rank[v.job_id] for v in victims)

    def allowed(self, victims: Sequence[RunningJob]) -> bool:
        g = self.guarantees
        if g is None:
            return True
        taken: dict[str, float] = {}
        for v in sorted(victims, key=lambda j: self.rank[j.job_id]):
            if not g.allows(v, taken):
                return False
            taken[v.team] = taken.get(v.team, 0.0) + g.holds(v)
        return True

    def prune(self, chosen: list[RunningJob], ok: Callable[[], bool]) -> list[RunningJob]:
        """Drop victims not needed, most expensive first; the room holds `chosen` released on
        entry and the pruned set released on exit."""
        room = self.room
        for v in sorted(chosen, key=lambda j: self.rank[j.job_id], reverse=True):
            room.remove(v)
            if ok():
                chosen = [j for j in chosen if j is not v]
            else:
                room.add(v)
        return chosen

    def frees(self, v: RunningJob, node: str) -> int:
        """Whole GPUs on `node` that `v` going alone would free."""
        room = self.room
        n = 0
        for key, share, _ in room.slices(v):
            if key[0] == node:
                used = room.used(key)
                if used > EPS and used - share <= EPS:
                    n += 1
        return n

    def ready(self, want: int) -> list[str]:
        """Nodes with `want` whole GPUs free already (the released jobs gone), by name."""
        room = self.room
        nodes = set(room.cap.nodes_with_free(room.model, want))
        nodes |= {nd for nd, more in room.extra.items() if more and room.free_on(nd) >= want}
        return sorted(nd for nd in nodes if room.ok(nd)) if room.allowed is not None else sorted(nodes)

    def singles(self, want: int, limit: int, ok: Callable[[str], bool]) -> dict[str, list[RunningJob]]:
        """Up to `limit` nodes (those `ok` accepts) where no victim, or one, leaves `want` whole
        GPUs free: node -> [] (none needed; first, by name) or [its cheapest such victim] (in
        cost order, a victim's own nodes by name)."""
        out: dict[str, list[RunningJob]] = {}
        for nd in self.ready(want):
            if ok(nd):
                out[nd] = []
                if len(out) >= limit:
                    return out
        room = self.room
        if self.whole:  # a victim frees the GPUs it holds: no need to ask the room GPU by GPU
            gpus, model, gone = room.cap.gpus, room.model, room.released
            for v in self.ranked:
                if v.job_id in gone:
                    continue
                slices = v.allocation.slices
                for sl in sorted(slices, key=lambda x: x.node) if len(slices) > 1 else slices:
                    nd = sl.node
                    if nd in out or gpus[(nd, sl.gpu_indices[0])].model != model or not room.ok(nd) or not ok(nd):
                        continue
                    if room.free_on(nd) + len(sl.gpu_indices) >= want:
                        out[nd] = [v]
                        if len(out) >= limit:
                            return out
            return out
        for v in self.ranked:
            for nd in sorted({key[0] for key, _, _ in room.slices(v)}):
                if nd in out or not ok(nd):
                    continue
                if room.free_on(nd) + self.frees(v, nd) >= want:
                    out[nd] = [v]
                    if len(out) >= limit:
                        return out
        return out

    def on_node(self, node: str, want: int) -> list[RunningJob] | None:
        """The victims that leave `want` whole GPUs free on `node`, or None; the room unchanged.
        GPUs are freed one at a time, each time the one needing the fewest further victims, then
        the cheapest; the set is then pruned."""
        room = self.room
        have = room.free_on(node)
        if have >= want:
            return []
        if self.whole:
            gone = room.released
            return prefix(
                [p for p in self.by_node.get(node, ()) if p[0].job_id not in gone], have, want, self.guarantees
            )
        gpus = self.occ.get(node, {})
        chosen: list[RunningJob] = []
        ids: set[int] = set()
        while room.free_on(node) < want:
            best: tuple[int, list[int], Key, list[RunningJob]] | None = None
            for key, occ in gpus.items():
                used = room.used(key)
                if used <= EPS:
                    continue
                if not self.freeable(key):
                    continue  # a job that may not be taken holds part of it
                need = [v for v in occ if v.job_id not in ids]
                if not self.allowed([*chosen, *need]):
                    continue
                cand = (len(need), self.cost(need), key, need)
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
        chosen = self.prune(chosen, lambda: room.free_on(node) >= want)
        for v in chosen:
            room.remove(v)
        return chosen

    def emptied(self, node: str) -> list[RunningJob] | None:
        """Every job on `node`'s GPUs of the model, when all may be taken (else None)."""
        room = self.room
        out: list[RunningJob] = []
        ids: set[int] = set()
        for key, occ in self.occ.get(node, {}).items():
            if not self.freeable(key):
                return None
            for v in occ:
                if v.job_id not in ids:
                    ids.add(v.job_id)
                    out.append(v)
        size = room.cap.node_model_count.get((node, room.model), 0)
        held = len(self.occ.get(node, {}))
        if room.free_on(node) + held < size:
            return None  # a GPU is held by jobs that may not be taken
        return out if self.allowed(out) else None


def on_one_node(search: Search, n: int) -> tuple[list[RunningJob], str] | None:
    """(victims, node) that leave `n` whole GPUs free on one node, or None."""
    room = search.room
    cap, model = room.cap, room.model

    def big_enough(nd: str) -> bool:
        return cap.node_model_count.get((nd, model), 0) >= n

    few = search.singles(n, 1, big_enough)
    if few:
        node, victims = next(iter(few.items()))
        return victims, node
    best: tuple[int, list[int], str, list[RunningJob]] | None = None
    for node in sorted(search.occ):
        if not big_enough(node):
            continue
        got = search.on_node(node, n)
        if got is not None:
            key = (len(got), search.cost(got), node, got)
            if best is None or key[:3] < best[:3]:
                best = key
    return None if best is None else (best[3], best[2])


def for_fraction(search: Search, share: float, mem: int) -> tuple[list[RunningJob], str] | None:
    """(victims, node) that leave one GPU of the model with `share` and `mem` to spare, or None.

    A GPU with room once the stopping jobs are gone needs no victim; then the cheapest
    single victim that makes room on one of its GPUs; else, on each GPU, the cheapest prefix of
    the candidates on it that makes room, pruned (GPUs taken in order of their cheapest
    candidate, so the scan stops once a later GPU could only be dearer)."""
    room = search.room
    cap, model = room.cap, room.model
    fresh = [(nd, cap.free[model][nd][0]) for nd in cap.nodes_with_free(model, 1)]
    for key in [*room.share, *cap.partial[model], *fresh]:
        if room.ok(key[0]) and room.fits_fraction(key, share, mem):
            return [], key[0]  # room without victims (the stopping jobs gone, or quota kept it off)
    for v in search.ranked:
        room.add(v)
        hit = sorted(key for key, _, _ in room.slices(v) if room.fits_fraction(key, share, mem))
        room.remove(v)
        if hit:
            return [v], hit[0][0]
    gpus = sorted(
        ((key, occ) for per in search.occ.values() for key, occ in per.items()),
        key=lambda item: (search.rank[item[1][0].job_id], item[0]),
    )
    best: tuple[int, list[int], Key, list[RunningJob]] | None = None
    for key, occ in gpus:
        if best is not None and len(best[3]) == 2 and search.rank[occ[0].job_id] > best[1][0]:
            break  # two is the fewest left (no single victim does), and every later set is dearer
        if room.cap.gpus[key].memory_mb < mem:
            continue
        chosen: list[RunningJob] = []
        for v in occ:
            if not search.allowed([*chosen, v]):
                continue
            chosen.append(v)
            room.add(v)
            if room.fits_fraction(key, share, mem):
                break
        if room.fits_fraction(key, share, mem):
            chosen = search.prune(chosen, _fits_on(room, key, share, mem))
            cand = (len(chosen), search.cost(chosen), key, chosen)
            if best is None or cand[:3] < best[:3]:
                best = cand
        for v in chosen:
            room.remove(v)
    return None if best is None else (best[3], best[2][0])


def _fits_on(room: Room, key: Key, share: float, mem: int) -> Callable[[], bool]:
    return lambda: room.fits_fraction(key, share, mem)


def for_gang(search: Search, per: int, count: int) -> tuple[list[RunningJob], frozenset[str]] | None:
    """(victims, nodes) that leave `per` whole GPUs free on `count` nodes, or None: the nodes
    needing no victim (by name), then those needing one (cheapest first), then, only if those
    are too few, every other node's own cheapest victims (`Search.on_node`), fewest first."""
    room = search.room
    cap, model = room.cap, room.model

    def big_enough(nd: str) -> bool:
        return cap.node_model_count.get((nd, model), 0) >= per

    picked = search.singles(per, count, big_enough)
    options = [(len(v), search.cost(v), nd, v) for nd, v in picked.items()]
    if len(options) < count:
        for node in sorted(search.occ):
            if node in picked or not big_enough(node):
                continue
            got = search.on_node(node, per)
            if got is not None:
                options.append((len(got), search.cost(got), node, got))
        if len(options) < count:
            return None
        options.sort(key=lambda o: o[:3])
    chosen = options[:count]
    victims = _distinct(o[3] for o in chosen)
    if not search.allowed(victims):
        return None
    # The gang may land on any node a chosen victim frees, not only the ones it was picked for:
    # one victim spanning two nodes (a gang itself) can make another node's victim unneeded.
    where = [o[2] for o in chosen]
    touched = sorted({sl.node for v in victims for sl in v.allocation.slices} - set(where))
    candidates = [*where, *(nd for nd in touched if big_enough(nd) and room.ok(nd))]
    for v in victims:
        room.add(v)

    def roomy() -> list[str]:
        return [nd for nd in candidates if room.free_on(nd) >= per]

    victims = search.prune(victims, lambda: len(roomy()) >= count)
    where = roomy()[:count]
    for v in victims:
        room.remove(v)
    return victims, frozenset(where)


def for_spread(search: Search, n: int) -> list[RunningJob] | None:
    """Victims that leave `n` whole GPUs free over the fewest nodes, or None (see the module
    docstring): the better of emptying nodes and taking the cheapest in cost order."""
    room = search.room
    best: tuple[int, int, list[int], list[RunningJob]] | None = None
    for victims in (_by_nodes(search, n), _in_order(search, n)):
        if victims is None:
            continue
        for v in victims:
            room.add(v)
        span = room.span(n)
        for v in victims:
            room.remove(v)
        assert span is not None
        cand = (len(victims), span, search.cost(victims), victims)
        if best is None or cand[:3] < best[:3]:
            best = cand
    return None if best is None else best[3]


def _in_order(search: Search, n: int) -> list[RunningJob] | None:
    """The cheapest prefix in cost order that frees `n` GPUs, pruned (keeping its span)."""
    room = search.room
    chosen: list[RunningJob] = []
    for v in search.ranked:
        if room.total_free() >= n:
            break
        if not search.allowed([*chosen, v]):
            continue
        chosen.append(v)
        room.add(v)
    if room.total_free() < n:
        for v in chosen:
            room.remove(v)
        return None
    span = room.span(n)
    assert span is not None
    chosen = search.prune(chosen, lambda: (s := room.span(n)) is not None and s <= span)
    for v in chosen:
        room.remove(v)
    return chosen


def _by_nodes(search: Search, n: int) -> list[RunningJob] | None:
    """Empty whole nodes, those giving the most GPUs first (then the fewest, cheapest victims),
    until the rest fits on one node; then take the rest where it comes cheapest; pruned."""
    room = search.room
    cap, model = room.cap, room.model
    emptied: list[tuple[int, int, list[int], str, list[RunningJob]]] = []
    for node in sorted(set(search.occ) | set(search.ready(1))):
        got = search.emptied(node)
        if got is not None:
            size = cap.node_model_count.get((node, model), 0)
            emptied.append((-size, len(got), search.cost(got), node, got))
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

        def rest_fits(nd: str) -> bool:
            return nd not in used and cap.node_model_count.get((nd, model), 0) >= need

        few = search.singles(need, 1, rest_fits)
        if few:
            take(next(iter(few.values())))
        else:
            rest: tuple[int, list[int], str, list[RunningJob]] | None = None
            for node in sorted(search.occ):
                if not rest_fits(node):
                    continue
                got_rest = search.on_node(node, need)
                if got_rest is not None:
                    cand = (len(got_rest), search.cost(got_rest), node, got_rest)
                    if rest is None or cand[:3] < rest[:3]:
                        rest = cand
            if rest is not None:
                take(rest[3])
    span = room.span(n)
    if span is None or not search.allowed(chosen):
        for v in chosen:
            room.remove(v)
        return None
    chosen = search.prune(chosen, lambda: (s := room.span(n)) is not None and s <= span)
    for v in chosen:
        room.remove(v)
    return chosen


def prefix(
    ranked: Sequence[tuple[RunningJob, int]], have: int, need: int, guarantees: Guarantees | None = None
) -> list[RunningJob] | None:
    """The cheapest prefix of (job, GPUs it frees) that brings `have` up to `need`, pruned of
    any victim not needed after all; a victim `guarantees` forbids after those before it is
    passed over (pruning only leaves more room, so the pruned set is allowed too)."""
    chosen: list[tuple[RunningJob, int]] = []
    taken: dict[str, float] = {}
    for j, g in ranked:
        if g == 0:
            continue
        if guarantees is not None:
            if not guarantees.allows(j, taken):
                continue
            taken[j.team] = taken.get(j.team, 0.0) + guarantees.holds(j)
        chosen.append((j, g))
        have += g
        if have >= need:
            break
    if have < need:
        return None
    # Prune: drop the most expensive victims that turn out not to be needed.
    for pair in reversed(list(chosen)):
        if have - pair[1] >= need:
            chosen.remove(pair)
            have -= pair[1]
    return [j for j, _ in chosen]


def _others_idle(room: Room, node: str) -> bool:
    """Whether `node`'s GPUs of other models than the room's hold nothing (a node with two
    models: victims are sought on one model only, so a job on the other keeps the node busy)."""
    cap = room.cap
    for i in cap.node_gpus.get(node, ()):
        key = (node, i)
        if cap.gpus[key].model != room.model and cap.used_share.get(key, 0.0) > EPS:
            return False
    return True


def for_exclusive(search: Search, n: int, count: int | None) -> tuple[list[RunningJob], frozenset[str]] | None:
    """(victims, nodes) that leave whole nodes of the model idle for an `--exclusive` job of
    `n` GPUs (over exactly `count` nodes if given), or None.

    An exclusive job holds its nodes alone, so a node serves it only once every job on it goes
    (`Search.emptied`: all of them candidates or stopping). Nodes are taken needing the fewest
    victims, then the cheapest, then by name; a job larger than any node takes the largest
    nodes first, so it spans the fewest. Exclusive jobs are few: every node of the model (on
    the allowed ones) is looked at, O(nodes) a call."""
    room = search.room
    cap, model = room.cap, room.model
    options: list[tuple[int, int, list[int], str, list[RunningJob]]] = []
    for node in cap.model_nodes(model):
        if not room.ok(node) or not _others_idle(room, node):
            continue
        got = search.emptied(node)
        if got is not None:
            size = cap.node_model_count.get((node, model), 0)
            options.append((-size, len(got), search.cost(got), node, got))
    if count:
        per = n // count
        fit = sorted((o for o in options if -o[0] >= per), key=lambda o: o[1:4])
        if len(fit) < count:
            return None
        chosen = fit[:count]
    elif n <= cap.node_size[model]:
        fit = sorted((o for o in options if -o[0] >= n), key=lambda o: o[1:4])
        if not fit:
            return None
        chosen = fit[:1]
    else:
        options.sort(key=lambda o: o[:4])
        chosen, need = [], n
        for o in options:
            if need <= 0:
                break
            chosen.append(o)
            need += o[0]
        if need > 0:
            return None
    victims = _distinct(o[4] for o in chosen)
    if not search.allowed(victims):
        return None
    return victims, frozenset(o[3] for o in chosen)


def _distinct(groups: Iterable[Iterable[RunningJob]]) -> list[RunningJob]:
    """The victims of several chosen options, each once, in the order they were chosen: a job
    on two of the chosen nodes (a gang) is one victim, stopped once."""
    victims: list[RunningJob] = []
    seen: set[int] = set()
    for group in groups:
        for v in group:
            if v.job_id not in seen:
                seen.add(v.job_id)
                victims.append(v)
    return victims
