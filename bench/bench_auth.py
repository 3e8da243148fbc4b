"""What authentication costs per API call: the same routes, with their access rule and with it
switched to public, side by side in one process (real app, real SQLite store, fake executor).

Baseline: the route's own handler with no token check (rule `public`). Measured: the route with
its real rule (token digest + cached identity + rate limit, and for job routes the job's team
lookup), and the same with the identity cache cleared before every call (a SQLite lookup of the
token each time: what the cache saves).

    .venv/bin/python bench/bench_auth.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from gpucluster.api.app import create_app
from gpucluster.auth.control import AccessControl
from gpucluster.auth.rules import ACCESS_KEY, Rule
from gpucluster.core.types import Gpu, Node
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.service import ClusterService
from gpucluster.store import Store


def per_call_us(cases: list[Callable[[], int]], calls: int, rounds: int = 7) -> list[float]:
    """Microseconds per call of each case, median over rounds that interleave the cases, so a
    load change on this shared machine hits all of them alike."""
    for fn in cases:
        for _ in range(50):
            fn()
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for i, fn in enumerate(cases):
            start = time.perf_counter()
            for _ in range(calls // rounds):
                status = fn()
                assert status < 400, status
            samples[i].append((time.perf_counter() - start) / (calls // rounds) * 1e6)
    return [statistics.median(s) for s in samples]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    store = Store(tmp / "state.db")
    gpus = tuple(Gpu(index=i, model="H100-80GB", memory_mb=81920, uuid=f"GPU-{i}") for i in range(8))
    store.put_node(Node("n1", gpus), virtual=True, now=time.time())
    head = Head(store=store, executor=FakeExecutor(), data_dir=DataDir(tmp), clock=time.time, base_env={})
    service = ClusterService(head)
    access = AccessControl(store, time.time, rate_per_s=0, run_as_submitter=False)
    access.bootstrap("root", None)
    _, member, _ = access.add_user("alice", ["vision"], "member", None, None)
    guarded = TestClient(create_app(service, access))
    open_app = create_app(service, access)
    public = TestClient(open_app)
    for route in open_app.app.app.routes:  # type: ignore[attr-defined]  # BodyLimit(AuditLog(FastAPI))
        if getattr(route, "openapi_extra", None):
            route.openapi_extra = {ACCESS_KEY: Rule.PUBLIC.value}
    auth = {"Authorization": f"Bearer {member}"}
    job = guarded.post("/v1/jobs", json={"command": ["true"]}, headers=auth).json()["id"]

    def cold(path: str) -> Callable[[], int]:
        def call() -> int:
            access._changed()  # forget cached identities: every call looks its token up in SQLite
            return guarded.get(path, headers=auth).status_code

        return call

    print(f"{args.calls} sequential calls per case, in process (TestClient), cases interleaved in 7 rounds;")
    print("microseconds per call, median of the rounds")
    print(f"{'route':<22} {'public (baseline)':>18} {'with its rule':>14} {'ratio':>6} {'no cache':>9} {'ratio':>6}")
    for path in ("/v1/nodes", f"/v1/jobs/{job}"):
        base, ruled, uncached = per_call_us(
            [
                lambda p=path: public.get(p).status_code,  # type: ignore[misc]
                lambda p=path: guarded.get(p, headers=auth).status_code,  # type: ignore[misc]
                cold(path),
            ],
            args.calls,
        )
        name = path if "jobs" not in path else "/v1/jobs/{id}"
        print(f"{name:<22} {base:>18.0f} {ruled:>14.0f} {ruled / base:>6.2f} {uncached:>9.0f} {uncached / base:>6.2f}")
    service.close()
    store.close()


if __name__ == "__main__":
    main()
