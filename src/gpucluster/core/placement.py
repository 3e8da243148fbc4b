"""Where a job fits: a working copy of free GPU capacity, indexed for fast best-fit placement.

Filters and scoring are separate: `acceptable_models` says which GPU models may host a job (type
list, minimum memory); the placement functions then score by packing. Whole-GPU jobs go to one
node when they fit on one (best fit: the node left with the fewest free GPUs, so whole nodes
stay free for large jobs), else to the fewest nodes. Inside a node, GPUs that share a topology
domain are preferred. Fractional jobs share a GPU already in fractional use before opening a
new one. Nodes are kept in buckets by their free-GPU count per model, so a placement costs
O(GPUs per node), not O(nodes): a cycle over 100,000 queued jobs on 10,000 nodes stays fast.

CPU cores and host memory (`JobRequest.cpus`, `mem_mb`) are a filter on the same walk: a node
the walk would pick is skipped when it has not the job's part of them left (`host_fits`), so a
job asking for neither takes exactly the path it took before, and one asking for them costs
more only where the first nodes by GPU count are short of CPUs or memory. A job's part on a
node is its request times the node's share of its GPUs (`host_part`), written into the node's
slice so that `take` and `release` count it back exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import filterfalse, groupby
from operator import itemgetter
from typing import Any

from gpucluster.core.image_affinity import holder
from gpucluster.core.inventory import inventory_of
from gpucluster.core.occupancy import SHARE_DIGITS, kinds, running_slices, used_by
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.selection import Selection
from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, RunningJob

EPS = 1e-9

_NODE_OF, _INDEX_OF = itemgetter(0), itemgetter(1)  # of a GPU's (node, index)

_MISSING: Any = object()  # in a fork's journal: the key was absent before the fork wrote it
# One undo record: (a dict or list of the lender's, key or index, what it held before or _MISSING).
_Journal = list[tuple[Any, Any, Any]]


def _undo(journal: _Journal) -> None:
    """Put back what a journaling fork wrote into its lender's containers, newest first."""
    for container, key, old in reversed(journal):
        if old is _MISSING:
            del container[key]
        else:
            container[key] = old
    journal.clear()


def acceptable_models(job: JobRequest, model_memory: dict[str, int], models_by_memory: list[str]) -> list[str]:
    """GPU models that may host the job, best first: its stated preference, else smallest memory.

    `model_memory`: each model's smallest GPU memory; `models_by_memory`: models by that, ascending.
    """
    models = list(job.gpu_types) if job.gpu_types else models_by_memory
    out = [m for m in models if m in model_memory]
    if job.min_gpu_memory_mb is not None:
        out = [m for m in out if model_memory[m] >= job.min_gpu_memory_mb]
    if job.gpu_memory_mb is not None:
        out = [m for m in out if model_memory[m] >= job.gpu_memory_mb]
    return out


def _first(pair: tuple[float, tuple[str, int]]) -> float:
    return pair[0]


