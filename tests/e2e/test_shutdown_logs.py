"""End to end: SIGTERM to a real head (jobs kept and adopted, or stopped and requeued) and job
logs capped with rotation while `logs` and `logs --follow` keep their offsets."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from tests.e2e.headproc import HeadProcess, pid_alive, wait_for
from tests.e2e.test_jobs import finished, running

PY = sys.executable


def _sigterm(head: HeadProcess) -> None:
    assert head.proc is not None
    head.proc.send_signal(signal.SIGTERM)
    head.proc.wait(30)


def test_sigterm_keeps_running_jobs_and_the_next_head_adopts_them(head_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    head = head_factory(data).start()
    go = tmp_path / "go"  # the job ends when the test says so, not after a sleep a slow restart outlasts
    script = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('adopted done')"
    with head.client() as c:
        job = c.submit([PY, "-c", script], gpus=2).id
        running(head, job)
    pgids = wait_for(head.job_pgids, what="the job's shim to record its pid")
    _sigterm(head)
    assert head.proc is not None and head.proc.returncode == 0
    assert "1 running job(s) keep running; the next head adopts them" in head.log_path.read_text()
    assert pid_alive(pgids[0]), "the job died with the head"
    head2 = head_factory(data, port=head.port).start()
    with head2.client() as c:
        assert c.job(job).state.value == "running"
        go.touch()
        done = finished(head2, job, timeout=30)
        assert done.state.value == "succeeded" and done.attempt == 1, done.reason
        assert c.logs(job).strip() == "adopted done"


def test_sigterm_with_on_shutdown_stop_stops_and_requeues_running_jobs(head_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    head = head_factory(data, extra_args=("--on-shutdown", "stop")).start()
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
        "print('started', flush=True); time.sleep(300)\n"
    )
    with head.client() as c:
        job = c.submit([PY, "-c", script], gpus=2).id
        running(head, job)
        wait_for(lambda: "started" in c.logs(job), what="the job to start")
    pgids = wait_for(head.job_pgids, what="the job's shim to record its pid")
    _sigterm(head)
    text = head.log_path.read_text()
    assert "stopping 1 running job(s) (SIGTERM, 1s grace, SIGKILL) and requeueing them" in text, text
    assert not pid_alive(pgids[0]), "the job outlived a head told to stop it"
    head2 = head_factory(data, port=head.port).start()
    with head2.client() as c:
        j = c.job(job)
        assert j.attempt >= 1 and j.state.value in ("queued", "running"), (j.state, j.reason)
        wait_for(lambda: c.job(job).attempt == 2, timeout=20, what="the requeued job to start again")
        assert "got SIGTERM" in c.logs(job, attempt=1)
        c.cancel(job)
        finished(head2, job)


def test_a_chatty_job_log_is_capped_and_logs_follow_reads_across_rotations(head_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    head = head_factory(data, extra_args=("--max-log-size", "64KiB")).start()
    # 20,000 numbered lines of 21 bytes = 420 KB, over 6 times the cap.
    script = "import sys\nfor i in range(20000): sys.stdout.write(f'line {i:09d}......\\n')\n"
    with head.client() as c:
        job = c.submit([PY, "-c", script], gpus=1).id
        with httpx.stream(
            "GET", f"{head.url}/v1/jobs/{job}/logs", params={"follow": "true"}, headers=head.headers, timeout=60
        ) as r:
            followed = b"".join(r.iter_bytes()).decode()
        done = finished(head, job)
        assert done.state.value == "succeeded", done.reason
        attempt_dir = data / "jobs" / str(job) / "attempt-1"
        kept = sum(p.stat().st_size for p in attempt_dir.glob("output.log*") if p.suffix in (".log", ".1"))
        assert kept <= 64 * 1024, kept
        dropped = int((attempt_dir / "output.log.dropped").read_text())
        assert dropped + kept == 20000 * 21
        tail = c.logs(job)
        lines = tail.splitlines()
        assert lines[-1] == "line 000019999......" and len(tail) == kept
        # An offset counts every byte the job wrote: the last line is at 19999 * 21.
        assert c.logs(job, offset=19999 * 21) == "line 000019999......\n"
        assert c.logs(job, offset=0) == tail  # rotated away: from the oldest byte kept
    # Following never repeats a byte and ends with the last line; what a rotation took away
    # before the follower read it is skipped, never re-sent.
    got = [int(line[5:14]) for line in followed.splitlines() if len(line) == 20]
    assert got and got[-1] == 19999 and got == sorted(set(got))
    assert followed.endswith("line 000019999......\n")
