"""The scheduling loop's own numbers for /metrics: cycle time, and how long started jobs waited.

Why here and not computed at scrape time: a cycle's duration and a job's wait at the moment it
starts exist only as they happen. Prometheus histograms in a registry of the head's own (not
the process-global one), so several heads in one process (tests) never share series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)


class LoopStats:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.cycle_seconds = Histogram(
            "gpucluster_scheduling_cycle_seconds",
            "Duration of one head cycle (reconcile running jobs, then plan and start)",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.wait_seconds = Histogram(
            "gpucluster_job_wait_seconds",
            "Time a job waited in the queue before it started (from submit or its last requeue)",
            ["team", "priority"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )

    def cycle(self, seconds: float) -> None:
        self.cycle_seconds.observe(seconds)

    def started(self, team: str, priority: str, waited_s: float) -> None:
        self.wait_seconds.labels(team, priority).observe(max(0.0, waited_s))