class Capacity:
    """Free capacity for one scheduling cycle; `take` updates it as the plan grows."""

    def __init__(self, nodes: Iterable[Node], running: Iterable[RunningJob]) -> None:
        # The inventory (core/inventory.py): built once per set of nodes and shared by every
        # capacity of the same nodes, so a fresh build pays only for what the running jobs hold.
        inv = inventory_of(nodes)
        self.gpus: dict[tuple[str, int], Gpu] = inv.gpus
        self.models_by_memory: list[str] = inv.models_by_memory
        self.model_memory: dict[str, int] = inv.model_memory
        self.node_size: dict[str, int] = inv.node_size  # model -> GPUs of that model on its largest node
        self.total: dict[str, int] = inv.total
        self.node_models: dict[str, list[str]] = inv.node_models
        self.node_model_count: dict[tuple[str, str], int] = inv.node_model_count
        # GPU index -> topology domain, for nodes with more than one domain (the others need no
        # choosing): `_slice` runs once per start and looked each GPU up by (node, index).
        self.domains: dict[str, dict[int, str | None]] = inv.domains
        # Node selection (core/selection.py): each node's labels and GPU indices, and per
        # selection the nodes it allows (the inventory never changes, so kept for its life).
        self.node_labels: dict[str, frozenset[str]] = inv.node_labels
        self.node_gpus: dict[str, tuple[int, ...]] = inv.node_gpus
        self._allowed: dict[Selection, frozenset[str]] = inv.allowed
        # Host resources of the nodes that account them (`Node.cpus`, `Node.memory_mb`); a node
        # absent here hosts any request.
        self.node_cpus: dict[str, float] = inv.node_cpus
        self.node_hmem: dict[str, int] = inv.node_hmem
        self._kinds: dict[str, list[tuple[tuple[int, float, float], int]]] = inv.kinds  # see `_host_kinds`
        self._model_nodes: dict[str, list[str]] = inv.model_nodes  # by name
        # Bumped by every `take` and `release`, for caches of derived facts (what fits where,
        # the most free GPUs, the idle nodes). Every one: a share of a GPU already in use changes
        # no free count, yet what fits (`fits`, `place`) reads shares and memory too.
        self.version = 0
        self._most: dict[str, tuple[int, int]] = {}

        # CPU cores and host memory held per node (only nodes where some job holds them).
        self.used_cpus: dict[str, float] = {}
        self.used_hmem: dict[str, int] = {}
        self._journal: _Journal | None = None  # a journaling fork: undo records for its lender
        slices = running_slices(running, self.held)
        whole, host = kinds(slices)
        if host:
            for s in slices:
                if (s.cpus or s.host_memory_mb) and s.node in self.node_gpus:
                    self._host_add(s.node, s.cpus, s.host_memory_mb)
        self.used_share: dict[tuple[str, int], float]
        self.used_mem: dict[tuple[str, int], int]
        self.used_share, self.used_mem = used_by(slices, inv.memory, whole)

        # Whole-free GPUs per model per node, and nodes bucketed by that count.
        self.free: dict[str, dict[str, list[int]]] = {m: {} for m in self.model_memory}
        self._buckets: dict[str, list[dict[str, None]]] = {
            m: [{} for _ in range(self.node_size[m] + 1)] for m in self.model_memory
        }
        self.total_free: dict[str, int] = dict.fromkeys(self.model_memory, 0)
        self.partial: dict[str, dict[tuple[str, int], None]] = {m: {} for m in self.model_memory}
        self._free_gpus(inv.plain)
        self._gpu_pos: dict[tuple[str, int], int] | None = None  # inventory order, for `fork`
        # Copy-on-write of the free lists: None when this object owns every list in `free`;
        # in a fork, the (model, node) lists it has copied so far (the rest are its base's).
        self._owned: set[tuple[str, str]] | None = None
        # Buckets a node was added to out of name order since they were last in canonical
        # order: a node moved in goes last. A journaling fork puts them in order when it first
        # touches them (`_settle`), not every fork all of them.
        self._unsorted: set[tuple[str, int]] = set()
        # Journaling forks (see `fork`): only an object built here lends its containers.
        self._lender = True
        self._lent: tuple[Capacity, _Journal] | None = None  # the fork of the open trial, its undo log
        self._lazy: set[tuple[str, int]] | None = None  # a journaling fork: its lender's `_unsorted`
        self._own_buckets: set[tuple[str, int]] | None = None  # a journaling fork: buckets it copied
        # A journaling fork: per model, the nodes it put into bucket 0 without sorting it first
        # (see `_move`), and the models whose bucket 0 it has since put in order for itself.
        self._zero_added: dict[str, set[str]] | None = None
        self._zero_done: set[str] | None = None
        self._fill_buckets()

    def _free_gpus(self, plain: bool) -> None:
        """The whole-free GPUs of each node per model (`free`: nodes in inventory order) and the
        GPUs in fractional use (`partial`: in inventory order), by a pass over every GPU. Why
        at C speed where it can: where every used GPU is wholly used (the common case: no
        shares) and the inventory is `plain`, a free GPU is one the running jobs do not hold,
        picked out by `filterfalse`, and the free ones come node by node (`groupby`): Python
        runs per node with a free GPU, not per GPU."""
        used, free = self.used_share, self.free
        if plain and (not used or min(used.values()) >= 1 - EPS):
            one = self.node_models
            for name, run in groupby(filterfalse(used.__contains__, self.gpus), _NODE_OF):
                models = one[name]
                if len(models) == 1:
                    free[models[0]][name] = list(map(_INDEX_OF, run))
                    continue
                for key in run:  # a node with GPUs of several models
                    free[self.gpus[key].model].setdefault(name, []).append(key[1])
            return
        for (name, idx), g in self.gpus.items():
            share = used.get((name, idx), 0.0)
            if share <= EPS:
                free[g.model].setdefault(name, []).append(idx)
            elif share < 1 - EPS:
                self.partial[g.model][(name, idx)] = None

    def _fill_buckets(self) -> None:
        """Each model's nodes with no free GPU get an empty free list (after those with one, in
        name order), every list is sorted, and the nodes go into buckets by free count in name
        order: the order best fit breaks ties in, the same however the free counts were reached."""
        for model, names in self._model_nodes.items():
            buckets = self._buckets[model]
            free = self.free[model]
            count = 0
            for name in names:
                idxs = free.get(name)
                if idxs is None:
                    free[name] = idxs = []
                else:
                    idxs.sort()
                    count += len(idxs)
                buckets[len(idxs)][name] = None
            self.total_free[model] = count

    @property
    def buckets(self) -> dict[str, list[dict[str, None]]]:
        """Nodes by free GPU count, per model, each bucket in name order (the order best fit
        breaks ties in) but for the nodes this object's own `take`/`release` moved in, which go
        last. A journaling fork first puts in order the buckets it has not touched yet."""
        if self._lazy:
            self._settle_all()
        return self._buckets

    def fork(self) -> Capacity:
        """An independent working copy, exactly as `Capacity(nodes, running)` would build it
        for the running jobs this one holds (a full copy, every bucket in name order). For one
        cycle's trial on a kept base, `trial` is the cheap way."""
        return self._copy()

    @contextmanager
    def trial(self) -> Iterator[Capacity]:
        """A working copy for one cycle, valid inside the `with` block only; when the block
        ends (even on error) this object is exactly as it was before.

        The copy is what `fork` gives (the inventory shared, bucket and shared-GPU order those
        of a fresh build, so a plan never depends on the order jobs came and went in), but a
        `Capacity` built by `__init__` (a capacity index's base) lends its free state to it
        instead of copying it. Why: at 100,000 GPUs copying the buckets, free lists and used
        shares (O(nodes + busy GPUs), at C speed) was ~0.7 ms a cycle, most of a cycle when
        one job waits, while a cycle changes a few nodes. The trial's copy writes into this
        object's containers and keeps an undo log (`_journal`) of what each held before; the
        end of the block replays it, newest first. Orders come back exactly: a key the copy
        added is deleted (the rest keep their order), a free list or a bucket it removes a
        node from is first copied and the copy put in this object's slot (the original comes
        back on undo). Buckets this object put a node into out of name order (`_unsorted`)
        are sorted in place when the copy first touches them (`_settle`): only the order
        changes, to the canonical one it owes its copies anyway; bucket 0, whose order no
        placement reads, is not sorted for a change, only for `buckets` (see `_move`).

        Why a block and not the garbage collector: the undo used to run from a weakref
        callback when the copy was freed, so when it ran depended on who still held the copy
        (a traceback, a debugger); the block says where the trial ends. If this object must
        change or open another trial while one is open, the open trial's copy first takes
        copies of everything (`_detach`) and the undo runs at once. While a trial is open this
        object's containers show the copy's changes: read it only through its methods (the
        index never reads it otherwise). Any other object's trial is a full copy (`fork`)."""
        if not self._lender:
            yield self._copy()
            return
        if self._lent is not None:
            self._reclaim()
        c = self._sharing_inventory()
        c.used_share = self.used_share
        c.used_mem = self.used_mem
        c.used_cpus = self.used_cpus
        c.used_hmem = self.used_hmem
        c.free = self.free
        c._buckets = self._buckets
        c.total_free = dict(self.total_free)
        c.partial = self._partial_copy()
        c._unsorted = set()
        c._lender = False
        c._lent = None
        journal: _Journal = []
        c._journal = journal
        c._lazy = self._unsorted
        c._owned = set()
        c._own_buckets = set()
        c._zero_added = {}
        c._zero_done = set()
        self._lent = (c, journal)
        try:
            yield c
        finally:
            lent = self._lent
            if lent is not None and lent[1] is journal:  # not reclaimed by a change meanwhile
                self._lent = None
                _undo(journal)
                # The copy's containers are its lender's again: one kept past its block must
                # fail loudly (AttributeError), not read the lender's state as its own.
                del c.free, c._buckets, c.used_share, c.used_mem, c.total_free, c.partial, c.used_cpus, c.used_hmem

    def _copy(self) -> Capacity:
        """A fork that copies everything (a fork of a fork): free lists, used shares, and every
        bucket put in name order."""
        c = self._sharing_inventory()
        c.used_share = dict(self.used_share)
        c.used_mem = dict(self.used_mem)
        c.used_cpus = dict(self.used_cpus)
        c.used_hmem = dict(self.used_hmem)
        c.free = {m: {n: list(idxs) for n, idxs in per.items()} for m, per in self.free.items()}
        c._buckets = {m: [dict.fromkeys(sorted(b)) for b in per] for m, per in self._buckets.items()}
        c.total_free = dict(self.total_free)
        c.partial = self._partial_copy()
        c._unsorted = set()
        c._lender = False
        c._lent = None
        c._journal = None
        c._lazy = None
        c._owned = None
        c._own_buckets = None
        c._zero_added = None
        c._zero_done = None
        return c

    def _sharing_inventory(self) -> Capacity:
        """A new object sharing this one's inventory (never changed after `__init__`), for
        `fork` and `_copy` to give the free state to."""
        c = Capacity.__new__(Capacity)
        c.gpus = self.gpus
        c.models_by_memory = self.models_by_memory
        c.model_memory = self.model_memory
        c.node_size = self.node_size
        c.total = self.total
        c.node_models = self.node_models
        c.node_model_count = self.node_model_count
        c.domains = self.domains
        c.node_labels = self.node_labels
        c.node_gpus = self.node_gpus
        c._allowed = self._allowed
        c.node_cpus = self.node_cpus
        c.node_hmem = self.node_hmem
        c._kinds = self._kinds
        c._model_nodes = self._model_nodes
        c._gpu_pos = None
        c.version = 0
        c._most = {}
        return c

    def _partial_copy(self) -> dict[str, dict[tuple[str, int], None]]:
        """Shared GPUs per model in inventory order, the order a fresh build gives."""
        out: dict[str, dict[tuple[str, int], None]] = {}
        for m, keys in self.partial.items():
            if len(keys) > 1:
                if self._gpu_pos is None:
                    self._gpu_pos = {key: i for i, key in enumerate(self.gpus)}
                keys = dict.fromkeys(sorted(keys, key=self._gpu_pos.__getitem__))
            out[m] = dict(keys)
        return out

    def _settle(self, model: str, k: int) -> None:
        """A journaling fork reads bucket k of `model` in order, or changes it, for the first
        time: if its lender put a node into it out of name order, sort it in the lender's slot
        (not journaled: the lender's nodes, in the order it owes its forks). Bucket 0 is the
        exception (see `_move`): a fork that put nodes into it unsorted sorts its own copy."""
        lazy = self._lazy
        if lazy is None or (model, k) not in lazy:
            return
        per = self._buckets[model]
        added = self._zero_added.get(model) if k == 0 and self._zero_added is not None else None
        if not added and (self._own_buckets is None or (model, k) not in self._own_buckets):
            lazy.discard((model, k))
            per[k] = dict.fromkeys(sorted(per[k]))
            return
        assert self._zero_done is not None and self._journal is not None and self._own_buckets is not None
        if model in self._zero_done:
            return
        # Bucket 0 this fork changed unsorted: the lender's nodes in name order, then the
        # fork's in the order it put them in, in a copy of its own (the lender's stays unsorted).
        added = added or set()
        bucket = per[0]
        mine = [n for n in bucket if n in added]
        ordered = dict.fromkeys(sorted(n for n in bucket if n not in added))
        ordered.update(dict.fromkeys(mine))
        if (model, 0) not in self._own_buckets:
            self._journal.append((per, 0, bucket))
            self._own_buckets.add((model, 0))
        per[0] = ordered
        self._zero_done.add(model)

    def _settle_all(self) -> None:
        assert self._lazy is not None
        for model, k in list(self._lazy):
            self._settle(model, k)

    def _reclaim(self) -> None:
        """This lender is about to change or fork: a fork still alive takes copies of what it
        sees first, then the lender undoes the fork's writes."""
        lent = self._lent
        if lent is None:
            return
        self._lent = None
        fork, journal = lent
        fork._detach()
        _undo(journal)

    def _detach(self) -> None:
        """A journaling fork becomes independent of its lender: copies of everything it sees."""
        if self._lazy:
            self._settle_all()
        self.used_share = dict(self.used_share)
        self.used_mem = dict(self.used_mem)
        self.used_cpus = dict(self.used_cpus)
        self.used_hmem = dict(self.used_hmem)
        self.free = {m: {n: list(idxs) for n, idxs in per.items()} for m, per in self.free.items()}
        self._buckets = {m: [dict(b) for b in per] for m, per in self._buckets.items()}
        self._journal = None
        self._lazy = None
        self._owned = None
        self._own_buckets = None
        self._zero_added = None
        self._zero_done = None

    # ---- filters ----------------------------------------------------------------------------

    def acceptable_models(self, job: JobRequest) -> list[str]:
        """GPU models that may host the job, best first: its stated preference, else smallest memory."""
        return acceptable_models(job, self.model_memory, self.models_by_memory)

    def could_ever_fit(self, job: JobRequest, model: str, allowed: Collection[str] | None = None) -> bool:
        """Whether some set of the nodes (of `allowed` only, when given) could host the job on
        `model` once everything else has ended (GPUs, and CPUs and host memory per node)."""
        if not self._gpus_could_ever_fit(job, model, allowed):
            return False
        return not job.host or self._host_could_ever_fit(job, model, allowed)

    def _host_could_ever_fit(self, job: JobRequest, model: str, allowed: Collection[str] | None) -> bool:
        """The host side of `could_ever_fit`: a node that could hold the job's GPUs there also
        has the CPUs and memory of its part once empty (for a job larger than a node: the
        nodes of the model together have them)."""
        # Nodes as (GPUs of the model, CPUs, memory) kinds with their counts: a cluster has few
        # kinds, so this is O(kinds) per shape, not O(nodes) (a cycle asks it for every shape).
        kinds = self._host_kinds(model) if allowed is None else self._kinds_of(model, allowed)
        if job.fractional:
            return any(c + EPS >= job.cpus and m >= job.mem_mb for (_, c, m), _ in kinds)
        n = int(job.gpus)
        if job.nodes:
            per = n // job.nodes
            cpus, mem = self.host_part(job, per)
            return sum(k for (g, c, m), k in kinds if g >= per and c + EPS >= cpus and m >= mem) >= job.nodes
        if n <= self.node_size[model]:
            cpus, mem = self.host_part(job, n)
            return any(g >= n and c + EPS >= cpus and m >= mem for (g, c, m), _ in kinds)
        total_cpus = sum(c * k for (_, c, _), k in kinds)
        total_mem = sum(m * k for (_, _, m), k in kinds)
        return total_cpus + EPS >= job.cpus and total_mem >= job.mem_mb

    def _host_kinds(self, model: str) -> list[tuple[tuple[int, float, float], int]]:
        """`_kinds_of` every node of `model`, kept (the inventory never changes)."""
        got = self._kinds.get(model)
        if got is None:
            got = self._kinds[model] = self._kinds_of(model, None)
        return got

    def _kinds_of(self, model: str, allowed: Collection[str] | None) -> list[tuple[tuple[int, float, float], int]]:
        """The nodes of `model` (of `allowed` only, when given) counted by (GPUs of the model,
        CPUs, host memory MiB); a resource a node does not account counts as unlimited."""
        inf = float("inf")
        counts: dict[tuple[int, float, float], int] = {}
        for nd in self._model_nodes[model]:
            if allowed is not None and nd not in allowed:
                continue
            key = (self.node_model_count[(nd, model)], self.node_cpus.get(nd, inf), float(self.node_hmem.get(nd, inf)))
            counts[key] = counts.get(key, 0) + 1
        return list(counts.items())

    def _gpus_could_ever_fit(self, job: JobRequest, model: str, allowed: Collection[str] | None) -> bool:
        if allowed is not None:
            counts = [c for nd in allowed if (c := self.node_model_count.get((nd, model), 0))]
            if not counts:
                return False
            if job.fractional:
                return True
            n = int(job.gpus)
            if job.nodes:
                return sum(1 for c in counts if c >= n // job.nodes) >= job.nodes
            return n <= sum(counts)
        if job.fractional:
            return True
        n = int(job.gpus)
        if job.nodes:
            per = n // job.nodes
            return (
                sum(1 for node in self.node_models if self.node_model_count.get((node, model), 0) >= per) >= job.nodes
            )
        return n <= self.total[model]

    # ---- node selection ---------------------------------------------------------------------

    def allowed(self, selection: Selection) -> frozenset[str]:
        """The nodes `selection`'s list, exclusions and constraint allow (idle or not)."""
        got = self._allowed.get(selection)
        if got is None:
            got = self._allowed[selection] = frozenset(
                name for name, labels in self.node_labels.items() if selection.allows(name, labels)
            )
        return got

    def model_nodes(self, model: str) -> list[str]:
        """The nodes with GPUs of `model`, by name."""
        return self._model_nodes[model]

    def idle(self, node: str) -> bool:
        """Whether no job holds any GPU (or share of one) of `node`: where an exclusive job may start."""
        used = self.used_share
        return all(used.get((node, i), 0.0) <= EPS for i in self.node_gpus.get(node, ()))

    def held(self, allocation: Allocation, exclusive: bool) -> Allocation:
        """What a job holds of the capacity: its allocation, and for an exclusive job every
        other GPU of its nodes too. Why taken as used and not only skipped by placement: every
        count the scheduler keeps (free per model, buckets, `fits`, the settle and room checks)
        then stays true for all other jobs without a test of its own on their fast path."""
        if not exclusive:
            return allocation
        mine = allocation.gpu_keys()
        extra = []
        for node in dict.fromkeys(s.node for s in allocation.slices):
            rest = tuple(i for i in self.node_gpus.get(node, ()) if (node, i) not in mine)
            if rest:
                extra.append(NodeSlice(node, rest))
        return Allocation(allocation.slices + tuple(extra)) if extra else allocation

    # ---- host resources (CPU cores, host memory) ----------------------------------------------

    @staticmethod
    def host_part(job: JobRequest, gpus_here: float) -> tuple[float, int]:
        """The CPUs and host memory (MiB) of `job` on a node where it holds `gpus_here` of its
        GPUs: its request times that node's share of them (rounded up for memory, so the parts
        never hold less than asked)."""
        if job.fractional or job.gpus <= gpus_here:
            return job.cpus, job.mem_mb
        ratio = gpus_here / job.gpus
        return round(job.cpus * ratio, SHARE_DIGITS), -(-job.mem_mb * int(gpus_here) // int(job.gpus))

    def host_fits(self, node: str, cpus: float, mem: int) -> bool:
        """Whether `node` has `cpus` cores and `mem` MiB of host memory left."""
        return self._host_room(node, cpus, mem, empty=False)

    def _host_room(self, node: str, cpus: float, mem: int, empty: bool) -> bool:
        if cpus:
            have = self.node_cpus.get(node)
            if have is not None and (0.0 if empty else self.used_cpus.get(node, 0.0)) + cpus > have + EPS:
                return False
        if mem:
            total = self.node_hmem.get(node)
            if total is not None and (0 if empty else self.used_hmem.get(node, 0)) + mem > total:
                return False
        return True

    def free_host(self, node: str) -> tuple[float | None, int | None]:
        """CPUs and host memory (MiB) left on `node`; None where it does not account them."""
        cpus = self.node_cpus.get(node)
        mem = self.node_hmem.get(node)
        return (
            None if cpus is None else round(cpus - self.used_cpus.get(node, 0.0), 6),
            None if mem is None else mem - self.used_hmem.get(node, 0),
        )

    def _host_add(self, node: str, cpus: float, mem: int) -> None:
        """Count `cpus` and `mem` (negative: give back) as held on `node`; a journaling fork
        notes what its lender's dicts held first."""
        journal = self._journal
        if cpus:
            used = self.used_cpus
            if journal is not None:
                journal.append((used, node, used.get(node, _MISSING)))
            now = round(used.get(node, 0.0) + cpus, SHARE_DIGITS)
            if now <= EPS:
                used.pop(node, None)
            else:
                used[node] = now
        if mem:
            hmem = self.used_hmem
            if journal is not None:
                journal.append((hmem, node, hmem.get(node, _MISSING)))
            left = hmem.get(node, 0) + mem
            if left <= 0:
                hmem.pop(node, None)
            else:
                hmem[node] = left

    def _with_host(self, job: JobRequest, allocation: Allocation) -> Allocation:
        """`allocation` with each slice carrying the job's part of its CPUs and memory."""
        if not job.host:
            return allocation
        out = []
        for s in allocation.slices:
            c, m = self.host_part(job, len(s.gpu_indices))
            out.append(NodeSlice(s.node, s.gpu_indices, s.share, s.memory_mb, c, m))
        return Allocation(tuple(out))

    # ---- CPU-only jobs (no GPU) ----------------------------------------------------------------

    def hosts_cpu_only(self, node: str, job: JobRequest) -> bool:
        """Whether `node` bounds a CPU-only job at all: it accounts at least one resource the
        job asks for. Why: a node that accounts neither (a trace node with GPUs only) would
        take any number of them, a placement no real node allows."""
        return (job.cpus > 0 and node in self.node_cpus) or (job.mem_mb > 0 and node in self.node_hmem)

    def could_host_only_ever_fit(self, job: JobRequest, allowed: Collection[str] | None = None) -> bool:
        """`could_ever_fit` for a CPU-only job: some node (of `allowed`) holds its CPUs and
        memory once empty. O(nodes), once per shape and cycle (`scheduler._models`)."""
        nodes = self.node_gpus if allowed is None else allowed
        return any(
            nd in self.node_gpus and self.hosts_cpu_only(nd, job) and self._host_room(nd, job.cpus, job.mem_mb, True)
            for nd in nodes
        )

    def place_host_only(self, job: JobRequest, exclude: Collection[str] = frozenset()) -> Allocation | None:
        """Where a CPU-only job goes now: a node not in `exclude` with its CPUs and memory left,
        nodes without GPUs first (so it leaves GPU nodes' CPUs to GPU jobs), then best fit (the
        fewest CPUs, then MiB, left after it), then inventory order. Its slice holds no GPU.

        O(nodes) per call: the scheduler calls it only for a request it has not seen fail in
        the cycle (free host room only shrinks within a cycle), so a queue of equal CPU-only
        jobs costs one scan per start, not per job."""
        cpus, mem = job.cpus, job.mem_mb
        best: tuple[bool, float, float] | None = None
        pick: str | None = None
        inf = float("inf")
        node_cpus, node_hmem, used_cpus, used_hmem = self.node_cpus, self.node_hmem, self.used_cpus, self.used_hmem
        for node, gpus in self.node_gpus.items():
            if node in exclude or not self.hosts_cpu_only(node, job) or not self._host_room(node, cpus, mem, False):
                continue
            have_c = node_cpus.get(node)
            have_m = node_hmem.get(node)
            key = (
                bool(gpus),
                inf if have_c is None else have_c - used_cpus.get(node, 0.0) - cpus,
                inf if have_m is None else float(have_m - used_hmem.get(node, 0) - mem),
            )
            if best is None or key < best:
                best, pick = key, node
        if pick is None:
            return None
        return Allocation((NodeSlice(pick, (), 1.0, None, cpus, mem),))

    def most_host(self) -> tuple[float, int]:
        """The most CPUs and the most host memory (MiB) any one node accounts (0: none does)."""
        return max(self.node_cpus.values(), default=0.0), max(self.node_hmem.values(), default=0)

    def cpu_only_no_fit(self, job: JobRequest, selected: bool = False) -> WaitFacts:
        """Why a CPU-only job fits no node even empty (`selected`: among the nodes its selection
        allows), as numbers: the scheduler's NO_FIT wait and the head's refusal at submit."""
        cpus, mem = self.most_host()
        return WaitFacts(
            variant="cpu_only",
            cpus=job.cpus,
            mem_mb=job.mem_mb,
            most_cpus=cpus,
            most_mem_mb=mem,
            selection="selected" if selected else None,
        )

    def host_only_short(self, job: JobRequest, exclude: Collection[str] = frozenset()) -> str:
        """Which resource a CPU-only job that fits nowhere now is short of: "cpus" when no
        node (outside `exclude`) has its CPUs left, else "mem"."""
        if job.cpus > 0 and not any(
            nd not in exclude and self.hosts_cpu_only(nd, job) and self._host_room(nd, job.cpus, 0, False)
            for nd in self.node_gpus
        ):
            return "cpus"
        return "mem"

    # ---- placement --------------------------------------------------------------------------

    def place(
        self,
        job: JobRequest,
        model: str,
        exclude: frozenset[str] = frozenset(),
        holders: Collection[str] = (),
        gpus_only: bool = False,
    ) -> Allocation | None:
        """Where the job goes on `model` now, or None. `holders`: nodes that have its container
        image, preferred between equally good nodes only (core/image_affinity.py): on one node
        (whole GPUs, or a fraction), never for a job over several nodes. `gpus_only`: as if it
        asked for no CPUs or memory (why a job that asks for them waits)."""
        if job.host and not gpus_only:
            got = self._place(job, model, exclude, holders, True)
            return None if got is None else self._with_host(job, got)
        return self._place(job, model, exclude, holders, False)

    def _place(
        self, job: JobRequest, model: str, exclude: frozenset[str], holders: Collection[str], host: bool
    ) -> Allocation | None:
        if job.fractional:
            return self._place_fraction(job, model, exclude, holders, host)
        n = int(job.gpus)
        if n > self.total_free[model]:
            return None
        if job.nodes:
            per = n // job.nodes
            return self._place_spread(model, per, job.nodes, exclude, self.host_part(job, per) if host else None)
        if n <= self.node_size[model]:
            node = self._best_fit_node(model, n, exclude, holders, self.host_part(job, n) if host else None)
            return None if node is None else Allocation((self._slice(model, node, n),))
        return self._place_fewest_nodes(model, n, exclude, job if host else None)

    def fits(self, job: JobRequest, model: str, gpus_only: bool = False) -> bool:
        """`place(job, model) is not None`, without building the allocation: for whole GPUs
        it only counts nodes in the free-count buckets (asked ~15,000 times a cycle at scale,
        each time some GPUs were taken since the last answer). `gpus_only`: as `place`'s."""
        host = job.host and not gpus_only
        if job.fractional:
            return self._place_fraction(job, model, frozenset(), (), host) is not None
        n = int(job.gpus)
        if n > self.total_free[model]:
            return False
        if host:  # a walk that skips nodes short of CPUs or memory: no count says it
            if not job.nodes and n <= self.node_size[model]:
                return self._best_fit_node(model, n, frozenset(), host=self.host_part(job, n)) is not None
            return self._place(job, model, frozenset(), (), True) is not None
        buckets = self._buckets[model]  # counts only: no order needed
        if job.nodes:
            per = n // job.nodes
            return sum(len(buckets[k]) for k in range(per, len(buckets))) >= job.nodes
        if n <= self.node_size[model]:
            return any(buckets[k] for k in range(n, len(buckets)))
        return True  # the fewest nodes: any `n` free GPUs will do, and `n` are free

    def _best_fit_node(
        self,
        model: str,
        n: int,
        exclude: frozenset[str],
        holders: Collection[str] = (),
        host: tuple[float, int] | None = None,
    ) -> str | None:
        """The node with the fewest free GPUs of `model`, at least `n`, not in `exclude` and
        (`host`: CPUs, MiB) with that much host room left; between equally good ones, one of
        `holders` (nodes with the job's image)."""
        buckets = self._buckets[model]
        lazy = self._lazy
        for k in range(n, len(buckets)):
            if lazy and (model, k) in lazy:
                self._settle(model, k)
            for node in buckets[k]:
                if node not in exclude and (host is None or self._host_room(node, host[0], host[1], False)):
                    # The best-fit level is found; between its nodes, one with the job's image.
                    if not holders:
                        return node
                    got = holder(buckets[k], holders, exclude)
                    ok = got is not None and (host is None or self._host_room(got, host[0], host[1], False))
                    return got if ok and got is not None else node
        return None

    def _place_spread(
        self, model: str, per: int, count: int, exclude: frozenset[str], host: tuple[float, int] | None = None
    ) -> Allocation | None:
        chosen: list[str] = []
        buckets = self._buckets[model]
        lazy = self._lazy
        for k in range(per, len(buckets)):
            if lazy and (model, k) in lazy:
                self._settle(model, k)
            for node in buckets[k]:
                if node not in exclude and (host is None or self._host_room(node, host[0], host[1], False)):
                    chosen.append(node)
                    if len(chosen) == count:
                        return Allocation(tuple(self._slice(model, nd, per) for nd in chosen))
        return None

    def _place_fewest_nodes(
        self, model: str, n: int, exclude: frozenset[str], job: JobRequest | None = None
    ) -> Allocation | None:
        """Whole nodes first (largest free first), then the best fit for the remainder. `job`:
        one asking for host resources, whose part each node must have left."""
        plan: list[tuple[str, int]] = []
        need = n
        buckets = self._buckets[model]
        lazy = self._lazy
        for k in range(len(buckets) - 1, 0, -1):
            if lazy and (model, k) in lazy:
                self._settle(model, k)
            for node in buckets[k]:
                if node in exclude:
                    continue
                if job is not None and not self.host_fits(node, *self.host_part(job, min(k, need))):
                    continue
                if need <= k:
                    # the smallest node that covers the rest, so the remainder packs tightly
                    host = self.host_part(job, need) if job is not None else None
                    last = self._best_fit_node(model, need, exclude | {nd for nd, _ in plan}, host=host)
                    plan.append((last if last is not None else node, need))
                    return Allocation(tuple(self._slice(model, nd, c) for nd, c in plan))
                plan.append((node, k))
                need -= k
        return None

    def _slice(self, model: str, node: str, n: int) -> NodeSlice:
        """n free GPUs on node, preferring a topology domain that holds them all (best fit)."""
        idxs = self.free[model][node]
        domains = self.domains.get(node)
        if domains is None:
            return NodeSlice(node, tuple(idxs[:n]))  # one domain (or none): any free GPUs
        by_domain: dict[str | None, list[int]] = {}
        for i in idxs:
            group = by_domain.get(domains[i])
            if group is None:
                by_domain[domains[i]] = [i]
            else:
                group.append(i)
        if len(by_domain) <= 1:
            return NodeSlice(node, tuple(idxs[:n]))
        fitting = [d for d in by_domain.values() if len(d) >= n]
        if fitting:
            return NodeSlice(node, tuple(min(fitting, key=len)[:n]))
        picked: list[int] = []
        for d in sorted(by_domain.values(), key=len, reverse=True):
            picked.extend(d[: n - len(picked)])
            if len(picked) == n:
                break
        return NodeSlice(node, tuple(sorted(picked)))

    def fraction(self, job: JobRequest, model: str) -> tuple[float, int]:
        mem = self.model_memory[model]
        if job.gpu_memory_mb is not None:
            share = max(job.gpus if job.gpus < 1 else 0.0, job.gpu_memory_mb / mem)
            return min(share, 1.0), job.gpu_memory_mb
        return job.gpus, int(job.gpus * mem)

    def _place_fraction(
        self,
        job: JobRequest,
        model: str,
        exclude: frozenset[str],
        holders: Collection[str] = (),
        with_host: bool = True,
    ) -> Allocation | None:
        share, mem = self.fraction(job, model)
        host = (job.cpus, job.mem_mb) if with_host and job.host else None
        # Best fit: the partly used GPU the share leaves least of, the first such in order; of
        # equally full ones, the first on a node with the job's image (core/image_affinity.py).
        # One comprehension over every partly used GPU, then min (which keeps the first of
        # equal ones, as a loop taking only a strictly better one did): with thousands of
        # shared GPUs this scan is most of a sharing workload's replay (issue 26), and a
        # comprehension runs it at a fraction of a loop's cost (bench/bench_sim_sharing.py).
        # A share that asks for CPUs or memory skips GPUs on nodes without them left.
        used_share, used_mem, gpus = self.used_share, self.used_mem, self.gpus
        fits = [
            (left, key)
            for key in self.partial[model]
            if (left := 1.0 - used_share[key] - share) >= -EPS
            and gpus[key].memory_mb - used_mem[key] - mem >= 0
            and key[0] not in exclude
            and (host is None or self._host_room(key[0], host[0], host[1], False))
        ]
        best = min(fits, key=_first) if fits else None
        if best is not None and holders and best[1][0] not in holders:
            best = next((f for f in fits if f[0] == best[0] and f[1][0] in holders), best)
        if best is not None:
            shared_node, idx = best[1]
            return Allocation((NodeSlice(shared_node, (idx,), share, mem),))
        fresh = self._best_fit_node(model, 1, exclude, holders, host)
        if fresh is None or self.gpus[(fresh, self.free[model][fresh][0])].memory_mb < mem:
            return None
        return Allocation((NodeSlice(fresh, (self.free[model][fresh][0],), share, mem),))

    # ---- bookkeeping ------------------------------------------------------------------------

    def take(self, allocation: Allocation) -> None:
        if self._lent is not None:
            self._reclaim()
        self.version += 1
        used_share, used_mem, journal = self.used_share, self.used_mem, self._journal
        for s in allocation.slices:
            if s.cpus or s.host_memory_mb:
                self._host_add(s.node, s.cpus, s.host_memory_mb)
            for i in s.gpu_indices:
                key = (s.node, i)
                g = self.gpus[key]
                was = used_share.get(key, 0.0)
                if journal is not None:  # the lender's dicts: note what they held
                    journal.append((used_share, key, used_share.get(key, _MISSING)))
                    journal.append((used_mem, key, used_mem.get(key, _MISSING)))
                now = used_share[key] = round(was + s.share, SHARE_DIGITS)
                used_mem[key] = used_mem.get(key, 0) + (s.memory_mb if s.memory_mb is not None else g.memory_mb)
                if was <= EPS:
                    self._move(g.model, s.node, remove=i)
                if now < 1 - EPS:
                    self.partial[g.model][key] = None
                else:
                    self.partial[g.model].pop(key, None)

    def occupy(self, allocation: Allocation) -> None:
        """`take` for a job already running: GPUs that left the inventory are skipped."""
        known = tuple(
            s if len(kept) == len(s.gpu_indices) else replace(s, gpu_indices=kept)
            for s in allocation.slices
            if (kept := tuple(i for i in s.gpu_indices if (s.node, i) in self.gpus))
            or (not s.gpu_indices and s.node in self.node_gpus)  # a CPU-only job's slice: its host part
        )
        self.take(Allocation(known))

    def release(self, allocation: Allocation) -> None:
        """Give back an allocation's GPUs (used to ask 'would it fit if these jobs stopped?')."""
        if self._lent is not None:
            self._reclaim()
        self.version += 1
        journal = self._journal
        for s in allocation.slices:
            if (s.cpus or s.host_memory_mb) and s.node in self.node_gpus:
                self._host_add(s.node, -s.cpus, -s.host_memory_mb)
            for i in s.gpu_indices:
                key = (s.node, i)
                if key not in self.gpus:
                    continue
                model = self.gpus[key].model
                if journal is not None:  # the lender's dicts: note what they held
                    journal.append((self.used_share, key, self.used_share.get(key, _MISSING)))
                    journal.append((self.used_mem, key, self.used_mem.get(key, _MISSING)))
                self.used_share[key] = round(self.used_share.get(key, 0.0) - s.share, SHARE_DIGITS)
                self.used_mem[key] = self.used_mem.get(key, 0) - (
                    s.memory_mb if s.memory_mb is not None else self.gpus[key].memory_mb
                )
                if self.used_share[key] <= EPS:
                    self.used_share[key] = 0.0
                    self.used_mem[key] = 0
                    self.partial[model].pop(key, None)
                    self._move(model, s.node, add=i)
                else:
                    self.partial[model][key] = None

    def _move(self, model: str, node: str, remove: int | None = None, add: int | None = None) -> None:
        """Move a node to the bucket of its new free count. A journaling fork (see `fork`)
        copies the lender's free list and the bucket it leaves before changing them, and notes
        the node it adds to a lender's bucket; an owner notes a bucket it adds a node to out of
        name order (`_unsorted`)."""
        self.version += 1
        free = self.free[model]
        journal = self._journal
        idxs = free.get(node)
        if idxs is None:
            if journal is not None:
                journal.append((free, node, _MISSING))
            idxs = free[node] = []
        owned = self._owned
        if owned is not None and (model, node) not in owned:
            if journal is not None:
                journal.append((free, node, idxs))
            idxs = free[node] = list(idxs)  # copy-on-write: the list is still the lender's
            owned.add((model, node))
        buckets = self._buckets[model]
        was = len(idxs)
        if remove is not None:
            idxs.remove(remove)
            self.total_free[model] -= 1
        if add is not None:
            idxs.append(add)
            idxs.sort()
            self.total_free[model] += 1
        k = len(idxs)
        if journal is None:
            del buckets[was][node]
            bucket = buckets[k]
            if bucket and next(reversed(bucket)) > node:
                self._unsorted.add((model, k))
            bucket[node] = None
            return
        # Bucket 0 (nodes with no free GPU) is not sorted first: no placement reads its order
        # (they look at buckets of at least one free GPU), and it is the largest bucket on a
        # busy cluster (sorting it was ~10% of a simulated cycle at 100,000 GPUs). The nodes put
        # into it are noted, so `buckets` can still show it in the order a fresh build gives.
        own = self._own_buckets
        assert own is not None
        if (model, was) not in own:
            if was:
                self._settle(model, was)
            journal.append((buckets, was, buckets[was]))
            buckets[was] = dict(buckets[was])  # the lender's original comes back on undo
            own.add((model, was))
        del buckets[was][node]
        if k == 0:
            assert self._zero_added is not None
            self._zero_added.setdefault(model, set()).add(node)
        if (model, k) not in own:
            if k:
                self._settle(model, k)
            journal.append((buckets[k], node, _MISSING))
        buckets[k][node] = None

    def model_of(self, allocation: Allocation) -> str:
        """The GPU model of an allocation's first GPU; "" for a CPU-only job's (no GPU)."""
        s = allocation.slices[0]
        return self.gpus[(s.node, s.gpu_indices[0])].model if s.gpu_indices else ""

    def free_count(self, model: str) -> int:
        return self.total_free[model]

    def free_histogram(self, model: str) -> list[int]:
        """How many nodes have k whole GPUs of `model` free, for each k (a new list)."""
        return [len(b) for b in self._buckets[model]]  # counts only: no order needed

    def nodes_with_free(self, model: str, n: int) -> list[str]:
        """The nodes with at least `n` whole GPUs of `model` free, in no particular order."""
        buckets = self._buckets[model]
        return [nd for k in range(n, len(buckets)) for nd in buckets[k]]

    def most_free_off(self, model: str, off: frozenset[str]) -> int:
        """The most whole GPUs of `model` free on one node outside `off` (from the fullest
        bucket down: O(1) when few nodes are off)."""
        if not off:
            return self.most_free_on_a_node(model)
        buckets = self._buckets[model]  # membership only: no order needed
        return next((k for k in range(len(buckets) - 1, 0, -1) if any(nd not in off for nd in buckets[k])), 0)

    def most_free_on_a_node(self, model: str) -> int:
        cached = self._most.get(model)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        buckets = self._buckets[model]  # emptiness only: no order needed
        most = next((k for k in range(len(buckets) - 1, -1, -1) if buckets[k]), 0)
        self._most[model] = (self.version, most)
        return most
