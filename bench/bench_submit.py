"""Submit latency and submit throughput: gpucluster vs a real Slurm, side by side, on this machine.

  .venv/bin/python bench/bench_submit.py [--jobs 5000] [--latency-jobs 200] [--out results.json]

Measured for each system, each phase on a freshly started cluster with 8 GPUs (gpucluster:
one node with 8 virtual GPUs; Slurm: 2 nodes x 4 fake GPUs, /work/shared/peers/slurm):

1. submit -> running latency of trivial 1-GPU jobs (`true`). Jobs arrive as a Poisson stream at
   --latency-rate jobs/s (seeded), not one right after another: Slurm schedules in passes a few
   seconds apart, and a closed loop would lock onto that rhythm and measure it, not the latency a
   job sees. The rate must stay low enough that jobs never wait for a GPU; the peak number of
   jobs running at once is reported to show they did not.
   gpucluster: from time.time() just before the POST to the job's started_at (set by the head).
   Slurm: from time.time() just before sbatch to StartTime in the jobcomp log (whole seconds,
   truncated), and to the millisecond "sched: Allocate JobId=N" line of slurmctld.log.
2. submissions accepted per second: N jobs asking for 1 GPU and running `sleep 1000`, so all but
   8 just queue; from one client, then from --clients threads (each its own HTTP connection for
   gpucluster, its own sbatch processes for Slurm). Afterwards Slurm's queue is scancel'ed; the
   head is stopped and the 8 jobs it leaves running (gpucluster jobs outlive their head by design)
   are ended through their process groups.

Client and servers share this machine's cores, so the figures are for this machine only. Each
phase records how many cores other processes kept busy meanwhile (from /proc/stat) and the
output flags figures taken on a busy machine. Ratios are gpucluster/Slurm.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import _head
import slurm_peer
from gpucluster.client import Client

Result = dict[str, Any]
TERMINAL = {"succeeded", "failed", "cancelled"}


# ---- generic measurement -------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, no interpolation; with 200
    samples p50 is the 100th and p99 the 198th smallest."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def peak_concurrency(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at one instant: how many GPUs the latency jobs held at most."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def poisson_submit(
    n: int, rate: float, seed: int, submit: Callable[[], tuple[int, float]], load: Result
) -> list[tuple[int, float]]:
    """Call submit() n times at Poisson arrival times; returns (job id, submit wall time) pairs.

    Arrival times are absolute, so a slow submit call does not stretch the whole schedule.
    Stores in `load` how many cores the whole machine kept busy meanwhile (the benchmark itself
    needs only a few percent at these rates, so much more means other work disturbed it).
    """
    t0, busy0 = time.monotonic(), machine_busy_s()
    rng = random.Random(seed)
    due = time.monotonic()
    out = []
    for _ in range(n):
        due += rng.expovariate(rate)
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        out.append(submit())
    load["machine_cores_busy"] = round((machine_busy_s() - busy0) / (time.monotonic() - t0), 2)
    return out


def proc_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user+system) a process has used: shows whether the server was the bottleneck."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all processes on this machine have used (/proc/stat), to see who else ran."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def client_cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the sbatch processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class RateRun:
    jobs: int
    clients: int
    seconds: float
    call_ms: list[float]  # duration of each accepted submit call
    errors: list[str]
    client_cpu_s: float
    server_cpu_s: float | None
    machine_cpu_s: float

    def result(self) -> Result:
        ok = len(self.call_ms)
        return {
            "jobs": self.jobs,
            "clients": self.clients,
            "accepted": ok,
            "errors": len(self.errors),
            "first_errors": self.errors[:5],
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(ok / self.seconds, 1) if self.seconds > 0 else None,
            "call_ms_p50": round(percentile(self.call_ms, 50), 2) if ok else None,
            "call_ms_p99": round(percentile(self.call_ms, 99), 2) if ok else None,
            # cores busy on average during the run; this machine has os.cpu_count() of them
            "client_cores_busy": round(self.client_cpu_s / self.seconds, 2),
            "server_cores_busy": None if self.server_cpu_s is None else round(self.server_cpu_s / self.seconds, 2),
            # cores busy with anything else on the machine: well above 0 means the run was disturbed
            "other_cores_busy": round(
                (self.machine_cpu_s - self.client_cpu_s - (self.server_cpu_s or 0)) / self.seconds, 2
            ),
        }


def submit_rate(
    n: int, clients: int, make_submit: Callable[[], Callable[[], None]], server_pid: int | None = None
) -> RateRun:
    """n submissions split over `clients` threads, each with its own submitter (connection).

    Timed from the moment all threads are ready (a barrier) to the last answer.
    """
    barrier = threading.Barrier(clients + 1)
    call_ms: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()  # set when the main thread is interrupted, so workers quit early

    def worker(count: int) -> None:
        submit = make_submit()
        mine: list[float] = []
        barrier.wait()
        for _ in range(count):
            if stop.is_set():
                return
            t = time.perf_counter()
            try:
                submit()
            except Exception as e:
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            mine.append((time.perf_counter() - t) * 1000)
        with lock:
            call_ms.extend(mine)

    shares = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(worker, k) for k in shares]
        barrier.wait()
        t0, cpu0, srv0, all0 = time.perf_counter(), client_cpu_s(), proc_cpu_s(server_pid), machine_busy_s()
        try:
            for f in futures:
                f.result()
        except BaseException:
            stop.set()
            raise
        seconds = time.perf_counter() - t0
        cpu, srv1, all1 = client_cpu_s() - cpu0, proc_cpu_s(server_pid), machine_busy_s()
    srv = None if srv0 is None or srv1 is None else srv1 - srv0
    return RateRun(n, clients, seconds, call_ms, errors, cpu, srv, all1 - all0)


def latency_summary(lat: Sequence[float]) -> Result:
    return {
        "n": len(lat),
        "p50_s": round(percentile(lat, 50), 4),
        "p99_s": round(percentile(lat, 99), 4),
        "mean_s": round(statistics.fmean(lat), 4),
        "min_s": round(min(lat), 4),
        "max_s": round(max(lat), 4),
    }


# ---- gpucluster ----------------------------------------------------------------------------


class Phase:
    """One phase on a fresh head: own data dir, port and log; stopped and swept on exit."""

    def __init__(self, work: Path, name: str, gpus: int, report: Result, src: Path | None = None) -> None:
        self.work, self.name, self.gpus, self.report, self.src = work, name, gpus, report, src

    def __enter__(self) -> _head.Head:
        data = self.work / f"data-{self.name}"
        shutil.rmtree(data, ignore_errors=True)
        self.head = _head.start(self.gpus, data, self.work / f"head-{self.name}.log", src=self.src)
        return self.head

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        died = self.head.proc.poll()  # None while the head runs, as it should until we stop it
        self.head.stop()
        problems = self.head.log_problems()
        self.report.setdefault("jobs_ended_after_head_stop", {})[self.name] = self.head.jobs_left_running
        if problems or self.head.unkillable or died is not None:
            self.report.setdefault("head_problems", {})[self.name] = {
                "log": str(self.head.log_path),
                "exited_by_itself_with": died,
                "lines": problems,
                "job_groups_surviving_sigkill": self.head.unkillable,
            }
        shutil.rmtree(self.head.data_dir, ignore_errors=True)
        if died is not None and exc is not None:
            how = f"killed by signal {-died}" if died < 0 else f"exit code {died}"
            raise _head.HeadError(
                f"the head died during the {self.name} phase ({how}; {type(exc).__name__}: {exc});"
                f" its output ({self.head.log_path}):\n{_head.tail(self.head.log_path)}"
            ) from exc


def gc_smoke(c: httpx.Client, head: _head.Head, timeout: float = 30) -> None:
    """One job end to end before measuring, so a head that cannot start jobs fails in seconds."""
    r = c.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
    if r.status_code != 201:
        raise _head.HeadError(f"POST /v1/jobs answered {r.status_code}: {r.text[:300]}")
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{r.json()['id']}").json())["state"] not in TERMINAL:
        if time.monotonic() > deadline:
            problems = "\n".join(head.log_problems(8)) or "(nothing in its output)"
            raise _head.HeadError(
                f"smoke job did not finish in {timeout:.0f}s (state {job['state']}, {job.get('reason')!r});"
                f" head output ({head.log_path}):\n{problems}"
            )
        time.sleep(0.1)
    if job["state"] != "succeeded":
        raise _head.HeadError(f"smoke job `true` ended {job['state']}: {job.get('reason')!r}")


def gc_latency(head: _head.Head, n: int, rate: float, seed: int, timeout: float, clients: int = 1) -> Result:
    """Submit -> running of n jobs arriving as a Poisson stream of `rate` per s, or as `clients`
    concurrent streams of `rate` per s each (n in all, each its own connection and seed): issue
    18's p50 "unchanged under 8 concurrent clients"."""
    made: list[httpx.Client] = []

    def client() -> httpx.Client:
        c = httpx.Client(base_url=head.url, timeout=30, headers=head.headers)
        made.append(c)
        return c

    def stream(i: int, count: int, load: Result) -> list[tuple[int, float]]:
        c = client()

        def submit() -> tuple[int, float]:
            t = time.time()
            r = c.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
            if r.status_code != 201:
                raise _head.HeadError(f"POST /v1/jobs answered {r.status_code}: {r.text[:300]}")
            return int(r.json()["id"]), t

        return poisson_submit(count, rate, seed + i, submit, load)

    try:
        c = client()
        gc_smoke(c, head)
        load: Result = {}
        if clients == 1:
            subs = stream(0, n, load)
        else:
            counts = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
            loads: list[Result] = [{} for _ in range(clients)]
            with ThreadPoolExecutor(clients) as pool:
                parts = list(pool.map(lambda i: stream(i, counts[i], loads[i]), range(clients)))
            subs = [s for part in parts for s in part]
            load["machine_cores_busy"] = max(x.get("machine_cores_busy", 0.0) for x in loads)
        jobs: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        for jid, _ in subs:  # started_at is kept after the job ends, so reading afterwards is exact
            while True:
                job = c.get(f"/v1/jobs/{jid}").json()
                if job.get("started_at") is not None and job["state"] in TERMINAL:
                    break
                if job["state"] in TERMINAL or time.monotonic() > deadline:
                    raise _head.HeadError(
                        f"job {jid} did not start and finish within {timeout:.0f}s of the last submission:"
                        f" state {job['state']}, started_at {job.get('started_at')}, reason {job.get('reason')!r}"
                    )
                time.sleep(0.05)
            jobs[jid] = job
    finally:
        for made_client in made:
            made_client.close()
    lat = [jobs[j]["started_at"] - t for j, t in subs]
    res = latency_summary(lat) | load | {"clients": clients}
    res["peak_running"] = peak_concurrency([(j["started_at"], j["ended_at"]) for j in jobs.values()])
    res["not_succeeded"] = sum(1 for j in jobs.values() if j["state"] != "succeeded")
    return res


