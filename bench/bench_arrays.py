"""Job arrays at scale (issue 20): accepting a 100,000-element array, and the scheduling cycle
with an array queued, each against the same number of plain jobs, side by side.

    PYTHONPATH=src .venv/bin/python bench/bench_arrays.py [--elements 100000] [--repeats 3] [--cycles 15]

1. Accepted: the time from the POST of `array: 0-99999` (held, so nothing starts meanwhile) to
   the head's 201, on a real `gpucluster up` head over HTTP, with a fresh head and data dir per
   repeat. Baselines: the same number of plain jobs inserted by the store's batch path
   (`Store.create_jobs`, one transaction: the fastest any plain submission can be stored), and
   plain submissions over HTTP from 8 threads (`--plain-http` of them, timed and scaled to the
   element count: 100,000 one by one would take minutes).
2. Scheduling cycle: three heads (real SQLite store, fake executor, a clock moved by hand), each
   with its 8 GPUs busy and 100,000 queued: plain jobs, an array without a throttle, an array
   with `%16`; they take turns cycle by cycle (`--cycles` each after the first, which reads the
   whole queue and records every wait), and the ratio is also given as the median of adjacent
   pairs, so the load of a shared machine cancels out.
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


class Cluster:
    """A head (real SQLite store, fake executor, a clock moved by hand) with 8 busy GPUs and
    `elements` queued as `kind`: plain jobs, an array, or an array with a throttle of 16."""

    def __init__(self, work: Path, elements: int, kind: str) -> None:
        self.store = Store(work / "state.db")
        node = Node("n1", tuple(Gpu(i, "H100-80GB", 81920, f"G{i}") for i in range(8)))
        self.store.put_node(node, virtual=True, now=1000.0)
        self.now = 1000.0
        self.head = Head(
            store=self.store, executor=FakeExecutor(), data_dir=DataDir(work), clock=lambda: self.now, base_env={}
        )
        self.service = ClusterService(self.head)
        for _ in range(8):
            self.service.submit(JobSpec(command=COMMAND, time_limit=3600))
        self.head.tick()  # the 8 start: every GPU busy from here on
        spec = JobSpec(command=COMMAND, time_limit=600)
        if kind == "plain":
            self.store.create_jobs([(spec, 1000.0)] * elements)
        else:
            array = f"0-{elements - 1}" + ("%16" if kind == "array%16" else "")
            self.service.submit(JobSpec(command=COMMAND, time_limit=600, array=array, allow_large_array=True))

    def cycle(self) -> float:
        self.now += 1.0
        self.head._capacity_changed = True  # plan every cycle, as after a job ends
        started = time.perf_counter()
        self.head.tick()
        return time.perf_counter() - started

    def close(self) -> None:
        self.service.close()
        self.store.close()


def cycles(fresh: Callable[[str], Path], elements: int, count: int) -> dict[str, list[float]]:
    """Each kind's cycle times after its first, the kinds taking turns cycle by cycle: a change
    in the machine's load (2 cores shared with other work) hits each kind alike."""
    kinds = ("plain", "array", "array%16")
    clusters = {k: Cluster(fresh(f"c-{k}"), elements, k) for k in kinds}
    try:
        for k, cl in clusters.items():
            print(f"cycle, {elements:,} queued as {k}: first {cl.cycle():.3f} s (reads the queue, records every wait)")
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(count):
            for k, cl in clusters.items():
                times[k].append(cl.cycle())
        return times
    finally:
        for cl in clusters.values():
            cl.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--plain-http", type=int, default=2000)
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
        times = cycles(fresh, n, args.cycles)
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            p90 = sorted(v)[int(len(v) * 0.9)]
            print(f"cycle, {n:,} queued as {k}: median {med[k] * 1000:.1f} ms of {len(v)} (p90 {p90 * 1000:.1f} ms)")
        for k in ("array", "array%16"):
            paired = statistics.median(a / p for a, p in zip(times[k], times["plain"], strict=True))
            print(f"cycle ratio {k}/plain: {med[k] / med['plain']:.3f} (median of adjacent pairs {paired:.3f})")
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
