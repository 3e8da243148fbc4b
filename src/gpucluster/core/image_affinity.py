"""Image affinity: among nodes equally good for a job, one that already has its container image.

Why only a tie-breaker, and only here: a job whose image is on its node starts without a pull
(seconds to minutes of held GPUs saved), but a scheduler that went out of its way for it would
trade packing, GPU types or topology for it, and could make this job or a later one wait. So the
rule never widens or narrows where a job may go: placement first finds the best-fit level it would
use anyway (the fewest free GPUs that fit, on the model and nodes the job may use, or the shared
GPU left fullest), and only between the nodes at that level does it take one holding the image
(the first by name), else the one it would have taken. The capacity it leaves is then the same up
to which equal node was taken, so no job waits for it.

Where images are is an input, not knowledge of the core: `Snapshot.images` (image -> the nodes
that have it), which the head learns from the attempts that ran there (head/images.py) and the
simulator leaves empty.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


def holder(candidates: Collection[str], holders: Iterable[str], exclude: Collection[str]) -> str | None:
    """The first (by name) of `holders` that is among `candidates` and not excluded, or None.

    Costs O(holders), not O(candidates): an image is on a few nodes, a best-fit bucket may hold
    thousands."""
    return min((n for n in holders if n in candidates and n not in exclude), default=None)
