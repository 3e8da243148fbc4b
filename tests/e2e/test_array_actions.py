"""Acting on an array's elements by state, and requeueing an array, on a real head with the real
CLI: `cancel|hold|release|requeue ID --state S` (as `scancel --state=PENDING`), `requeue ID` and
`requeue ID[7]`."""

from __future__ import annotations

import os
import pwd
import sys

import httpx

from gpucluster.client import ApiError, Client
from tests.e2e.headproc import HeadProcess, cli, wait_for

PY = sys.executable
LONG = [PY, "-c", "import time; time.sleep(600)"]


def states(head: HeadProcess, array_id: int) -> dict[int, tuple[str, int, bool]]:
    """index -> (state, attempt, held) of every element."""
    with head.client() as c:
        return {j.array_index: (j.state.value, j.attempt, j.held) for j in c.jobs() if j.array_id == array_id}  # type: ignore[misc]


def submit_array(head: HeadProcess, *args: str) -> int:
    r = cli(head, "submit", *args, "--gpus", "1", "--", *LONG)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[2])


def count(head: HeadProcess, array_id: int, state: str) -> int:
    return sum(1 for s, _, _ in states(head, array_id).values() if s == state)


def test_cancel_by_state_cancels_only_the_queued_elements_then_the_running(head: HeadProcess) -> None:
    array_id = submit_array(head, "--array", "0-5%2")
    wait_for(lambda: count(head, array_id, "running") == 2, 60, what="two elements running")
    r = cli(head, "cancel", str(array_id), "--state", "queued")
    assert r.returncode == 0, r.stderr
    after = states(head, array_id)
    assert [after[i][0] for i in range(6)] == ["running"] * 2 + ["cancelled"] * 4
    r = cli(head, "cancel", str(array_id), "--state", "running")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: count(head, array_id, "cancelled") == 6, 60, what="every element cancelled")


def test_hold_and_cancel_by_state_pick_the_held_elements(head: HeadProcess) -> None:
    array_id = submit_array(head, "--array", "0-3%1")
    wait_for(lambda: states(head, array_id)[0][0] == "running", 60, what="element 0 running")
    assert cli(head, "hold", f"{array_id}[3]").returncode == 0
    r = cli(head, "cancel", str(array_id), "--state", "held")
    assert r.returncode == 0, r.stderr
    now = states(head, array_id)
    assert [now[i][0] for i in range(4)] == ["running", "queued", "queued", "cancelled"]
    # hold the queued ones only, then release the held ones only: the running one is untouched
    r = cli(head, "hold", str(array_id), "--state", "queued")
    assert r.returncode == 0 and "held 2 jobs" in r.stdout, r.stdout + r.stderr
    assert [states(head, array_id)[i][2] for i in (1, 2)] == [True, True]
    r = cli(head, "release", str(array_id), "--state", "held")
    assert r.returncode == 0 and "released 2 jobs" in r.stdout, r.stdout + r.stderr
    with head.client() as c:  # the SDK: several states at once
        c.cancel(array_id, state=["running", "queued"])
    wait_for(lambda: count(head, array_id, "cancelled") == 4, 60, what="every element cancelled")


def test_requeue_of_an_array_requeues_its_running_elements_and_of_an_element_only_it(head: HeadProcess) -> None:
    array_id = submit_array(head, "--array", "0-2")
    wait_for(lambda: count(head, array_id, "running") == 3, 60, what="three elements running")
    r = cli(head, "requeue", f"{array_id}[1]")
    assert r.returncode == 0 and "requeueing" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: states(head, array_id)[1][:2] == ("running", 2), 60, what="element 1 running again")
    assert [states(head, array_id)[i][:2] for i in (0, 2)] == [("running", 1), ("running", 1)]
    r = cli(head, "requeue", str(array_id), "--state", "queued")  # a filter that picks nothing
    assert r.returncode == 0, r.stderr
    r = cli(head, "requeue", str(array_id))
    assert r.returncode == 0 and "running elements requeueing" in r.stdout, r.stdout + r.stderr
    wait_for(
        lambda: [s[:2] for s in states(head, array_id).values()] == [("running", 2), ("running", 3), ("running", 2)],
        60,
        what="every element running again, one attempt later",
    )
    cli(head, "cancel", str(array_id))
    # an element that is not running cannot be requeued: one line, exit 1
    held = submit_array(head, "--array", "0-1", "--hold")
    r = cli(head, "requeue", f"{held}[0]")
    assert r.returncode == 1 and "only a running job can be requeued" in r.stderr and "Traceback" not in r.stderr


def test_bad_state_filters_and_another_teams_array(head: HeadProcess) -> None:
    r = cli(head, "cancel", "1", "--state", "pending")
    assert r.returncode == 1 and "--state 'pending': give one of queued, held, running, preempted" in r.stderr
    assert "Traceback" not in r.stderr
    me = pwd.getpwuid(os.geteuid())[0]
    with head.client() as admin:
        theirs = admin.submit([PY, "-c", "pass"], team="vision", hold=True, array="0-3").id
        bob = admin.add_user("bob", ["nlp"], unix_user=me).token
    resp = httpx.post(f"{head.url}/v1/jobs/{theirs}/cancel?state=pending", headers=head.headers)
    assert resp.status_code == 422 and "state" in resp.text
    with Client(head.url, token=bob) as c:
        for call in (c.cancel, c.hold, c.release, c.requeue):
            for missing in (theirs, 999_999):
                try:
                    call(missing, state=["queued"])
                    raise AssertionError("accepted")
                except ApiError as e:
                    assert e.status == 404 and str(e).endswith(f"no job with id {missing}"), str(e)
    assert {s for s, _, held in states(head, theirs).values()} == {"queued"}  # bob changed nothing
