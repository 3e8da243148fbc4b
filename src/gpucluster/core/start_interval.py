"""An 80% interval around every queued job's estimated start (issue 24), calibrated on how far
this cluster's own recent estimates were from the real starts.

Why calibrated on past errors and not on sampled replays: the first version replayed the queue
ten times with run times drawn from similar finished jobs (the spread of run times), and on
the Philly replay only 41% of real starts fell inside its "80%" interval, 5 minutes wide at the
median: most of the uncertainty is not how long the jobs ahead run but what the replay leaves
out (jobs submitted later that go first: a higher class, a team further below its share;
failures; preemptions). What those do to an estimate shows in the history of estimates, so the
interval is taken from it (split-conformal prediction): for each of the last `window` jobs that
started, the ratio r = (real start - when estimated) / (estimate - when estimated); a new
estimate of wait w gets [now + w * q(0.1), now + w * q(0.9)] of those ratios. Calibrated by
construction while the cluster behaves as it did lately; the coverage is measured, not assumed
(`gpucluster simulate --estimates`: `interval_coverage`).

Pure: the caller feeds each started job's first estimate (head: head/estimates.py; simulator:
sim/estimate_error.py) and asks with the time it is given.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpucluster.core.runtime_predict import quantile

LOW, HIGH = 0.1, 0.9
WINDOW = 500  # recent starts the interval is calibrated on
MIN_SAMPLES = 20  # fewer: no interval (a handful of errors says little about the 10% tails)
MIN_WAIT_S = 60.0  # waits shorter than this count as this long: the ratio of two tiny waits is noise


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


class WaitCalibration:
    """The ratios of real to estimated waits of the last `window` started jobs."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        if min_samples < 2 or window < min_samples:
            raise ValueError(f"min_samples must be >= 2 and window >= min_samples, got {min_samples}, {window}")
        self.min_samples = min_samples
        self._ratios: deque[float] = deque(maxlen=window)
        self._sorted: list[float] | None = None

    def __len__(self) -> int:
        return len(self._ratios)

    def observe(self, estimated_at: float, estimate: float, started: float) -> None:
        """A job estimated at `estimated_at` to start at `estimate` started at `started`."""
        wait = max(estimate - estimated_at, MIN_WAIT_S)
        self._ratios.append(max(0.0, started - estimated_at) / wait)
        self._sorted = None

    def interval(self, now: float, estimate: float) -> Interval | None:
        """The 80% interval of a start estimated now at `estimate`; None until enough history."""
        if len(self._ratios) < self.min_samples:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._ratios)
        wait = max(estimate - now, MIN_WAIT_S)
        low = now + wait * quantile(self._sorted, LOW)
        high = now + wait * quantile(self._sorted, HIGH)
        return Interval(min(low, estimate), max(high, estimate))
