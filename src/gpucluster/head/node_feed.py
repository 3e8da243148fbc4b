"""The head's nodes and drains, told to its cluster state as events, as the simulator tells them.

Why: `decide` plans on the ClusterState (core/cluster_state.py), which the simulator feeds with
NodeUp/NodeDown and Drained/Undrained as its failures, repairs and drain windows happen. The head
learns the same facts from three places: the store's node rows (`gpucluster up` registers them,
the Ray inventory adds and refreshes them), the drain states (a user's `drain`, a health drain,
a drain whose planned end came) and the inventory's down nodes. This feed compares what those
say with what it told last and tells only the difference, once per cycle on the loop's thread,
so the snapshot reads nodes and drains from the state, as the simulator's does.

A node gone from the Ray inventory is told as Drained("down: ..."), not NodeDown: its jobs stay
running in the store until their stop completes (head/inventory.py), and a NodeDown would take
from capacity the GPUs they still hold. A node whose row is removed is a NodeDown.

The sources are caches, invalidated by the head's own writes. Another process's write (a second
head or API process on the same database) tells nobody: when `Store.others_wrote_token` moves
(head/full_reads.py), the node and drain caches are forgotten and read again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpucluster.core.cluster_state import ClusterState
from gpucluster.core.events import Drained, NodeDown, NodeUp, Undrained
from gpucluster.core.types import Drain, Node
from gpucluster.head.full_reads import FullReads
from gpucluster.store import Store
from gpucluster.store.telemetry import TelemetryStore

DOWN = Drain("down: gone from the cluster's inventory")


def wanted_drains(drains: Mapping[str, Drain], down: frozenset[str]) -> dict[str, Drain]:
    """Every node that takes no new job and why: a recorded drain says more than 'down'."""
    return {**dict.fromkeys(down, DOWN), **drains}


class NodeFeed:
    def __init__(
        self,
        store: Store,
        telemetry: TelemetryStore,
        cluster: ClusterState,
        down: Callable[[], frozenset[str]],
    ) -> None:
        self._store = store
        self._telemetry = telemetry
        self._cluster = cluster
        self._down = down
        self._reads = FullReads(store)
        # The sources as of the last tell, by identity: the caches hand back the same objects
        # until a write invalidates them, so an unchanged cycle costs three comparisons.
        self._seen: tuple[object, object, frozenset[str]] | None = None
        self.nodes: tuple[Node, ...] = ()  # the state's nodes in name order: the snapshot's
        self.drained: frozenset[str] = frozenset()  # the state's drained nodes, as a snapshot holds them

    def refresh(self, now: float, recheck: bool = False) -> bool:
        """Tell the state what changed since the last call; True if anything did. `recheck`
        (check mode, after a difference): read the sources again now if another process wrote,
        not only when the periodic check is due."""
        if recheck and self._reads.others_wrote():
            self._reads.invalidate()  # due now
        if self._reads.due(now):
            self._store.forget_nodes()  # another process may have written: read them again
            self._telemetry.forget_states()
            self._reads.done(now)
        rows, states, down = self._store.nodes(), self._telemetry.node_states(), self._down()
        seen = self._seen
        if seen is not None and seen[0] is rows and seen[1] is states and seen[2] == down:
            return False
        self._seen = (rows, states, down)
        return self._tell_nodes({r.node.name: r.node for r in rows}) | self._tell_drains(
            wanted_drains(self._telemetry.drains(states), down)
        )

    def _tell_nodes(self, wanted: dict[str, Node]) -> bool:
        state = self._cluster
        gone = [n for n in state.nodes if n not in wanted]
        changed = [node for name, node in wanted.items() if state.nodes.get(name) != node]
        for name in gone:
            state.apply(NodeDown(name))
        for node in changed:
            state.apply(NodeUp(node))
        if not (gone or changed):
            return False
        self.nodes = tuple(state.nodes[n] for n in sorted(state.nodes))
        return True

    def _tell_drains(self, wanted: dict[str, Drain]) -> bool:
        state = self._cluster
        ended = [n for n in state.drained if n not in wanted]
        changed = [(n, d) for n, d in wanted.items() if n not in state.drained or state.drains.get(n) != d]
        for name in ended:
            state.apply(Undrained(name))
        for name, drain in changed:
            state.apply(Drained(name, drain))
        if not (ended or changed):
            return False
        self.drained = frozenset(state.drained)
        return True

    def fresh(self) -> tuple[list[Node], dict[str, Drain]]:
        """The nodes and drains read now from the store, past the caches, for check mode's
        fresh build: a write that did not invalidate a cache shows as a difference."""
        nodes = [r.node for r in self._store.read_nodes()]
        return nodes, wanted_drains(self._telemetry.drains(self._telemetry.read_states()), self._down())
