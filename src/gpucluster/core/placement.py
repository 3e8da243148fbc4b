"""Where a job fits: a working copy of free GPU capacity, indexed for fast best-fit placement.

Filters and scoring are separate: `acceptable_models` says which GPU models may host a job (type
list, minimum memory); the placement functions then score by packing. Whole-GPU jobs go to one
node when they fit on one (best fit: the node left with the fewest free GPUs, so whole nodes
stay free for large jobs), else to the fewest nodes. Inside a node, GPUs that share a topology
domain are preferred. Fractional jobs share a GPU already in fractional use before opening a
new one. Nodes are kept in buckets by their free-GPU count per model, so a placement costs
O(GPUs per node), not O(nodes): a cycle over 100,000 queued jobs on 10,000 nodes stays fast.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, RunningJob

EPS = 1e-9
# A shared GPU's used share is kept on a grid of 1e-9: summed in another order (a fresh build
# adds the running jobs' shares, a kept index adds and subtracts them as jobs come and go) the
# float would differ in its last bit (0.2 + 0.2 + 0.2 - 0.2 != 0.2 + 0.2), and a near tie
# between two shared GPUs would be placed differently by the two.
SHARE_DIGITS = 9


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


class Capacity:
    """Free capacity for one scheduling cycle; `take` updates it as the plan grows."""

    def __init__(self, nodes: Iterable[Node], running: Iterable[RunningJob]) -> None:
        self.gpus: dict[tuple[str, int], Gpu] = {}
        self.models_by_memory: list[str] = []
        self.model_memory: dict[str, int] = {}
        self.node_size: dict[str, int] = {}  # model -> GPUs of that model on its largest node
        self.total: dict[str, int] = {}
        self.node_models: dict[str, list[str]] = {}
        self.node_model_count: dict[tuple[str, str], int] = {}
        # GPU index -> topology domain, for nodes with more than one domain (the others need no
        # choosing): `_slice` runs once per start and looked each GPU up by (node, index).
        self.domains: dict[str, dict[int, str | None]] = {}
        for node in nodes:
            counts: dict[str, int] = {}
            if len({g.domain for g in node.gpus}) > 1:
                self.domains[node.name] = {g.index: g.domain for g in node.gpus}
            for g in node.gpus:
                self.gpus[(node.name, g.index)] = g
                counts[g.model] = counts.get(g.model, 0) + 1
                mem = self.model_memory.get(g.model)
                self.model_memory[g.model] = g.memory_mb if mem is None else min(mem, g.memory_mb)
            self.node_models[node.name] = sorted(counts)
            for model, n in counts.items():
                self.node_model_count[(node.name, model)] = n
            for model, n in counts.items():
                self.node_size[model] = max(self.node_size.get(model, 0), n)
                self.total[model] = self.total.get(model, 0) + n
        self.models_by_memory = sorted(self.model_memory, key=lambda m: (self.model_memory[m], m))
        self.version = 0  # bumped whenever free GPUs change, for caches of derived facts
        self._most: dict[str, tuple[int, int]] = {}

        self.used_share: dict[tuple[str, int], float] = {}
        self.used_mem: dict[tuple[str, int], int] = {}
        for job in running:
            for s in job.allocation.slices:
                for i in s.gpu_indices:
                    key = (s.node, i)
                    if key not in self.gpus:
                        continue  # a node or GPU that left the inventory
                    self.used_share[key] = round(self.used_share.get(key, 0.0) + s.share, SHARE_DIGITS)
                    mem = s.memory_mb if s.memory_mb is not None else self.gpus[key].memory_mb
                    self.used_mem[key] = self.used_mem.get(key, 0) + mem

        # Whole-free GPUs per model per node, and nodes bucketed by that count.
        self.free: dict[str, dict[str, list[int]]] = {m: {} for m in self.model_memory}
        self.buckets: dict[str, list[dict[str, None]]] = {
            m: [{} for _ in range(self.node_size[m] + 1)] for m in self.model_memory
        }
        self.total_free: dict[str, int] = dict.fromkeys(self.model_memory, 0)
        self.partial: dict[str, dict[tuple[str, int], None]] = {m: {} for m in self.model_memory}
        for (name, idx), g in self.gpus.items():
            used = self.used_share.get((name, idx), 0.0)
            if used <= EPS:
                self.free[g.model].setdefault(name, []).append(idx)
            elif used < 1 - EPS:
                self.partial[g.model][(name, idx)] = None
        self._model_nodes: dict[str, list[str]] = {m: [] for m in self.model_memory}  # by name
        for name in sorted(self.node_models):
            for model in self.node_models[name]:
                self._model_nodes[model].append(name)
        self._gpu_pos: dict[tuple[str, int], int] | None = None  # inventory order, for `fork`
        # Copy-on-write of the free lists: None when this object owns every list in `free`;
        # in a fork, the (model, node) lists it has copied so far (the rest are its base's).
        self._owned: set[tuple[str, str]] | None = None
        # Buckets a node was added to since they were last in canonical (name) order: a node
        # moved in goes last, which `fork` puts right in the base before copying.
        self._unsorted: set[tuple[str, int]] = set()
        for model, per_node in self.free.items():
            for name in self._model_nodes[model]:
                idxs = per_node.setdefault(name, [])
                idxs.sort()
                self.total_free[model] += len(idxs)
        self._fill_buckets()

    def _fill_buckets(self) -> None:
        """Nodes into buckets by free count, in name order: the order best fit breaks ties in,
        the same however the free counts were reached."""
        for model, names in self._model_nodes.items():
            buckets = self.buckets[model]
            free = self.free[model]
            for name in names:
                buckets[len(free[name])][name] = None

    def fork(self) -> Capacity:
        """A working copy for one cycle, exactly as `Capacity(nodes, running)` would build it
        for the running jobs this one holds: the inventory is shared (it is never changed),
        the free state is copied, and bucket and shared-GPU order are put back into the
        canonical order, so a plan never depends on the order jobs came and went in."""
        c = Capacity.__new__(Capacity)
        c.gpus = self.gpus
        c.models_by_memory = self.models_by_memory
        c.model_memory = self.model_memory
        c.node_size = self.node_size
        c.total = self.total
        c.node_models = self.node_models
        c.node_model_count = self.node_model_count
        c.domains = self.domains
        c._model_nodes = self._model_nodes
        c._gpu_pos = None
        c.version = 0
        c._most = {}
        c.used_share = dict(self.used_share)
        c.used_mem = dict(self.used_mem)
        # Round 4: copies at C speed, no loop over nodes. Why: at 100,000 GPUs (12,500 nodes)
        # refilling the buckets node by node and copying every free list was ~8 ms a cycle,
        # almost all of a cycle when a few jobs wait. The free lists are shared with this
        # object until the fork changes one (`_move` copies it first); this object may change
        # its own lists again only once the fork is done with (the index forks once a cycle).
        # The buckets are copied whole, after the ones a node was added to are put back into
        # name order, the order `_fill_buckets` gives (a nearly sorted sort: O(nodes), in C).
        for model, k in self._unsorted:
            bucket = self.buckets[model]
            bucket[k] = dict.fromkeys(sorted(bucket[k]))
        self._unsorted.clear()
        if self._owned is not None:
            self._owned = set()  # a fork forked: its lists are now shared as well
        c._owned = set()
        c._unsorted = set()
        c.free = {m: dict(per) for m, per in self.free.items()}
        c.buckets = {m: [dict(b) for b in per] for m, per in self.buckets.items()}
        c.total_free = dict(self.total_free)
        c.partial = {}
        for m, keys in self.partial.items():
            if len(keys) > 1:
                if self._gpu_pos is None:
                    self._gpu_pos = {key: i for i, key in enumerate(self.gpus)}
                keys = dict.fromkeys(sorted(keys, key=self._gpu_pos.__getitem__))
            c.partial[m] = dict(keys)
        return c

    # ---- filters ----------------------------------------------------------------------------

    def acceptable_models(self, job: JobRequest) -> list[str]:
        """GPU models that may host the job, best first: its stated preference, else smallest memory."""
        return acceptable_models(job, self.model_memory, self.models_by_memory)

    def could_ever_fit(self, job: JobRequest, model: str) -> bool:
        if job.fractional:
            return True
        n = int(job.gpus)
        if job.nodes:
            per = n // job.nodes
            return (
                sum(1 for node in self.node_models if self.node_model_count.get((node, model), 0) >= per) >= job.nodes
            )
        return n <= self.total[model]

    # ---- placement --------------------------------------------------------------------------

    def place(self, job: JobRequest, model: str, exclude: frozenset[str] = frozenset()) -> Allocation | None:
        if job.fractional:
            return self._place_fraction(job, model, exclude)
        n = int(job.gpus)
        if n > self.total_free[model]:
            return None
        if job.nodes:
            return self._place_spread(model, n // job.nodes, job.nodes, exclude)
        if n <= self.node_size[model]:
            node = self._best_fit_node(model, n, exclude)
            return None if node is None else Allocation((self._slice(model, node, n),))
        return self._place_fewest_nodes(model, n, exclude)

    def fits(self, job: JobRequest, model: str) -> bool:
        """`place(job, model) is not None`, without building the allocation: for whole GPUs
        it only counts nodes in the free-count buckets (asked ~15,000 times a cycle at scale,
        each time some GPUs were taken since the last answer)."""
        if job.fractional:
            return self._place_fraction(job, model, frozenset()) is not None
        n = int(job.gpus)
        if n > self.total_free[model]:
            return False
        buckets = self.buckets[model]
        if job.nodes:
            per = n // job.nodes
            return sum(len(buckets[k]) for k in range(per, len(buckets))) >= job.nodes
        if n <= self.node_size[model]:
            return any(buckets[k] for k in range(n, len(buckets)))
        return True  # the fewest nodes: any `n` free GPUs will do, and `n` are free

    def _best_fit_node(self, model: str, n: int, exclude: frozenset[str]) -> str | None:
        buckets = self.buckets[model]
        for k in range(n, len(buckets)):
            for node in buckets[k]:
                if node not in exclude:
                    return node
        return None

    def _place_spread(self, model: str, per: int, count: int, exclude: frozenset[str]) -> Allocation | None:
        chosen: list[str] = []
        buckets = self.buckets[model]
        for k in range(per, len(buckets)):
            for node in buckets[k]:
                if node not in exclude:
                    chosen.append(node)
                    if len(chosen) == count:
                        return Allocation(tuple(self._slice(model, nd, per) for nd in chosen))
        return None

    def _place_fewest_nodes(self, model: str, n: int, exclude: frozenset[str]) -> Allocation | None:
        """Whole nodes first (largest free first), then the best fit for the remainder."""
        plan: list[tuple[str, int]] = []
        need = n
        buckets = self.buckets[model]
        for k in range(len(buckets) - 1, 0, -1):
            for node in buckets[k]:
                if node in exclude:
                    continue
                if need <= k:
                    # the smallest node that covers the rest, so the remainder packs tightly
                    last = self._best_fit_node(model, need, exclude | {nd for nd, _ in plan})
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

    def _fraction(self, job: JobRequest, model: str) -> tuple[float, int]:
        mem = self.model_memory[model]
        if job.gpu_memory_mb is not None:
            share = max(job.gpus if job.gpus < 1 else 0.0, job.gpu_memory_mb / mem)
            return min(share, 1.0), job.gpu_memory_mb
        return job.gpus, int(job.gpus * mem)

    def _place_fraction(self, job: JobRequest, model: str, exclude: frozenset[str]) -> Allocation | None:
        share, mem = self._fraction(job, model)
        best: tuple[float, tuple[str, int]] | None = None
        for key in self.partial[model]:
            if key[0] in exclude:
                continue
            left = 1.0 - self.used_share[key] - share
            mem_left = self.gpus[key].memory_mb - self.used_mem[key] - mem
            if left >= -EPS and mem_left >= 0 and (best is None or left < best[0]):
                best = (left, key)
        if best is not None:
            shared_node, idx = best[1]
            return Allocation((NodeSlice(shared_node, (idx,), share, mem),))
        fresh = self._best_fit_node(model, 1, exclude)
        if fresh is None or self.gpus[(fresh, self.free[model][fresh][0])].memory_mb < mem:
            return None
        return Allocation((NodeSlice(fresh, (self.free[model][fresh][0],), share, mem),))

    # ---- bookkeeping ------------------------------------------------------------------------

    def take(self, allocation: Allocation) -> None:
        used_share, used_mem = self.used_share, self.used_mem
        for s in allocation.slices:
            for i in s.gpu_indices:
                key = (s.node, i)
                g = self.gpus[key]
                was = used_share.get(key, 0.0)
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
            NodeSlice(s.node, kept, s.share, s.memory_mb)
            for s in allocation.slices
            if (kept := tuple(i for i in s.gpu_indices if (s.node, i) in self.gpus))
        )
        self.take(Allocation(known))

    def release(self, allocation: Allocation) -> None:
        """Give back an allocation's GPUs (used to ask 'would it fit if these jobs stopped?')."""
        for s in allocation.slices:
            for i in s.gpu_indices:
                key = (s.node, i)
                if key not in self.gpus:
                    continue
                model = self.gpus[key].model
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
        self.version += 1
        free = self.free[model]
        idxs = free.setdefault(node, [])
        owned = self._owned
        if owned is not None and (model, node) not in owned:
            idxs = free[node] = list(idxs)  # copy-on-write: the list is still the base's
            owned.add((model, node))
        del self.buckets[model][len(idxs)][node]
        if remove is not None:
            idxs.remove(remove)
            self.total_free[model] -= 1
        if add is not None:
            idxs.append(add)
            idxs.sort()
            self.total_free[model] += 1
        self.buckets[model][len(idxs)][node] = None
        self._unsorted.add((model, len(idxs)))

    def model_of(self, allocation: Allocation) -> str:
        s = allocation.slices[0]
        return self.gpus[(s.node, s.gpu_indices[0])].model

    def free_count(self, model: str) -> int:
        return self.total_free[model]

    def most_free_on_a_node(self, model: str) -> int:
        cached = self._most.get(model)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        buckets = self.buckets[model]
        most = next((k for k in range(len(buckets) - 1, -1, -1) if buckets[k]), 0)
        self._most[model] = (self.version, most)
        return most
