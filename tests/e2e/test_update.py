"""`gpucluster update`: a queued job's fields and a running job's time limit, on a real head.

Who may change what (owner yes, a teammate without rights no, another team as if missing), the
submit's rules (a class above normal needs its grant; a bad value is one clear line), the events
and the audit log, the scheduler seeing the new request, and a shortened limit enforced.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.headproc import HeadProcess, cli, passable_dir, wait_for

ME = pwd.getpwuid(os.geteuid())[0]


@pytest.fixture(scope="module")
def head() -> Iterator[HeadProcess]:
    with passable_dir("gc-update-") as root:
        h = HeadProcess(root / "data", gpus=4)
        try:
            yield h.start()
        finally:
            h.stop()
            h.kill_jobs()


@pytest.fixture(scope="module")
def users(head: HeadProcess) -> dict[str, str]:
    """alice and carol: members of vision; bob: of nlp. Each one's token."""
    tokens = {}
    for name, team in (("alice", "vision"), ("carol", "vision"), ("bob", "nlp")):
        r = cli(head, "admin", "add-user", name, "--team", team, "--unix-user", ME, "--json")
        assert r.returncode == 0, r.stderr
        tokens[name] = json.loads(r.stdout)["token"]
    return tokens


def submit(head: HeadProcess, token: str, *args: str) -> dict[str, Any]:
    r = cli(head, "submit", "--json", *args, token=token)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def show(head: HeadProcess, job_id: int | str) -> dict[str, Any]:
    r = cli(head, "show", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_the_owner_changes_a_queued_job_and_it_is_in_its_events_and_the_audit_log(
    head: HeadProcess, users: dict[str, str]
) -> None:
    alice = users["alice"]
    job = submit(head, alice, "--hold", "--name", "first", "--", "true")
    r = cli(head, "update", str(job["id"]), "--priority", "low", "--time-limit", "2h", "--name", "second", token=alice)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"job {job['id']}: ")
    got = show(head, job["id"])
    assert (got["name"], got["spec"]["priority"], got["spec"]["time_limit"]) == ("second", "low", 7200.0)
    assert "priority normal -> low, time limit none -> 2h, name first -> second by alice" in [
        e["reason"] for e in got["events"]
    ]
    audit = json.loads(cli(head, "admin", "audit", "--json").stdout)
    entry = next(e for e in audit if e["action"] == "update-job" and e["target"] == f"job {job['id']}")
    assert entry["user"] == "alice" and "priority normal -> low" in entry["detail"]


def test_who_may_change_a_job(head: HeadProcess, users: dict[str, str]) -> None:
    job = submit(head, users["alice"], "--hold", "--", "true")
    r = cli(head, "update", str(job["id"]), "--priority", "low", token=users["carol"])  # a teammate, no rights
    assert r.returncode == 1
    assert "was submitted by alice; only they, an admin of its team, or a cluster admin may change it" in r.stderr
    other = cli(head, "update", str(job["id"]), "--priority", "low", token=users["bob"])  # another team's job
    missing = cli(head, "update", "999999", "--priority", "low", token=users["bob"])
    assert other.returncode == missing.returncode == 1
    assert other.stderr == f"error: no job with id {job['id']}\n"
    assert missing.stderr == "error: no job with id 999999\n"
    assert show(head, job["id"])["spec"]["priority"] == "normal"  # none of them changed it


def test_a_priority_above_normal_needs_its_grant_as_at_submit(head: HeadProcess, users: dict[str, str]) -> None:
    job = submit(head, users["alice"], "--hold", "--", "true")
    r = cli(head, "update", str(job["id"]), "--priority", "high", token=users["alice"])
    assert r.returncode == 1
    assert "priority: you (alice) may not submit high jobs to team vision" in r.stderr
    assert cli(head, "update", str(job["id"]), "--priority", "high").returncode == 0  # a cluster admin may
    assert show(head, job["id"])["spec"]["priority"] == "high"


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--time-limit", "banana", "time_limit: "),
        ("--gpus", "2.5", "gpus: gpus above 1 must be a whole number (got 2.5)"),
        ("--gpus", "64", "gpus: asks for 64 GPUs but this cluster can never host that"),
        ("--priority", "urgent", "priority: "),
        ("--gpu-type", "Z80", "gpu_type: unknown GPU type 'Z80'"),
    ],
)
def test_a_bad_value_is_one_clear_line(
    head: HeadProcess, users: dict[str, str], option: str, value: str, says: str
) -> None:
    job = submit(head, users["alice"], "--hold", "--", "true")
    r = cli(head, "update", str(job["id"]), option, value, token=users["alice"])
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"error: {says}") and r.stderr.count("\n") == 1, r.stderr


