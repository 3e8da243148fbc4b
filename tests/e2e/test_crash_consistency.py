"""Crash consistency: the head is killed with SIGKILL 50 times while jobs are submitted,
cancelled, completed, failed and preempted, and restarted on the same data dir each time.

A client thread submits a stream of jobs (short ones that succeed, ones that fail and may be
restarted, low-priority ones that fill the GPUs and high-priority ones that preempt them) and
cancels some, recording every submission the API acknowledged. The main thread kills the head
at random moments (seeded), sometimes while it is still starting, and checks:

  (a) after each restart, every acknowledged submission exists (in the API's listing every
      fifth time, in the store's the others);
  (b) no job ever ran twice at once: each attempt's command logs its start and end, and holds a
      flock on its job and on each of its GPUs while it runs (crashkit.JOB_SCRIPT), so a second
      attempt of a running job, or a second job on a GPU, says so as it starts;
  (c) with the restarted head stopped (SIGSTOP) so its store holds still: every live job process
      belongs to a job the store has running at that attempt (no orphans), sees exactly its
      allocated GPUs, no GPU is held by two jobs, and the GPUs of running jobs equal those of
      live processes, but for jobs whose process just ended (which must have ended after this
      head started: its first cycle records those that ended before) and jobs committed but not
      launched yet (within LAUNCH_GRACE_S);
  (d) while the head is down, the store passes SQLite's integrity and foreign key checks and
      its rows agree with each other (crashkit.store_problems, read-only); at the end, also
      Store.integrity_problems.

At the end the stream stops, everything drains, and each job ended as its command says: exit 0
succeeded once, exit 3 failed after its restarts, cancelled only if the client asked.

Heads are forked from a process that has imported `gpucluster up` already (forkhead.py): a
restart from the command line spends ~1.2 s importing, which fifty restarts cannot afford.
GPUCLUSTER_CRASH_SEED and GPUCLUSTER_CRASH_KILLS change the seed and the number of kills.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from gpucluster.client import ApiError, Client, ClusterUnreachable
from gpucluster.models import Job
from gpucluster.store import Store
from tests.e2e.crashkit import (
    Accounting,
    check_accounting,
    double_runs,
    job_command,
    job_ids,
    job_processes,
    open_ro,
    read_events,
    store_problems,
    wait_stopped,
)
from tests.e2e.forkhead import ForkedHead, ForkServer
from tests.e2e.headproc import HeadProcess, free_port, wait_for
from tests.pgserver import PostgresServer

SEED = int(os.environ.get("GPUCLUSTER_CRASH_SEED", "20261122"))
KILLS = int(os.environ.get("GPUCLUSTER_CRASH_KILLS", "50"))
MAX_ACTIVE = 12  # queued or running jobs of the stream at once: the queue must drain at the end
TERMINAL = {"succeeded", "failed", "cancelled"}


class Stream(threading.Thread):
    """The client: submits and cancels until stopped, whether or not the head is up."""

    def __init__(self, url: str, token: str | None, seed: int, run_id: str, job_dir: Path) -> None:
        super().__init__(name="crash-stream", daemon=True)
        self.url, self.token = url, token
        self.rng = random.Random(seed)
        self.env = {"CC_RUN": run_id, "CC_DIR": str(job_dir)}
        self.lock = threading.Lock()
        self.acked: dict[int, str] = {}  # job id -> kind, for every submission the API answered
        self.unanswered = 0  # submissions sent that got no answer: they may or may not exist
        self.cancel_asked: set[int] = set()
        self.server_errors: list[str] = []
        self.active: set[int] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        with Client(self.url, token=self.token, timeout=10) as c:
            while not self.halt.is_set():
                try:
                    self.step(c)
                except ClusterUnreachable:
                    time.sleep(0.02)
                except ApiError as e:
                    if e.status >= 500:
                        self.server_errors.append(str(e))
                time.sleep(self.rng.uniform(0.02, 0.1))

    def step(self, c: Client) -> None:
        if len(self.active) >= MAX_ACTIVE:
            mine = {j.id for j in c.jobs(state=["queued", "running"])}
            self.active &= mine
            if len(self.active) >= MAX_ACTIVE:
                return
        r = self.rng.random()
        if r < 0.1 and self.active:
            victim = self.rng.choice(sorted(self.active))
            with self.lock:
                self.cancel_asked.add(victim)
            try:
                c.cancel(victim)
            except ApiError as e:  # 409: it ended meanwhile
                if e.status >= 500:
                    raise
            return
        if r < 0.22:
            kind, gpus, prio, secs, code = "fail", 1, "normal", self.rng.uniform(0.1, 0.3), 3
        elif r < 0.5:
            kind, gpus, prio, secs, code = "ok", self.rng.randint(1, 2), "normal", self.rng.uniform(0.2, 0.6), 0
        elif r < 0.78:
            kind, gpus, prio, secs, code = "low", self.rng.randint(2, 4), "low", self.rng.uniform(0.8, 2.0), 0
        else:
            kind, gpus, prio, secs, code = "high", self.rng.randint(2, 4), "high", self.rng.uniform(0.2, 0.6), 0
        restarts = self.rng.randint(0, 1) if kind == "fail" else 0
        try:
            job = c.submit(
                job_command(secs, code), gpus=gpus, priority=prio, name=kind, env=self.env, max_restarts=restarts
            )
        except ClusterUnreachable as e:
            if "ConnectError" not in str(e):  # refused: never sent; else it may have been committed
                with self.lock:
                    self.unanswered += 1
            raise
        with self.lock:
            self.acked[job.id] = kind
        self.active.add(job.id)


def _freeze_and_check(head: ForkedHead, run_id: str, started_at: float) -> Accounting:
    """`check_accounting` with the head stopped. A head stopped in the middle of writing its
    WAL index header leaves a read-only reader unable to read (SQLite retries, then answers
    SQLITE_PROTOCOL, "locking protocol": only the writer can finish or recover that header, and
    it is stopped). That is the checker's problem, not the head's: let the head run on and
    freeze it again, a bounded number of times (each try is an event, not a deadline)."""
    for attempt in range(20):
        assert head.pid is not None and head.alive, f"the head died: {head.log_path.read_text()[-3000:]}"
        os.kill(head.pid, signal.SIGSTOP)
        try:
            wait_stopped(head.pid)
            return check_accounting(head.data_dir / "state.db", head.data_dir, run_id, started_at)
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorcode", None) != sqlite3.SQLITE_PROTOCOL or attempt == 19:
                raise
        finally:
            os.kill(head.pid, signal.SIGCONT)
        time.sleep(0.05)  # the head's turn to finish its write (any pause would do: it is retried)
    raise AssertionError("unreachable")


def _drained(c: Client) -> list[Job] | None:
    jobs = c.jobs()
    return jobs if all(j.state.value in TERMINAL for j in jobs) else None


def _kill_leftovers(run_id: str) -> None:
    for pid, _ in job_processes(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_sigkill_of_the_head_50_times_loses_nothing_runs_nothing_twice_and_accounts_every_gpu(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    rng = random.Random(SEED)
    run_id = uuid.uuid4().hex
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    events = job_dir / "events"
    data = tmp_path / "data"
    db = data / "state.db"
    server = ForkServer()
    head = ForkedHead(server, data, grace="1s", extra_args=("--restart-backoff", "0.2s", "--telemetry-interval", "30s"))
    stream: Stream | None = None
    spent: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    try:
        started_at = time.time()
        head.start()
        stream = Stream(head.url, head.token, rng.randrange(1 << 30), run_id, job_dir)
        stream.start()
        with head.client() as c:
            for kill in range(KILLS):
                t = time.monotonic()
                if kill > 0:
                    started_at = time.time()
                    head.start()
                spent["restart"] += time.monotonic() - t

                # (a) every acknowledged submission exists
                t = time.monotonic()
                with stream.lock:
                    acked = set(stream.acked)
                # through the API every fifth time, else straight from the store (a listing costs)
                ids = {j.id for j in c.jobs()} if kill % 5 == 0 else job_ids(db)
                assert not acked - ids, f"kill {kill}: acknowledged jobs missing after restart: {acked - ids}"
                spent["check a"] += time.monotonic() - t

                # (c) GPU accounting against live processes, the head held still
                t = time.monotonic()
                acc = _freeze_and_check(head, run_id, started_at)
                assert not acc.problems, f"after restart {kill}: {acc.problems}"
                seen["live GPUs"] += acc.live_gpus
                seen["ended, awaiting a cycle"] += acc.ended
                seen["committed, not launched yet"] += acc.unlaunched
                seen["killed, awaiting a cycle"] += acc.stopping
                seen["launching, missed by the scan"] += acc.launching
                spent["check c"] += time.monotonic() - t

                time.sleep(rng.uniform(0.05, 0.6))
                head.kill9()

                # (d) the store, while no head runs, and (b) nothing ran twice
                t = time.monotonic()
                problems = store_problems(db)
                assert not problems, f"kill {kill}: {problems}"
                twice = double_runs(read_events(events))
                assert not twice, f"kill {kill}: {twice}"
                spent["check b, d"] += time.monotonic() - t

                # Now and then, a kill while the next head is still starting (adopting jobs).
                if rng.random() < 0.2:
                    t = time.monotonic()
                    head.spawn()
                    time.sleep(rng.uniform(0.05, 0.5))
                    head.kill9()
                    seen["extra kills while starting"] += 1
                    problems = store_problems(db)
                    assert not problems, f"kill {kill}, while starting: {problems}"
                    spent["kills while starting"] += time.monotonic() - t

            # Drain: the stream stops, the last head runs everything left to its end.
            t = time.monotonic()
            stream.halt.set()
            stream.join(15)
            started_at = time.time()
            head.start()
            try:
                jobs = wait_for(lambda: _drained(c), 60, 0.2, "every job to end")
            except AssertionError:
                left = [
                    f"{j.id} {j.state.value} attempt {j.attempt}: {j.reason}"
                    for j in c.jobs()
                    if j.state.value not in TERMINAL
                ]
                raise AssertionError(f"jobs that never ended: {left}") from None
            spent["drain"] += time.monotonic() - t
        assert not stream.server_errors, stream.server_errors
        by_id = {j.id: j for j in jobs}
        acked = set(stream.acked)
        assert acked <= set(by_id), f"acknowledged jobs lost: {acked - set(by_id)}"
        unknown = set(by_id) - acked
        assert len(unknown) <= stream.unanswered, (unknown, stream.unanswered)

        ev = read_events(events)
        assert not double_runs(ev), double_runs(ev)
        states: Counter[str] = Counter()
        for j in jobs:
            state = j.state.value
            states[state] += 1
            code = int(j.spec.command[-1])
            assert "lost" not in j.reason, f"job {j.id}: {j.reason}"
            started = {a for (job, a) in ev.runs if job == j.id}
            assert all(a <= j.attempt for a in started), (j.id, started, j.attempt)
            if state == "cancelled":
                assert j.id in stream.cancel_asked, f"job {j.id} cancelled, never asked: {j.reason}"
                continue
            last = ev.runs.get((j.id, j.attempt), [])
            assert len(last) == 1 and last[0].code == code, f"job {j.id} ({state}, attempt {j.attempt}): {last}"
            if code == 0:
                assert state == "succeeded", f"job {j.id}: {state} {j.reason}"
                # An attempt that ended with 0 and still ran again must have been signalled by
                # the head first (a preemption judged by its intent), never requeued unasked.
                wins = [r for (job, _), rs in ev.runs.items() if job == j.id for r in rs if r.code == 0]
                again = [r.attempt for r in wins if r.attempt != j.attempt]
                assert all((j.id, a) in ev.signalled for a in again), f"job {j.id} ran again after success: {wins}"
                seen["successes run again after a SIGTERM"] += len(again)
            else:
                assert state == "failed" and j.exit_code == code, f"job {j.id}: {state} {j.exit_code} {j.reason}"
                assert j.restarts == j.spec.max_restarts, (j.id, j.restarts, j.spec.max_restarts)
        assert states["succeeded"] + states["failed"] + states["cancelled"] == len(jobs)
        wait_for(lambda: not job_processes(run_id), 5, what="no job process to outlive its job")
        head.kill9()
        assert not store_problems(db)
        store = Store(db)
        try:
            assert not store.integrity_problems() and store.integrity_ok()
        finally:
            store.close()
        with contextlib.closing(open_ro(db)) as conn:
            outcomes = dict(conn.execute("SELECT outcome, count(*) FROM attempts GROUP BY outcome").fetchall())
        # The stream did what it is for (so many jobs make each all but certain).
        assert outcomes.get("preempted", 0) > 0 and states["cancelled"] > 0 and states["failed"] > 0, outcomes
        total = time.monotonic() - began
        print(
            f"\n{KILLS} kills (+{seen['extra kills while starting']} while starting) in {total:.1f}s, seed {SEED}; "
            f"{len(jobs)} jobs {dict(states)}, attempts by outcome {outcomes}, "
            f"{sum(len(v) for v in ev.runs.values())} attempts ran; {stream.unanswered} submissions unanswered, "
            f"{len(unknown)} of them committed; seen at checks: {dict(seen)}; "
            f"time: {', '.join(f'{k} {v:.1f}s' for k, v in spent.items())}"
        )
    finally:
        if stream is not None:
            stream.halt.set()
        if head.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(head.pid, signal.SIGCONT)
        head.stop()
        head.kill_jobs()
        _kill_leftovers(run_id)
        server.close()


# ---- PostgreSQL: a restart in the middle of work, and a second head ---------------------------


def _health(url: str) -> tuple[int, dict[str, object]]:
    r = httpx.get(f"{url}/v1/health", timeout=10)
    return r.status_code, r.json()


def _all_ended(c: Client, ids: list[int]) -> list[Job] | None:
    jobs = [c.job(i) for i in ids]
    return jobs if all(j.state.value in TERMINAL for j in jobs) else None


def test_postgresql_restart_mid_work_and_a_second_head_never_double_book(
    head_factory: type[HeadProcess], private_postgres: PostgresServer, tmp_path: Path
) -> None:
    """The measured bug: PostgreSQL restarted under a working head dropped its one-head lock, a
    second head was then accepted, marked the first one's running jobs `process lost` and gave
    their GPUs to new jobs. Now, with real processes (heads, jobs, the PostgreSQL server):

    1. PostgreSQL stops while jobs run: the head answers 503 JSON with the reason (health and a
       submit), its log has no traceback; jobs keep running (one ends during the outage); the
       server starts again and the head resumes by itself, recording what happened meanwhile;
    2. a second head on the same database (another data dir), started right after the restart
       while the first is alive, is refused;
    3. the first head frozen (SIGSTOP) past its lease: the second head waits for the expiry and
       takes over; the first, thawed, finds the lease gone, stops scheduling, says so in its
       health (503) and log, and touches no job; the second runs the next jobs.

    Throughout, no job runs twice at once and no GPU is held by two jobs (crashkit.JOB_SCRIPT's
    flocks span both heads: one host, the same GPU indices), every job ran exactly one attempt
    and succeeded, and the database passes Store.integrity_problems.
    """
    rng = random.Random(SEED)
    url = private_postgres.create_database()
    run_id = uuid.uuid4().hex
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    events = job_dir / "events"
    env = {"CC_RUN": run_id, "CC_DIR": str(job_dir)}
    extra = ("--database", url, "--lease", "3s", "--telemetry-interval", "30s")
    first = head_factory(tmp_path / "a", gpus=4, extra_args=extra).start()
    ids: list[int] = []
    try:
        with first.client() as c:

            def wave(n: int, seconds: tuple[float, float]) -> None:
                for _ in range(n):
                    cmd = job_command(rng.uniform(*seconds), 0)
                    ids.append(c.submit(cmd, gpus=rng.randint(1, 2), name="pg", env=env).id)

            # 1. a PostgreSQL restart while jobs run
            wave(8, (1.5, 3.0))
            wait_for(lambda: len(c.jobs(state=["running"])) >= 2, 30, 0.05, "two jobs to run")
            private_postgres.shutdown()
            ended_before = sum(1 for rs in read_events(events).runs.values() for r in rs if r.end is not None)
            status, body = _health(first.url)
            assert status == 503 and str(body["error"]).startswith("database unavailable: "), body
            r = httpx.post(f"{first.url}/v1/jobs", headers=first.headers, json={"command": ["true"]}, timeout=10)
            assert r.status_code == 503 and r.json()["error"].startswith("database unavailable: "), r.text
            wait_for(
                lambda: (
                    sum(1 for rs in read_events(events).runs.values() for r in rs if r.end is not None) > ended_before
                ),
                30,
                0.05,
                "a job to end during the outage",
            )
            private_postgres.start_again()
            wait_for(lambda: _health(first.url)[0] == 200, 30, 0.1, "the head to resume by itself")

            # 2. a second head, right after the restart, while the first is alive: refused
            other = tmp_path / "b"
            r2 = subprocess.run(
                [sys.executable, "-m", "gpucluster.cli.main", "up", "--data-dir", str(other), "--virtual-gpus", "4",
                 "--port", str(free_port()), *extra],
                capture_output=True,
                text=True,
                timeout=120,  # the refusal comes within a renewal (1 s); a head that waited forever fails here
            )  # fmt: skip
            assert r2.returncode == 1 and "another gpucluster head is using the database" in r2.stderr, r2.stderr
            assert "Traceback" not in r2.stderr, r2.stderr

            wave(4, (0.3, 1.0))
            jobs = wait_for(lambda: _all_ended(c, ids), 90, 0.2, "every job to end")
            for j in jobs:
                assert (j.state.value, j.attempt) == ("succeeded", 1), (
                    f"job {j.id}: {j.state.value} {j.reason}; attempts: {[a.reason for a in j.attempts]}; "
                    f"head log: {first.log_path.read_text()[-3000:]}"
                )
        log = first.log_path.read_text()
        assert "Traceback" not in log, log[-3000:]
        assert "database unavailable" in log and "database available again" in log, log[-3000:]

        # 3. the first head frozen past its lease: the second waits for the expiry and takes over
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            second = head_factory(tmp_path / "b", gpus=4, extra_args=extra).start(timeout=60)
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        # It waited for the expiry (or found it past already, having taken a while to start).
        assert "took over the database's lease (epoch 2) from the head with pid" in second.log_path.read_text()
        wait_for(lambda: _health(first.url)[0] == 503, 30, 0.1, "the first head to see it lost the lease")
        status, body = _health(first.url)
        assert "no longer holds the database's lease" in str(body["error"]), body
        assert "head stopped scheduling" in first.log_path.read_text()
        r = httpx.post(f"{first.url}/v1/jobs", headers=first.headers, json={"command": ["true"]}, timeout=10)
        assert r.status_code == 503 and "no longer holds the database's lease" in r.json()["error"], r.text
        with Client(second.url, token=first.token) as c:  # the users and tokens live in the database
            more = [c.submit(job_command(rng.uniform(0.3, 1.0), 0), gpus=2, name="b", env=env).id for _ in range(4)]
            for j in wait_for(lambda: _all_ended(c, more), 60, 0.2, "the second head's jobs to end"):
                assert (j.state.value, j.attempt) == ("succeeded", 1), f"job {j.id}: {j.state.value} {j.reason}"
            assert len(c.jobs()) == len(ids) + len(more)
        first.stop()  # a head that lost the lease releases nothing: the second keeps it
        assert _health(second.url)[0] == 200
        twice = double_runs(read_events(events))
        assert not twice, twice
        ran = read_events(events).runs
        assert sorted(job for job, _ in ran) == sorted(ids + more), "every job ran once"
        store = Store(url)
        try:
            assert store.integrity_problems() == []
        finally:
            store.close()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first.proc.pid, signal.SIGCONT)
        _kill_leftovers(run_id)
