"""Job arrays at scale (issue 20): accepting a 100,000-element array, and the scheduling cycle
with an array queued, each against the same number of plain jobs, side by side.

    PYTHONPATH=src .venv/bin/python bench/bench_arrays.py [--elements 100000] [--repeats 3] [--cycles 15]

1. Accepted: the time from the POST of `array: 0-99999` (held, so nothing starts meanwhile) to
   the head's 201, on a real `gpucluster up` head over HTTP, with a fresh head and data dir per
   repeat. Baselines: the same number of plain jobs inserted by the store's batch path
   (`Store.create_jobs`, one transaction: the fastest any plain submission can be stored), and
   plain submissions over HTTP from 8 threads (`--plain-http` of them, timed and scaled to the
   element count: 100,000 one by one would take minutes).
2. Scheduling cycle: a head (real SQLite store, fake executor, a clock moved by hand) whose 8
   GPUs are all busy, with the elements (or as many plain jobs) queued; the median of
   `--cycles` cycles after the first (the first reads the whole queue and records every wait).
   Three queues: plain jobs, an array without a throttle, an array with `%16`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

import _head
from gpucluster.core.types import Gpu, Node
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService
from gpucluster.models import JobSpec
from gpucluster.store import Store

COMMAND = ["sleep", "1000"]


def accept_array(work: Path, elements: int) -> float:
    head = _head.start(8, work / "data", work / "head.log")
    try:
        with httpx.Client(base_url=head.url, headers=head.headers, timeout=120) as c:
            body = {"command": COMMAND, "array": f"0-{elements - 1}", "hold": True, "allow_large_array": True}
            started = time.perf_counter()
            r = c.post("/v1/jobs", json=body)
            took = time.perf_counter() - started
            r.raise_for_status()
            assert r.json()["array_counts"] == {"queued": elements}, r.text
        return took
    finally:
        head.stop()


def accept_plain_http(work: Path, count: int, threads: int = 8) -> float:
    head = _head.start(8, work / "data", work / "head.log")
    try:
        per = count // threads

        def client() -> None:
            with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
                for _ in range(per):
                    c.post("/v1/jobs", json={"command": COMMAND, "hold": True}).raise_for_status()

        started = time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return (time.perf_counter() - started) / (per * threads)
    finally:
        head.stop()


def accept_plain_batch(work: Path, count: int) -> float:
    store = Store(work / "state.db")
    spec = JobSpec(command=COMMAND, hold=True)
    try:
        started = time.perf_counter()
        store.create_jobs([(spec, 1000.0)] * count)
        return time.perf_counter() - started
    finally:
        store.close()


def cycle(work: Path, elements: int, kind: str, cycles: int) -> tuple[float, float]:
    """(first cycle, median of the next `cycles`) in seconds, with 8 busy GPUs and the queue."""
    store = Store(work / "state.db")
    node = Node("n1", tuple(Gpu(i, "H100-80GB", 81920, f"G{i}") for i in range(8)))
    store.put_node(node, virtual=True, now=1000.0)
    clock = [1000.0]
    head = Head(store=store, executor=FakeExecutor(), data_dir=DataDir(work), clock=lambda: clock[0], base_env={})
    service = ClusterService(head)
    try:
        for _ in range(8):
            service.submit(JobSpec(command=COMMAND, time_limit=3600))
        head.tick()  # the 8 start: every GPU busy from here on
        spec = JobSpec(command=COMMAND, time_limit=600)
        if kind == "plain":
            store.create_jobs([(spec, 1000.0)] * elements)
        else:
            array = f"0-{elements - 1}" + ("%16" if kind == "array%16" else "")
            service.submit(JobSpec(command=COMMAND, time_limit=600, array=array, allow_large_array=True))
        times = []
        for _ in range(cycles + 1):
            clock[0] += 1.0
            head._capacity_changed = True  # plan every cycle, as after a job ends
            started = time.perf_counter()
            head.tick()
            times.append(time.perf_counter() - started)
        return times[0], statistics.median(times[1:])
    finally:
        service.close()
        store.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cycles", type=int, default=15)
    p.add_argument("--plain-http", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2, help="cycle measurements per queue kind, interleaved")
    p.add_argument("--only-cycles", action="store_true")
    args = p.parse_args()
    n = args.elements
    root = Path(tempfile.mkdtemp(prefix="bench-arrays-"))
    try:

        def fresh(name: str) -> Path:
            d = root / name
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            return d

        if not args.only_cycles:
            accepting(args, n, fresh)
        medians: dict[str, list[float]] = {"plain": [], "array": [], "array%16": []}
        for r in range(args.rounds):  # interleaved, so a change in the machine's load hits each kind alike
            for kind in medians:
                first, median = cycle(fresh(f"c-{kind}-{r}"), n, kind, args.cycles)
                medians[kind].append(median)
                print(f"cycle, {n:,} queued as {kind}: first {first:.3f} s, median {median * 1000:.1f} ms")
        results = {k: statistics.median(v) for k, v in medians.items()}
        for kind in ("array", "array%16"):
            print(f"cycle ratio {kind}/plain: {results[kind] / results['plain']:.3f} (median of {args.rounds} rounds)")
        print("load average:", os.getloadavg())
        print("machine:", subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def accepting(args: argparse.Namespace, n: int, fresh: Callable[[str], Path]) -> None:
    """Part 1: the array over HTTP against plain jobs (store batch; HTTP, scaled)."""
    arrays = [accept_array(fresh(f"a{i}"), n) for i in range(args.repeats)]
    batches = [accept_plain_batch(fresh(f"b{i}"), n) for i in range(args.repeats)]
    per_job = accept_plain_http(fresh("h"), args.plain_http)
    a, b = statistics.median(arrays), statistics.median(batches)
    print(f"accept {n:,}: array over HTTP median {a:.3f} s (runs {', '.join(f'{x:.3f}' for x in arrays)})")
    print(f"accept {n:,}: plain jobs, one store batch median {b:.3f} s -> array/batch {a / b:.2f}")
    print(
        f"accept {n:,}: plain jobs over HTTP, 8 threads: {per_job * 1000:.2f} ms each -> "
        f"{per_job * n:.1f} s for {n:,} (scaled from {args.plain_http:,}) -> array/plain {a / (per_job * n):.4f}"
    )


if __name__ == "__main__":
    sys.exit(main())
