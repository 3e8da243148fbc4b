"""/metrics: parses with Prometheus' own text parser, carries the expected series and values, and
every series the shipped Grafana dashboard queries exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpucluster.telemetry.metrics import metrics_registry, render_metrics

from .telemetrykit import make_telemetry

DASHBOARD = Path(__file__).parent.parent.parent / "deploy" / "grafana" / "gpucluster.json"


def test_metrics_parse_with_the_expected_series_and_cover_the_dashboard(tmp_path: Path) -> None:
    t = make_telemetry(tmp_path)
    try:
        c = t.cluster
        c.service.telemetry = t.monitor
        held = c.submit(gpus=6, priority="high")
        c.submit(gpus=4, team="vision")  # waits: 2 GPUs left
        t.script(g0={"util": 100, "temp": 95})
        t.step()
        text = render_metrics(metrics_registry(c.service)).decode()
    finally:
        t.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in families[name].samples if all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("gpucluster_gpu_utilization_ratio", node="n1", gpu="0") == 1.0
    assert value("gpucluster_gpu_temperature_celsius", node="n1", gpu="0") == 95
    assert value("gpucluster_gpu_power_watts", node="n1", gpu="3") == 300
    assert value("gpucluster_gpu_memory_used_bytes", node="n1", gpu="3") == 1000 * 1024 * 1024
    assert value("gpucluster_gpu_healthy", node="n1", gpu="0") == 0  # too hot
    assert value("gpucluster_gpu_healthy", node="n1", gpu="1") == 1
    assert value("gpucluster_node_drained", node="n1") == 1
    assert sum(s.value for s in families["gpucluster_gpu_allocated_ratio"].samples) == 6
    assert value("gpucluster_queue_length", team="vision", priority="normal") == 1
    assert value("gpucluster_queue_oldest_wait_seconds", team="vision", priority="normal") == 5  # one step of 5 s
    assert value("gpucluster_jobs", state="running") == 1 and value("gpucluster_jobs", state="queued") == 1
    assert held == 1
    waits = [s for s in families["gpucluster_job_wait_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["team"], s.labels["priority"], s.value) for s in waits] == [("default", "high", 1)]
    cycles = next(s for s in families["gpucluster_scheduling_cycle_seconds"].samples if s.name.endswith("_count"))
    assert cycles.value == 2  # one step: two head cycles
    assert value("gpucluster_estimate_refreshes") >= 1  # the vision job waits: estimated
    assert value("gpucluster_estimate_refresh_cpu_seconds") > 0

    exposed = set(families)
    used = set(re.findall(r"gpucluster_[a-z_]+", " ".join(_exprs(json.loads(DASHBOARD.read_text())))))
    missing = {n for n in used if re.sub(r"_(bucket|count|sum|total)$", "", n) not in exposed}
    assert not missing, f"the dashboard queries series /metrics does not have: {sorted(missing)}"


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)] + [
            e for v in node.values() for e in _exprs(v)
        ]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []
