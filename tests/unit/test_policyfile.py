"""policyfile.load_policy: YAML -> core.policy.Policy, with errors that name the file, line and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpucluster.core.policy import (
    DEFAULT_TEAM,
    Limit,
    Limits,
    Org,
    Policy,
    Preemption,
    Team,
    fifo_policy,
    priority_policy,
)
from gpucluster.core.types import Priority
from gpucluster.policyfile import PolicyFileError, load_policy

FULL = """\
# five teams, two orgs
teams:
  vision: {weight: 2, org: research, quota: {H100-80GB: 16}, max_borrow: 8, max_lend: 4}
  nlp:    {weight: 1, org: research}
  infra:
    weight: 0.5
    quota: {A100-40GB: 4, L4: 2.5}
orgs:
  research: {weight: 3}
preemption: {enabled: true, grace_period: 45s, min_runtime: 5m, protected_classes: [high, critical]}
fair_share: {enabled: false, half_life: 2d}
backfill:   {enabled: true, default_time_limit: 90m}
priorities: true
starvation_age: 12h
unknown_teams: reject
"""


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error(tmp_path: Path, text: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(PolicyFileError) as e:
        load_policy(p)
    return str(e.value)


def test_a_full_policy_file(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, FULL))
    assert p.teams == {
        "vision": Team("vision", 2.0, "research", {"H100-80GB": 16.0}, 8.0, 4.0),
        "nlp": Team("nlp", 1.0, "research"),
        "infra": Team("infra", 0.5, None, {"A100-40GB": 4.0, "L4": 2.5}),
    }
    assert p.orgs == {"research": Org("research", 3.0)}
    assert p.preemption == Preemption(
        enabled=True,
        grace_period_s=45.0,
        min_runtime_s=300.0,
        protected_classes=frozenset({Priority.HIGH, Priority.CRITICAL}),
        reclaim_quota=True,
    )
    assert (p.fair_share, p.fair_share_half_life_s) == (False, 2 * 86400.0)
    assert (p.backfill, p.default_time_limit_s) == (True, 5400.0)
    assert p.priorities is True
    assert p.starvation_age_s == 12 * 3600.0
    assert p.allow_unknown_teams is False
    # research (3) = vision 2/3 + nlp 1/3; infra (0.5) at the top level beside it
    assert p.share("vision") == pytest.approx(3 / 3.5 * 2 / 3)
    assert p.share("infra") == pytest.approx(0.5 / 3.5)


def test_an_empty_file_is_the_default_policy(tmp_path: Path) -> None:
    assert load_policy(write(tmp_path, "")) == Policy()
    assert load_policy(write(tmp_path, "# nothing but a comment\n")) == Policy()
    assert list(load_policy(write(tmp_path, "priorities: false\n")).teams) == [DEFAULT_TEAM]


def test_numbers_are_seconds_and_durations_are_read(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, "preemption: {grace_period: 10, min_runtime: 1h30m}\nstarvation_age: 2d\n"))
    assert (p.preemption.grace_period_s, p.preemption.min_runtime_s, p.starvation_age_s) == (10.0, 5400.0, 172800.0)


@pytest.mark.parametrize(("name", "make"), [("fifo", fifo_policy), ("priority", priority_policy), ("default", Policy)])
def test_baselines_by_name(name: str, make: object) -> None:
    assert load_policy(name) == make()  # type: ignore[operator]


def test_a_file_named_like_a_baseline_is_read_when_given_as_a_path(tmp_path: Path) -> None:
    p = write(tmp_path, "priorities: false\n", name="fifo")
    assert load_policy(p).priorities is False
    assert load_policy(p) != fifo_policy()


# ---- errors: file, line, field -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("teams:\n  vision:\n    weight: -2\n", 3, "teams.vision.weight", "greater than 0"),
        (
            "teams:\n  vision: {weight: 1}\n  nlp:\n    org: research\n    weight: zero\n",
            5,
            "teams.nlp.weight",
            "number",
        ),
        ("teams:\n  x:\n    quota: {H100: -1}\n", 3, "teams.x.quota", "cannot be negative"),
        ("teams:\n  x: {max_borrow: -1}\n", 2, "teams.x.max_borrow", "greater than or equal to 0"),
        ("preemption:\n  enabled: true\n  grace_period: soon\n", 3, "preemption.grace_period", "cannot read duration"),
        ("preemption:\n  min_runtime: -5\n", 2, "preemption.min_runtime", "cannot be negative"),
        ("preemption:\n  protected_classes: [critical, urgent]\n", 2, "preemption.protected_classes.1", "'critical'"),
        ("fair_share:\n  half_life: 0\n", 2, "fair_share.half_life", "must be positive"),
        ("backfill: {default_time_limit: 0s}\n", 1, "backfill.default_time_limit", "must be positive"),
        ("priorities: maybe\n", 1, "priorities", "boolean"),
        ("unknown_teams: sometimes\n", 1, "unknown_teams", "'allow' or 'reject'"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, words: str) -> None:
    msg = error(tmp_path, text)
    assert f"policy.yaml:{line}: {field}: " in msg, msg
    assert words in msg, msg


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("teams: {}\nsurprise: 1\n", 2, "surprise"),
        ("teams:\n  vision:\n    wieght: 2\n", 3, "teams.vision.wieght"),
        ("preemption:\n  grace: 30s\n", 2, "preemption.grace"),
        ("orgs:\n  research: {weight: 1, budget: 9}\n", 2, "orgs.research.budget"),
    ],
)
def test_unknown_keys_are_refused_where_they_are(tmp_path: Path, text: str, line: int, field: str) -> None:
    msg = error(tmp_path, text)
    assert f"policy.yaml:{line}: {field}: Extra inputs are not permitted" in msg, msg


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    msg = error(tmp_path, "teams:\n  a: {weight: -1}\n  b: {weight: 1, colour: red}\npreemption: {grace_period: x}\n")
    lines = msg.splitlines()
    assert len(lines) == 3
    assert [re.match(r".*policy\.yaml:(\d+):", m).group(1) for m in lines] == ["2", "3", "4"]  # type: ignore[union-attr]


def test_an_unknown_org_is_refused_at_the_line_of_the_team(tmp_path: Path) -> None:
    msg = error(tmp_path, "teams:\n  vision: {org: research}\n  nlp: {org: langs}\norgs:\n  research: {}\n")
    assert "policy.yaml:3: teams.nlp.org: " in msg, msg
    assert "'langs'" in msg and "research" in msg  # names the org asked for and those that exist
    msg = error(tmp_path, "teams:\n  nlp: {org: langs}\n")
    assert "policy.yaml:2: teams.nlp.org: " in msg and "none defined" in msg, msg


@pytest.mark.parametrize(("value", "words"), [("soon", "cannot read duration"), ("-5", "negative"), ("0", "positive")])
def test_a_bad_starvation_age_is_a_policy_file_error_with_its_line(tmp_path: Path, value: str, words: str) -> None:
    msg = error(tmp_path, f"priorities: true\nstarvation_age: {value}\n")
    assert "policy.yaml:2: starvation_age: " in msg and words in msg, msg


def test_reject_unknown_teams_needs_teams(tmp_path: Path) -> None:
    assert "needs at least one team" in error(tmp_path, "unknown_teams: reject\n")


def test_yaml_syntax_errors_have_line_and_column(tmp_path: Path) -> None:
    msg = error(tmp_path, "teams:\n  a: {weight: 1\n")
    assert re.search(r"policy\.yaml:\d+:\d+: not valid YAML", msg), msg


def test_a_policy_must_be_a_mapping(tmp_path: Path) -> None:
    assert "a policy is a mapping" in error(tmp_path, "- teams\n- orgs\n")


def test_a_missing_file_is_a_policy_file_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_prices_and_budgets_load_beside_the_policy(tmp_path: Path) -> None:
    from gpucluster.core.accounting import Budget
    from gpucluster.policyfile import load_policy_file

    text = (
        "prices: {H100-80GB: 3.6}\n"
        "budgets:\n  vision: {period: month, money: 1000}\n  nlp: {gpu_hours: 50, on_exceed: stop}\n"
    )
    _, acct = load_policy_file(write(tmp_path, text))
    assert acct.prices == {"H100-80GB": 3.6}
    assert acct.budgets == {
        "vision": Budget("vision", "month", None, money=1000),
        "nlp": Budget("nlp", "30d", 30 * 86400.0, gpu_hours=50, on_exceed="stop"),
    }
    assert acct.with_prices({"H100-80GB": 9.0, "A100": 2.0}).prices == {"H100-80GB": 3.6, "A100": 2.0}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("budgets:\n  vision: {period: 30d}\n", "policy.yaml:2: budgets.vision: budget of team vision needs money:"),
        ("budgets:\n  vision: {money: -1}\n", "policy.yaml:2: budgets.vision.money: "),
        ("budgets:\n  vision: {money: 1, period: 10s}\n", "at least 1m"),
        ("budgets:\n  vision: {money: 1, on_exceed: kill}\n", "on_exceed"),
        ("prices: {H100: -3}\n", "price for H100 must be a number, 0 or more"),
    ],
)
def test_bad_budgets_and_prices_are_refused_at_their_line(tmp_path: Path, text: str, words: str) -> None:
    msg = error(tmp_path, text)
    assert words in msg, msg


def test_price_options_of_up() -> None:
    from gpucluster.cli.usage import parse_prices

    assert parse_prices(["H100-80GB=3.60", "A100=0"]) == {"H100-80GB": 3.6, "A100": 0.0}
    for bad in ("H100", "=3", "H100=cheap", "H100=-1", "H100=inf"):
        with pytest.raises(ValueError, match="write it as MODEL=PRICE"):
            parse_prices([bad])


def test_listed_shares_of_teams_outside_the_policy_sum_to_one() -> None:
    """`policy show` and the dashboard list every team with usage; two outside the policy each
    got the share of a lone newcomer and the column summed to 150% (issue 19)."""
    p = Policy(
        teams={"vision": Team("vision", weight=2, org="research"), "infra": Team("infra", weight=1)},
        orgs={"research": Org("research", weight=3)},
    )
    names = ["infra", "outsider-a", "outsider-b", "vision"]
    shares = p.shares_of(names)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["outsider-a"] == shares["outsider-b"] == shares["infra"] == pytest.approx(1 / 6)
    assert shares["vision"] == pytest.approx(3 / 6)
    assert p.shares_of(["infra", "vision"]) == {"infra": p.share("infra"), "vision": p.share("vision")}


# ---- limits (issue 16) ---------------------------------------------------------------------------


def test_limits_per_user_per_named_user_and_per_class(tmp_path: Path) -> None:
    p = load_policy(
        write(
            tmp_path,
            "limits:\n"
            "  per_user: {max_running_gpus: 8, max_queued_jobs: 100, max_gpu_hours_in_flight: 64}\n"
            "  users:\n    alice: {max_running_gpus: 16}\n"
            "  per_class:\n    high: {max_running_gpus: 4.5}\n",
        )
    )
    assert p.limits == Limits(
        per_user=Limit(8, 100, 64),
        users={"alice": Limit(max_running_gpus=16)},
        per_class={Priority.HIGH: Limit(max_running_gpus=4.5)},
    )
    assert p.limits.of_user("alice", "max_queued_jobs") == (100, "limits.per_user.max_queued_jobs")
    assert p.limits.of_user("alice", "max_running_gpus") == (16, "limits.users.alice.max_running_gpus")
    assert load_policy(write(tmp_path, "teams: {}\n")).limits == Limits()


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("limits:\n  per_user: {max_running_gpus: 0}\n", 2, "limits.per_user.max_running_gpus", "greater than 0"),
        ("limits:\n  per_user:\n    max_queued_jobs: 2.5\n", 3, "limits.per_user.max_queued_jobs", "integer"),
        ("limits:\n  users:\n    bob: {max_gpu_hours_in_flight: -1}\n", 3, "limits.users.bob", "greater than 0"),
        ("limits:\n  per_class:\n    urgent: {max_running_gpus: 4}\n", 3, "limits.per_class.urgent", "'low'"),
        ("limits:\n  per_user: {max_gpus: 4}\n", 2, "limits.per_user.max_gpus", "Extra inputs are not permitted"),
    ],
)
def test_bad_limits_name_their_line_and_field(tmp_path: Path, text: str, line: int, field: str, words: str) -> None:
    msg = error(tmp_path, text)
    assert f"policy.yaml:{line}: {field}" in msg, msg
    assert words in msg, msg
