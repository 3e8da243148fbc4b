"""How many replicas a service should have, from its requests in flight (concurrency) and,
if the owner set a target for it, its requests per second.

Pure apart from the samples it is fed: time is a parameter, so tests drive it with a fake clock.
Scale-up follows the load at once (the mean in flight over a short window, divided by the
owner's target per replica, rounded up); scale-down waits until the load has been lower for
`scale_down_delay_s` (the largest count wanted over that time), so a burst's gaps do not make
replicas come and go. With `min_replicas` 0, a service nobody called for that long goes to zero,
and a request held at the gateway counts as in flight, so the first request scales it back up.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW_S = 2.0  # the load is the mean in flight over this window


@dataclass(frozen=True)
class ScaleBounds:
    min_replicas: int
    max_replicas: int
    target_concurrency: float
    scale_down_delay_s: float
    target_rps: float | None = None  # requests per second per replica; None: concurrency only


class Autoscaler:
    def __init__(self, initial: int, now: float, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()  # (at, in flight)
        self._rates: deque[tuple[float, float]] = deque()  # (at, requests per second)
        self._wanted: deque[tuple[float, int]] = deque([(now, initial)])  # (at, count wanted then)

    def observe(self, now: float, in_flight: int, rps: float = 0.0) -> None:
        """One sample: requests in flight (held ones included) and requests answered per second."""
        self._samples.append((now, in_flight))
        self._rates.append((now, rps))
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()
        while self._rates and self._rates[0][0] < now - self.window_s:
            self._rates.popleft()

    def load(self) -> float:
        """The mean in flight over the window (0 with no samples)."""
        if not self._samples:
            return 0.0
        return sum(n for _, n in self._samples) / len(self._samples)

    def desired(self, now: float, bounds: ScaleBounds) -> int:
        load = self.load()
        want = math.ceil(load / bounds.target_concurrency - 1e-9)
        if bounds.target_rps is not None and self._rates:
            rate = sum(r for _, r in self._rates) / len(self._rates)
            want = max(want, math.ceil(rate / bounds.target_rps - 1e-9))  # whichever asks for more
        if want == 0 and any(n > 0 for _, n in self._samples):
            want = 1  # a request is waiting or running: never zero under it
        want = max(bounds.min_replicas, min(bounds.max_replicas, want))
        self._wanted.append((now, want))
        while len(self._wanted) > 1 and self._wanted[0][0] < now - bounds.scale_down_delay_s:
            self._wanted.popleft()
        # The most wanted over the delay: up at once, down only once the delay has passed.
        return max(bounds.min_replicas, min(bounds.max_replicas, max(n for _, n in self._wanted)))
