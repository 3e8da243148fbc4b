"""Where the head knows container images to be: the input of placement's image affinity.

Why learned from attempts and not asked of the nodes each cycle: listing a node's store is a
podman call (a second or more on a busy node, a remote call on Ray), while the head already sees
every container attempt end on the nodes it ran on. An attempt that ended without a pull failure
had its image on each of its nodes; the node's image cache (executors/image_cache.py) tells the
head when it removes one, and at start the local node's cache says what it kept. What is not
seen (an image removed by hand, a Ray node's store after its agent restarted) costs only a
preference that does not pay off: affinity is a tie-breaker between equally good nodes
(core/image_affinity.py), so a wrong entry never delays a job.

Kept in memory: after a head restart the local node's cache (its own file) seeds it again; Ray
nodes' entries are relearned from the next attempts. Members' rootless stores are per account,
so an entry says "pulled there by some job": for another account it is a tie-break that may not
pay off, never a cost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class ImageSightings:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the executor's pruning thread forgets; the loop reads
        self._nodes: dict[str, set[str]] = {}
        self._view: dict[str, frozenset[str]] | None = {}

    def seen(self, image: str, nodes: Iterable[str]) -> None:
        with self._lock:
            where = self._nodes.setdefault(image, set())
            before = len(where)
            where.update(nodes)
            if len(where) != before:
                self._view = None

    def forget(self, image: str, node: str | None = None) -> None:
        """`image` is gone from `node` (None: from every node, a local head's one)."""
        with self._lock:
            where = self._nodes.get(image)
            if where is None:
                return
            if node is None:
                where.clear()
            else:
                where.discard(node)
            if not where:
                del self._nodes[image]
            self._view = None

    def by_image(self) -> dict[str, frozenset[str]]:
        """Image -> the nodes that have it, for `Snapshot.images` (the same object while
        nothing changed, so a cycle pays nothing for it)."""
        with self._lock:
            if self._view is None:
                self._view = {i: frozenset(n) for i, n in self._nodes.items()}
            return self._view
