"""A fresh `Capacity(nodes, running)` equals a straightforward build, container by container
and in every order (dicts, free lists, buckets, shared GPUs), over seeded random inventories
and running jobs: several models and memory sizes per node, topology domains, labels, CPUs and
host memory, GPU indices out of order, nodes without GPUs, jobs on whole GPUs, on shares of
one (with memory grants), exclusive, holding CPUs and memory, on nodes or GPUs that left the
inventory, and two jobs on one GPU; and inventories that repeat a node name or a GPU index.

Why: the build takes fast paths (an inventory kept per set of nodes, whole GPUs held once at C
speed, free lists a node at a time) that must give exactly the capacity the straightforward
pass gave: a capacity index's forks and trials are checked against a fresh build, and a plan
can depend on any of these orders (best fit breaks ties in bucket order).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpucluster.core.inventory import inventory_of
from gpucluster.core.placement import EPS, SHARE_DIGITS, Capacity
from gpucluster.core.selection import Selection
from gpucluster.core.types import Allocation, Gpu, JobRequest, Node, NodeSlice, Priority, RunningJob

MODELS = [("H100", 81920), ("A100", 81920), ("A100", 40960), ("V100", 32768)]


def _reference(nodes: list[Node], running: list[RunningJob]) -> dict[str, Any]:
    """What `Capacity.__init__` built before its fast paths: one pass per node, per GPU and
    per running GPU, written for reading, not speed."""
    gpus: dict[tuple[str, int], Gpu] = {}
    model_memory: dict[str, int] = {}
    node_size: dict[str, int] = {}
    total: dict[str, int] = {}
    node_models: dict[str, list[str]] = {}
    node_model_count: dict[tuple[str, str], int] = {}
    domains: dict[str, dict[int, str | None]] = {}
    node_labels: dict[str, frozenset[str]] = {}
    node_gpus: dict[str, tuple[int, ...]] = {}
    node_cpus: dict[str, float] = {}
    node_hmem: dict[str, int] = {}
    for node in nodes:
        counts: dict[str, int] = {}
        if node.cpus is not None:
            node_cpus[node.name] = node.cpus
        if node.memory_mb is not None:
            node_hmem[node.name] = node.memory_mb
        node_labels[node.name] = node.labels
        node_gpus[node.name] = tuple(g.index for g in node.gpus)
        if len({g.domain for g in node.gpus}) > 1:
            domains[node.name] = {g.index: g.domain for g in node.gpus}
        for g in node.gpus:
            gpus[(node.name, g.index)] = g
            counts[g.model] = counts.get(g.model, 0) + 1
            mem = model_memory.get(g.model)
            model_memory[g.model] = g.memory_mb if mem is None else min(mem, g.memory_mb)
        node_models[node.name] = sorted(counts)
        for model, n in counts.items():
            node_model_count[(node.name, model)] = n
        for model, n in counts.items():
            node_size[model] = max(node_size.get(model, 0), n)
            total[model] = total.get(model, 0) + n
    used_share: dict[tuple[str, int], float] = {}
    used_mem: dict[tuple[str, int], int] = {}
    used_cpus: dict[str, float] = {}
    used_hmem: dict[str, int] = {}
    for job in running:
        for s in job.allocation.slices:
            if (s.cpus or s.host_memory_mb) and s.node in node_gpus:
                if s.cpus:
                    now = round(used_cpus.get(s.node, 0.0) + s.cpus, SHARE_DIGITS)
                    if now <= EPS:
                        used_cpus.pop(s.node, None)
                    else:
                        used_cpus[s.node] = now
                if s.host_memory_mb:
                    left = used_hmem.get(s.node, 0) + s.host_memory_mb
                    if left <= 0:
                        used_hmem.pop(s.node, None)
                    else:
                        used_hmem[s.node] = left
        slices = list(job.allocation.slices)
        if job.exclusive:  # every other GPU of its nodes too
            mine = job.allocation.gpu_keys()
            for name in dict.fromkeys(s.node for s in job.allocation.slices):
                rest = tuple(i for i in node_gpus.get(name, ()) if (name, i) not in mine)
                if rest:
                    slices.append(NodeSlice(name, rest))
        for s in slices:
            for i in s.gpu_indices:
                key = (s.node, i)
                if key not in gpus:
                    continue
                used_share[key] = round(used_share.get(key, 0.0) + s.share, SHARE_DIGITS)
                used_mem[key] = used_mem.get(key, 0) + (s.memory_mb if s.memory_mb is not None else gpus[key].memory_mb)
    free: dict[str, dict[str, list[int]]] = {m: {} for m in model_memory}
    partial: dict[str, dict[tuple[str, int], None]] = {m: {} for m in model_memory}
    for (name, idx), g in gpus.items():
        used = used_share.get((name, idx), 0.0)
        if used <= EPS:
            free[g.model].setdefault(name, []).append(idx)
        elif used < 1 - EPS:
            partial[g.model][(name, idx)] = None
    model_nodes: dict[str, list[str]] = {m: [] for m in model_memory}
    for name in sorted(node_models):
        for model in node_models[name]:
            model_nodes[model].append(name)
    total_free = dict.fromkeys(model_memory, 0)
    buckets: dict[str, list[dict[str, None]]] = {m: [{} for _ in range(node_size[m] + 1)] for m in model_memory}
    for model, per_node in free.items():
        for name in model_nodes[model]:
            idxs = per_node.setdefault(name, [])
            idxs.sort()
            total_free[model] += len(idxs)
            buckets[model][len(idxs)][name] = None
    return {
        "gpus": gpus,
        "models_by_memory": sorted(model_memory, key=lambda m: (model_memory[m], m)),
        "model_memory": model_memory,
        "node_size": node_size,
        "total": total,
        "node_models": node_models,
        "node_model_count": node_model_count,
        "domains": domains,
        "node_labels": node_labels,
        "node_gpus": node_gpus,
        "node_cpus": node_cpus,
        "node_hmem": node_hmem,
        "_model_nodes": model_nodes,
        "used_share": used_share,
        "used_mem": used_mem,
        "used_cpus": used_cpus,
        "used_hmem": used_hmem,
        "free": free,
        "_buckets": buckets,
        "total_free": total_free,
        "partial": partial,
        "version": 0,
        "_most": {},
        "_unsorted": set(),
    }


def _ordered(x: object) -> object:
    """`x` with every dict as its list of items, so that == compares orders too; values are
    compared with their types (1 and 1.0 differ)."""
    if isinstance(x, dict):
        return [(k, _ordered(v)) for k, v in x.items()]
    if isinstance(x, list):
        return [_ordered(v) for v in x]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return (type(x).__name__, x)
    return x


def _same(cap: Capacity, ref: dict[str, Any]) -> None:
    for field, want in ref.items():
        assert _ordered(getattr(cap, field)) == _ordered(want), field


def _inventory(rng: random.Random, odd: bool) -> list[Node]:
    nodes = []
    names = [f"n{i:02d}" for i in range(rng.randrange(1, 14))]
    rng.shuffle(names)  # inventory order is not name order
    for name in names:
        count = rng.choice([0, 1, 2, 4, 8, 8, 8])
        indices = list(range(count))
        if rng.random() < 0.2:
            rng.shuffle(indices)
        kinds = rng.sample(MODELS, rng.choice([1, 1, 2]))
        gpus = []
        for i in indices:
            model, mem = kinds[i % len(kinds)] if rng.random() < 0.5 else kinds[0]
            mem = mem if rng.random() < 0.8 else mem // 2  # a model's smallest not always on the first GPU
            domain = rng.choice([None, f"d{i // 4}"]) if rng.random() < 0.5 else None
            gpus.append(Gpu(i, model, mem, f"G-{name}-{i}", domain))
        if odd and gpus and rng.random() < 0.2:  # a GPU index twice on the node
            gpus.append(Gpu(gpus[0].index, gpus[0].model, gpus[0].memory_mb, "dup", None))
        labels = frozenset(rng.sample(["ib", "rack=r1", "rack=r2"], rng.randrange(0, 3)))
        cpus = rng.choice([None, 32.0, 96.0])
        memory = rng.choice([None, 256 * 1024])
        nodes.append(Node(name, tuple(gpus), labels, cpus, memory))
    if odd and rng.random() < 0.5:  # a node name twice: its GPUs again, or others
        twin = rng.choice(nodes)
        base = rng.choice([0, 100])
        nodes.append(Node(twin.name, tuple(Gpu(base + g.index, "V100", 32768, "t", None) for g in twin.gpus[:2])))
    return nodes


def _running(rng: random.Random, nodes: list[Node], odd: bool) -> list[RunningJob]:
    free = {(n.name, g.index) for n in nodes for g in n.gpus}
    asks = rng.choice([(True, True), (True, False), (False, True)])  # CPUs, host memory: which jobs ask
    jobs = []
    for job_id in range(1, rng.randrange(2, 40)):
        slices = []
        for _ in range(rng.choice([1, 1, 1, 2])):
            name = rng.choice(nodes).name if not odd or rng.random() < 0.9 else "gone"
            mine = [k[1] for k in sorted(free) if k[0] == name]
            cpus, hmem = (rng.choice([0.0, 4.0, 1e-10]), rng.choice([0, 8192])) if rng.random() < 0.3 else (0.0, 0)
            cpus, hmem = cpus if asks[0] else 0.0, hmem if asks[1] else 0
            if odd and rng.random() < 0.3:  # a share of one GPU (maybe one another job holds)
                idx = rng.choice([*mine, 0, 99])
                share = rng.choice([0.25, 0.5, 0.1, 1 / 3, 1.0])
                slices.append(NodeSlice(name, (idx,), share, rng.choice([None, 20480]), cpus, hmem))
                continue
            if not mine:
                if rng.random() < 0.3:
                    slices.append(NodeSlice(name, (), 1.0, None, 2.0 * asks[0], 1024 * asks[1]))  # a CPU-only slice
                continue
            took = rng.sample(mine, rng.randrange(1, len(mine) + 1))
            if odd and rng.random() < 0.1:
                took.append(99)  # a GPU the node no longer has
            free.difference_update((name, i) for i in took)
            grant = 20480 if odd and rng.random() < 0.1 else None  # memory granted of whole GPUs
            slices.append(NodeSlice(name, tuple(took), 1.0, grant, cpus, hmem))
        if slices:
            exclusive = rng.random() < 0.1
            jobs.append(RunningJob(job_id, Allocation(tuple(slices)), "a", Priority(1), 0.0, None, exclusive=exclusive))
    return jobs


def _case(seed: int) -> tuple[list[Node], list[RunningJob]]:
    """Seed by seed: an inventory with or without repeats (odd seeds), running jobs on whole
    GPUs held once, or anything (shares, grants, gone nodes: seeds 2 and 3 mod 4)."""
    rng = random.Random(seed)
    nodes = _inventory(rng, seed % 2 == 1)
    return nodes, _running(rng, nodes, seed % 4 >= 2)


def _whole(jobs: list[RunningJob], grants: bool) -> list[RunningJob]:
    """The jobs on whole GPUs only (with memory grants or without)."""
    return [j for j in jobs if all(s.share == 1.0 and (grants or s.memory_mb is None) for s in j.allocation.slices)]


@pytest.mark.parametrize("seed", range(80))
def test_a_fresh_build_equals_the_straightforward_one(seed: int) -> None:
    nodes, running = _case(seed)
    for jobs in (running, _whole(running, False), _whole(running, True), []):
        try:
            ref = _reference(nodes, jobs)
        except IndexError:  # a node name twice with more free GPUs than its largest node's
            with pytest.raises(IndexError):
                Capacity(nodes, jobs)
            continue
        _same(Capacity(nodes, jobs), ref)
        _same(Capacity(tuple(nodes), jobs), ref)  # a kept inventory: the same objects


def test_the_seeds_reach_every_path() -> None:
    """The seeds above reach the paths they are meant to: plain inventories (free lists a node
    at a time) with and without shares, others (a node name or GPU twice), running jobs whose
    GPUs are all whole and held once (the C-speed used shares), and others."""
    paths: dict[tuple[bool, bool], int] = {}
    for seed in range(80):
        nodes, running = _case(seed)
        keys = [(s.node, i) for j in running for s in j.allocation.slices for i in s.gpu_indices]
        whole = len(_whole(running, False)) == len(running) and len(set(keys)) == len(keys)
        path = (inventory_of(nodes).plain, whole)
        paths[path] = paths.get(path, 0) + 1
    assert len(paths) == 4 and min(paths.values()) >= 8, paths


def test_an_inventory_is_kept_per_set_of_node_objects_and_never_written() -> None:
    """The same `Node` objects (in a tuple or a list) share one inventory; equal but other
    objects get their own. What one capacity takes, or asks through the inventory's caches,
    leaves a capacity of the same nodes as a fresh build makes it."""
    rng = random.Random(5)
    nodes = _inventory(rng, False)
    inv = inventory_of(tuple(nodes))
    assert inventory_of(list(nodes)) is inv
    copies = [Node(n.name, n.gpus, n.labels, n.cpus, n.memory_mb) for n in nodes]
    assert inventory_of(copies) is not inv
    running = _running(rng, nodes, False)
    a, b = Capacity(nodes, running), Capacity(nodes, running)
    assert a.gpus is b.gpus and a._allowed is b._allowed
    for model in a.model_memory:
        for name in list(a.free[model]):
            for i in list(a.free[model][name]):
                a.take(Allocation((NodeSlice(name, (i,)),)))
    a.allowed(Selection(constraint=(("ib",),)))
    a.could_ever_fit(JobRequest(1, 2.0, cpus=4.0, mem_mb=1024), next(iter(a.model_memory)))
    _same(b, _reference(nodes, running))
    _same(Capacity(nodes, running), _reference(nodes, running))