def sdk_submitter(head: _head.Head, closers: list[Callable[[], None]]) -> Callable[[], Callable[[], None]]:
    """Makes, per client thread, the SDK's client (`gpucluster.Client`, a kept connection) as a
    user's script submits: `submit(command, gpus=1, export="NONE")`, the body earlier rounds
    posted with httpx (no exported environment; sbatch sends its caller's, ~1-2 KB). Each
    client's `close` goes to `closers`. bench/bench_client.py measures it against httpx's."""

    def make() -> Callable[[], None]:
        c = Client(head.url, timeout=60, token=head.token)
        closers.append(c.close)
        return lambda: c.submit(["sleep", "1000"], gpus=1, export="NONE")

    return make


def gc_rate(head: _head.Head, n: int, clients: int) -> Result:
    """n submissions from `clients` threads, each with the SDK's client (`sdk_submitter`)."""
    closers: list[Callable[[], None]] = []
    try:
        run = submit_rate(n, clients, sdk_submitter(head, closers), server_pid=head.proc.pid)
    finally:
        for close in closers:
            close()
    res = run.result()
    res["head_counts_after"] = httpx.get(f"{head.url}/v1/health", timeout=30).json().get("jobs")
    return res


def run_gpucluster(args: argparse.Namespace, work: Path) -> Result:
    report: Result = {}
    with Phase(work, "latency", args.gpus, report) as head:
        report["latency"] = gc_latency(head, args.latency_jobs, args.latency_rate, args.seed, args.wait_timeout)
    log(f"gpucluster: latency: {_brief(report['latency'])}")
    for clients in sorted({1, args.clients}):
        with Phase(work, f"rate-{clients}", args.gpus, report) as head:
            report[f"rate_{clients}"] = gc_rate(head, args.jobs, clients)
        log(f"gpucluster: rate_{clients}: {_brief(report[f'rate_{clients}'])}")
    return report


