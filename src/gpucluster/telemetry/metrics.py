"""`/metrics` in the Prometheus text format (prometheus-client).

Read at scrape time from what the head already holds (the monitor's latest readings, the queue
cache, job counts, drain state), so a scrape costs one small query and no bookkeeping between
scrapes; the loop's own histograms (cycle time, waits) come from `LoopStats`.

Series (deploy/grafana/gpucluster.json is built on these names):
  gpucluster_gpu_utilization_ratio{node,gpu,model}      0-1, latest sample
  gpucluster_gpu_memory_used_bytes / _total_bytes{node,gpu,model}
  gpucluster_gpu_temperature_celsius{node,gpu,model}
  gpucluster_gpu_power_watts{node,gpu,model}
  gpucluster_gpu_sm_clock_hertz{node,gpu,model}
  gpucluster_gpu_allocated_ratio{node,gpu,model}        share of the GPU held by jobs
  gpucluster_gpu_healthy{node,gpu,model}                1, or 0 with a problem
  gpucluster_node_drained{node}                         1 when no new jobs go there
  gpucluster_queue_length{team,priority}
  gpucluster_queue_oldest_wait_seconds{team,priority}   age of the longest-waiting queued job
  gpucluster_queue_mean_wait_seconds{team,priority}
  gpucluster_job_wait_seconds{team,priority}            histogram: waits of jobs at their start
  gpucluster_jobs{state}                                jobs by state
  gpucluster_jobs_idle                                  running jobs flagged idle
  gpucluster_scheduling_cycle_seconds                   histogram: one head cycle
  gpucluster_scheduler_decide_seconds                   the last plan's decide() time
  gpucluster_scheduling_cycles_total
  gpucluster_estimate_refreshes_total                   replays estimating every queued job's start
  gpucluster_estimate_refresh_cpu_seconds_total         the loop thread's CPU time in start estimates
  gpucluster_team_fair_share_usage_gpu_hours{team}      decayed usage the fair share orders by (*)
  gpucluster_job_metric{job,team,name}                  a running job's newest reported metric (*)
  gpucluster_telemetry_step_seconds                     the last telemetry round

GPU-hours, cost and energy per team (undecayed, for billing) come from accounting's collector,
registered next to these in `metrics_registry` (telemetry/accounting_metrics.py):
  gpucluster_team_gpu_hours_total{team,model}, gpucluster_team_cost_total{team},
  gpucluster_team_energy_joules_total{team}

(*) and those three: what a team used and spent, which only a cluster admin may see; they are
in the registry built with `team_usage=True` (the API serves it to a cluster admin's token, or
to anyone under `gpucluster up --public-team-usage`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpucluster.store.telemetry import NODE_WIDE
from gpucluster.telemetry.accounting_metrics import AccountingCollector

if TYPE_CHECKING:
    from gpucluster.head.service import ClusterService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024


class ClusterCollector(Collector):
    def __init__(self, service: ClusterService, team_usage: bool = True) -> None:
        self.service = service
        self.team_usage = team_usage

    def collect(self) -> Iterable[Metric]:
        yield from self._gpus()
        yield from self._queue()
        yield from self._jobs()
        yield from self._loop()

    def _gpus(self) -> Iterator[Metric]:
        head = self.service.head
        monitor = self.service.telemetry
        labels = ["node", "gpu", "model"]
        util = GaugeMetricFamily("gpucluster_gpu_utilization_ratio", "GPU utilisation, 0 to 1", labels=labels)
        used = GaugeMetricFamily("gpucluster_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("gpucluster_gpu_memory_total_bytes", "GPU memory", labels=labels)
        temp = GaugeMetricFamily("gpucluster_gpu_temperature_celsius", "GPU temperature", labels=labels)
        power = GaugeMetricFamily("gpucluster_gpu_power_watts", "GPU power draw", labels=labels)
        clock = GaugeMetricFamily("gpucluster_gpu_sm_clock_hertz", "GPU SM clock", labels=labels)
        alloc = GaugeMetricFamily("gpucluster_gpu_allocated_ratio", "Share of the GPU held by jobs", labels=labels)
        healthy = GaugeMetricFamily("gpucluster_gpu_healthy", "1 if telemetry finds no problem", labels=labels)
        drained = GaugeMetricFamily("gpucluster_node_drained", "1 if the node takes no new jobs", labels=["node"])
        held: dict[tuple[str, int], float] = {}
        for _, a in self.service.store.running_allocations():
            for s in a.slices:
                for i in s.gpu_indices:
                    held[(s.node, i)] = held.get((s.node, i), 0.0) + s.share
        problems = head.telemetry.problems()
        states = head.telemetry.node_states()
        for rec in self.service.store.nodes():
            name = rec.node.name
            st = states.get(name)
            drained.add_metric([name], 1.0 if st is not None and st.drained else 0.0)
            node_down = (name, NODE_WIDE) in problems
            for g in rec.node.gpus:
                lv = [name, str(g.index), g.model]
                total.add_metric(lv, g.memory_mb * MIB)
                alloc.add_metric(lv, min(held.get((name, g.index), 0.0), 1.0))
                healthy.add_metric(lv, 0.0 if node_down or (name, g.index) in problems else 1.0)
                now = monitor.gpus.get((name, g.index)) if monitor is not None else None
                if now is None:
                    continue
                r = now.reading
                if r.utilization is not None:
                    util.add_metric(lv, r.utilization / 100.0)
                if r.memory_used_mb is not None:
                    used.add_metric(lv, r.memory_used_mb * MIB)
                if r.temperature_c is not None:
                    temp.add_metric(lv, r.temperature_c)
                if r.power_w is not None:
                    power.add_metric(lv, r.power_w)
                if r.sm_clock_mhz is not None:
                    clock.add_metric(lv, r.sm_clock_mhz * 1e6)
        yield from (util, used, total, temp, power, clock, alloc, healthy, drained)

    def _queue(self) -> Iterator[Metric]:
        head = self.service.head
        now = head.clock()
        groups: dict[tuple[str, str], list[float]] = {}
        for r in head.queue.requests():
            groups.setdefault((r.team, r.priority.label), []).append(max(0.0, now - (r.queued_at or r.submitted_at)))
        labels = ["team", "priority"]
        length = GaugeMetricFamily("gpucluster_queue_length", "Queued jobs", labels=labels)
        oldest = GaugeMetricFamily(
            "gpucluster_queue_oldest_wait_seconds", "How long the longest-waiting queued job has waited", labels=labels
        )
        mean = GaugeMetricFamily("gpucluster_queue_mean_wait_seconds", "Mean wait of queued jobs so far", labels=labels)
        for key, waits in sorted(groups.items()):
            length.add_metric(list(key), len(waits))
            oldest.add_metric(list(key), max(waits))
            mean.add_metric(list(key), sum(waits) / len(waits))
        yield from (length, oldest, mean)

    def _jobs(self) -> Iterator[Metric]:
        from gpucluster.core.states import JobState

        counts = self.service.store.count_jobs()
        jobs = GaugeMetricFamily("gpucluster_jobs", "Jobs by state", labels=["state"])
        for s in JobState:
            jobs.add_metric([s.value], counts.get(s.value, 0))
        yield jobs
        idle = GaugeMetricFamily("gpucluster_jobs_idle", "Running jobs flagged idle by telemetry")
        idle.add_metric([], len({f.job_id for f in self.service.head.telemetry.flags() if f.flag == "idle"}))
        yield idle
        if not self.team_usage:
            return
        usage = GaugeMetricFamily(
            "gpucluster_team_fair_share_usage_gpu_hours",
            "Decayed GPU-hours the fair share orders teams by (not billing: see accounting)",
            labels=["team"],
        )
        for team, seconds in sorted(self.service.head.usage.items()):
            usage.add_metric([team], seconds / 3600.0)
        yield usage
        reported = GaugeMetricFamily(
            "gpucluster_job_metric",
            "The newest value of each metric a running job reports (gpucluster.train.report)",
            labels=["job", "team", "name"],
        )
        for job_id, team, name, value in self.service.store.running_metrics():
            reported.add_metric([str(job_id), team, name], value)
        yield reported

    def _loop(self) -> Iterator[Metric]:
        head = self.service.head
        decide = GaugeMetricFamily("gpucluster_scheduler_decide_seconds", "The last plan's decide() time")
        decide.add_metric([], head.last_decide_s)
        yield decide
        cycles = CounterMetricFamily("gpucluster_scheduling_cycles", "Head cycles run")
        cycles.add_metric([], head.cycles)
        yield cycles
        refreshes = CounterMetricFamily("gpucluster_estimate_refreshes", "Replays estimating every queued job's start")
        refreshes.add_metric([], head.estimates.refreshes)
        yield refreshes
        refresh_cpu = CounterMetricFamily(
            "gpucluster_estimate_refresh_cpu_seconds", "The loop thread's CPU time in start estimates (replays, merges)"
        )
        refresh_cpu.add_metric([], head.estimates.cpu_s)
        yield refresh_cpu
        step = GaugeMetricFamily("gpucluster_telemetry_step_seconds", "The last telemetry round's duration")
        monitor = self.service.telemetry
        step.add_metric([], monitor.last_step_s if monitor is not None else 0.0)
        yield step
        yield from head.stats.registry.collect()


def metrics_registry(service: ClusterService, team_usage: bool = True) -> CollectorRegistry:
    """The series of /metrics; each team's usage and spend only with `team_usage` (see above)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(service, team_usage))
    if team_usage:
        registry.register(AccountingCollector(service.head.accounting))
        for collector in service.private_collectors:  # each service's numbers (services/metrics.py)
            registry.register(collector)
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
