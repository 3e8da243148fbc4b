"""End to end: per-user limits (issue 16) on a live head with real processes and the real CLI.

One team with a quota of the whole node; its member alice is stopped at the per-user limit on
running GPUs while her teammate bob's job starts, `why` names the limit, and a submission beyond
`max_queued_jobs` is refused with the limit, the count and what to do."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

from gpucluster.client import Client
from tests.e2e.headproc import HeadProcess, wait_for
from tests.e2e.test_jobs import running

CLI = [sys.executable, "-m", "gpucluster.cli.main"]
POLICY = """\
teams:
  vision: {quota: {H100-80GB: 8}}
limits:
  per_user: {max_running_gpus: 4, max_queued_jobs: 2}
"""
# A job on a busy two-core machine starts in well under a second; the margin is for CI's load.
TIMEOUT_S = 60.0


def cli(head: HeadProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**head.env, "GPUCLUSTER_TOKEN": token}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def test_a_user_at_their_limit_waits_while_a_teammate_starts_and_cannot_queue_beyond_it(
    tmp_path: Path,
    head_factory,  # type: ignore[no-untyped-def]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    head = head_factory(tmp_path / "data", gpus=8)
    head.args += ["--policy", str(policy)]
    head.start()
    me = pwd.getpwuid(os.geteuid())[0]  # jobs run as this account, whoever submits them
    with head.client() as admin:
        alice = admin.add_user("alice", ["vision"], unix_user=me).token
        bob = admin.add_user("bob", ["vision"], unix_user=me).token
    with Client(head.url, token=alice) as a, Client(head.url, token=bob) as b:
        first = a.submit(["sleep", "120"], gpus=4, time_limit="10m", team="vision").id
        started = running(head, first, timeout=TIMEOUT_S).started_at
        assert started is not None
        second = a.submit(["true"], gpus=2, team="vision").id
        wait_for(lambda: a.job(second).wait_reason == "user_gpus", TIMEOUT_S, what="alice's job to wait on her limit")
        teammate = b.submit(["sleep", "120"], gpus=2, team="vision").id
        running(head, teammate, timeout=TIMEOUT_S)  # 2 GPUs are still free: bob is not alice
        assert a.job(second).state.value == "queued"

        why = cli(head, alice, "why", str(second))
        assert why.returncode == 0, why.stderr
        assert "[user_gpus]" in why.stdout
        assert "alice runs 4 GPUs, the per-user limit (limits.per_user.max_running_gpus) is 4" in why.stdout
        # when alice's running job reaches its 10-minute limit, her GPUs come back
        estimate = json.loads(cli(head, alice, "why", str(second), "--json").stdout)["estimated_start"]
        assert estimate is not None and abs(estimate - (started + 600)) < 5
        listing = cli(head, alice, "jobs")
        assert "per-user limit" in listing.stdout

        third = a.submit(["true"], gpus=1, team="vision").id  # 2 queued now: her limit
        refused = cli(head, alice, "submit", "--team", "vision", "--", "true")
        assert refused.returncode == 1
        assert "Traceback" not in refused.stderr
        assert (
            "alice has 2 jobs queued, the per-user limit (limits.per_user.max_queued_jobs) is 2, "
            "and this submission adds 1" in refused.stderr
        ), refused.stderr
        array = cli(head, bob, "submit", "--team", "vision", "--array", "0-2", "--", "true")
        assert array.returncode == 1 and "bob has 0 jobs queued" in array.stderr and "adds 3" in array.stderr

        shown = cli(head, alice, "policy", "show")
        assert "limits: every user (limits.per_user): at most 4 running GPUs, 2 queued jobs" in shown.stdout

        # once her first job ends, the waiting one starts
        a.cancel(first)
        wait_for(lambda: a.job(second).state.terminal, TIMEOUT_S, what="alice's second job to run once under the limit")
        # her third (1 GPU, `true`) fits beside the second now too, and ends by itself
        wait_for(lambda: a.job(third).state.terminal, TIMEOUT_S, what="alice's third job to run and end")
        b.cancel(teammate)
