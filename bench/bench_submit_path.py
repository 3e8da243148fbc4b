"""The API's CPU per POST /v1/jobs on its event loop, a baseline tree beside this one (issue 18).

  PYTHONPATH=src:bench python bench/bench_submit_path.py --baseline DIR [--rounds 5] [--jobs 2000]

Why: the submit-rate runs (bench_submit_rounds.py) measure through uvicorn, sockets and an httpx
client sharing two loaded cores with other engineers' work, and one tree's rate moves 2-3x run
to run. This measures only the part of a submission the API's code decides: the ASGI app that
`gpucluster up` serves (create_app: body limit, audit log, routing, auth, validation, the
handler, the answer), driven in process with prebuilt ASGI messages, no socket and no client. A
root head's checks included (it runs as root here, so `check_can_run` asks pwd as `up` does).
The store is real (SQLite, group commit by the submit batcher's writer thread); the head's
scheduling loop is not running (its wake is only set), so the figure is the request path alone.

Figures, per tree, each round a fresh process, the trees alternating which goes first:
- event loop CPU per submission (`time.thread_time` on the loop's thread): the request path;
- process CPU per submission (`time.process_time`): plus the writer's insert and commit;
with 1 client (each submission awaited before the next) and 8 (eight tasks at once). CPU time,
not rate: other processes on the machine slow it less than they slow a rate (they still cost
caches and a little of each tick), which is why it is the figure to compare under load. Medians
over rounds and this / baseline ratios; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BODY = b'{"command": ["sleep", "1000"], "gpus": 1}'


def child(jobs: int, clients: int) -> dict[str, float]:
    """One tree's figures, in this process (its `gpucluster` is whatever PYTHONPATH names)."""
    import asyncio
    import tempfile
    import time

    from gpucluster.api.app import create_app
    from gpucluster.auth.control import AccessControl
    from gpucluster.core.types import Gpu, Node
    from gpucluster.executors.fake import FakeExecutor
    from gpucluster.head.loop import Head
    from gpucluster.head.paths import DataDir
    from gpucluster.head.service import ClusterService
    from gpucluster.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="bench-submit-path-"))
    store = Store(tmp / "state.db")
    gpus = tuple(Gpu(index=i, model="H100", memory_mb=81920, uuid=f"V-{i}") for i in range(8))
    store.put_node(Node(name="n0", gpus=gpus), virtual=True, now=time.time())
    head = Head(store=store, executor=FakeExecutor(), data_dir=DataDir(tmp / "data"), clock=time.time)
    service = ClusterService(head)
    access = AccessControl(store, time.time, rate_per_s=0.0)  # a root head: runs jobs as their submitters
    admin = access.bootstrap("root", None)  # a cluster admin, as bench_submit's head token is
    assert admin is not None
    app: Any = create_app(service, access)
    headers = [
        (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {admin}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ]

    async def submit() -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "root_path": "",
            "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        }  # fmt: skip
        sent = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": BODY, "more_body": False}
            await asyncio.Event().wait()  # as a kept-alive connection: nothing more
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])

        await app(scope, receive, send)
        if status != 201:
            raise RuntimeError(f"POST /v1/jobs answered {status}")

    async def run(n: int, width: int) -> None:
        async def stream(count: int) -> None:
            for _ in range(count):
                await submit()

        await asyncio.gather(*(stream(n // width) for _ in range(width)))

    async def measure() -> dict[str, float]:
        await run(50, 1)  # warm: imports, statement caches, the cached identity
        n = (jobs // clients) * clients
        loop0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        await run(n, clients)
        loop1, proc1, wall1 = time.thread_time(), time.process_time(), time.perf_counter()
        return {
            "loop_us": 1e6 * (loop1 - loop0) / n,
            "process_us": 1e6 * (proc1 - proc0) / n,
            "per_s": n / (wall1 - wall0),
        }

    try:
        try:
            import uvloop  # what uvicorn runs the head's event loop on, where installed
        except ImportError:
            return asyncio.run(measure())
        return uvloop.run(measure())
    finally:
        service.close()
        store.close()


def run_child(src: Path, jobs: int, clients: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{src.resolve()}{os.pathsep}{HERE}"}
    argv = [sys.executable, __file__, "--child", "--jobs", str(jobs), "--clients", str(clients)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{src}: exit {out.returncode}\n{out.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, help="the baseline checkout's src dir")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=2000, help="submissions per run (default 2000)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--clients", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.jobs, args.clients)))
        return 0
    if args.baseline is None:
        p.error("--baseline is required")
    trees = {"this": HERE.parent / "src", "base": args.baseline}
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} cores; load before {os.getloadavg()}", flush=True)
    print(f"this: {trees['this']}; base: {trees['base']}; {args.jobs} submissions per run", flush=True)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        order = ["this", "base"] if r % 2 == 0 else ["base", "this"]
        for name in order:
            for clients in (1, 8):
                f = run_child(trees[name], args.jobs, clients)
                results.setdefault((name, clients), []).append(f)
                print(
                    f"round {r} {name} {clients} client(s): event loop {f['loop_us']:.0f} us, process "
                    f"{f['process_us']:.0f} us per submission ({f['per_s']:.0f}/s)  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    print(f"load after {os.getloadavg()}")
    print(f"{'figure (median of rounds)':48s}{'this':>10s}{'base':>10s}{'this/base':>10s}")
    for clients in (1, 8):
        for key, label in (("loop_us", "event loop CPU us/submission"), ("process_us", "process CPU us/submission")):
            a = statistics.median(f[key] for f in results[("this", clients)])
            b = statistics.median(f[key] for f in results[("base", clients)])
            print(f"{label + f', {clients} client(s)':48s}{a:10.1f}{b:10.1f}{a / b:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
