"""Each service's numbers in /metrics (the registry a cluster admin reads, as teams' usage).

gpucluster_service_requests_total{service,team}       requests answered through the gateway
gpucluster_service_errors_total{service,team}         of which failed (5xx, or no replica)
gpucluster_service_requests_per_second{service,team}  over the last 10 s
gpucluster_service_latency_seconds{service,team,quantile}   0.5 and 0.99, the latest requests
gpucluster_service_replicas{service,team,phase}       replicas by phase (ready, starting, ...)
gpucluster_service_desired_replicas{service,team}     what the autoscaler asks for
gpucluster_service_gpu_hours_total{service,team}      GPU-hours of every replica job so far
gpucluster_service_cost_total{service,team}           their cost (the cluster's price units)
gpucluster_service_energy_kwh_total{service,team}     their energy, where GPUs report power
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gpucluster.services.manager import ServiceManager

PHASES = ("queued", "starting", "ready", "unready", "draining")


class ServiceCollector(Collector):
    def __init__(self, manager: ServiceManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        labels = ["service", "team"]
        requests = CounterMetricFamily("gpucluster_service_requests", "requests through the gateway", labels=labels)
        errors = CounterMetricFamily("gpucluster_service_errors", "failed requests (5xx or no replica)", labels=labels)
        rate = GaugeMetricFamily("gpucluster_service_requests_per_second", "over the last 10 s", labels=labels)
        latency = GaugeMetricFamily(
            "gpucluster_service_latency_seconds", "gateway latency", labels=[*labels, "quantile"]
        )
        replicas = GaugeMetricFamily("gpucluster_service_replicas", "replicas by phase", labels=[*labels, "phase"])
        desired = GaugeMetricFamily("gpucluster_service_desired_replicas", "the autoscaler's count", labels=labels)
        gpu_hours = CounterMetricFamily("gpucluster_service_gpu_hours", "replica jobs' GPU-hours", labels=labels)
        cost = CounterMetricFamily("gpucluster_service_cost", "replica jobs' cost", labels=labels)
        energy = CounterMetricFamily("gpucluster_service_energy_kwh", "replica jobs' energy", labels=labels)
        usage = self.manager.store.usage()
        for record in self.manager.list():
            if record.state != "running":
                continue
            out = self.manager.describe(record, usage)
            key = [out.name, out.team]
            requests.add_metric(key, out.stats.requests)
            errors.add_metric(key, out.stats.errors)
            rate.add_metric(key, out.stats.requests_per_s)
            for q, v in (("0.5", out.stats.latency_p50_s), ("0.99", out.stats.latency_p99_s)):
                if v is not None:
                    latency.add_metric([*key, q], v)
            phases = Counter(str(r.phase) for r in out.replicas)
            for phase in PHASES:
                replicas.add_metric([*key, phase], phases.get(phase, 0))
            desired.add_metric(key, out.desired_replicas)
            gpu_hours.add_metric(key, out.usage.gpu_hours)
            cost.add_metric(key, out.usage.cost)
            energy.add_metric(key, out.usage.energy_kwh)
        yield from (requests, errors, rate, latency, replicas, desired, gpu_hours, cost, energy)
