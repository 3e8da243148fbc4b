"""Job arrays and sweeps on a real head: real processes, real HTTP, a real SQLite file."""

from __future__ import annotations

import sys
from pathlib import Path

from gpucluster.client import ApiError
from tests.e2e.headproc import HeadProcess, cli, wait_for
from tests.e2e.test_jobs import finished

PY = sys.executable
# Each element prints its own start and end (its clock, not the head's) and its array variables.
ELEMENT = (
    "import os, time; e = os.environ; print('start', time.time(), flush=True); "
    "print('vars', e['GPUCLUSTER_ARRAY_ID'], e['GPUCLUSTER_ARRAY_INDEX'], e['GPUCLUSTER_ARRAY_COUNT'], "
    "e['SLURM_ARRAY_TASK_ID'], flush=True); time.sleep(0.6); print('end', time.time(), flush=True)"
)


def elements(head: HeadProcess, array_id: int) -> list[dict[str, object]]:
    with head.client() as c:
        jobs = c.jobs()  # every element: the SDK lists arrays collapsed only when asked
    return [{"id": j.id, "index": j.array_index, "state": j.state.value} for j in jobs if j.array_id == array_id]


def test_a_throttled_array_never_runs_more_than_its_throttle_at_once(head: HeadProcess) -> None:
    r = cli(head, "submit", "--array", "0-9:1%3", "--gpus", "1", "--", PY, "-c", ELEMENT)
    assert r.returncode == 0, r.stderr
    assert "submitted array" in r.stdout and "10 elements" in r.stdout
    array_id = int(r.stdout.split()[2])
    with head.client() as c:
        ids = [e["id"] for e in elements(head, array_id)]
        assert len(ids) == 10
        jobs = [finished(head, int(i), timeout=120) for i in ids]  # type: ignore[call-overload]
        spans = []
        for j in jobs:
            assert j.state.value == "succeeded", j.reason
            log = dict(line.split(" ", 1) for line in c.logs(j.id).splitlines() if " " in line)
            aid, index, count, slurm = log["vars"].split()
            assert (int(aid), int(index), int(count), int(slurm)) == (array_id, j.array_index, 10, j.array_index)
            spans.append((float(log["start"]), float(log["end"])))
    # The most elements alive at any moment, from the elements' own start and end times.
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    alive = most = 0
    for _, step in events:
        alive += step
        most = max(most, alive)
    assert most <= 3
    assert most >= 2  # 8 free GPUs: the throttle, not the cluster, held them back


def test_jobs_lists_an_array_as_one_line_and_expand_lists_its_elements(head: HeadProcess) -> None:
    r = cli(head, "submit", "--array", "1,5,7", "--hold", "--", PY, "-c", "pass")
    assert r.returncode == 0, r.stderr
    array_id = int(r.stdout.split()[2])
    listing = cli(head, "jobs")
    assert f"{array_id}[]" in listing.stdout and "3 queued" in listing.stdout
    expanded = cli(head, "jobs", "--expand")
    for index in (1, 5, 7):
        assert f"{array_id}[{index}]" in expanded.stdout
    # Release one element: only it runs.
    rel = cli(head, "release", f"{array_id}[5]")
    assert rel.returncode == 0, rel.stderr
    with head.client() as c:
        five = next(e for e in elements(head, array_id) if e["index"] == 5)
        done = finished(head, int(five["id"]))  # type: ignore[call-overload]
        assert done.state.value == "succeeded"
        # Its history starts with the array's submission, recorded once for all its elements.
        assert done.events[0].reason == "submitted (array of 3)"
        assert [e.state.value for e in done.events][-2:] == ["running", "succeeded"]
        assert sorted(str(e["state"]) for e in elements(head, array_id)) == ["queued", "queued", "succeeded"]
        # Cancel the array: its queued elements end, the finished one stays as it was.
        cancelled = cli(head, "cancel", str(array_id))
        assert cancelled.returncode == 0, cancelled.stderr
        assert sorted(str(e["state"]) for e in elements(head, array_id)) == ["cancelled", "cancelled", "succeeded"]
        assert c.job(array_id).array_counts == {"cancelled": 2, "succeeded": 1}
    shown = cli(head, "show", str(array_id))
    assert f"array:      {array_id}, element 1 ({array_id}[1]); the array: 2 cancelled, 1 succeeded" in shown.stdout


