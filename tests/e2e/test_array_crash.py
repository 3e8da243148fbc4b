"""kill -9 of the head while an array is half run, twice, with a job depending on the whole array:
no element is lost, none runs twice, the throttle holds across the restarts (counted from the
jobs' own start and end lines), and the dependent job starts only after every element ended."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.crashkit import double_runs, job_command, read_events
from tests.e2e.headproc import HeadProcess, wait_for

ELEMENTS = 12
THROTTLE = 3


def test_kill9_of_the_head_mid_array_loses_no_element_and_runs_none_twice(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    data = tmp_path / "data"
    head = head_factory(data).start()
    env = {"CC_DIR": str(events_dir)}
    with head.client() as c:
        array_id = c.submit(job_command(1.0, 0), array=f"0-{ELEMENTS - 1}%{THROTTLE}", env=env).array_id
        assert array_id is not None
        after = c.submit(job_command(0.1, 0), afterok=[array_id], env=env, name="after-all").id

    def succeeded(h: HeadProcess) -> int:
        with h.client() as c:
            return (c.job(array_id).array_counts or {}).get("succeeded", 0)

    for at_least in (3, 7):  # kill it twice, each time with elements running and others queued
        wait_for(lambda: succeeded(head) >= at_least, timeout=60, what=f"{at_least} elements done")  # noqa: B023
        head.kill9()
        head = head_factory(data, port=head.port).start()
    with head.client() as c:
        wait_for(lambda: c.job(after).state.terminal, timeout=90, what="the dependent job to end")
        counts = c.job(array_id).array_counts
        dependent = c.job(after)
    assert counts == {"succeeded": ELEMENTS}, counts
    assert dependent.state.value == "succeeded", dependent.reason
    ev = read_events(events_dir / "events")
    assert double_runs(ev) == []
    runs = [r for (job, _), rs in ev.runs.items() if job != after for r in rs]
    assert len({r.job for r in runs}) == ELEMENTS and len(runs) == ELEMENTS  # each element once
    # The throttle, from the jobs' own lines: never more than THROTTLE elements alive at once.
    edges = sorted([(r.start, 1) for r in runs if r.start] + [(r.end, -1) for r in runs if r.end])
    alive = most = 0
    for _, step in edges:
        alive += step
        most = max(most, alive)
    assert most <= THROTTLE
    last_end = max(r.end for r in runs if r.end is not None)
    (dep_run,) = [r for (job, _), rs in ev.runs.items() if job == after for r in rs]
    assert dep_run.start is not None and dep_run.start >= last_end