# ---- Slurm ---------------------------------------------------------------------------------


def slurm_latency(peer: slurm_peer.SlurmPeer, n: int, rate: float, seed: int, timeout: float) -> Result:
    smoke, _ = peer.submit("true")  # one job end to end first, as for gpucluster
    deadline = time.monotonic() + 30
    while smoke not in peer.read_jobcomp():
        if time.monotonic() > deadline:
            raise slurm_peer.SlurmError(f"smoke job {smoke} not in {peer.jobcomp_path} after 30s")
        time.sleep(0.2)
    load: Result = {}
    subs = poisson_submit(n, rate, seed, lambda: peer.submit("true"), load)
    deadline = time.monotonic() + timeout
    while True:
        comp = peer.read_jobcomp()
        if all(j in comp for j, _ in subs):
            break
        if time.monotonic() > deadline:
            missing = [j for j, _ in subs if j not in comp]
            raise slurm_peer.SlurmError(f"{len(missing)} jobs not in {peer.jobcomp_path}, e.g. {missing[:5]}")
        time.sleep(0.5)
    starts, ends = peer.read_ctld_times()
    res: Result = {"jobcomp": latency_summary([comp[j].start - t for j, t in subs]), **load}
    res["jobcomp"]["resolution"] = "1 s (Slurm StartTime is truncated to whole seconds)"
    if all(j in starts for j, _ in subs):
        res["ctld_log"] = latency_summary([starts[j] - t for j, t in subs])
        res["ctld_log"]["resolution"] = "1 ms (slurmctld.log 'sched: Allocate JobId=N')"
        res["peak_running"] = peak_concurrency([(starts[j], ends.get(j, comp[j].end + 1)) for j, _ in subs])
    res["not_completed"] = sum(1 for j, _ in subs if comp[j].state != "COMPLETED")
    return res


