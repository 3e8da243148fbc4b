"""End to end: the scheduler's policy on a live head with real processes."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from gpucluster.client import Client
from tests.e2e.headproc import HeadProcess, cli, wait_for
from tests.e2e.test_jobs import PY, finished, running

TRAP = """
import os, signal, sys, time
attempt = os.environ['GPUCLUSTER_ATTEMPT']
def term(*_):
    print(f'attempt {attempt}: got SIGTERM', flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print(f'attempt {attempt}: started', flush=True)
time.sleep(float(sys.argv[1]))
print(f'attempt {attempt}: done', flush=True)
"""


def test_a_high_priority_job_preempts_a_low_one_which_runs_again_after_it(head: HeadProcess) -> None:
    with head.client() as c:
        low = c.submit([PY, "-c", TRAP, "30"], gpus=8, priority="low", name="low").id
        running(head, low)
        wait_for(lambda: "started" in c.logs(low), what="the low job to start")
        high = c.submit([PY, "-c", TRAP, "1"], gpus=8, priority="high", name="high").id
        h = finished(head, high, timeout=30)
        assert h.state.value == "succeeded"
        # the low job came back as attempt 2 after the high one; shorten the wait by cancelling it
        again = wait_for(lambda: (j := c.job(low)).attempt == 2 and j.state.value == "running" and j, 20)
        assert again.started_at is not None and h.ended_at is not None and again.started_at >= h.ended_at
        states = [e.state.value for e in c.job(low).events]
        assert states == ["queued", "running", "preempted", "queued", "running"], states
        preempted = next(e for e in c.job(low).events if e.state.value == "preempted")
        assert f"preempted by job {high}" in preempted.reason
        assert c.logs(low, attempt=1).splitlines() == ["attempt 1: started", "attempt 1: got SIGTERM"]
        wait_for(lambda: "attempt 2: started" in c.logs(low), what="attempt 2 to log")
        c.cancel(low)
        finished(head, low)


def test_queue_and_why_explain_waiting_jobs(head: HeadProcess) -> None:
    with head.client() as c:
        big = c.submit(["sleep", "30"], gpus=8, priority="critical", time_limit="10m").id
        running(head, big)
        waiting = c.submit(["true"], gpus=4).id
        behind = c.submit(["true"], gpus=4).id
        third = c.submit(["true"], gpus=8).id
        wait_for(lambda: c.job(waiting).wait_reason == "reserved", what="a reservation for the first waiting job")
        j = c.job(waiting)
        big_ends = (c.job(big).started_at or 0) + 600
        assert j.estimated_start is not None and abs(j.estimated_start - big_ends) < 5
        # Every job gets an estimate (refreshed every few seconds): the 3rd in line after the
        # first (no limit: the default hour) ends.
        wait_for(lambda: c.job(third).estimated_start is not None, what="an estimate for the 3rd in line")
        q = json.loads(cli(head, "queue", "--json").stdout)
        assert [e["job"]["id"] for e in q] == [waiting, behind, third]
        assert [e["position"] for e in q] == [1, 2, 3]
        assert abs(q[2]["job"]["estimated_start"] - (big_ends + 3600)) < 5
        table = cli(head, "queue").stdout
        est = time.strftime("%Y-%m-%d %H:%M", time.localtime(q[2]["job"]["estimated_start"]))
        assert est in table
        why = json.loads(cli(head, "why", str(behind), "--json").stdout)
        assert why["position"] == 2 and why["wait_reason"] in ("behind_reservation", "resources")
        text = cli(head, "why", str(waiting)).stdout
        assert "position 1" in text and "reserved" in text
        c.cancel(big)


def test_policy_check_reports_the_line_and_up_refuses_a_bad_policy(tmp_path: Path, head_factory) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "good.yaml"
    good.write_text(
        "teams:\n  vision: {weight: 2, quota: {H100-80GB: 4}}\n  nlp: {weight: 1}\npreemption:\n  grace_period: 1s\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams:\n  vision:\n    weight: 2\n    quota: {H100-80GB: -4}\n")
    h = head_factory(tmp_path / "data")
    ok = cli(h, "policy", "check", str(good))
    assert ok.returncode == 0 and "2 team(s)" in ok.stdout and "order in a team's line: las" in ok.stdout
    r = cli(h, "policy", "check", str(bad))
    assert r.returncode == 1 and f"{bad}:4: teams.vision.quota" in r.stderr and "Traceback" not in r.stderr
    h.args += ["--policy", str(bad)]
    try:
        h.start(timeout=10)
        raise AssertionError("a head started with an invalid policy")
    except RuntimeError as e:
        assert "invalid policy" in str(e) and "bad.yaml:4" in str(e)


def test_the_head_reloads_its_policy_file_without_dropping_jobs(tmp_path: Path, head_factory) -> None:  # type: ignore[no-untyped-def]
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams:\n  vision: {weight: 1}\n")
    h = head_factory(tmp_path / "data")
    h.args += ["--policy", str(policy)]
    h.start()
    with h.client() as c:
        job = c.submit(["sleep", "30"], gpus=1, team="vision").id
        running(h, job)
        assert [t.name for t in c.policy().teams if t.weight == 1.0] == ["vision"]
        time.sleep(1.1)
        policy.write_text("teams:\n  vision: {weight: 3}\n  nlp: {weight: 1}\n")
        wait_for(lambda: {t.name: t.weight for t in c.policy().teams}.get("vision") == 3.0, what="the reload")
        policy.write_text("teams:\n  vision: {weight: -1}\n")
        wait_for(lambda: c.policy().error is not None, what="the failed reload to be reported")
        p = c.policy()
        assert "policy.yaml:2" in (p.error or "") and {t.name: t.weight for t in p.teams}["vision"] == 3.0
        assert c.job(job).state.value == "running"
        c.cancel(job)


def test_fractional_jobs_share_one_gpu_and_are_told_their_share(head: HeadProcess) -> None:
    with head.client() as c:
        show = (
            "import os, time; e = os.environ; "
            "print(e['CUDA_VISIBLE_DEVICES'], e['GPUCLUSTER_GPU_FRACTION'], e['GPUCLUSTER_GPU_MEMORY_LIMIT']); "
            "time.sleep(1)"
        )
        ids = [c.submit([PY, "-c", show], gpus=0.25).id for _ in range(4)]
        ids.append(c.submit([PY, "-c", show], gpu_memory="40GiB").id)
        done = [finished(head, i) for i in ids]
        assert all(j.state.value == "succeeded" for j in done)
        quarter = [c.logs(i).split() for i in ids[:4]]
        assert {q[0] for q in quarter} == {quarter[0][0]}  # all four on one GPU
        assert {q[1] for q in quarter} == {"0.25"} and int(quarter[0][2]) == 20 * 1024**3
        half = c.logs(ids[4]).split()
        assert half[1] == "0.5" and int(half[2]) == 40 * 1024**3
        assert all(j.allocation[0].share in (0.25, 0.5) for j in done)


def test_two_teams_at_their_quotas_do_not_livelock_on_preemption(tmp_path: Path, head_factory) -> None:  # type: ignore[no-untyped-def]
    """Issue 14, measured: teams a and b each hold their 1-GPU quota of 2 GPUs, a's GPU with a
    critical job. a's high job may not take b's guaranteed job (a is at its own quota), so it
    waits for a's GPU instead of preempting b's job round after round (attempt 55 in 45 s,
    while the high job never started)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams:\n  a: {quota: {H100-80GB: 1}}\n  b: {quota: {H100-80GB: 1}}\n")
    h = head_factory(tmp_path / "data", gpus=2)  # grace period 1s: a loop would turn every ~2 s
    h.args += ["--policy", str(policy)]
    h.start()
    with h.client() as c:
        hold = c.submit([PY, "-c", "import time; time.sleep(6)"], gpus=1, team="a", priority="critical").id
        running(h, hold)
        victim = c.submit([PY, "-c", TRAP, "120"], gpus=1, team="b", name="b-guaranteed").id
        running(h, victim)
        high = c.submit([PY, "-c", "print('high ran')"], gpus=1, team="a", priority="high").id
        done = finished(h, high, timeout=60)  # a's critical job ends after 6 s; then it starts
        assert done.state.value == "succeeded" and done.attempt == 1
        assert c.logs(high).strip() == "high ran"
        v = c.job(victim)
        preempted = [e for e in v.events if e.state.value == "preempted"]
        assert len(preempted) <= 1, [e.reason for e in preempted]
        assert v.attempt == 1 and v.state.value == "running", (v.attempt, v.state)
        assert done.started_at is not None and done.started_at >= (c.job(hold).ended_at or 0)
        c.cancel(victim)
        finished(h, victim)


def _submit_cli(head: HeadProcess, *args: str) -> int:
    """Submit through the real CLI; the job's id from its `submitted job N` line."""
    out = cli(head, "submit", *args)
    assert out.returncode == 0, out.stderr
    found = re.search(r"submitted job (\d+)", out.stdout)
    assert found is not None, out.stdout
    return int(found.group(1))


def _first_gpu(c: Client, job_id: int) -> str:
    """Where the job's first attempt ran, from its first start event ("started on n GPUs 3")."""
    return next(e.reason for e in c.job(job_id).events if e.state.value == "running").split(" on ", 1)[1]


def test_a_whole_gpu_job_preempts_the_two_half_gpu_jobs_of_one_gpu_which_run_again(head: HeadProcess) -> None:
    """Issue 16, measured: 16 low half-GPU jobs fill the 8 GPUs; a high 1-GPU job waited forever
    (fractional jobs were never victims). Now the two halves of one GPU are preempted (one GPU
    frees only when every share on it goes), the high job runs, and both come back."""
    with head.client() as c:
        lows = [c.submit(["sleep", "600"], gpus=0.5, priority="low", name=f"half-{i}").id for i in range(16)]
        for j in lows:
            running(head, j, timeout=60)
        high = _submit_cli(head, "--gpus", "1", "--priority", "high", "--", PY, "-c", "print('high ran')")
        done = finished(head, high, timeout=60)
        assert done.state.value == "succeeded" and c.logs(high).strip() == "high ran"
        victims = [j for j in lows if any(e.state.value == "preempted" for e in c.job(j).events)]
        assert len(victims) == 2, victims
        for v in victims:
            reason = next(e.reason for e in c.job(v).events if e.state.value == "preempted")
            assert f"preempted by job {high}" in reason
        assert _first_gpu(c, victims[0]) == _first_gpu(c, victims[1]) == _first_gpu(c, high)
        for v in victims:  # requeued like any job: a second attempt once the high job is done
            again = wait_for(lambda v=v: (j := c.job(v)).attempt == 2 and j.state.value == "running" and j, 60)
            assert again.started_at is not None and done.ended_at is not None and again.started_at >= done.ended_at
        for j in lows:
            c.cancel(j)
        for j in lows:
            finished(head, j, timeout=60)


def test_a_high_half_gpu_job_preempts_one_low_whole_gpu_job(head: HeadProcess) -> None:
    """Issue 16: a fractional job never preempted; on a cluster full of low whole-GPU jobs it
    waited forever. Now it takes exactly one of them."""
    with head.client() as c:
        lows = [c.submit(["sleep", "600"], gpus=1, priority="low", name=f"low-{i}").id for i in range(8)]
        for j in lows:
            running(head, j, timeout=60)
        high = _submit_cli(head, "--gpus", "0.5", "--priority", "high", "--", PY, "-c", "print('half ran')")
        done = finished(head, high, timeout=60)
        assert done.state.value == "succeeded" and c.logs(high).strip() == "half ran"
        assert done.allocation is None or done.allocation[0].share == 0.5
        victims = [j for j in lows if any(e.state.value == "preempted" for e in c.job(j).events)]
        assert len(victims) == 1, victims
        wait_for(lambda: c.job(victims[0]).attempt == 2, 60, what="the victim's second attempt")
        for j in lows:
            c.cancel(j)
        for j in lows:
            finished(head, j, timeout=60)
