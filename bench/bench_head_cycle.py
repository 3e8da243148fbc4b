"""The live head's cycle at 1,000 nodes with 100,000 queued, a baseline tree beside this one (issue 15).

  python bench/bench_head_cycle.py --baseline DIR [--nodes 1000] [--jobs 100000] [--cycles 15]

Issue 15 asks the head's cycle for the simulator's speed: cluster state fed by events rather
than rebuilt or diffed from the store each cycle. This measures `Head.tick()` itself (the real
loop, a real SQLite store, the fake executor on virtual GPUs, a clock the benchmark moves, the
default policy) in a fresh process per tree, so the baseline's figures come from its own code:

- setup: `--nodes` nodes of 8 virtual GPUs, `--jobs` queued jobs of 1-8 GPUs over 20 teams and
  three priorities, inserted through the store's batch path (`create_jobs`), then a first tick
  that fills the cluster (its time is printed, not compared: it is mostly the starts);
- `quiet`: a cycle with nothing changed (the clock moves 0.05 s): reconcile and no plan;
- `change`: one running job exits and one job is submitted between two cycles (clock +0.05 s):
  the cycle finishes the job, reads the new one and plans the whole queue again;
- `full`: a quiet cycle 5 s after the last (`--cycles` / 3 of them, after the others): the one
  in 5 s (every 50th at a 0.1 s loop) that made the full reads, of the queue and, where they are
  fed by events, of the running jobs. Where the head reads whole only after another process
  wrote (head/full_reads.py), nobody else wrote here: it is a periodic plan and a check.
- `foreign`: as `full`, but a second Store on the same file (its own connection: another
  process, as SQLite sees it) submitted a job first: the cycle that reads whole in either tree.
- `idle_check`: the loop's `certainly_idle` alone on that snapshot (trees that have it), the
  test a cycle that is not the periodic replan makes before `decide`;
- `decide`: the core's `decide` alone (`--cycles` / 3 calls, the collector paused as the loop
  does) on the head's last admitted snapshot, with wait reasons as the head asks for them
  (`decide`) and without, as the simulator asks (`decide_plan_only`): what the head's cycle
  after a change is compared with.

Figures are CPU seconds of the process (`time.process_time`; the head's loop runs in this
thread, no API threads) and wall seconds; median and p95 over `--cycles` of each kind. The machine
has 2 cores that other engineers load: the script prints the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)


class Clock:
    """The head's clock, moved by the benchmark (also bench_submit_cycle.py's)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def child(nodes: int, jobs: int, cycles: int) -> dict[str, object]:
    """One tree's figures, in this process (its `gpucluster` is whatever PYTHONPATH names)."""
    import random
    import time

    from gpucluster.core.types import Gpu, Node
    from gpucluster.executors.base import Exited, Running
    from gpucluster.executors.fake import FakeExecutor
    from gpucluster.head.loop import Head
    from gpucluster.head.paths import DataDir
    from gpucluster.models import JobSpec
    from gpucluster.store import Store

    rng = random.Random(15)
    tmp = Path(tempfile.mkdtemp(prefix="bench-head-cycle-"))
    clock = Clock()
    store = Store(tmp / "state.db")
    for n in range(nodes):
        gpus = tuple(Gpu(index=i, model="H100", memory_mb=81920, uuid=f"V-{n}-{i}") for i in range(8))
        store.put_node(Node(name=f"n{n:05d}", gpus=gpus), virtual=True, now=clock.t)

    def one(k: int) -> tuple[JobSpec, float]:
        spec = JobSpec.model_validate(
            {
                "command": ["train"],
                "gpus": rng.choice((1, 1, 2, 4, 8)),
                "team": f"t{k % 20}",
                "priority": rng.choice(("low", "normal", "normal", "high")),
                "time_limit": rng.choice((3600, 7200, 14400)),
            }
        )
        return spec, clock.t - jobs + k * 1.0  # submitted over the last `jobs` seconds

    t0 = time.perf_counter()
    for first in range(0, jobs, 10_000):
        store.create_jobs([one(k) for k in range(first, min(jobs, first + 10_000))])
    insert_s = time.perf_counter() - t0
    fake = FakeExecutor()
    head = Head(store=store, executor=fake, data_dir=DataDir(tmp / "data"), clock=clock, base_env={"HOME": "/h"})
    t0 = time.perf_counter()
    head.tick()
    first_s = time.perf_counter() - t0
    running_after_first = len(fake.running())

    def timed() -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        head.tick()
        return time.process_time() - c0, time.perf_counter() - w0

    quiet: list[tuple[float, float]] = []
    change: list[tuple[float, float]] = []
    for k in range(cycles):
        clock.t += 0.05
        quiet.append(timed())
        # one job ends, one is submitted: the next cycle finishes it and plans again
        victim = rng.choice(fake.running())
        for (j, _), p in fake.processes.items():
            if j == victim and isinstance(p.status, Running):
                p.status = Exited(0)
        store.create_jobs([one(jobs + k)])
        clock.t += 0.05
        change.append(timed())
    full: list[tuple[float, float]] = []
    for _ in range(max(1, cycles // 3)):
        clock.t += 5.0
        full.append(timed())
    foreign: list[tuple[float, float]] = []
    other = Store(tmp / "state.db")
    for k in range(max(1, cycles // 3)):
        other.create_jobs([one(jobs + cycles + k)])  # another process's write, as SQLite sees it
        clock.t += 5.0
        foreign.append(timed())
    other.close()
    from gpucluster.core.scheduler import decide, gc_paused

    snap, policy = head.last_snapshot, head.planning_policy
    assert snap is not None
    decide_cpu: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(max(1, cycles // 3)):
        for reasons in (True, False):
            c0 = time.process_time()
            with gc_paused():
                decide(snap, policy, clock.t, reasons=reasons)
            decide_cpu[reasons].append(time.process_time() - c0)
    # The loop's test of whether a cycle could start anything (`certainly_idle`, trees that
    # have it): run before `decide` in every cycle that is not the periodic replan.
    idle_cpu: list[float] = []
    try:
        from gpucluster.core.scheduler import certainly_idle  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        certainly_idle = None
    for _ in range(max(1, cycles // 3) if certainly_idle is not None else 0):
        c0 = time.process_time()
        certainly_idle(snap, policy, clock.t)
        idle_cpu.append(time.process_time() - c0)
    queued = len(head.queue.requests())
    store.close()

    def stats(xs: list[float]) -> dict[str, float]:
        s = sorted(xs)
        return {"median": statistics.median(s), "p95": s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]}

    return {
        "insert_s": insert_s,
        "first_tick_s": first_s,
        "running": running_after_first,
        "queued": queued,
        "quiet_cpu": stats([c for c, _ in quiet]),
        "quiet_wall": stats([w for _, w in quiet]),
        "change_cpu": stats([c for c, _ in change]),
        "change_wall": stats([w for _, w in change]),
        "full_cpu": stats([c for c, _ in full]),
        "full_wall": stats([w for _, w in full]),
        "foreign_cpu": stats([c for c, _ in foreign]),
        "foreign_wall": stats([w for _, w in foreign]),
        "decide_cpu": stats(decide_cpu[True]),
        "decide_plan_only_cpu": stats(decide_cpu[False]),
        **({"idle_check_cpu": stats(idle_cpu)} if idle_cpu else {}),
    }


def child_figures(script: str, tree: Path, argv: list[str], stderr: int | None = subprocess.PIPE) -> dict[str, object]:
    """`script --child ARGV` in a fresh process importing `tree`'s gpucluster: the JSON object
    its last line prints. Shared with bench_submit_cycle.py (same child protocol)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [str(PYTHON), script, "--child", *argv], env=env, check=True, stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    got: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def alternate(
    rounds: int, baseline: Path, run: Callable[[Path], dict[str, object]]
) -> dict[str, list[dict[str, object]]]:
    """`run` on the baseline tree and on this one, alternated for `rounds` pairs, each printed
    with the load average it started at: "baseline" and "this" -> their figures, in order."""
    results: dict[str, list[dict[str, object]]] = {"baseline": [], "this": []}
    for r in range(rounds):
        for name, tree in (("baseline", baseline), ("this", ROOT)):
            print(f"round {r + 1} {name}: load average {os.getloadavg()[0]:.2f}", flush=True)
            got = run(tree)
            results[name].append(got)
            print(f"  {json.dumps(got)}", flush=True)
    return results


def run(tree: Path, args: argparse.Namespace) -> dict[str, object]:
    return child_figures(__file__, tree, [str(args.nodes), str(args.jobs), str(args.cycles)])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        nodes, jobs, cycles = (int(x) for x in sys.argv[2:5])
        print(json.dumps(child(nodes, jobs, cycles)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout of the tree before (its src/)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=1, help="baseline/this pairs, alternated")
    args = ap.parse_args()
    print(f"{args.nodes} nodes x 8 virtual GPUs, {args.jobs} queued, {args.cycles} cycles of each kind")
    results = alternate(args.rounds, args.baseline, lambda tree: run(tree, args))

    def fig(tree: str, name: str, q: str) -> float:
        return statistics.median(float(x[name][q]) for x in results[tree])  # type: ignore[index]

    print("\nkind              figure       baseline  this      baseline/this")
    for kind in ("quiet", "change", "full", "foreign", "decide", "decide_plan_only"):
        for what in ("cpu", "wall") if kind not in ("decide", "decide_plan_only") else ("cpu",):
            for q in ("median", "p95"):
                b, t = fig("baseline", f"{kind}_{what}", q), fig("this", f"{kind}_{what}", q)
                print(f"{kind:17} {what} {q:6} {b:8.3f}s {t:8.3f}s  {b / t:5.2f}x")
    if "idle_check_cpu" in results["this"][0]:
        print(f"idle check (certainly_idle) cpu median, this tree: {fig('this', 'idle_check_cpu', 'median'):.4f}s")
    for tree in ("baseline", "this"):
        d = fig(tree, "decide_cpu", "median")
        print(
            f"{tree}: change cycle / decide alone (CPU medians) {fig(tree, 'change_cpu', 'median') / d:.2f}x, "
            f"foreign (whole read) / decide {fig(tree, 'foreign_cpu', 'median') / d:.2f}x"
        )


if __name__ == "__main__":
    main()