def run_slurm(args: argparse.Namespace) -> Result:
    report: Result = {"jobs": args.slurm_jobs}
    phases: list[tuple[str, Callable[[slurm_peer.SlurmPeer], Result]]] = [
        ("latency", lambda p: slurm_latency(p, args.latency_jobs, args.latency_rate, args.seed, args.wait_timeout)),
    ]
    for clients in sorted({1, args.clients}):
        phases.append((f"rate_{clients}", functools.partial(_slurm_rate, n=args.slurm_jobs, clients=clients)))
    for name, measure in phases:
        log(f"slurm: {name}: starting a fresh Slurm in {args.slurm_dir}")
        peer = slurm_peer.start(args.slurm_dir, args.slurm_nodes, args.gpus // args.slurm_nodes)
        try:
            report.setdefault("version", peer.version())
            report[name] = measure(peer)
            log(f"slurm: {name}: {_brief(report[name])}")
            peer.cancel_all()
        finally:
            slurm_peer.stop(peer)
    return report


def _slurm_rate(peer: slurm_peer.SlurmPeer, n: int, clients: int) -> Result:
    def submit() -> None:
        peer.submit("sleep 1000")

    def make_submit() -> Callable[[], None]:
        return submit  # each call runs its own sbatch process: nothing to set up per thread

    res = submit_rate(n, clients, make_submit, server_pid=peer.ctld_pid()).result()
    res["queue_after"] = peer.queue_len()
    return res


# ---- report --------------------------------------------------------------------------------


def source_digest() -> str:
    """sha256 of gpucluster's sources: which head code was measured (it changes under our feet)."""
    h = hashlib.sha256()
    for f in sorted((Path(__file__).resolve().parent.parent / "src" / "gpucluster").rglob("*.py")):
        h.update(f.as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _brief(r: Result) -> str:
    if "jobs_per_s" in r:
        return f"{r['jobs_per_s']} jobs/s ({r['accepted']}/{r['jobs']} accepted, {r['errors']} errors)"
    lat = r.get("ctld_log") or r.get("jobcomp") or r
    return f"p50 {lat['p50_s']:.3f}s p99 {lat['p99_s']:.3f}s, peak running {r.get('peak_running')}"


def _get(d: Result | None, *path: str) -> float | None:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, int | float) else None


def figures(gc: Result | None, sl: Result | None, clients: int) -> list[tuple[str, float | None, float | None]]:
    """(metric, gpucluster, slurm) rows of the final table."""
    rows: list[tuple[str, float | None, float | None]] = []
    for q in ("p50", "p99"):
        g = _get(gc, "latency", f"{q}_s")
        rows.append(
            (f"submit->running {q} (s), Slurm from jobcomp [1 s res.]", g, _get(sl, "latency", "jobcomp", f"{q}_s"))
        )
        rows.append(
            (f"submit->running {q} (s), Slurm from slurmctld.log [1 ms]", g, _get(sl, "latency", "ctld_log", f"{q}_s"))
        )
    for c in sorted({1, clients}):
        label = "1 client" if c == 1 else f"{c} concurrent clients"
        rows.append(
            (f"submissions/s, {label}", _get(gc, f"rate_{c}", "jobs_per_s"), _get(sl, f"rate_{c}", "jobs_per_s"))
        )
    return rows


def print_table(rows: list[tuple[str, float | None, float | None]], notes: list[str]) -> None:
    def cell(v: float | None, name: str) -> str:
        return "-" if v is None else f"{v:.1f}" if name.startswith("submissions") else f"{v:.3f}"

    w = max(len(r[0]) for r in rows)
    print(f"\n{'metric':<{w}}  {'gpucluster':>11}  {'slurm':>11}  {'gpucluster/slurm':>16}")
    for name, g, s in rows:
        ratio = f"{g / s:.3f}" if g is not None and s else "-"
        print(f"{name:<{w}}  {cell(g, name):>11}  {cell(s, name):>11}  {ratio:>16}")
    for n in notes:
        print(f"note: {n}")


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000, help="jobs per submit-rate run (default 5000)")
    p.add_argument("--slurm-jobs", type=int, help="jobs per Slurm submit-rate run (default: --jobs)")
    p.add_argument("--latency-jobs", type=int, default=200, help="jobs in the latency run (default 200)")
    p.add_argument(
        "--latency-rate", type=float, default=1.0,
        help="mean Poisson arrival rate of latency jobs, jobs/s (default 1; Slurm here starts at most"
        " ~8 jobs per ~3 s scheduling pass, so much faster rates measure its queue, not its latency)",
    )  # fmt: skip
    p.add_argument("--clients", type=int, default=8, help="concurrent clients in the second rate run (default 8)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in each cluster (default 8)")
    p.add_argument("--slurm-nodes", type=int, default=2, help="Slurm nodes the GPUs are split over (default 2)")
    p.add_argument("--slurm-dir", type=Path, default=Path("/tmp/slurm-peer"), help="Slurm peer DIR (wiped per phase)")
    p.add_argument("--skip-slurm", action="store_true", help="measure gpucluster only (no root needed)")
    p.add_argument("--skip-gpucluster", action="store_true", help="measure Slurm only")
    p.add_argument("--work-dir", type=Path, help="where head data dirs and logs go (default: a new temp dir)")
    p.add_argument("--wait-timeout", type=float, default=120, help="seconds to wait for latency jobs to start")
    p.add_argument("--seed", type=int, default=1, help="seed of the Poisson arrivals (same for both systems)")
    p.add_argument("--out", type=Path, help="also write all figures as JSON here")
    args = p.parse_args(argv)
    # SIGTERM/SIGINT unwind through the finally blocks, which stop the heads and Slurm (a shell's
    # background job otherwise starts with SIGINT ignored, and SIGTERM would kill us outright).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    args.slurm_jobs = args.slurm_jobs or args.jobs
    if min(args.jobs, args.slurm_jobs, args.latency_jobs, args.clients, args.latency_rate) <= 0:
        p.error("--jobs, --slurm-jobs, --latency-jobs, --clients and --latency-rate must be positive")
    if args.gpus % args.slurm_nodes:
        p.error("--gpus must be a multiple of --slurm-nodes")

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpucluster-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    digest = source_digest()
    out: Result = {
        "config": config,
        "cpu_count": os.cpu_count(),
        "gpucluster_src_sha256": digest,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "errors": [],
    }
    failed = False
    systems: list[tuple[str, bool, Callable[[], Result]]] = [
        ("gpucluster", args.skip_gpucluster, lambda: run_gpucluster(args, work)),
        ("slurm", args.skip_slurm, lambda: run_slurm(args)),
    ]
    for system, skip, run in systems:
        if skip:
            continue
        log(f"{system}: measuring (head logs in {work})" if system == "gpucluster" else f"{system}: measuring")
        try:
            out[system] = run()
        except (_head.HeadError, slurm_peer.SlurmError, httpx.HTTPError, OSError) as e:
            failed = True
            out["errors"].append(f"{system}: {type(e).__name__}: {e}")
            log(f"{system} FAILED: {e}")
        except Exception:
            failed = True
            out["errors"].append(f"{system}: {traceback.format_exc()}")
            log(f"{system} FAILED:\n{traceback.format_exc()}")

    rows = figures(out.get("gpucluster"), out.get("slurm"), args.clients)
    out["figures"] = [
        {"metric": m, "gpucluster": g, "slurm": s, "ratio": g / s if g and s else None} for m, g, s in rows
    ]
    notes = [
        "latency: lower is better (ratio < 1: gpucluster faster); submissions/s: higher is better",
        "Slurm jobcomp StartTime is whole seconds (truncated), so its latencies can be up to 1 s low"
        " (even negative); the slurmctld.log rows use the same event with ms timestamps",
        f"latency jobs: {args.latency_jobs} x `true`, 1 GPU, Poisson arrivals at {args.latency_rate}/s;"
        f" rate runs: gpucluster N={args.jobs}, Slurm N={args.slurm_jobs} x `sleep 1000`, 1 GPU",
    ]
    if not args.skip_gpucluster and source_digest() != digest:
        notes.append("gpucluster's sources changed during the run: its phases may have measured different code")
    for system in ("gpucluster", "slurm"):
        for phase, r in (out.get(system) or {}).items():
            other = r.get("other_cores_busy") if isinstance(r, dict) else None
            busy = r.get("machine_cores_busy") if isinstance(r, dict) else None
            if (other or 0) > 0.3 or (busy or 0) > 0.5:
                what = f"{other} cores used by other processes" if other else f"{busy} cores busy machine-wide"
                notes.append(f"{system} {phase}: {what} during the run: this figure is disturbed by other work")
        peak = _get(out.get(system), "latency", "peak_running")
        if peak is not None and peak >= args.gpus:
            notes.append(
                f"{system}: a burst of {peak} latency jobs ran at once (all GPUs): a few may have waited for one"
            )
    if "head_problems" in out.get("gpucluster", {}):
        notes.append(f"gpucluster head printed errors: see head_problems in the JSON / logs in {work}")
    notes += [f"ERROR {e.splitlines()[0]}" for e in out["errors"]]
    out["notes"] = notes
    print_table(rows, notes)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
