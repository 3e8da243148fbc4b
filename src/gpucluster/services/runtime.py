"""What the gateway and the reconciler share in memory: each service's endpoints and numbers.

The reconciler (a thread) writes the endpoints and their phases; the gateway (the API's event
loop) takes one per request and gives it back. One lock guards both sides; a request waiting for
a ready replica (a service scaled to zero) is woken on its own event loop when one appears.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpucluster.services.balancer import Endpoint, pick
from gpucluster.services.spec import ServiceStats

LATENCY_WINDOW = 4096  # the latest requests' latencies, for p50/p99
RATE_WINDOW_S = 10.0  # requests per second over this


@dataclass
class Access:
    """Who may call a service through the gateway: its team's members, or anyone if public."""

    team: str
    public: bool


@dataclass
class _Service:
    access: Access
    endpoints: dict[int, Endpoint] = field(default_factory=dict)
    waiting: int = 0  # requests held at the gateway for a ready replica
    requests: int = 0
    errors: int = 0
    done: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


class Runtimes:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._services: dict[str, _Service] = {}
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._turn = 0

    # ---- the reconciler's side ------------------------------------------------------------

    def set_service(self, name: str, access: Access, endpoints: list[tuple[int, str, str]]) -> None:
        """The service's replicas now: (replica id, base URL, phase); in-flight counts carry over."""
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                svc = self._services[name] = _Service(access)
            svc.access = access
            old = svc.endpoints
            svc.endpoints = {}
            for rid, url, phase in endpoints:
                e = old.get(rid)
                if e is None or e.url != url:
                    e = Endpoint(rid, url, phase)
                e.phase = phase
                svc.endpoints[rid] = e
            ready = any(e.phase == "ready" for e in svc.endpoints.values())
            waiters = list(self._waiters) if ready else []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def drop_service(self, name: str) -> None:
        """The service failed or was deleted: requests held for it are answered now, not at their timeout."""
        with self._lock:
            gone = self._services.pop(name, None)
            waiters = list(self._waiters) if gone is not None else []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def in_flight(self, name: str) -> tuple[int, dict[int, int]]:
        """All requests in flight or waiting for the service, and those of each replica."""
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return 0, {}
            per = {rid: e.in_flight for rid, e in svc.endpoints.items()}
            return svc.waiting + sum(per.values()), per

    def stats(self, name: str) -> ServiceStats:
        now = self.clock()
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return ServiceStats()
            done = list(svc.done)
            requests, errors = svc.requests, svc.errors
        recent = [at for at, _ in done if at >= now - RATE_WINDOW_S]
        latencies = sorted(lat for _, lat in done)
        return ServiceStats(
            requests=requests,
            errors=errors,
            requests_per_s=len(recent) / RATE_WINDOW_S,
            latency_p50_s=_quantile(latencies, 0.5),
            latency_p99_s=_quantile(latencies, 0.99),
        )

    def rate(self, name: str, window_s: float) -> float:
        """Requests answered per second over the last `window_s`."""
        now = self.clock()
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return 0.0
            count = 0
            for at, _ in reversed(svc.done):
                if at < now - window_s:
                    break
                count += 1
        return count / window_s

    def phase_of(self, name: str, replica_id: int) -> str | None:
        """The phase the gateway holds for a replica (it marks one `unready` on a failed connection)."""
        with self._lock:
            svc = self._services.get(name)
            e = svc.endpoints.get(replica_id) if svc is not None else None
            return e.phase if e is not None else None

    def names(self) -> list[str]:
        with self._lock:
            return list(self._services)

    # ---- the gateway's side -----------------------------------------------------------------

    def access(self, name: str) -> Access | None:
        with self._lock:
            svc = self._services.get(name)
            return svc.access if svc is not None else None

    def acquire(self, name: str, exclude: frozenset[int] = frozenset()) -> Endpoint | None:
        """The replica for the next request (its in-flight count taken), or None if none is ready."""
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return None
            self._turn += 1
            e = pick(list(svc.endpoints.values()), self._turn, exclude)
            if e is not None:
                e.in_flight += 1
            return e

    def release(self, name: str, e: Endpoint) -> None:
        with self._lock:
            e.in_flight -= 1

    def record(self, name: str, latency_s: float, ok: bool) -> None:
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return
            svc.requests += 1
            if not ok:
                svc.errors += 1
            svc.done.append((self.clock(), latency_s))

    def mark_unready(self, name: str, e: Endpoint) -> None:
        """The gateway could not reach it: no more traffic until its probe answers again."""
        with self._lock:
            if e.phase == "ready":
                e.phase = "unready"

    async def wait_ready(self, name: str, timeout_s: float) -> bool:
        """Hold a request until the service has a ready replica (or `timeout_s` passes); the
        request counts as in flight meanwhile, so the autoscaler starts one."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        key = (loop, event)
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                return False
            svc.waiting += 1
            self._waiters.add(key)
        deadline = loop.time() + timeout_s
        try:
            while True:
                with self._lock:
                    if self._services.get(name) is not svc:
                        return False  # failed or deleted meanwhile
                    if any(e.phase == "ready" for e in svc.endpoints.values()):
                        return True
                    event.clear()
                left = deadline - loop.time()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return False
        finally:
            with self._lock:
                svc.waiting -= 1
                self._waiters.discard(key)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
