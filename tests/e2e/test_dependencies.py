"""Holds and dependencies on a real head: real job processes, real HTTP, a real SQLite file."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import httpx

from gpucluster.client import ApiError, Client
from tests.e2e.headproc import HeadProcess, cli, wait_for
from tests.e2e.test_jobs import finished

PY = sys.executable


def test_a_held_job_never_starts_until_released(head: HeadProcess) -> None:
    with head.client() as c:
        held = cli(head, "submit", "--hold", "--", PY, "-c", "print('ran')")
        assert held.returncode == 0, held.stderr
        assert "(held)" in held.stdout
        job_id = int(held.stdout.split()[2])
        # A later job runs to its end while the held one stays queued: the scheduler had a chance.
        other = c.submit([PY, "-c", "pass"]).id
        assert finished(head, other).state.value == "succeeded"
        wait_for(lambda: c.job(job_id).wait_reason == "held", what="the hold reason")
        job = c.job(job_id)
        assert job.state.value == "queued" and job.held and job.attempt == 0
        assert "held by user" in cli(head, "why", str(job_id)).stdout
        released = cli(head, "release", str(job_id))
        assert released.returncode == 0 and f"job {job_id}: released job {job_id}" in released.stdout
        done = finished(head, job_id)
        assert done.state.value == "succeeded" and not done.held


def test_hold_of_a_running_job_is_refused_in_one_line(head: HeadProcess) -> None:
    with head.client() as c:
        job_id = c.submit([PY, "-c", "import time; time.sleep(30)"]).id
        wait_for(lambda: c.job(job_id).state.value == "running", what="start")
        r = cli(head, "hold", str(job_id))
        assert r.returncode == 1 and "only a queued job can be held" in r.stderr
        assert "Traceback" not in r.stderr
        c.cancel(job_id)


def test_a_pipeline_runs_each_step_only_after_its_dependency_succeeded(head: HeadProcess, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()

    def step(name: str, needs: str | None) -> list[str]:
        # Each step fails unless the step before it left its mark: the order is checked by the jobs.
        code = (
            "import pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
            "need = sys.argv[3]; "
            "sys.exit(3) if need != '-' and not (d / need).exists() else None; "
            "time.sleep(1); (d / sys.argv[2]).write_text('done')"
        )
        return [PY, "-c", code, str(marks), name, needs or "-"]

    with head.client() as c:
        pre = c.submit(step("pre", None), name="preprocess").id
        train = c.submit(step("train", "pre"), name="train", afterok=[pre]).id
        evaluate = c.submit(step("eval", "train"), name="evaluate", afterok=[train]).id
        wait_for(lambda: c.job(evaluate).wait_reason == "dependency", what="evaluate to wait")
        text = c.job(evaluate).reason
        assert text.startswith(f"waits for job {train} (")
        jobs = [finished(head, i, timeout=60) for i in (pre, train, evaluate)]
        assert [j.state.value for j in jobs] == ["succeeded"] * 3, [j.reason for j in jobs]
        assert jobs[0].ended_at <= jobs[1].started_at and jobs[1].ended_at <= jobs[2].started_at  # type: ignore[operator]


def test_a_waiting_pipeline_has_a_timeline(head: HeadProcess) -> None:
    with head.client() as c:
        first = c.submit([PY, "-c", "import time; time.sleep(60)"], time_limit="10m").id
        second = c.submit([PY, "-c", "pass"], time_limit="20m", afterok=[first]).id
        third = c.submit([PY, "-c", "pass"], afterany=[second]).id
        wait_for(lambda: c.job(first).state.value == "running", what="start")
        started = c.job(first).started_at
        assert started is not None
        wait_for(lambda: c.job(third).estimated_start is not None, what="an estimate through the chain")
        two, three = c.job(second), c.job(third)
        assert two.estimated_start == started + 600  # its dependency's limit from its start
        assert three.estimated_start == started + 600 + 1200  # and the step before it's
        assert "running, expected to end" in two.reason
        assert f"waits for job {second} (waiting, expected to end" in three.reason
        why = cli(head, "why", str(third))
        assert why.returncode == 0, why.stderr
        assert f"[dependency] waits for job {second} (waiting, expected to end" in why.stdout
        assert "start: about " in why.stdout
        c.cancel(first)


def test_afterok_on_a_failed_job_cancels_the_dependent_with_the_reason(head: HeadProcess) -> None:
    with head.client() as c:
        bad = c.submit([PY, "-c", "import sys; sys.exit(2)"]).id
        dependent = c.submit([PY, "-c", "pass"], afterok=[bad]).id
        later = c.submit([PY, "-c", "pass"], afterany=[dependent]).id
        notok = c.submit([PY, "-c", "pass"], afternotok=[bad]).id
        job = finished(head, dependent)
        assert job.state.value == "cancelled" and job.attempt == 0
        assert job.reason == f"dependency can never be met: job {bad} failed (afterok)"
        assert finished(head, later).state.value == "succeeded"  # afterany: a cancelled end is an end
        assert finished(head, notok).state.value == "succeeded"


def test_a_dependency_on_an_unknown_or_foreign_job_is_refused(head: HeadProcess) -> None:
    with head.client() as c:
        try:
            c.submit([PY, "-c", "pass"], afterok=[424242])
            raise AssertionError("accepted")
        except ApiError as e:
            assert e.status == 422 and "no job with id 424242" in str(e)
    r = cli(head, "submit", "--afterok", "x1", "--", PY, "-c", "pass")
    assert r.returncode == 1 and "--afterok 'x1'" in r.stderr and "Traceback" not in r.stderr
    resp = httpx.post(f"{head.url}/v1/jobs", json={"command": ["x"], "afterok": [0]}, headers=head.headers)
    assert resp.status_code == 422


def test_another_teams_job_is_answered_as_a_missing_one(head: HeadProcess) -> None:
    """A dependency, a hold or a release naming another team's job learns nothing of it."""
    me = pwd.getpwuid(os.geteuid())[0]
    with head.client() as admin:
        theirs = admin.submit([PY, "-c", "import time; time.sleep(30)"], team="vision", hold=True).id
        bob = admin.add_user("bob", ["nlp"], unix_user=me).token
    with Client(head.url, token=bob) as c:
        try:
            c.submit([PY, "-c", "pass"], afterok=[theirs])
            raise AssertionError("accepted")
        except ApiError as e:
            assert e.status == 422 and f"no job with id {theirs}" in str(e)
        for call in (c.hold, c.release):
            try:
                call(theirs)
                raise AssertionError("accepted")
            except ApiError as e:
                assert e.status == 404 and f"no job with id {theirs}" in str(e)
    with head.client() as admin:
        assert admin.job(theirs).held  # still held: bob's release changed nothing
        admin.cancel(theirs)
