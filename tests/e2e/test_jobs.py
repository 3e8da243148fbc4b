"""End to end: a real head process, real job processes on virtual GPUs, real HTTP."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpucluster.executors.cgroups import detect as detect_cgroups
from gpucluster.models import Job
from tests.e2e.headproc import HeadProcess, cli, pid_alive, wait_for

CLI = [sys.executable, "-m", "gpucluster.cli.main"]
PY = sys.executable


def finished(head: HeadProcess, job_id: int, timeout: float = 20.0) -> Job:
    with head.client() as c:
        return wait_for(lambda: (j := c.job(job_id)).state.terminal and j, timeout, what=f"job {job_id} to end")  # type: ignore[no-any-return]


def running(head: HeadProcess, job_id: int, timeout: float = 20.0) -> Job:
    with head.client() as c:
        return wait_for(
            lambda: (j := c.job(job_id)).state.value == "running" and j.attempt and j,
            timeout,
            what=f"job {job_id} to run",
        )  # type: ignore[no-any-return]


def test_each_job_sees_only_its_own_gpus(head: HeadProcess) -> None:
    with head.client() as c:
        ids = [
            c.submit(
                [
                    PY,
                    "-c",
                    "import os,time; e = os.environ; "
                    "print('CVD', e['CUDA_VISIBLE_DEVICES'], e['GPUCLUSTER_JOB_ID']); time.sleep(1.5)",
                ],
                gpus=2,
            ).id
            for _ in range(4)
        ]
        jobs = [finished(head, i) for i in ids]
        seen: list[set[int]] = []
        for j in jobs:
            assert j.state.value == "succeeded", j.reason
            line = c.logs(j.id).split()
            assert line[0] == "CVD" and line[2] == str(j.id)
            visible = {int(x) for x in line[1].split(",")}
            assert visible == set(j.allocation[0].gpu_indices) and len(visible) == 2
            seen.append(visible)
        # All four ran at once on 8 GPUs, so their GPU sets are disjoint and cover the node.
        assert set().union(*seen) == set(range(8))
        assert sum(len(s) for s in seen) == 8
        starts = [j.started_at for j in jobs]
        ends = [j.ended_at for j in jobs]
        assert max(starts) < min(ends)  # type: ignore[type-var]


def test_jobs_wait_for_gpus_and_start_in_priority_then_fifo_order(head: HeadProcess) -> None:
    with head.client() as c:
        # high, like the highest waiting job, so this is about queue order and nothing preempts it
        blocker = c.submit([PY, "-c", "import time; time.sleep(1.5)"], gpus=8, priority="high").id
        running(head, blocker)
        normal = c.submit(["sleep", "0.3"], gpus=8).id
        low = c.submit(["sleep", "0.3"], gpus=8, priority="low").id
        high = c.submit(["sleep", "0.3"], gpus=8, priority="high").id
        normal2 = c.submit(["sleep", "0.3"], gpus=8).id
        waiting = c.job(normal)
        assert waiting.state.value == "queued"
        order = [finished(head, i) for i in (blocker, high, normal, normal2, low)]
        assert all(j.state.value == "succeeded" for j in order)
        starts = [j.started_at or 0 for j in order]
        assert starts == sorted(starts), [j.id for j in sorted(order, key=lambda j: j.started_at or 0)]
        # No overlap: each 8-GPU job started only after the previous one ended.
        for prev, nxt in itertools.pairwise(order):
            assert (nxt.started_at or 0) >= (prev.ended_at or 0)


TREE = """
import os, signal, subprocess, sys, time
IGNORE = {ignore}
if IGNORE:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child: both must be SIGKILLed
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
with open('pids', 'w') as f:
    f.write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(300)
