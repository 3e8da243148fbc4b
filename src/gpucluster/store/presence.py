"""Which nodes are up: presence of nodes that join and leave while the head runs (Ray).

Why a table of its own: a node's GPUs (`nodes`) outlive its presence. A node that dies stays
listed, shown down, so `gpucluster nodes` says what happened to it, and comes back under the
same name when it rejoins. A node without a presence row (the local node of `gpucluster up`) is
always up. Only the head's inventory writes here (one head per store), so reads are cached.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import insert, select, update

from gpucluster.store import schema
from gpucluster.store.store import Store


@dataclass(frozen=True)
class Presence:
    name: str
    address: str  # where the node's processes are reached (MASTER_ADDR when it holds rank 0)
    incarnation: str  # the engine's id of this life of the node (a Ray node id)
    up: bool
    reason: str  # why it is down; "" when up
    since: float  # when it last changed between up and down


class PresenceStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cache: dict[str, Presence] | None = None

    def all(self) -> dict[str, Presence]:
        with self._lock:
            if self._cache is not None:
                return self._cache
        with self.store._read() as c:
            rows = c.execute(select(schema.node_presence)).mappings().all()
        cache = {
            r["name"]: Presence(r["name"], r["address"], r["incarnation"], bool(r["up"]), r["reason"], r["since"])
            for r in rows
        }
        with self._lock:
            self._cache = cache
        return cache

    def down(self) -> frozenset[str]:
        return frozenset(n for n, p in self.all().items() if not p.up)

    def set_up(self, name: str, address: str, incarnation: str, now: float) -> bool:
        """Record the node as up at `address`; False if it already was, as that incarnation."""
        current = self.all().get(name)
        if current is not None and current.up and (current.address, current.incarnation) == (address, incarnation):
            return False
        since = current.since if current is not None and current.up else now
        self._put(Presence(name, address, incarnation, True, "", since), exists=current is not None)
        return True

    def set_down(self, name: str, reason: str, now: float) -> bool:
        """Record the node as down; False if it already was (when and why are kept)."""
        current = self.all().get(name)
        if current is not None and not current.up:
            return False
        address, incarnation = (current.address, current.incarnation) if current is not None else ("", "")
        self._put(Presence(name, address, incarnation, False, reason, now), exists=current is not None)
        return True

    def _put(self, p: Presence, exists: bool) -> None:
        values = {
            "address": p.address,
            "incarnation": p.incarnation,
            "up": p.up,
            "reason": p.reason,
            "since": p.since,
        }
        t = schema.node_presence
        with self.store._write() as c:
            if exists:
                c.execute(update(t).where(t.c.name == p.name).values(**values))
            else:
                c.execute(insert(t).values(name=p.name, **values))
        with self._lock:
            self._cache = None
