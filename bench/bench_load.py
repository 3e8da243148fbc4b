"""Load: N submissions from C concurrent clients while jobs run; nothing lost, no errors.

  .venv/bin/python bench/bench_load.py [--jobs 10000] [--clients 16] [--baseline-jobs N] [--out r.json]

Each phase starts a fresh head (`gpucluster up --virtual-gpus 8`, auth on, the clients act as
its first cluster admin, which rate limits do not apply to) and runs, in order:

1. load: C client threads, each with its own HTTP connection (httpx), submit their share of N
   jobs (1 GPU, `sleep 0.2`..`sleep 1.0`, seeded), so the scheduler and the executor start and
   reap jobs throughout. After each submission a client makes a read with probability
   --read-ratio: its own recent job (GET /v1/jobs/{id}, 60%), the newest 50 jobs (GET
   /v1/jobs?limit=50, 30%), the whole queue in scheduling order (GET /v1/queue, 5%) or the nodes
   (GET /v1/nodes, 5%). Every request's latency is recorded per operation; an error is any
   exception or any status other than the one the operation expects.
2. check: the whole job list (GET /v1/jobs): every acknowledged job must be there with the name
   and command it was submitted with (else it is lost); jobs nobody got an answer for are counted.
3. drain: --drain-s seconds for jobs to finish on their own; then the C clients cancel every job
   still queued or running, from C threads in every phase (a cancel answered 409 raced with the
   job's end: not an error); then
   every job must reach a terminal state, and none may have failed.

The head's memory is sampled from /proc/PID/status (VmRSS every 0.25 s; VmHWM at the end). The
baseline is the same load from one client (--baseline-jobs, default N) on its own fresh head,
run first; ratios are C clients / 1 client. The machine's load average and how many cores other
work kept busy are printed, since this machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import _head
from bench_submit import machine_busy_s, percentile, proc_cpu_s, source_digest

Result = dict[str, Any]
TERMINAL = {"succeeded", "failed", "cancelled"}
SLEEPS = ("0.2", "0.4", "0.6", "0.8", "1.0")
# operation -> (method, share of reads); submissions are their own operation
READS = (("get", 0.60), ("list50", 0.30), ("queue", 0.05), ("nodes", 0.05))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the head's memory ---------------------------------------------------------------------


def vm_kib(pid: int, key: str) -> int | None:
    """A VmRSS/VmHWM line of /proc/PID/status, in KiB (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler:
    """VmRSS of one process every `every` seconds, in a thread, until stopped."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            rss = vm_kib(self.pid, "VmRSS")
            if rss is not None:
                self.samples.append((time.monotonic() - t0, rss))
            self._stop.wait(self.every)

    def peak_mib(self) -> float | None:
        return round(max(r for _, r in self.samples) / 1024, 1) if self.samples else None


# ---- the load ------------------------------------------------------------------------------


@dataclass
class Tally:
    """What all client threads saw; appended to under one lock."""

    lat_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    acked: dict[int, tuple[str, list[str]]] = field(default_factory=dict)  # id -> (name, command)
    unanswered: int = 0  # submissions that raised or got a non-201 answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def merge(self, lat: dict[str, list[float]], errors: list[str], acked: dict[int, tuple[str, list[str]]]) -> None:
        with self.lock:
            for op, v in lat.items():
                self.lat_ms[op].extend(v)
            self.errors.extend(errors)
            self.acked.update(acked)


def call(c: httpx.Client, op: str, method: str, url: str, ok: int, lat: dict[str, list[float]],
         errors: list[str], **kw: Any) -> httpx.Response | None:  # fmt: skip
    """One timed request; an exception or an unexpected status is an error (None is returned)."""
    t = time.perf_counter()
    try:
        r = c.request(method, url, **kw)
    except httpx.HTTPError as e:
        errors.append(f"{op}: {type(e).__name__}: {e}")
        return None
    lat[op].append((time.perf_counter() - t) * 1000)
    if r.status_code != ok:
        errors.append(f"{op}: {r.status_code}: {r.text[:200]}")
        return None
    return r


def client_loop(head: _head.Head, me: int, count: int, read_ratio: float, seed: int,
                barrier: threading.Barrier, stop: threading.Event, tally: Tally) -> None:  # fmt: skip
    rng = random.Random(seed * 1000 + me)
    lat: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    acked: dict[int, tuple[str, list[str]]] = {}
    mine: list[int] = []
    ops, weights = [op for op, _ in READS], [w for _, w in READS]
    with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
        barrier.wait()
        for i in range(count):
            if stop.is_set():
                break
            name, cmd = f"load-{me}-{i}", ["sleep", rng.choice(SLEEPS)]
            r = call(c, "submit", "POST", "/v1/jobs", 201, lat, errors, json={"name": name, "command": cmd, "gpus": 1})
            if r is None:
                with tally.lock:
                    tally.unanswered += 1
            else:
                jid = int(r.json()["id"])
                acked[jid] = (name, cmd)
                mine.append(jid)
            if rng.random() >= read_ratio:
                continue
            op = rng.choices(ops, weights)[0]
            if op == "get" and mine:
                call(c, op, "GET", f"/v1/jobs/{rng.choice(mine[-50:])}", 200, lat, errors)
            elif op == "list50":
                call(c, op, "GET", "/v1/jobs", 200, lat, errors, params={"limit": 50})
            elif op == "queue":
                call(c, op, "GET", "/v1/queue", 200, lat, errors)
            elif op == "nodes":
                call(c, op, "GET", "/v1/nodes", 200, lat, errors)
    tally.merge(lat, errors, acked)


def run_clients(head: _head.Head, jobs: int, clients: int, read_ratio: float, seed: int, tally: Tally) -> float:
    """The load itself; returns its wall time (from all clients ready to the last answer)."""
    barrier = threading.Barrier(clients + 1)
    stop = threading.Event()
    shares = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(client_loop, head, i, n, read_ratio, seed, barrier, stop, tally) for i, n in enumerate(shares)
        ]
        barrier.wait()
        t0 = time.perf_counter()
        try:
            for f in futures:
                f.result()
        except BaseException:
            stop.set()
            raise
        return time.perf_counter() - t0


def all_jobs(head: _head.Head) -> dict[int, Result]:
    r = httpx.get(f"{head.url}/v1/jobs", headers=head.headers, timeout=300)
    r.raise_for_status()
    return {int(j["id"]): j for j in r.json()["jobs"]}


def check_acked(head: _head.Head, tally: Tally) -> Result:
    """Every acknowledged job is in the head's list with what it was submitted with."""
    jobs = all_jobs(head)
    lost = [
        jid for jid, (name, cmd) in tally.acked.items()
        if jid not in jobs or jobs[jid]["name"] != name or jobs[jid]["spec"]["command"] != cmd
    ]  # fmt: skip
    unacked = sum(1 for jid in jobs if jid not in tally.acked)  # committed, but the client saw an error
    return {"listed": len(jobs), "lost": len(lost), "lost_ids": lost[:20], "listed_not_acknowledged": unacked}


def states(jobs: dict[int, Result]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for j in jobs.values():
        out[j["state"]] += 1
    return dict(out)


def drain(head: _head.Head, tally: Tally, threads: int, drain_s: float, timeout: float) -> Result:
    """Let jobs finish for drain_s, cancel the rest from `threads` clients, wait until all ended."""
    t_end = time.monotonic() + drain_s
    while time.monotonic() < t_end:
        time.sleep(1)
    before = states(all_jobs(head))
    todo = [jid for jid, j in all_jobs(head).items() if j["state"] not in TERMINAL]
    lat: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    raced = 0
    lock = threading.Lock()
    stop = threading.Event()

    def cancel_some(ids: Sequence[int]) -> None:
        nonlocal raced
        my_lat: dict[str, list[float]] = defaultdict(list)
        my_err: list[str] = []
        n_raced = 0
        with httpx.Client(base_url=head.url, headers=head.headers, timeout=60) as c:
            for jid in ids:
                if stop.is_set():
                    break
                r = call(c, "cancel", "POST", f"/v1/jobs/{jid}/cancel", 200, my_lat, my_err)
                if r is None and my_err and my_err[-1].startswith("cancel: 409"):
                    my_err.pop()  # it ended between the listing and the cancel
                    n_raced += 1
        with lock:
            for k, v in my_lat.items():
                lat[k].extend(v)
            errors.extend(my_err)
            raced += n_raced

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        try:
            list(pool.map(cancel_some, [todo[i::threads] for i in range(threads)]))
        except BaseException:
            stop.set()
            raise
    cancel_s = time.perf_counter() - t0
    deadline = time.monotonic() + timeout
    while True:
        jobs = all_jobs(head)
        left = [jid for jid, j in jobs.items() if j["state"] not in TERMINAL]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    with tally.lock:
        for k, v in lat.items():
            tally.lat_ms[k].extend(v)
        tally.errors.extend(errors)
    after = states(jobs)
    return {
        "states_before_cancel": before,
        "cancelled_by_bench": len(todo) - raced,
        "cancel_raced_with_end": raced,
        "cancel_s": round(cancel_s, 1),
        "final_states": after,
        "not_terminal": len(left),
        "not_terminal_ids": left[:20],
        "acked_not_terminal": sum(1 for jid in tally.acked if jobs.get(jid, {}).get("state") not in TERMINAL),
    }


def phase(work: Path, name: str, args: argparse.Namespace, jobs: int, clients: int) -> Result:
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    log(f"{name}: starting a head (logs in {d})")
    head = _head.start(args.gpus, d / "data", d / "head.log")
    res: Result = {"jobs": jobs, "clients": clients}
    try:
        pid = head.proc.pid
        res["head_rss_idle_mib"] = round((vm_kib(pid, "VmRSS") or 0) / 1024, 1)
        tally = Tally()
        load0, busy0, srv0 = os.getloadavg(), machine_busy_s(), proc_cpu_s(pid)
        with RssSampler(pid) as rss:
            seconds = run_clients(head, jobs, clients, args.read_ratio, args.seed, tally)
            busy1, srv1 = machine_busy_s(), proc_cpu_s(pid)
            log(f"{name}: {len(tally.acked)} submissions acknowledged in {seconds:.1f}s; checking")
            res["load"] = {
                "seconds": round(seconds, 1),
                "submissions_per_s": round(len(tally.acked) / seconds, 1),
                "requests_per_s": round(sum(len(v) for v in tally.lat_ms.values()) / seconds, 1),
                "loadavg_before": [round(x, 2) for x in load0],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "machine_cores_busy": round((busy1 - busy0) / seconds, 2),
                "head_cores_busy": round(((srv1 or 0) - (srv0 or 0)) / seconds, 2),
                "head_rss_peak_during_load_mib": rss.peak_mib(),
            }
            res["check"] = check_acked(head, tally)
            # Cancels come from --clients threads in every phase: ending the jobs is not the load.
            res["drain"] = drain(head, tally, args.clients, args.drain_s, args.wait_timeout)
        res["head_rss_end_mib"] = round((vm_kib(pid, "VmRSS") or 0) / 1024, 1)
        res["head_hwm_mib"] = round((vm_kib(pid, "VmHWM") or 0) / 1024, 1)
        res["head_rss_peak_mib"] = rss.peak_mib()
        res["rss_samples"] = len(rss.samples)
        res["latency_ms"] = {
            op: {
                "n": len(v),
                "p50": round(percentile(v, 50), 1),
                "p90": round(percentile(v, 90), 1),
                "p99": round(percentile(v, 99), 1),
                "max": round(max(v), 1),
            }
            for op, v in sorted(tally.lat_ms.items())
            if v
        }
        res["acknowledged"] = len(tally.acked)
        res["unanswered_submissions"] = tally.unanswered
        res["errors"] = len(tally.errors)
        res["first_errors"] = tally.errors[:10]
        res["head_problems"] = head.log_problems()
        alive = head.proc.poll() is None
        res["head_alive_at_end"] = alive
    finally:
        head.stop()
        res["job_groups_left_running"] = head.jobs_left_running
        res["unkillable_job_groups"] = head.unkillable
        if not args.keep:
            shutil.rmtree(d / "data", ignore_errors=True)
    log(f"{name}: {brief(res)}")
    return res


def brief(r: Result) -> str:
    lat = r.get("latency_ms", {}).get("submit", {})
    return (
        f"{r.get('load', {}).get('submissions_per_s')} submissions/s, submit p50 {lat.get('p50')} ms p99"
        f" {lat.get('p99')} ms, errors {r.get('errors')}, lost {r.get('check', {}).get('lost')}, not ended"
        f" {r.get('drain', {}).get('not_terminal')}, head peak RSS {r.get('head_rss_peak_mib')} MiB"
    )


def failures(r: Result) -> list[str]:
    out = []
    if r.get("errors"):
        out.append(f"{r['errors']} errors, e.g. {r['first_errors'][:3]}")
    if r.get("check", {}).get("lost"):
        out.append(f"{r['check']['lost']} acknowledged jobs lost: {r['check']['lost_ids']}")
    d = r.get("drain", {})
    if d.get("not_terminal"):
        out.append(f"{d['not_terminal']} jobs never ended: {d['not_terminal_ids']}")
    if d.get("final_states", {}).get("failed"):
        out.append(f"{d['final_states']['failed']} jobs failed")
    if r.get("acknowledged") != r.get("jobs"):
        out.append(f"only {r.get('acknowledged')} of {r.get('jobs')} submissions acknowledged")
    if r.get("unkillable_job_groups"):
        out.append(f"job process groups survived SIGKILL: {r['unkillable_job_groups']}")
    return out


def print_table(base: Result | None, load: Result) -> None:
    cols: list[tuple[str, Result]] = [("1 client", base)] if base is not None else []
    cols.append((f"{load['clients']} clients", load))
    rows: list[tuple[str, list[Any]]] = [
        ("jobs submitted", [r["jobs"] for _, r in cols]),
        ("load seconds", [r["load"]["seconds"] for _, r in cols]),
        ("submissions/s", [r["load"]["submissions_per_s"] for _, r in cols]),
        ("requests/s (all ops)", [r["load"]["requests_per_s"] for _, r in cols]),
    ]
    ops = sorted({op for _, r in cols for op in r["latency_ms"]})
    for op in ops:
        for q in ("p50", "p90", "p99", "max"):
            rows.append((f"{op} {q} ms (n={'/'.join(str(r['latency_ms'].get(op, {}).get('n', 0)) for _, r in cols)})",
                         [r["latency_ms"].get(op, {}).get(q) for _, r in cols]))  # fmt: skip
    rows += [
        ("errors", [r["errors"] for _, r in cols]),
        ("lost acknowledged jobs", [r["check"]["lost"] for _, r in cols]),
        ("succeeded on their own", [r["drain"]["final_states"].get("succeeded", 0) for _, r in cols]),
        ("cancelled at the end", [r["drain"]["final_states"].get("cancelled", 0) for _, r in cols]),
        ("failed", [r["drain"]["final_states"].get("failed", 0) for _, r in cols]),
        ("never ended", [r["drain"]["not_terminal"] for _, r in cols]),
        ("head RSS idle MiB", [r["head_rss_idle_mib"] for _, r in cols]),
        ("head RSS peak MiB (sampled)", [r["head_rss_peak_mib"] for _, r in cols]),
        ("head VmHWM MiB", [r["head_hwm_mib"] for _, r in cols]),
        ("head cores busy", [r["load"]["head_cores_busy"] for _, r in cols]),
        ("machine cores busy", [r["load"]["machine_cores_busy"] for _, r in cols]),
        ("load average (1 min) before/after", [_loadavg(r) for _, r in cols]),
    ]  # fmt: skip
    w = max(len(n) for n, _ in rows)
    print(f"\n{'metric':<{w}}  " + "  ".join(f"{n:>12}" for n, _ in cols) + ("  ratio" if len(cols) == 2 else ""))
    for name, vals in rows:
        ratio = ""
        if len(vals) == 2 and all(isinstance(v, int | float) for v in vals) and vals[0]:
            ratio = f"  {vals[1] / vals[0]:.2f}"
        print(f"{name:<{w}}  " + "  ".join(f"{'-' if v is None else v!s:>12}" for v in vals) + ratio)


def _loadavg(r: Result) -> str:
    return f"{r['load']['loadavg_before'][0]}/{r['load']['loadavg_after'][0]}"


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10_000, help="submissions in the concurrent run (default 10000)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--baseline-jobs", type=int, help="submissions from one client first (default: --jobs; 0: skip)")
    p.add_argument("--read-ratio", type=float, default=0.2, help="a read after this share of submissions (0.2)")
    p.add_argument("--gpus", type=int, default=8, help="virtual GPUs of the head (default 8)")
    p.add_argument("--drain-s", type=float, default=10, help="seconds jobs may finish before the rest is cancelled")
    p.add_argument("--wait-timeout", type=float, default=180, help="seconds for every job to end after the cancels")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", type=Path, help="head data dirs and logs (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the heads' data dirs")
    p.add_argument("--out", type=Path, help="also write every figure as JSON here")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    base_jobs = args.jobs if args.baseline_jobs is None else args.baseline_jobs
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpucluster-load-"))
    work.mkdir(parents=True, exist_ok=True)
    digest = source_digest()
    out: Result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gpucluster_src_sha256": digest,
    }
    problems: list[str] = []
    try:
        if base_jobs > 0:
            out["baseline"] = phase(work, "clients-1", args, base_jobs, 1)
            problems += [f"1 client: {f}" for f in failures(out["baseline"])]
        out["load"] = phase(work, f"clients-{args.clients}", args, args.jobs, args.clients)
        problems += [f"{args.clients} clients: {f}" for f in failures(out["load"])]
    except (_head.HeadError, httpx.HTTPError, OSError) as e:
        problems.append(f"{type(e).__name__}: {e}")
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if source_digest() != digest:
        problems.append("note: gpucluster's sources changed during the run")
    out["problems"] = problems
    if "load" in out:
        print_table(out.get("baseline"), out["load"])
    for msg in problems:
        print(f"PROBLEM: {msg}")
    if not problems:
        print("no errors, no lost jobs, every job ended")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.out}")
    with contextlib.suppress(OSError):
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work)
    return 1 if any(not m.startswith("note:") for m in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
