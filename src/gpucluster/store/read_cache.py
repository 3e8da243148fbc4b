"""A value read from the store and kept until a write says it is stale (`ReadCache`).

Why one piece: the node rows (`Store.nodes`) and the node drain states
(`TelemetryStore.node_states`) are each read once and kept between writes, and handed out as
the same object until then (the head's node feed compares by identity). Both had the same
race: a read that ran while another thread's write invalidated the cache could keep the value
from before that write, and plans went on without it until the next write. A generation
counter, bumped by each invalidation, keeps such a read from being cached. (The per-owner
account names of auth/control.py keep their own counter: that cache is keyed, and cleared
with the identities under their lock.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadCache(Generic[T]):
    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._value: T | None = None
        self._generation = 0  # bumped by each `forget`: a read that overlapped one is not kept
        self._lock = threading.Lock()

    def get(self) -> T:
        """The kept value, else a fresh read (kept unless a `forget` ran meanwhile)."""
        with self._lock:
            if self._value is not None:
                return self._value
            generation = self._generation
        value = self._read()  # outside the lock: a store read may take a while
        with self._lock:
            if self._generation == generation:
                self._value = value
        return value

    def forget(self) -> None:
        """Read again next time: this process wrote, or another may have."""
        with self._lock:
            self._value = None
            self._generation += 1
