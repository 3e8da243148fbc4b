"""Run times learned from finished jobs on a real head (issue 24): after a user's `train` jobs
finish, a new `train` job shows "expected to run ~1 s (from 3 similar jobs ...)" in the API and
in `gpucluster show`, and the job queued behind it is estimated to start ~1 s after it, not the
whole hour of its limit."""

from __future__ import annotations

from tests.e2e.headproc import HeadProcess, wait_for
from tests.e2e.headproc import cli as _cli


def test_a_similar_job_shows_its_learned_run_time_and_the_queue_behind_it_uses_it(head: HeadProcess) -> None:
    with head.client() as c:
        for _ in range(3):
            done = c.submit(["sleep", "1"], gpus=8, name="train", time_limit="1h")
            wait_for(lambda j=done: c.job(j.id).state == "succeeded", timeout=60, what=f"job {done.id} to succeed")
        # No limit and a name never seen: its estimate assumes the default hour.
        c.submit(["sleep", "600"], gpus=8, name="blocker")
        train = c.submit(["sleep", "1"], gpus=8, name="train", time_limit="1h")
        after = c.submit(["sleep", "1"], gpus=8, name="after", priority="low")
        wait_for(
            lambda: c.job(train.id).estimated_start is not None and c.job(after.id).estimated_start is not None,
            timeout=60,
            what="estimates for both waiting jobs",
        )
        expected = c.job(train.id).expected_run
        assert expected is not None and expected.samples == 3, expected
        assert 1 <= expected.seconds < 30, expected
        assert expected.sentence.startswith("expected to run ~"), expected
        assert "(from 3 similar jobs: same user, workload, GPUs and model)" in expected.sentence, expected
        gap = c.job(after.id).estimated_start - c.job(train.id).estimated_start  # type: ignore[operator]
        assert 1 <= gap < 60, gap  # the train job's learned ~1 s, not its 1 h limit
        shown = _cli(head, "show", str(train.id))
        assert shown.returncode == 0, shown.stderr
        assert "run time:   expected to run ~" in shown.stdout and "from 3 similar jobs" in shown.stdout
        unknown = c.job(after.id).expected_run
        assert unknown is not None and (unknown.samples, unknown.basis) == (0, "time limit"), unknown


def test_submit_dry_run_says_where_and_when_and_queues_nothing(head: HeadProcess) -> None:
    free = _cli(head, "submit", "--dry-run", "--gpus", "2", "--name", "probe", "--", "sleep", "1")
    assert free.returncode == 0, free.stderr
    assert free.stdout.startswith("would start now on node0 GPUs "), free.stdout
    assert "(dry run: nothing queued)" in free.stdout
    with head.client() as c:
        before = [j.id for j in c.jobs()]  # the module's shared head: other tests' jobs are there
        assert "probe" not in {j.name for j in c.jobs()}
        blocker = c.submit(["sleep", "600"], gpus=8, time_limit="1h")
        wait_for(lambda: c.job(blocker.id).state == "running", timeout=60, what="the blocker to run")
        # the head plans again after the start; the dry run answers from its last plan
        busy = wait_for(
            lambda: (
                (r := _cli(head, "submit", "--dry-run", "--gpus", "2", "--", "sleep", "1")).stdout.startswith(
                    "would start ~"
                )
                and r
            ),
            timeout=60,
            what="a dry run that waits for the blocker",
        )
        assert "until then:" in busy.stdout and "expected to run up to its time limit" in busy.stdout, busy.stdout
        assert [j.id for j in c.jobs()] == [*before, blocker.id]  # nothing queued, by either dry run
    bad = _cli(head, "submit", "--dry-run", "--gpus", "64", "--", "true")
    assert bad.returncode == 1 and "gpus" in bad.stderr, bad.stderr  # refused as a submit would be


def test_why_what_if_compares_a_change_and_changes_nothing(head: HeadProcess) -> None:
    """Six GPUs busy for an hour: an 8-GPU job waits that hour; with 2 GPUs it would start now.
    The busy job is of a team with no finished jobs, so it is expected to run its hour: in the
    module's team, the earlier tests' 1-s jobs taught the head it would end ~1 s after its start,
    and once the 8-GPU job's estimate came later than that (on a loaded machine, or with the
    plan left to the next periodic one), "as it is" was now as well."""
    with head.client() as c:
        busy = c.submit(["sleep", "600"], gpus=6, time_limit="1h", team="whatif")
        wait_for(lambda: c.job(busy.id).state == "running", timeout=60, what="the 6-GPU job to run")
        big = c.submit(["sleep", "1"], gpus=8, time_limit="10m")
        wait_for(lambda: c.job(big.id).estimated_start is not None, timeout=60, what="the 8-GPU job's estimate")
        smaller = _cli(head, "why", str(big.id), "--what-if", "gpus=2")
        assert smaller.returncode == 0, smaller.stderr
        assert smaller.stdout.startswith("with gpus=2: would start now on node0 GPUs "), smaller.stdout
        assert "earlier" in smaller.stdout and "(nothing changed)" in smaller.stdout, smaller.stdout
        bigger = _cli(head, "why", str(big.id), "--what-if", "time-limit=20m")
        assert bigger.stdout.startswith("with time_limit=20m: would start ~"), bigger.stdout
        job = c.job(big.id)
        assert (job.state, job.spec.gpus, job.spec.time_limit) == ("queued", 8, 600)  # nothing changed
        bad = _cli(head, "why", str(big.id), "--what-if", "colour=red")
        assert bad.returncode == 1 and "KEY one of gpus, gpu-type, priority, time-limit" in bad.stderr
        over = _cli(head, "why", str(big.id), "--what-if", "gpus=64")
        assert over.returncode == 1 and "gpus" in over.stderr, over.stderr
