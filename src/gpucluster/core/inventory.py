"""What a `Capacity` knows of its nodes alone, built once per set of nodes and shared.

Why: a fresh `Capacity(nodes, running)` paid a Python pass over every GPU for facts that
depend only on the nodes (each GPU by (node, index), models and their memory, GPUs per model
per node, labels, topology domains, CPUs and host memory): ~0.06 CPU-s of its ~0.19 at 10,000
nodes x 8 GPUs, paid again by every dry run (`head/dry_run.py` plans without the loop's kept
index), every `certainly_idle` without an index, and every elastic resize. The nodes change
far more rarely than that: the head hands the same tuple, or a tuple of the same `Node`
objects (admission rebuilds it around drained nodes), cycle after cycle. So `inventory_of`
keeps the last few inventories and hands one back for nodes that are the same objects in the
same order; a `Node` is frozen, so the same objects always build the same inventory.

An inventory is never changed after its build, but for its two caches of derived facts (the
nodes a selection allows, the host kinds per model), which depend on the nodes alone: every
`Capacity` of the same inventory shares them, as a capacity's forks always did.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import is_

from gpucluster.core.selection import Selection
from gpucluster.core.types import Gpu, Node

KEPT = 4  # inventories kept: the loop's, a dry run's and admission's with drained nodes back


class Inventory:
    """The inventory part of a `Capacity` (see its attributes of the same names)."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self.gpus: dict[tuple[str, int], Gpu] = {}
        self.model_memory: dict[str, int] = {}
        self.node_size: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.node_models: dict[str, list[str]] = {}
        self.node_model_count: dict[tuple[str, str], int] = {}
        self.domains: dict[str, dict[int, str | None]] = {}
        self.node_labels: dict[str, frozenset[str]] = {}
        self.node_gpus: dict[str, tuple[int, ...]] = {}
        self.node_cpus: dict[str, float] = {}
        self.node_hmem: dict[str, int] = {}
        self.allowed: dict[Selection, frozenset[str]] = {}
        self.kinds: dict[str, list[tuple[tuple[int, float, float], int]]] = {}
        for node in nodes:
            name, gpus = node.name, node.gpus
            counts: dict[str, int] = {}
            if node.cpus is not None:
                self.node_cpus[name] = node.cpus
            if node.memory_mb is not None:
                self.node_hmem[name] = node.memory_mb
            self.node_labels[name] = node.labels
            self.node_gpus[name] = tuple(g.index for g in gpus)
            if len({g.domain for g in gpus}) > 1:
                self.domains[name] = {g.index: g.domain for g in gpus}
            for g in gpus:
                self.gpus[(name, g.index)] = g
                counts[g.model] = counts.get(g.model, 0) + 1
                mem = self.model_memory.get(g.model)
                self.model_memory[g.model] = g.memory_mb if mem is None else min(mem, g.memory_mb)
            self.node_models[name] = sorted(counts)
            for model, n in counts.items():
                self.node_model_count[(name, model)] = n
            for model, n in counts.items():
                self.node_size[model] = max(self.node_size.get(model, 0), n)
                self.total[model] = self.total.get(model, 0) + n
        self.models_by_memory = sorted(self.model_memory, key=lambda m: (self.model_memory[m], m))
        self.model_nodes: dict[str, list[str]] = {m: [] for m in self.model_memory}  # by name
        for name in sorted(self.node_models):
            for model in self.node_models[name]:
                self.model_nodes[model].append(name)
        self.memory = {key: g.memory_mb for key, g in self.gpus.items()}  # each GPU's own
        # No node name and no (node, index) repeats: the GPUs of `gpus` are then node by node, in
        # each node's order (what `Capacity` needs to build its free lists a node at a time).
        self.plain = len(self.node_labels) == len(nodes) and len(self.gpus) == sum(len(n.gpus) for n in nodes)


_kept: list[Inventory] = []  # newest first


def inventory_of(nodes: Iterable[Node]) -> Inventory:
    """The inventory of `nodes`: a kept one when `nodes` are the same `Node` objects in the same
    order as one of the `KEPT` last asked for (a check at C speed, O(nodes) pointer compares),
    else built. Safe from several threads: a list's reads and one-item writes are atomic."""
    seq = nodes if isinstance(nodes, tuple) else tuple(nodes)
    kept = list(_kept)
    for inv in kept:
        old = inv.nodes
        if old is seq or (len(old) == len(seq) and all(map(is_, old, seq))):
            if inv is not kept[0]:
                _kept[:] = [inv, *(k for k in kept if k is not inv)]
            return inv
    inv = Inventory(seq)
    _kept[:] = [inv, *kept[: KEPT - 1]]
    return inv
