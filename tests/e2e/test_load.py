"""A short load test (bench/bench_load.py is the long one): 1,000 submissions from 16 concurrent
clients, each its own HTTP connection, with reads mixed in, while jobs start and end on the 8
virtual GPUs. Zero errors, every acknowledged job exists as submitted, and every job ends: on
its own or cancelled after the load. Correctness only: no timing is asserted."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.headproc import HeadProcess, wait_for

CLIENTS, JOBS = 16, 1000
TERMINAL = {"succeeded", "failed", "cancelled"}


def test_1000_submissions_from_16_clients_lose_nothing_and_every_job_ends(head: HeadProcess, tmp_path: Path) -> None:
    acked: dict[int, str] = {}  # job id -> name
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(me: int) -> None:
        rng = random.Random(me)
        mine: dict[int, str] = {}
        bad: list[str] = []
        with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
            barrier.wait()
            for i in range(JOBS // CLIENTS + (me < JOBS % CLIENTS)):
                name = f"load-{me}-{i}"
                body = {"name": name, "command": ["true"], "gpus": 1, "workdir": str(tmp_path)}
                try:
                    r = c.post("/v1/jobs", json=body)
                    if r.status_code == 201:
                        mine[int(r.json()["id"])] = name
                    else:
                        bad.append(f"submit {r.status_code}: {r.text[:200]}")
                    if rng.random() < 0.2:  # a read now and then, as users do
                        own = f"/v1/jobs/{rng.choice(list(mine)[-50:])}" if mine else "/v1/jobs?limit=1"
                        path = rng.choice([own, own, "/v1/jobs?limit=50", "/v1/queue", "/v1/nodes"])
                        r = c.get(path)
                        if r.status_code != 200:
                            bad.append(f"GET {path} {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    bad.append(f"{type(e).__name__}: {e}")
        with lock:
            acked.update(mine)
            errors.extend(bad)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    assert errors == [], errors[:10]
    assert len(acked) == JOBS

    with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
        jobs = {j["id"]: j for j in c.get("/v1/jobs").raise_for_status().json()["jobs"]}
        lost = [jid for jid, name in acked.items() if jobs.get(jid, {}).get("name") != name]
        assert lost == [] and len(jobs) == JOBS, (lost[:10], len(jobs))
        # What has not run yet is cancelled (a job that ended meanwhile answers 409).
        left = [jid for jid, j in jobs.items() if j["state"] not in TERMINAL]

    def cancel(ids: list[int]) -> list[str]:
        with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
            codes = [(jid, c.post(f"/v1/jobs/{jid}/cancel")) for jid in ids]
        return [f"cancel {jid}: {r.status_code} {r.text[:200]}" for jid, r in codes if r.status_code not in (200, 409)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        cancel_errors = [e for errs in pool.map(cancel, [left[i::CLIENTS] for i in range(CLIENTS)]) for e in errs]
    assert cancel_errors == [], cancel_errors[:10]

    def ended() -> dict[int, str] | None:
        r = httpx.get(f"{head.url}/v1/jobs", headers=head.headers, timeout=60)
        states = {j["id"]: j["state"] for j in r.raise_for_status().json()["jobs"]}
        return states if all(s in TERMINAL for s in states.values()) else None

    states = wait_for(ended, timeout=60, interval=0.5, what="every job ended")
    assert sorted(states) == sorted(acked)
    assert "failed" not in states.values(), [j for j, s in states.items() if s == "failed"][:10]
    assert "succeeded" in states.values()  # jobs ran during the load
