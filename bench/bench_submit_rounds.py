"""Submissions/s and the head's CPU per submission, this tree against a baseline tree, in
alternated rounds (issue 18).

Why rounds: on this shared 2-core machine one rate run of the same tree moved 21-146/s between
runs under load, so a single pair of runs says nothing. Here each round runs bench_submit's rate
phase (N `sleep 1000` jobs, 1 GPU, 8 GPUs: all but 8 queue) for both trees, each on a fresh head,
with 1 client (one reused connection) and with --clients clients; the order of the two trees
alternates between rounds so that a load that drifts hurts both alike. Reported: the median over
rounds of submissions/s, of the head's CPU per accepted submission (the head process's own
/proc ticks over the run: load disturbs it less than the rate, since it counts work, not waits),
and of its event loop's (main thread's) CPU per submission, the request path without the
scheduling cycles each submission wakes; with this tree / baseline ratios.

Run: `PYTHONPATH=src:bench python bench/bench_submit_rounds.py --baseline /work/main/src
[--rounds 5] [--jobs 1000] [--clients 8]`
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import _head
import bench_submit


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the head's main thread: its event loop, where every request is parsed,
    routed, authenticated, validated and answered (the store's commit is on the writer thread,
    the scheduling cycles on the loop's): the request path's own share, apart from the cycles
    each submission wakes."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(work: Path, name: str, src: Path | None, jobs: int, clients: int) -> dict[str, float]:
    """One rate run on a fresh head: submissions/s, head CPU ms per submission, other cores busy."""
    report: dict[str, object] = {}
    with bench_submit.Phase(work, name, 8, report, src=src) as head:
        bench_submit.gc_rate(head, 20, 1)  # warm: first request's imports and statement caches
        loop0 = main_thread_cpu_s(head.proc.pid)
        r = bench_submit.gc_rate(head, jobs, clients)
        loop1 = main_thread_cpu_s(head.proc.pid)
    if r["errors"]:
        raise _head.HeadError(f"{name}: {r['errors']} submissions failed: {r['first_errors']}")
    return {
        "rate": float(r["jobs_per_s"]),
        "cpu_ms": 1000 * float(r["server_cores_busy"]) * float(r["seconds"]) / int(r["accepted"]),
        "event_loop_ms": 1000 * (loop1 - loop0) / int(r["accepted"]),
        "other": float(r["other_cores_busy"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="the baseline checkout's src dir")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1000, help="submissions per rate run (default 1000)")
    p.add_argument("--clients", type=int, default=8, help="clients of the second rate run (default 8)")
    args = p.parse_args()
    here = Path(__file__).resolve().parent.parent / "src"
    trees = {"this": here, "base": args.baseline.resolve()}
    work = Path(tempfile.mkdtemp(prefix="bench-rounds-"))
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} cores; load before {os.getloadavg()}")
    print(f"this: {here}; base: {trees['base']}; {args.jobs} submissions per run, {args.rounds} rounds")
    try:
        for n in range(args.rounds):
            order = ["this", "base"] if n % 2 == 0 else ["base", "this"]
            for tree in order:
                for clients in (1, args.clients):
                    r = one_run(work, f"{tree}-{clients}-{n}", trees[tree], args.jobs, clients)
                    runs.setdefault((tree, clients), []).append(r)
                    print(
                        f"round {n} {tree:4} {clients} client(s): {r['rate']:7.1f}/s  head CPU {r['cpu_ms']:.3f}"
                        f" ms/submission, its event loop {r['event_loop_ms']:.3f}  other cores busy"
                        f" {r['other']:.2f}  load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load after {os.getloadavg()}")
    print(f"{'figure (median of rounds)':44} {'this':>9} {'base':>9} {'this/base':>9}")
    for clients in (1, args.clients):
        for key, what in (
            ("rate", "submissions/s"),
            ("cpu_ms", "head CPU ms/submission"),
            ("event_loop_ms", "event loop CPU ms/submission"),
        ):
            this = statistics.median(r[key] for r in runs[("this", clients)])
            base = statistics.median(r[key] for r in runs[("base", clients)])
            print(f"{f'{what}, {clients} client(s)':44} {this:9.3f} {base:9.3f} {this / base:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
