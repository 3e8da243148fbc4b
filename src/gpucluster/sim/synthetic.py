"""A seeded synthetic workload of any size, shaped like Philly, written as a native CSV.

Why: planning for 100,000 GPUs needs workloads far larger than any public trace. Job sizes and
run times are drawn from a real trace when one is given (resampling its (GPUs, run time) pairs
keeps their correlation: big jobs run longer), else from Philly's published marginals: 93% of
jobs on 1 GPU, run times log-normal with a 19-minute median and a ~3-day p99. Arrivals are a
Poisson process whose rate gives the requested load on the requested GPUs; teams follow a Zipf
law, as Philly's virtual clusters do (one submits half the jobs).
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path

from gpucluster.sim.workload import TraceJob

# Philly 2017-09..11: jobs per GPU count (../shared/traces/README.md and the file itself).
PHILLY_GPUS = {1: 69294, 2: 1530, 4: 1687, 8: 1444, 12: 7, 16: 162, 24: 6, 32: 37}
PHILLY_MEDIAN_S = 19 * 60.0
PHILLY_P99_S = 3 * 86400.0

Draw = Callable[[], tuple[float, int]]  # -> (run time in seconds, GPUs)


def generate(
    path: Path,
    jobs: int,
    gpus: int,
    load: float = 0.8,
    seed: int = 0,
    teams: int = 50,
    shape: Sequence[TraceJob] | None = None,
) -> Path:
    """Write `jobs` jobs to `path` (native CSV: submit_time, duration, gpus, team)."""
    rng = random.Random(f"{seed}/synthetic")
    draw = _resampler(shape, rng) if shape else _philly_marginals(rng)
    sizes = [draw() for _ in range(jobs)]
    mean_gpu_s = math.fsum(d * g for d, g in sizes) / max(1, jobs)
    rate = load * gpus / mean_gpu_s  # jobs per second
    zipf = list(accumulate(1.0 / (k + 1) ** 1.1 for k in range(teams)))
    t = 0.0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_time", "duration", "gpus", "team"])
        for duration, size in sizes:
            t += rng.expovariate(rate)
            team = bisect.bisect_right(zipf, rng.random() * zipf[-1])
            w.writerow([f"{t:.3f}", f"{duration:.1f}", size, f"team{min(team, teams - 1):02d}"])
    return path


def _resampler(shape: Sequence[TraceJob], rng: random.Random) -> Draw:
    pairs = [(j.duration, max(1, round(j.gpus))) for j in shape]

    def draw() -> tuple[float, int]:
        return pairs[rng.randrange(len(pairs))]

    return draw


def _philly_marginals(rng: random.Random) -> Draw:
    sizes = list(PHILLY_GPUS)
    cum = list(accumulate(PHILLY_GPUS.values()))
    mu = math.log(PHILLY_MEDIAN_S)
    sigma = (math.log(PHILLY_P99_S) - mu) / 2.326

    def draw() -> tuple[float, int]:
        size = sizes[bisect.bisect_right(cum, rng.random() * cum[-1])]
        return max(1.0, round(rng.lognormvariate(mu, sigma))), size

    return draw
