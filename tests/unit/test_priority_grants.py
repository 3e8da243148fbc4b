"""Priority classes above normal are granted by the policy (issue 14): the file section, the
403 at submit through the real API with real users and tokens, and what GET /v1/policy shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.policy import Grant, Policy
from gpucluster.core.types import Priority
from gpucluster.head.policy_source import PolicySource
from gpucluster.policyfile import PolicyFileError, load_policy

from .authkit import World, make_world

GRANTS = """\
teams:
  vision: {}
  nlp: {}
priority_grants:
  high: {teams: [vision]}
  critical: {users: [alice]}
"""


def _submit(world: World, who: str, priority: str, team: str | None = None) -> tuple[int, str]:
    body: dict[str, object] = {"command": ["true"], "priority": priority}
    if team is not None:
        body["team"] = team
    r = world.app.post("/v1/jobs", json=body, headers=world.as_(who))
    return r.status_code, r.json().get("error", "")


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)  # SQLite only: the check reads no store


def test_by_default_members_use_low_and_normal_team_admins_high_cluster_admins_all(world: World) -> None:
    assert _submit(world, "alice", "low")[0] == 201
    assert _submit(world, "alice", "normal")[0] == 201
    status, error = _submit(world, "alice", "high")
    assert status == 403
    assert "you (alice) may not submit high jobs to team vision" in error
    assert "granted to team admins and cluster admins" in error
    assert "you may use: low, normal" in error
    assert "priority_grants: {high: {teams: [vision]}}" in error
    assert _submit(world, "carol", "high")[0] == 201  # vision's team admin
    status, error = _submit(world, "carol", "critical")
    assert status == 403 and "you may use: low, normal, high" in error and "cluster admins only" in error
    assert _submit(world, "root", "critical", team="nlp")[0] == 201


def test_the_policy_grants_classes_to_teams_and_users(world: World, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GRANTS)
    world.cluster.head.policy_source = PolicySource(path)
    assert _submit(world, "dave", "high")[0] == 201  # any member of vision
    status, error = _submit(world, "bob", "high")
    assert status == 403 and "granted to members of vision and cluster admins" in error
    assert _submit(world, "alice", "critical")[0] == 201
    assert _submit(world, "carol", "high")[0] == 201
    assert _submit(world, "carol", "critical")[0] == 403  # the file replaced nothing for her: users only
    grants = world.app.get("/v1/policy", headers=world.as_("bob")).json()["priority_grants"]
    assert grants["high"]["teams"] == ["vision"] and grants["critical"]["users"] == ["alice"]
    assert grants["critical"]["holders"] == "users alice and cluster admins"


def test_plain_jobs_may_not_take_the_serving_class_even_with_its_grant(world: World) -> None:
    """serving is for service replicas (issue 23): every member holds it by default, so a batch
    job in it would jump every line; the refusal says what to do instead and queues nothing."""
    before = world.cluster.store.count_jobs()
    for who in ("alice", "root"):
        status, error = _submit(world, who, "serving")
        assert status == 422, error
        assert "serving is the class of service replicas" in error and "gpucluster serve" in error
    assert world.cluster.store.count_jobs() == before
    status, error = _submit(world, "alice", "critical")  # the list a member is told leaves serving out
    assert status == 403 and "you may use: low, normal." in error


def test_a_refused_submission_creates_no_job(world: World) -> None:
    before = world.cluster.store.count_jobs()
    assert _submit(world, "bob", "critical")[0] == 403
    assert world.cluster.store.count_jobs() == before


# ---- the policy file ---------------------------------------------------------------------------


def test_grants_load_and_classes_left_out_keep_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("priority_grants:\n  critical: {roles: [team-admin], users: [ops]}\n")
    p = load_policy(path)
    assert p.priority_grants[Priority.CRITICAL] == Grant(roles=frozenset({"team-admin"}), users=frozenset({"ops"}))
    assert p.priority_grants[Priority.HIGH] == Policy().priority_grants[Priority.HIGH]
    assert p.may_use(Priority.CRITICAL, "x", "team-admin", "u", False)
    assert p.may_use(Priority.CRITICAL, "x", None, "ops", False)
    assert not p.may_use(Priority.CRITICAL, "x", "member", "u", False)
    every = load_policy(_write(tmp_path, "priority_grants:\n  high: {roles: [member]}\n"))
    assert every.may_use(Priority.HIGH, "any", "member", "u", False)
    assert not every.may_use(Priority.HIGH, "any", None, "u", False)  # not a member of the team


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("priority_grants:\n  high: {}\n  low: {teams: [a]}\n", "policy.yaml:3: priority_grants.low: ", "every member"),
        ("priority_grants:\n  urgent: {}\n", "policy.yaml:2: priority_grants.urgent: ", "high, serving and critical"),
        (
            "priority_grants:\n  high:\n    roles: [member, boss]\n",
            "policy.yaml:3: priority_grants.high.roles.1: ",
            "'team-admin'",
        ),
        ("priority_grants:\n  critical: {groups: [x]}\n", "policy.yaml:2: priority_grants.critical.groups: ", "Extra"),
        (
            "teams:\n  vision: {}\npriority_grants:\n  high:\n    teams: [vision, nlp]\n",
            "policy.yaml:5: priority_grants.high.teams: ",
            "team 'nlp', which is not under teams: (vision)",
        ),
    ],
)
def test_bad_grants_are_refused_at_their_line(tmp_path: Path, text: str, where: str, words: str) -> None:
    with pytest.raises(PolicyFileError) as e:
        load_policy(_write(tmp_path, text))
    assert where in str(e.value) and words in str(e.value), str(e.value)
