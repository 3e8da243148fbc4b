"""Per-token rate limits: a token bucket per caller, in memory.

In memory is enough: one head serves the API, and a restart forgiving a burst is harmless.
Buckets of callers silent for a minute are dropped, so the table stays small.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: float | None, clock: Callable[[], float]) -> None:
        self.rate = rate_per_s
        self.burst = burst if burst is not None else max(1.0, 2 * rate_per_s)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()
        self._swept_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: str) -> float:
        """Spend one request of `key`'s budget: 0.0 if allowed, else seconds until it would be."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens - 1.0, now)
            if now - self._swept_at > 60:
                self._swept_at = now
                idle = self.burst / self.rate + 60
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < idle}
        return 0.0