def test_update_throttle_lets_more_elements_run(head: HeadProcess) -> None:
    with head.client() as c:
        first = c.submit([PY, "-c", "import time; time.sleep(60)"], array="0-3%1")
        array_id = first.array_id
        assert array_id is not None
        wait_for(lambda: c.job(array_id).array_counts == {"running": 1, "queued": 3}, what="one running")
        r = cli(head, "update", str(array_id), "--throttle", "3")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: c.job(array_id).array_counts == {"running": 3, "queued": 1}, what="three running")
        c.cancel(array_id)
        wait_for(lambda: c.job(array_id).array_counts == {"cancelled": 4}, what="all cancelled")


def test_a_sweep_gives_each_element_its_values(head: HeadProcess) -> None:
    with head.client() as c:
        first = c.submit(
            [PY, "-c", "import os, sys; print('got', sys.argv[1], os.environ['lr'], os.environ['batch'])", "{lr}"],
            sweep={"lr": [0.001, 0.0003], "batch": [32, 64]},
        )
        array_id = first.array_id
        assert array_id is not None and first.array_counts == {"queued": 4}
        seen = set()
        for e in elements(head, array_id):
            job = finished(head, int(e["id"]))  # type: ignore[call-overload]
            assert job.state.value == "succeeded", job.reason
            _, arg, lr, batch = c.logs(job.id).split()
            assert arg == lr
            seen.add((lr, batch))
        assert seen == {("0.001", "32"), ("0.001", "64"), ("0.0003", "32"), ("0.0003", "64")}


def test_aftercorr_pairs_elements(head: HeadProcess) -> None:
    with head.client() as c:
        code = "import os, sys; sys.exit(1 if os.environ['GPUCLUSTER_ARRAY_INDEX'] == '1' else 0)"
        a = c.submit([PY, "-c", code], array="0-2").array_id
        b = c.submit([PY, "-c", "pass"], array="0-2", aftercorr=a).array_id
        assert a is not None and b is not None
        wait_for(lambda: c.job(b).array_counts == {"succeeded": 2, "cancelled": 1}, timeout=60, what="b to end")
        cancelled = next(e for e in elements(head, b) if e["state"] == "cancelled")
        assert cancelled["index"] == 1


def test_bad_arrays_get_one_clear_error_each(head: HeadProcess) -> None:
    for spec, words in (
        ("0-", "cannot read '0-'"),
        ("5-1", "ends before it starts"),
        ("0-9%0", "throttle of 0"),
        ("0-100000", "more than 100,000; confirm with --yes"),
    ):
        r = cli(head, "submit", "--array", spec, "--", PY, "-c", "pass")
        assert r.returncode == 1 and words in r.stderr, (spec, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    with head.client() as c:
        try:
            c.submit([PY, "-c", "pass"], array="0-1:0")
            raise AssertionError("accepted")
        except ApiError as e:
            assert e.status == 422 and "step" in str(e)


def test_a_sweep_from_a_job_file_and_the_large_sweep_guard(head: HeadProcess, tmp_path: Path) -> None:
    job = tmp_path / "sweep.yaml"
    job.write_text(
        "command: [" + PY + ', -c, "import sys; print(sys.argv[1:])", "{lr}", "{batch}"]\n'
        "sweep: {lr: [0.1, 0.01], batch: [8]}\n"
        "throttle: 1\n"
    )
    r = cli(head, "submit", "-f", str(job))
    assert r.returncode == 0, r.stderr
    array_id = int(r.stdout.split()[2])
    assert "2 elements" in r.stdout
    with head.client() as c:
        logs = sorted(c.logs(finished(head, int(e["id"])).id).strip() for e in elements(head, array_id))  # type: ignore[call-overload]
    assert logs == ["['0.01', '8']", "['0.1', '8']"]
    big = tmp_path / "big.yaml"
    big.write_text("command: [/bin/true]\nsweep: {a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], random: 100001, seed: 1}\n")
    r = cli(head, "submit", "-f", str(big))
    assert r.returncode == 1 and "confirm with --yes" in r.stderr and "Traceback" not in r.stderr, r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [/bin/true]\nsweep: {lr: 0.1}\n")
    r = cli(head, "submit", "-f", str(bad))
    assert r.returncode == 1 and "sweep: lr: give a non-empty list" in r.stderr, r.stderr
