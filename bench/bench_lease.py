"""What the one-head lease costs and how fast it reacts (store/lease.py), on SQLite and PostgreSQL.

- the check each write transaction makes (a primary-key SELECT of the lease row and its JSON),
  timed alone inside one transaction, against a whole small write (update_job) for scale;
- how long a second head's claim takes to take over a lease its holder stopped renewing;
- the first renewal after a PostgreSQL restart (the pool's stale connections are replaced).

Needs PostgreSQL's server binaries (tests/pgserver.py starts a private server).
Run from the repository root: PYTHONPATH=src:. python bench/bench_lease.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.pgserver import find_bindir, start_server

from gpucluster.core.states import JobState
from gpucluster.models import JobSpec
from gpucluster.store import Store
from gpucluster.store.lease import Holder

CHECKS = 2000
WRITES = 500


def per_call_us(target: Path | str) -> tuple[float, float]:
    """Median microseconds of one lease check, and of one update_job write with the check."""
    s = Store(target)
    try:
        s.claim(Holder("bench", 1, "/bench"), duration_s=600)
        checks = []
        for _ in range(5):
            with s._writer.begin() as c:
                t = time.perf_counter()
                for _ in range(CHECKS):
                    s._check_lease(c)
                checks.append((time.perf_counter() - t) / CHECKS * 1e6)
        job = s.create_job(JobSpec(command=["true"], gpus=1), 1.0)  # type: ignore[call-arg]
        t = time.perf_counter()
        for i in range(WRITES):
            s.update_job(job, JobState.QUEUED, reason=f"r{i}")
        write = (time.perf_counter() - t) / WRITES * 1e6
        return statistics.median(checks), write
    finally:
        s.close()


def main() -> None:
    bindir = find_bindir()
    if bindir is None:
        sys.exit("needs PostgreSQL's server binaries (apt-get install postgresql)")
    server = start_server(bindir)
    try:
        for name, target in (("sqlite", Path(tempfile.mkdtemp()) / "s.db"), ("postgresql", server.create_database())):
            check, write = per_call_us(target)
            print(f"{name}: lease check {check:.0f} us per write transaction; a whole update_job write {write:.0f} us")
        url = server.create_database()
        old, new = Store(url), Store(url)
        try:
            old.claim(Holder("host-a", 1, "/a"), duration_s=3)
            t = time.monotonic()
            new.claim(Holder("host-b", 2, "/b"), duration_s=3)
            print(f"takeover of a 3 s lease its holder stopped renewing: {time.monotonic() - t:.2f} s")
            server.shutdown()
            server.start_again()
            t = time.monotonic()
            new.renew()
            print(f"first renewal after a PostgreSQL restart: {(time.monotonic() - t) * 1000:.0f} ms")
        finally:
            old.close()
            new.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
