"""The head's cycle while submissions stream into a full cluster, a baseline tree beside this one (issue 18).

  python bench/bench_submit_cycle.py --baseline DIR [--queued 3000] [--cycles 200] [--burst 11]

The lead's profile of bench_jobcost's rate phases: 8 GPUs busy with `sleep 1000` jobs, thousands
queued, and a burst of submissions before each cycle (the loop's pause gathers them), so every
cycle was woken by queue news alone and planned every queued job's wait. This measures
`Head.tick()` in that state: one node of 8 virtual GPUs, a real SQLite store, the fake executor,
the default policy, a clock the benchmark moves by 0.05 s a cycle (so every 20th cycle is the
periodic full plan), `--burst` jobs inserted through the store's batch path before each cycle.
Where the tree has it, a cycle that is not the periodic plan and finds nothing could start
(`core.scheduler.certainly_idle`) plans nothing. Each tree runs in a fresh process, so the
baseline's figures come from its own code. (Written by a helper for its own version of that
skip; it measures this one unchanged.)

Figures: the loop thread's CPU per cycle (`time.thread_time`), median and p95, and CPU per
submission (the cycles' total over the jobs submitted); with `--profile`, the top functions of
this tree's cycles by cumulative time. The machine has 2 cores that other engineers load: the
load average is printed before each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench_head_cycle import ROOT, alternate, child_figures


def child(queued: int, cycles: int, burst: int, profile: bool) -> dict[str, object]:
    """One tree's figures, in this process (its `gpucluster` is whatever PYTHONPATH names)."""
    import random
    import time

    from bench_head_cycle import Clock
    from gpucluster.core.types import Gpu, Node
    from gpucluster.executors.fake import FakeExecutor
    from gpucluster.head.loop import Head
    from gpucluster.head.paths import DataDir
    from gpucluster.models import JobSpec
    from gpucluster.store import Store

    rng = random.Random(18)
    tmp = Path(tempfile.mkdtemp(prefix="bench-submit-cycle-"))
    clock = Clock()
    store = Store(tmp / "state.db")
    gpus = tuple(Gpu(index=i, model="H100", memory_mb=81920, uuid=f"V-{i}") for i in range(8))
    store.put_node(Node(name="n0", gpus=gpus), virtual=True, now=clock.t)

    def one() -> tuple[JobSpec, float]:
        spec = JobSpec.model_validate({"command": ["sleep", "1000"], "gpus": 1, "team": f"t{rng.randrange(4)}"})
        return spec, clock.t

    store.create_jobs([one() for _ in range(queued + 8)])
    head = Head(
        store=store, executor=FakeExecutor(), data_dir=DataDir(tmp / "data"), clock=clock, base_env={"HOME": "/h"}
    )
    head.tick()  # starts 8; the rest wait
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    cpu: list[float] = []
    for _ in range(cycles):
        store.create_jobs([one() for _ in range(burst)])
        clock.t += 0.05
        c0 = time.thread_time()
        if prof is not None:
            prof.enable()
        head.tick()
        if prof is not None:
            prof.disable()
        cpu.append(time.thread_time() - c0)
    if prof is not None:
        import io
        import pstats

        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue(), file=sys.stderr)
    left = len(head.queue.requests())
    store.close()
    s = sorted(cpu)
    return {
        "queued_at_end": left,
        "cycle_cpu_ms_median": round(statistics.median(s) * 1000, 3),
        "cycle_cpu_ms_p95": round(s[round(0.95 * (len(s) - 1))] * 1000, 3),
        "cpu_ms_per_submission": round(sum(s) * 1000 / (cycles * burst), 3),
    }


def run(tree: Path, args: argparse.Namespace) -> dict[str, object]:
    argv = [str(args.queued), str(args.cycles), str(args.burst)]
    if args.profile and tree == ROOT:
        argv.append("--profile")
    return child_figures(__file__, tree, argv, stderr=None)  # the profile goes to stderr


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        queued, cycles, burst = (int(x) for x in sys.argv[2:5])
        print(json.dumps(child(queued, cycles, burst, "--profile" in sys.argv)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="a tree before the change (the parent of its src/)")
    ap.add_argument("--queued", type=int, default=3000)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--burst", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=1, help="baseline/this pairs, alternated")
    ap.add_argument("--profile", action="store_true", help="cProfile this tree's cycles (stderr)")
    args = ap.parse_args()
    print(
        f"1 node x 8 virtual GPUs busy, {args.queued} queued, "
        f"{args.burst} submitted before each of {args.cycles} cycles"
    )
    results = alternate(args.rounds, args.baseline, lambda tree: run(tree, args))
    print("\nfigure                  baseline    this   baseline/this")
    for key in ("cycle_cpu_ms_median", "cycle_cpu_ms_p95", "cpu_ms_per_submission"):
        b = statistics.median(float(x[key]) for x in results["baseline"])  # type: ignore[arg-type]
        t = statistics.median(float(x[key]) for x in results["this"])  # type: ignore[arg-type]
        print(f"{key:22} {b:8.3f} {t:8.3f}   {b / t:5.2f}x")


if __name__ == "__main__":
    main()
