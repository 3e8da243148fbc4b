"""Does telemetry slow the scheduling loop? And what do its writes and downsampling cost?

A real store (SQLite file), the fake executor, 16 nodes x 8 virtual GPUs with 128 running jobs
and a queue of 2,000: the head's cycle (`tick`, reconcile + plan) is timed with no telemetry
(baseline) and then with the telemetry monitor sampling all 128 GPUs on its own thread at an
aggressive cadence (every 50 ms, a batch written every 0.5 s: 100x the default rate), side by
side, alternating rounds so machine load hits both alike. Then writing an hour of samples for
128 GPUs at the default 5 s interval in one batch, and downsampling them (the routine minute
that ages out each round, and a catch-up of the rest), are timed alone.

    .venv/bin/python bench/bench_telemetry.py [--rounds 6] [--ticks 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from gpucluster.core.types import Gpu, Node
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.models import JobSpec
from gpucluster.store import Store
from gpucluster.store.telemetry import GpuSample, TelemetryStore
from gpucluster.telemetry.monitor import TelemetryMonitor
from gpucluster.telemetry.synthetic import LoadBook, SyntheticSource

NODES, GPUS = 16, 8


def build(tmp: Path) -> tuple[Head, list[Node]]:
    store = Store(tmp / "state.db")
    nodes = [
        Node(f"n{i}", tuple(Gpu(g, "H100-80GB", 81920, f"GPU-{i}-{g}") for g in range(GPUS))) for i in range(NODES)
    ]
    for n in nodes:
        store.put_node(n, True, 0.0)
    head = Head(store=store, executor=FakeExecutor(), data_dir=DataDir(tmp), clock=time.time, base_env={"HOME": "/"})
    specs = [(JobSpec(command=["sleep", "1"], gpus=1), 0.0) for _ in range(NODES * GPUS)]
    store.create_jobs(specs)
    head.tick()  # start 128 one-GPU jobs: the cluster is full
    store.create_jobs([(JobSpec(command=["sleep", "1"], gpus=2), 0.0) for _ in range(2000)])
    head.tick()
    return head, nodes


def time_ticks(head: Head, n: int) -> list[float]:
    out = []
    for _ in range(n):
        head._last_plan_at = None  # plan every cycle, as under a stream of submissions
        t = time.perf_counter()
        head.tick()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ticks", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        head, nodes = build(Path(d))
        loads = LoadBook()
        monitor = TelemetryMonitor(
            head, [SyntheticSource(n, loads) for n in nodes], interval_s=0.05, flush_s=0.5, downsample_s=5.0
        )
        base: list[float] = []
        with_tel: list[float] = []
        for _ in range(args.rounds):
            base += time_ticks(head, args.ticks)
            monitor._stop.clear()
            thread = threading.Thread(target=monitor.run, daemon=True)
            thread.start()
            time.sleep(0.2)
            with_tel += time_ticks(head, args.ticks)
            monitor.stop()
            thread.join()
        steps = monitor.steps
        written = sum(TelemetryStore(head.store).count_samples().values())

        ts = TelemetryStore(head.store)
        hour = [
            GpuSample(n.name, g.index, 1e6 + k * 5.0, 5.0, (1,), 50.0, 1000.0, 60.0, 400.0, 1980.0, 2619.0)
            for k in range(720)
            for n in nodes
            for g in n.gpus
        ]
        t = time.perf_counter()
        ts.add_samples(hour)
        flush_s = time.perf_counter() - t
        t = time.perf_counter()
        minute = ts.downsample(now=1e6 + 3600 + 60)  # routine: the minute that just aged out
        minute_s = time.perf_counter() - t
        t = time.perf_counter()
        removed = ts.downsample(now=1e6 + 2 * 3600 + 60)  # catch-up: the whole hour at once
        down_s = time.perf_counter() - t
        head.store.close()

    def ms(xs: list[float], q: float) -> float:
        return 1000 * (statistics.median(xs) if q == 0.5 else sorted(xs)[int(q * (len(xs) - 1))])

    print(f"head cycle with {NODES * GPUS} running jobs, 2,000 queued; {args.rounds} x {args.ticks} cycles each way")
    print(f"telemetry meanwhile: {steps} rounds of {NODES * GPUS} GPUs, {written} samples written")
    print(f"{'':28}{'median':>10}{'p95':>10}")
    print(f"{'no telemetry (baseline)':28}{ms(base, 0.5):>8.2f}ms{ms(base, 0.95):>8.2f}ms")
    print(f"{'telemetry every 50 ms':28}{ms(with_tel, 0.5):>8.2f}ms{ms(with_tel, 0.95):>8.2f}ms")
    print(f"ratio (telemetry / baseline), median: {statistics.median(with_tel) / statistics.median(base):.2f}")
    print(
        f"writing an hour of samples (128 GPUs at 5 s, {len(hour):,} rows) in one batch: {flush_s * 1000:.0f} ms"
        f" = {flush_s / len(hour) * 1e6:.1f} us/row (a default 10 s flush is 256 rows)"
    )
    print(f"routine downsample, the minute that aged out ({minute:,} rows merged): {minute_s * 1000:.0f} ms")
    print(f"catch-up downsample of the rest of the hour ({removed:,} rows merged): {down_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
