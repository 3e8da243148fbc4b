"""CPU of a lone submission's store transaction, this tree against a baseline tree (issue 18).

Why: a lone client's submission is one transaction of its own (BEGIN, lease check, INSERT ...
RETURNING, the event's INSERT, COMMIT with its fsync), and its CPU, unlike a rate, can be read on
a loaded machine: each measurement is `time.process_time()` around N one-row
`Store.create_jobs_each` calls (what the submit writer runs) in a fresh process on a fresh SQLite
file. Pairs of processes, the order alternating, one per tree; reported: the median per tree and
the median of the pairs' ratios.

Run: `PYTHONPATH=src python bench/bench_submit_insert.py --baseline /work/main/src [--pairs 6] [--n 200]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import statistics, sys, tempfile, time
from pathlib import Path
from gpucluster.models import JobSpec
from gpucluster.store import Store

n = int(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    store = Store(Path(d) / "state.db")
    spec = JobSpec(command=["sleep", "1000"], gpus=1)
    for _ in range(50):  # warm: statement caches, the first pages
        store.create_jobs_each([(spec, 1.0)], ["u"])
    per = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            store.create_jobs_each([(spec, 1.0)], ["u"])
        per.append((time.process_time() - t) / n * 1e6)
    store.close()
print(statistics.median(per))
"""


def one(src: Path, n: int) -> float:
    """Microseconds of CPU per one-row submission transaction, in a fresh process on `src`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="the baseline checkout's src dir")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--n", type=int, default=200, help="transactions per measurement (default 200)")
    args = p.parse_args()
    trees = {"this": Path(__file__).resolve().parent.parent / "src", "base": args.baseline.resolve()}
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} cores; load before {os.getloadavg()}")
    got: dict[str, list[float]] = {"this": [], "base": []}
    ratios = []
    for n in range(args.pairs):
        pair = {}
        for tree in ("this", "base") if n % 2 == 0 else ("base", "this"):
            pair[tree] = one(trees[tree], args.n)
            got[tree].append(pair[tree])
        ratios.append(pair["this"] / pair["base"])
        print(
            f"pair {n}: this {pair['this']:.0f} us, base {pair['base']:.0f} us, this/base {ratios[-1]:.2f}", flush=True
        )
    print(f"load after {os.getloadavg()}")
    this, base = statistics.median(got["this"]), statistics.median(got["base"])
    print(f"CPU per lone submission transaction, median: this {this:.0f} us, base {base:.0f} us ({this / base:.2f}x);")
    lower = sum(r < 1 for r in ratios)
    print(f"median of the pairs' ratios {statistics.median(ratios):.2f}; this lower in {lower} of {len(ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
