"""Accounting end to end: a real `gpucluster up --price`, a policy file with a budget, real job
processes, the real CLI and HTTP, the real SQLite file. The cost of a finished job is exactly
GPUs x its run time x the price; its team, over budget, gets its next job held; a member of
another team sees none of it; a job with --max-cost is stopped before it passes it."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import httpx
import pytest

from gpucluster.client import Client

from .headproc import HeadProcess, cli, wait_for

POLICY = """
teams: {vision: {}, nlp: {}}
budgets:
  vision: {period: 1d, money: 0.001}
"""


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadProcess]:
    base = tmp_path_factory.mktemp("accounting")
    (base / "policy.yaml").write_text(POLICY)
    h = HeadProcess(
        base / "data", gpus=4, extra_args=("--price", "H100-80GB=3.60", "--policy", str(base / "policy.yaml"))
    )
    try:
        yield h.start()
    finally:
        h.stop()
        h.kill_jobs()


def test_usage_budgets_and_max_cost_on_a_real_head(head: HeadProcess) -> None:
    with head.client() as c:
        job = c.submit(["sleep", "1"], gpus=2, team="vision")
        done = wait_for(lambda: (j := c.job(job.id)).state.terminal and j, timeout=30, what="the job to end")
        assert done.state.value == "succeeded"
        [attempt] = done.attempts
        assert attempt.ended_at is not None and attempt.started_at is not None
        exact = 2 * (attempt.ended_at - attempt.started_at) * 3.60 / 3600  # ~0.002 per second of run
        # Final within one accrual step (5 s), and exact: GPUs x seconds x price per GPU-hour.
        row = wait_for(
            lambda: next((r for r in c.usage(by="job").rows if r.job_id == job.id and r.attempts), None),
            timeout=10,
            what="the job's usage",
        )
        assert row.cost == pytest.approx(exact, rel=1e-9)
        assert row.gpu_hours == pytest.approx(2 * (attempt.ended_at - attempt.started_at) / 3600, rel=1e-9)
        assert (row.team, row.gpu_model, row.user) == ("vision", "H100-80GB", done.owner)

        # The team spent more than its 0.001: its next job is held, with the reason in `why` and the queue.
        wait_for(lambda: c.budgets()[0].over, timeout=10, what="the budget to be over")
        held = c.submit(["sleep", "30"], gpus=1, team="vision")
        wait_for(lambda: c.job(held.id).wait_reason == "budget", timeout=10, what="the job to be held")
        why = cli(head, "why", str(held.id))
        assert why.returncode == 0 and "held: team vision spent" in why.stdout, why.stdout + why.stderr

        # Another team is not held; a job of it with --max-cost stops before passing it.
        r = cli(head, "submit", "--team", "nlp", "--max-cost", "0.003", "--json", "--", "sleep", "60")
        assert r.returncode == 0, r.stderr
        capped = json.loads(r.stdout)["id"]
        stopped = wait_for(lambda: (j := c.job(capped)).state.terminal and j, timeout=30, what="the max-cost stop")
        assert stopped.state.value == "failed" and "would exceed its max cost of 0.003" in stopped.reason

        # The CLI: a table, JSON and CSV of the same numbers; bad input is one line, exit 1.
        wait_for(lambda: len(c.usage().rows) == 2, timeout=10, what="the stopped job's usage")
        table = cli(head, "usage", "--by", "team")
        assert table.returncode == 0 and "vision" in table.stdout and "nlp" in table.stdout, table.stderr
        rows = list(csv.DictReader(io.StringIO(cli(head, "usage", "--by", "gpu-model", "--csv").stdout)))
        assert [r["key"] for r in rows] == ["H100-80GB", "total"]
        assert float(rows[0]["cost"]) == pytest.approx(c.usage(by="gpu-model").total.cost)
        bad = cli(head, "usage", "--since", "last week")
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
        assert "since: cannot read 'last week'" in bad.stderr

        # A member of nlp sees nlp's usage and no budget of vision.
        bob = c.add_user("bob", ["nlp"]).token
    with Client(head.url, token=bob) as b:
        assert {r.key for r in b.usage().rows} == {"nlp"}
        assert b.budgets() == []
    assert httpx.get(f"{head.url}/v1/usage").status_code == 401
    metrics = httpx.get(f"{head.url}/metrics", headers=head.headers).text  # a team's spend: a cluster admin's
    assert 'gpucluster_team_cost_total{team="vision"}' in metrics
    assert "gpucluster_team_cost_total" not in httpx.get(f"{head.url}/metrics").text
