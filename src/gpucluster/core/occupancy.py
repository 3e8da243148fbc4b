"""The GPUs the running jobs hold, as a fresh `Capacity` counts them: share and memory per GPU.

Why its own pass: `Capacity.__init__` walked every running job's slices and each GPU in them
in Python (a rounded sum and three dict look-ups per GPU: ~0.1 CPU-s at 10,000 nodes x 8 GPUs
and 60,000 running jobs, paid by every dry run). Nearly every running slice holds whole GPUs
that no other job holds, whose share is then 1.0 and whose memory the GPU's own: those are
built at C speed (`map`, `zip`, `dict.fromkeys`), and only the GPUs some slice shares, grants
memory of, or holds twice take the summing pass, over those GPUs alone and in running order,
so every value and every dict order is what the summing pass over all of them gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import chain, compress
from operator import attrgetter

from gpucluster.core.types import Allocation, NodeSlice, RunningJob

# A shared GPU's used share is kept on a grid of 1e-9: summed in another order (a fresh build
# adds the running jobs' shares, a kept index adds and subtracts them as jobs come and go) the
# float would differ in its last bit (0.2 + 0.2 + 0.2 - 0.2 != 0.2 + 0.2), and a near tie
# between two shared GPUs would be placed differently by the two.
SHARE_DIGITS = 9

_ALLOCATION = attrgetter("allocation")
_EXCLUSIVE = attrgetter("exclusive")
_SLICES = attrgetter("slices")
_PARTS = attrgetter("share", "memory_mb", "cpus", "host_memory_mb")
_PLAIN = (1.0, None, 0.0, 0)  # a slice of whole GPUs, no memory granted, no CPUs or host memory


def running_slices(running: Iterable[RunningJob], held: Callable[[Allocation, bool], Allocation]) -> list[NodeSlice]:
    """Every slice the running jobs hold, in running order: for an exclusive job, what `held`
    makes of its allocation (its nodes' other GPUs too)."""
    jobs = running if isinstance(running, (list, tuple)) else list(running)
    allocs: Iterable[Allocation] = map(_ALLOCATION, jobs)
    if any(map(_EXCLUSIVE, jobs)):
        allocs = [held(j.allocation, True) if j.exclusive else j.allocation for j in jobs]
    return list(chain.from_iterable(map(_SLICES, allocs)))


def kinds(slices: list[NodeSlice]) -> tuple[bool, bool]:
    """Whether every slice holds whole GPUs without a memory grant, and whether any holds
    CPUs or host memory: one pass that collects the slices' distinct (share, grant, CPUs,
    memory), a single one when every slice is plain (the common case)."""
    seen = set(map(_PARTS, slices))
    if not seen or seen == {_PLAIN}:
        return True, False
    whole = all(share == 1.0 and grant is None for share, grant, _, _ in seen)
    return whole, any(cpus or mem for _, _, cpus, mem in seen)


def used_by(
    slices: list[NodeSlice], memory: dict[tuple[str, int], int], whole: bool
) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], int]]:
    """The used share and memory of each GPU of `memory` (each GPU's own memory, by (node,
    index)) that `slices` hold, each dict in the order the slices first hold its GPUs (GPUs no
    longer in `memory` left out): a share is the slices' shares summed in order on the 1e-9
    grid, memory their grants (a GPU's own memory where a slice grants none) summed. `whole`:
    every slice holds whole GPUs without a memory grant (`kinds`)."""
    keys = [(s.node, i) for s in slices for i in s.gpu_indices]
    try:
        mem = dict(zip(keys, map(memory.__getitem__, keys), strict=True))
        owner: list[NodeSlice] | None = None
    except KeyError:  # a node or GPU that left the inventory
        known = list(map(memory.__contains__, keys))
        keys = list(compress(keys, known))
        owner = list(compress(_owners(slices), known))
        mem = dict(zip(keys, map(memory.__getitem__, keys), strict=True))
    share = dict.fromkeys(mem, 1.0)  # the keys of `keys` in the same order, their hashes reused
    if whole and len(share) == len(keys):
        return share, mem  # whole GPUs, each held once: the common case
    # The GPUs some slice holds a share of, grants memory of, or that two slices hold: summed
    # in running order as the pass over every GPU did (their places in the dicts stay those
    # of their first holder); the others keep the values above.
    if owner is None:
        owner = _owners(slices)
    odd = {k for k, n in Counter(keys).items() if n > 1} if len(share) != len(keys) else set()
    odd.update(k for k, s in zip(keys, owner, strict=True) if s.share != 1.0 or s.memory_mb is not None)
    for k in odd:
        share[k], mem[k] = 0.0, 0
    for k, s in zip(keys, owner, strict=True):
        if k in odd:
            share[k] = round(share[k] + s.share, SHARE_DIGITS)
            mem[k] += s.memory_mb if s.memory_mb is not None else memory[k]
    return share, mem


def _owners(slices: list[NodeSlice]) -> list[NodeSlice]:
    """The slice of each GPU `used_by` lists, in its order."""
    return [s for s in slices for _ in s.gpu_indices]