def test_nothing_to_change_and_a_bad_reference_are_one_line(head: HeadProcess) -> None:
    r = cli(head, "update", "1")
    assert r.returncode == 1 and r.stderr.startswith("error: nothing to change") and r.stderr.count("\n") == 1
    r = cli(head, "update", "x7", "--priority", "low")
    assert r.returncode == 1 and "is not a job id" in r.stderr and r.stderr.count("\n") == 1


def test_the_scheduler_starts_the_job_with_its_new_request(head: HeadProcess, users: dict[str, str]) -> None:
    alice = users["alice"]
    job = submit(head, alice, "--begin", "now+1h", "--gpus", "1", "--", "sleep", "60")
    assert show(head, job["id"])["state"] == "queued"
    r = cli(head, "update", str(job["id"]), "--gpus", "2", "--begin", "none", token=alice)
    assert r.returncode == 0, r.stderr
    running = wait_for(lambda: (j := show(head, job["id"]))["state"] == "running" and j, what="the job to start")
    assert sum(len(s["gpu_indices"]) for s in running["allocation"]) == 2
    r = cli(head, "update", str(job["id"]), "--priority", "low", token=alice)  # running: only the limit
    assert r.returncode == 1 and "is running; only its time limit can change (not priority)" in r.stderr
    assert cli(head, "cancel", str(job["id"]), token=alice).returncode == 0


def test_a_running_jobs_time_limit_is_shortened_by_its_owner_and_enforced(
    head: HeadProcess, users: dict[str, str]
) -> None:
    alice = users["alice"]
    job = submit(head, alice, "--time-limit", "1h", "--", "sleep", "600")
    wait_for(lambda: show(head, job["id"])["state"] == "running", what="the job to start")
    r = cli(head, "update", str(job["id"]), "--time-limit", "2h", token=alice)  # only a cluster admin extends
    assert r.returncode == 1
    assert "time_limit: a running job's time limit may only be shortened (it is 1h)" in r.stderr
    r = cli(head, "update", str(job["id"]), "--time-limit", "2s", token=alice)
    assert r.returncode == 0, r.stderr
    ended = wait_for(lambda: (j := show(head, job["id"]))["state"] in ("failed", "succeeded") and j, timeout=60)
    assert ended["state"] == "failed" and ended["reason"].startswith("time limit 2s exceeded"), ended["reason"]
    assert "time limit 1h -> 2s by alice" in [e["reason"] for e in ended["events"]]


def test_a_cluster_admin_may_extend_a_running_jobs_limit(head: HeadProcess, users: dict[str, str]) -> None:
    job = submit(head, users["alice"], "--time-limit", "1h", "--", "sleep", "600")
    wait_for(lambda: show(head, job["id"])["state"] == "running", what="the job to start")
    assert cli(head, "update", str(job["id"]), "--time-limit", "3h").returncode == 0
    assert show(head, job["id"])["spec"]["time_limit"] == 3 * 3600.0
    assert cli(head, "cancel", str(job["id"])).returncode == 0


def test_an_array_element_or_all_queued_elements(head: HeadProcess, users: dict[str, str]) -> None:
    alice = users["alice"]
    array = submit(head, alice, "--hold", "--array", "0-3", "--name", "sweep", "--", "true")
    first = array["array_id"]
    r = cli(head, "update", f"{first}[2]", "--priority", "low", token=alice)
    assert r.returncode == 0, r.stderr
    elements = {e["array_index"]: e for e in (show(head, first + i) for i in range(4))}
    assert [elements[i]["spec"]["priority"] for i in range(4)] == ["normal", "normal", "low", "normal"]
    r = cli(head, "update", str(first), "--name", "renamed", token=alice)  # the array: every queued element
    assert r.returncode == 0, r.stderr
    assert [show(head, first + i)["name"] for i in range(4)] == ["renamed"] * 4
    assert show(head, first + 2)["spec"]["priority"] == "low"  # its own change kept