"""


def _tree_job(c, tmp: Path, ignore_term: bool, **kw):  # type: ignore[no-untyped-def]
    job = c.submit([PY, "-c", TREE.format(ignore=ignore_term)], gpus=1, workdir=str(tmp), **kw)
    pids_file = tmp / "pids"
    wait_for(lambda: pids_file.exists() and pids_file.read_text().count(" ") == 1, what="job to write its pids")
    return job, [int(p) for p in pids_file.read_text().split()]


def test_cancel_kills_the_whole_process_tree(head: HeadProcess, tmp_path: Path) -> None:
    with head.client() as c:
        job, pids = _tree_job(c, tmp_path, ignore_term=False)
        assert all(pid_alive(p) for p in pids)
        c.cancel(job.id)
        done = finished(head, job.id)
        assert done.state.value == "cancelled"
        assert "cancelled by user" in done.reason
        wait_for(lambda: not any(pid_alive(p) for p in pids), 5, what="job processes to die")


def test_time_limit_sends_sigterm_then_sigkill_to_the_tree(head: HeadProcess, tmp_path: Path) -> None:
    with head.client() as c:
        job, pids = _tree_job(c, tmp_path, ignore_term=True, time_limit="1s")
        done = finished(head, job.id)
        assert done.state.value == "failed"
        assert "time limit 1s exceeded" in done.reason and "SIGKILL" in done.reason, done.reason
        assert done.exit_code == 137
        # it ignored SIGTERM, so it lived through the 1 s grace period
        assert (done.ended_at or 0) - (done.started_at or 0) >= 1.9
        wait_for(lambda: not any(pid_alive(p) for p in pids), 5, what="job processes to die")


def test_kill_9_of_the_head_loses_nothing_and_runs_nothing_twice(head_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    head = head_factory(data).start()
    marker = tmp_path / "starts"
    count = f"open({str(marker)!r}, 'a').write('x');"
    # The jobs end when the test says so (a file appears), not after a sleep: a 10 s job once
    # ended before a restarted head came up on a busy machine.
    release, go, exited = tmp_path / "release", tmp_path / "go", tmp_path / "exited"
    until = "import os, sys, time\nwhile not os.path.exists({!r}): time.sleep(0.05)\n"
    with head.client() as c:
        long = c.submit([PY, "-c", f"{count} {until.format(str(release))}print('long done')"], gpus=4).id
        fail_then = f"open({str(exited)!r}, 'w').close(); sys.exit(7)"
        quick_fail = c.submit([PY, "-c", f"{count} {until.format(str(go))}{fail_then}"], gpus=4).id
        queued = c.submit([PY, "-c", f"{count} print('queued ran')"], gpus=8).id
        running(head, long)
        running(head, quick_fail)
    # `running` is committed before the launch: wait until both commands have begun (each marks
    # it), or the kill can land between the commit and the launch and nothing exits meanwhile.
    wait_for(lambda: marker.exists() and marker.read_text() == "xx", what="both jobs' commands to start")
    head.kill9()
    go.touch()  # quick_fail exits while no head is watching
    wait_for(exited.exists, what="the failing job to exit while the head is down")
    head2 = head_factory(data, port=head.port).start()
    with head2.client() as c:
        assert c.job(queued).state.value in ("queued", "running", "succeeded")
        assert c.job(long).state.value == "running"  # re-adopted, still running
        j_fail = finished(head2, quick_fail)
        assert j_fail.state.value == "failed" and j_fail.exit_code == 7
        release.touch()
        j_long = finished(head2, long, timeout=40)
        assert j_long.state.value == "succeeded" and c.logs(long).strip() == "long done"
        j_q = finished(head2, queued, timeout=40)
        assert j_q.state.value == "succeeded" and c.logs(queued).strip() == "queued ran"
        # Each job ran exactly once, and the 8-GPU job never overlapped the others.
        assert marker.read_text() == "xxx"
        assert all(j.attempt == 1 for j in (j_fail, j_long, j_q))
        assert (j_q.started_at or 0) >= max(j_long.ended_at or 0, j_fail.ended_at or 0)
        ids = {j.id for j in c.jobs()}
        assert ids == {long, quick_fail, queued}


def test_a_job_whose_process_vanished_while_the_head_was_down_is_failed_with_the_reason(
    head_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    head = head_factory(data).start()
    with head.client() as c:
        job = c.submit(["sleep", "300"], gpus=1).id
        running(head, job)
    # `running` is committed before the launch: wait until the process itself exists
    wait_for(lambda: head.job_pgids(), what="the job's shim to record its pid")
    head.kill9()
    head.kill_jobs()  # the job and its shim die without a trace
    head2 = head_factory(data, port=head.port).start()
    done = finished(head2, job)
    assert done.state.value == "failed"
    assert "process lost" in done.reason


def test_commands_never_go_through_a_shell_unless_asked(head: HeadProcess) -> None:
    with head.client() as c:
        literal = c.submit(["echo", "$HOME;", "`id`"], gpus=1).id
        shell = c.submit(["echo $((6*7))"], gpus=1, shell=True).id
        assert finished(head, literal).state.value == "succeeded"
        assert c.logs(literal).strip() == "$HOME; `id`"
        finished(head, shell)
        assert c.logs(shell).strip() == "42"


def test_missing_program_and_workdir_fail_with_a_reason(head: HeadProcess) -> None:
    with head.client() as c:
        nope = c.submit(["/no/such/program"], gpus=1).id
        bad_wd = c.submit(["true"], gpus=1, workdir="/no/such/dir").id
        j = finished(head, nope)
        assert j.state.value == "failed" and j.exit_code == 127
        assert "cannot start '/no/such/program'" in c.logs(nope)
        j2 = finished(head, bad_wd)
        assert j2.state.value == "failed" and "cannot enter the workdir /no/such/dir" in j2.reason


def test_bad_input_gets_4xx_naming_the_field(head: HeadProcess) -> None:
    url, auth = head.url, head.headers
    before = [j["id"] for j in httpx.get(f"{url}/v1/jobs", headers=auth).json()["jobs"]]  # earlier tests'

    cases = [
        ({"command": ["true"], "gpus": 0}, 422, "gpus"),
        ({"command": ["true"], "gpus": -2}, 422, "gpus"),
        ({"command": ["true"], "gpus": 1.5}, 422, "whole number"),
        ({"command": ["true"], "gpus": 0.001}, 422, "at least 0.01"),
        ({"command": ["true"], "gpu_memory": "900GiB"}, 422, "no GPU in this cluster has that much memory"),
        ({"command": ["true"], "gpus": 4, "nodes": 3}, 422, "divide evenly"),
        ({"command": ["true"], "gpus": 1e9}, 422, "at most"),
        ({"command": ["true"], "gpus": "many"}, 422, "gpus"),
        ({"command": ["true"], "gpus": 9}, 422, "can never host"),
        ({"command": ["true"], "gpus": 4, "nodes": 2}, 422, "can never host"),
        ({"command": ["true"], "gpus": 1, "gpu_type": "Z100"}, 422, "H100-80GB"),
        ({"command": [], "gpus": 1}, 422, "command"),
        ({"command": [""], "gpus": 1}, 422, "command is empty"),
        ({"gpus": 1}, 422, "command"),
        ({"command": ["true"], "name": "x" * 500}, 422, "name"),
        ({"command": ["true"], "priority": "urgent"}, 422, "priority"),
        ({"command": ["true"], "time_limit": "soon"}, 422, "time_limit"),
        ({"command": ["true"], "env": {"1BAD": "x"}}, 422, "env"),
        ({"command": ["true"], "gpu": 2}, 422, "gpu"),
        ({"command": ["true"], "workdir": "relative/dir"}, 422, "absolute"),
    ]
    for body, status, needle in cases:
        r = httpx.post(f"{url}/v1/jobs", json=body, headers=auth)
        assert r.status_code == status, (body, r.text)
        assert needle in r.json()["error"], (body, r.json())
    r = httpx.post(f"{url}/v1/jobs", content=b"{not json", headers={**auth, "content-type": "application/json"})
    assert r.status_code == 422
    r = httpx.post(f"{url}/v1/jobs", json={"command": ["x" * 1000] * 2000}, headers=auth)
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    r = httpx.get(f"{url}/v1/jobs/424242", headers=auth)
    assert r.status_code == 404 and r.json()["error"] == "no job with id 424242"
    r = httpx.get(f"{url}/v1/jobs?state=sleeping", headers=auth)
    assert r.status_code == 422 and "state" in r.json()["error"]
    assert [j["id"] for j in httpx.get(f"{url}/v1/jobs", headers=auth).json()["jobs"]] == before  # none created


def test_cli_errors_are_one_message_without_a_traceback(head: HeadProcess, tmp_path: Path) -> None:
    bad_yaml = tmp_path / "job.yaml"
    bad_yaml.write_text("command: [python, train.py]\ngpus: 2\n  team: : x\n")
    wrong_field = tmp_path / "job2.yaml"
    wrong_field.write_text("name: ok\ncommand: [true]\ngpus: -1\n")
    cases = [
        (["submit", "--gpus", "0", "--", "true"], "gpus 0 is a CPU-only job: ask for CPU cores"),
        (["submit", "--gpus", "2.5", "--", "true"], "whole number"),
        (["submit", "--gpus", "64", "--", "true"], "can never host"),
        (["submit", "--gpu-type", "A100", "--", "true"], "unknown GPU type"),
        (["submit", "--gpus", "1"], "no command given"),
        (["submit", "--env", "NOEQUALS", "--", "true"], "KEY=VALUE"),
        (["submit", "--begin", "25:00", "--", "true"], "--begin: '25:00' is not a time of day"),
        (["submit", "--begin", "soon", "--", "true"], "--begin: cannot read the begin time 'soon'"),
        (["submit", "--begin", "now+400d", "--", "true"], "begin: is more than 366 days ahead"),
        (["submit", "-f", str(bad_yaml)], f"{bad_yaml}:3"),
        (["submit", "-f", str(wrong_field)], f"{wrong_field}:3: gpus"),
        (["submit", "-f", str(tmp_path / "missing.yaml")], "cannot read job file"),
        (["show", "99999"], "no job with id 99999"),
        (["logs", "99999"], "no job with id 99999"),
        (["cancel", "99999"], "no job with id 99999"),
    ]
    for args, needle in cases:
        r = cli(head, *args)
        assert r.returncode != 0, args
        assert needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout, args
    r = subprocess.run([*CLI, "jobs", "--url", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot reach the head" in r.stderr and "Traceback" not in r.stderr


def test_cli_tour_submit_watch_logs_cancel_with_json(head: HeadProcess, tmp_path: Path) -> None:
    r = cli(
        head,
        "submit",
        "--gpus",
        "2",
        "--name",
        "tour",
        "--team",
        "vision",
        "--env",
        "GREETING=hi",
        "--json",
        "--",
        PY,
        "-c",
        "import os,time\nfor i in range(3): print(os.environ['GREETING'], i, flush=True); time.sleep(0.3)",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "queued" and job["spec"]["team"] == "vision" and job["spec"]["workdir"] == str(tmp_path)
    follow = cli(head, "logs", str(job["id"]), "--follow")
    assert follow.returncode == 0 and follow.stdout == "hi 0\nhi 1\nhi 2\n"
    shown = json.loads(cli(head, "show", str(job["id"]), "--json").stdout)
    assert shown["state"] == "succeeded" and [e["state"] for e in shown["events"]] == ["queued", "running", "succeeded"]
    assert shown["allocation"][0]["node"] == "node0" and len(shown["allocation"][0]["gpu_indices"]) == 2
    listing = json.loads(cli(head, "jobs", "--json", "--team", "vision").stdout)
    assert [j["id"] for j in listing] == [job["id"]]
    assert json.loads(cli(head, "jobs", "--json", "--team", "nobody").stdout) == []

    long = json.loads(cli(head, "submit", "--json", "--gpus", "8", "--", "sleep", "300").stdout)
    wait_for(lambda: json.loads(cli(head, "show", str(long["id"]), "--json").stdout)["state"] == "running")
    nodes = json.loads(cli(head, "nodes", "--json").stdout)
    assert [g["job_id"] for g in nodes[0]["gpus"]] == [long["id"]] * 8
    assert nodes[0]["virtual"] is True and nodes[0]["gpus"][0]["model"] == "H100-80GB"
    table = cli(head, "nodes").stdout
    assert "H100-80GB" in table and "used" in table
    assert cli(head, "cancel", str(long["id"])).returncode == 0
    done = finished(head, long["id"])
    assert done.state.value == "cancelled"
    again = cli(head, "cancel", str(long["id"]))
    assert again.returncode == 1 and "already ended" in again.stderr


def test_job_file_and_sdk_submit_the_same_job(head: HeadProcess, tmp_path: Path) -> None:
    jf = tmp_path / "job.yaml"
    jf.write_text("name: from-file\ngpus: 2\npriority: high\ntime_limit: 10m\ncommand: [echo, file]\nenv:\n  A: b\n")
    r = cli(head, "submit", "-f", str(jf), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from_file = json.loads(r.stdout)
    assert from_file["spec"]["time_limit"] == 600 and from_file["spec"]["priority"] == "high"
    import gpucluster

    with gpucluster.Client(head.url) as c:
        sdk = c.submit(["echo", "sdk"], gpus=2, name="from-sdk", priority="high", time_limit="10m", env={"A": "b"})
        assert sdk.spec.gpu_count == from_file["spec"]["gpus"] and sdk.spec.time_limit == 600
        assert finished(head, sdk.id).state.value == "succeeded" and c.logs(sdk.id) == "sdk\n"
        assert finished(head, from_file["id"]).state.value == "succeeded" and c.logs(from_file["id"]) == "file\n"


def test_openapi_document_and_docs_are_served(head: HeadProcess) -> None:
    doc = httpx.get(f"{head.url}/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/logs", "/v1/nodes"} <= set(
        doc["paths"]
    )
    assert httpx.get(f"{head.url}/docs").status_code == 200


def test_a_second_head_on_the_same_data_dir_is_refused(head: HeadProcess) -> None:
    r = subprocess.run(
        [*CLI, "up", "--data-dir", str(head.data_dir), "--virtual-gpus", "2", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "another head is already running" in r.stderr


def test_cli_begin_holds_a_job_until_its_time_on_a_real_head(head: HeadProcess, tmp_path: Path) -> None:
    """`--begin +3s` (and a job file's `begin:`): held though every GPU is free, started at or
    after that time, never before (the wait's reason and estimate: test_head_estimates.py)."""
    job_file = tmp_path / "later.yaml"
    job_file.write_text('command: ["true"]\nbegin: now+3s\n')
    asked = time.time()
    r = cli(head, "submit", "--json", "--begin", "+3s", "--", "true")
    assert r.returncode == 0, r.stderr
    by_option = json.loads(r.stdout)
    by_file = json.loads(cli(head, "submit", "--json", "-f", str(job_file)).stdout)
    for job in (by_option, by_file):
        assert asked + 3 <= job["spec"]["begin"] <= time.time() + 3
    shown = cli(head, "show", str(by_option["id"])).stdout
    assert "begin: " in shown, shown
    with head.client():
        for job in (by_option, by_file):
            done = finished(head, job["id"])
            assert done.state.value == "succeeded"
            assert (done.started_at or 0) >= job["spec"]["begin"]


def test_a_stopped_head_leaves_no_cgroup_behind(head_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each data dir's head has a parent cgroup of its own (gpucluster/head-<hash>): one that
    stops with no job left running removes it (every test's head had left one behind: 3,500 on
    the development machine), and a job's own cgroup is removed when the job ends."""
    support = detect_cgroups()
    if not support.usable:
        pytest.skip(f"no cgroups here: {support.describe()}")
    data = tmp_path / "data"
    head = head_factory(data).start()
    instance = "head-" + hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:12]
    parents = support.parent_paths(instance)
    with head.client() as c:
        job = c.submit(["true"], gpus=1).id
        wait_for(lambda: c.job(job).state.value == "succeeded", timeout=60, what="the job's end")
    assert all(os.path.isdir(p) for p in parents.values())  # made by the job's start
    assert not any(_job_dirs(p) for p in parents.values())  # the job's own, removed as it ended
    head.stop()
    assert head.proc is not None and head.proc.returncode is not None
    assert not any(os.path.exists(p) for p in parents.values())


def _job_dirs(parent: str) -> list[str]:
    return [e.name for e in os.scandir(parent) if e.is_dir() and e.name.startswith("job-")]
