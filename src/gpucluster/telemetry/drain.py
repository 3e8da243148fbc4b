"""A drained node in the scheduler's eyes: gone for new jobs, while its running jobs go on.

The scheduler places only on the snapshot's nodes, so a drained node is left out of it. Its
running jobs keep running (nothing signals them), but they are left out of the snapshot too, or
rather their slices on drained nodes are: the core must never consider a GPU it does not know
(preemption would look it up), and a job spanning a drained and a healthy node still holds its
GPUs on the healthy one. The price: preemption never picks a job for GPUs on a drained node,
which is what a drain means anyway (nothing new may go there).
"""

from __future__ import annotations

from gpucluster.core.admission import without_nodes
from gpucluster.core.snapshot import Snapshot


def schedulable(snap: Snapshot, drained: frozenset[str]) -> Snapshot:
    """`snap` without the drained nodes and without running jobs' slices on them (the core's
    admission rule, core/admission.py)."""
    return without_nodes(snap, drained)
