"""Identity and access through the API: teams from identity, tokens, limits, job tokens, audit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpucluster.auth import tokens, unix
from gpucluster.auth.control import ACCOUNT_SEEN_S, AccessControl
from gpucluster.models import JobSpec
from gpucluster.store import Store

from .authkit import World, make_world

STORE_BACKENDS = ("sqlite", "postgresql")  # the `world` fixture's store: tests/unit/conftest.py


def test_the_team_comes_from_identity_and_cannot_be_forged(world: World) -> None:
    r = world.app.post("/v1/jobs", json={"command": ["true"]}, headers=world.as_("alice"))
    assert r.status_code == 201 and r.json()["spec"]["team"] == "vision" and r.json()["owner"] == "alice"
    r = world.app.post("/v1/jobs", json={"command": ["true"], "team": "nlp"}, headers=world.as_("alice"))
    assert r.status_code == 403
    assert r.json()["error"] == "team: you (alice) are not a member of team 'nlp'; your teams: vision"
    r = world.app.post("/v1/jobs", json={"command": ["true"], "team": "nlp"}, headers=world.as_("root"))
    assert r.status_code == 201 and r.json()["spec"]["team"] == "nlp" and r.json()["owner"] == "root"
    r = world.app.get("/v1/jobs?team=vision", headers=world.as_("bob"))
    assert r.status_code == 403 and "not in team 'vision'" in r.json()["error"]


def test_denials_say_why(world: World) -> None:
    r = world.app.post(f"/v1/jobs/{world.own}/cancel", headers=world.as_("dave"))
    assert r.status_code == 403
    assert "submitted by alice; only they, an admin of its team, or a cluster admin" in r.json()["error"]
    r = world.app.get(f"/v1/jobs/{world.own}/logs", headers=world.as_("bob"))  # another team's: as if missing
    assert r.status_code == 404 and r.json()["error"] == f"no job with id {world.own}"
    r = world.app.get("/v1/admin/users", headers=world.as_("carol"))
    assert r.status_code == 403 and "for cluster admins; you (carol) are not one" in r.json()["error"]
    r = world.app.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in r.json()["error"]
    r = world.app.get("/v1/jobs", headers={"Authorization": "Bearer gc_nonsense"})
    assert r.status_code == 401 and "not valid" in r.json()["error"]


def test_a_team_admin_acts_on_the_team_and_everything_is_audited(world: World) -> None:
    r = world.app.post(f"/v1/jobs/{world.own}/cancel", headers=world.as_("carol"))
    assert r.status_code == 200
    world.app.post(f"/v1/jobs/{world.other}/cancel", headers=world.as_("carol"))  # denied: not audited
    assert world.app.post(f"/v1/admin/tokens/{world.spare_token}/revoke", headers=world.as_("root")).status_code == 200
    entries = world.app.get("/v1/admin/audit", headers=world.as_("root")).json()["entries"]
    seen = [(e["user"], e["action"], e["target"]) for e in entries]
    assert ("carol", "cancel", f"job {world.own}") in seen
    assert ("alice", "submit", f"job {world.own}") in seen and ("bob", "submit", f"job {world.other}") in seen
    assert ("root", "revoke", f"token_id {world.spare_token}") in seen
    assert not any(u == "carol" and t == f"job {world.other}" for u, _, t in seen)
    only = world.app.get("/v1/admin/audit?action=cancel", headers=world.as_("root")).json()["entries"]
    assert [(e["user"], e["target"]) for e in only] == [("carol", f"job {world.own}")]


def test_revoked_and_expired_tokens_are_refused_at_once(world: World) -> None:
    assert world.app.get("/v1/whoami", headers=world.as_("alice")).status_code == 200
    alice_token = world.access.tokens("alice")[0].id
    world.app.post(f"/v1/admin/tokens/{alice_token}/revoke", headers=world.as_("root"))
    r = world.app.get("/v1/whoami", headers=world.as_("alice"))
    assert (
        r.status_code == 401
        and r.json()["error"] == f"token {alice_token} was revoked; ask a cluster admin for a new one"
    )
    r = world.app.post("/v1/admin/users/bob/tokens", json={"expires_in": "1h"}, headers=world.as_("root"))
    assert r.status_code == 201
    short = {"Authorization": f"Bearer {r.json()['token']}"}
    assert world.app.get("/v1/whoami", headers=short).json()["user"] == "bob"
    world.cluster.clock.advance(3601)
    r = world.app.get("/v1/whoami", headers=short)
    assert r.status_code == 401 and "expired" in r.json()["error"]
    listed = {
        t["id"]: t["status"] for t in world.app.get("/v1/admin/tokens", headers=world.as_("root")).json()["tokens"]
    }
    assert listed[alice_token] == "revoked" and listed[max(t.id for t in world.access.tokens("bob"))] == "expired"


def test_a_new_membership_counts_at_once(world: World) -> None:
    assert (
        world.app.get(f"/v1/jobs/{world.own}", headers=world.as_("bob")).status_code == 404
    )  # another team's job: as if missing
    r = world.app.put("/v1/admin/users/bob/membership", json={"team": "vision"}, headers=world.as_("root"))
    assert r.status_code == 200 and [t["team"] for t in r.json()["teams"]] == ["nlp", "vision"]
    assert world.app.get(f"/v1/jobs/{world.own}", headers=world.as_("bob")).status_code == 200
    world.app.put("/v1/admin/users/bob/membership", json={"team": "vision", "role": None}, headers=world.as_("root"))
    assert world.app.get(f"/v1/jobs/{world.own}", headers=world.as_("bob")).status_code == 404


def test_admin_input_is_validated(world: World) -> None:
    root = world.as_("root")
    r = world.app.post("/v1/admin/users", json={"name": "alice", "teams": ["x"]}, headers=root)
    assert r.status_code == 409 and "exists already" in r.json()["error"]
    r = world.app.post("/v1/admin/users", json={"name": "eve"}, headers=root)
    assert r.status_code == 422 and r.json()["error"].startswith("teams:")
    r = world.app.post("/v1/admin/users", json={"name": "eve", "teams": ["t"], "role": "boss"}, headers=root)
    assert r.status_code == 422 and r.json()["error"].startswith("role:")
    r = world.app.post(
        "/v1/admin/users", json={"name": "eve", "teams": ["t"], "unix_user": "no-such-acct"}, headers=root
    )
    assert r.status_code == 422 and "no Unix account 'no-such-acct'" in r.json()["error"]
    r = world.app.post("/v1/admin/users", json={"name": "eve", "teams": ["t"], "expires_in": "soon"}, headers=root)
    assert r.status_code == 422 and r.json()["error"].startswith("expires_in:")
    r = world.app.post("/v1/admin/tokens/999/revoke", headers=root)
    assert r.status_code == 404
    r = world.app.put("/v1/admin/users/nobody-here/membership", json={"team": "t"}, headers=root)
    assert r.status_code == 404


def test_the_queue_shows_only_your_teams_jobs_at_their_true_positions(world: World) -> None:
    for who in ("alice", "bob", "alice"):
        world.app.post("/v1/jobs", json={"command": ["true"], "gpus": 8}, headers=world.as_(who))
    world.cluster.tick_at(world.cluster.clock.t + 1)
    everyone = world.app.get("/v1/queue", headers=world.as_("root")).json()["entries"]
    mine = world.app.get("/v1/queue", headers=world.as_("bob")).json()["entries"]
    assert len(everyone) == 3 and len(mine) == 1
    assert mine[0]["job"]["owner"] == "bob"
    assert mine[0]["position"] == next(e["position"] for e in everyone if e["job"]["owner"] == "bob")


def test_the_queue_lists_a_page_from_the_front_counts_the_rest_and_finds_one_job(world: World) -> None:
    for who in ("alice", "bob", "alice", "alice", "bob"):
        world.app.post("/v1/jobs", json={"command": ["true"], "gpus": 8}, headers=world.as_(who))
    world.cluster.tick_at(world.cluster.clock.t + 1)
    everyone = world.app.get("/v1/queue", headers=world.as_("root")).json()
    front = world.app.get("/v1/queue?limit=2", headers=world.as_("root")).json()
    assert everyone["total"] == front["total"] == len(everyone["entries"]) == 5
    assert front["entries"] == everyone["entries"][:2]
    bobs = world.app.get("/v1/queue?limit=1", headers=world.as_("bob")).json()
    assert bobs["total"] == 2 and [e["job"]["owner"] for e in bobs["entries"]] == ["bob"]
    last = everyone["entries"][-1]
    one = world.app.get(f"/v1/queue?job={last['job']['id']}", headers=world.as_("root")).json()
    assert one["entries"] == [last]
    alices = next(e for e in everyone["entries"] if e["job"]["owner"] == "alice")
    hidden = world.app.get(f"/v1/queue?job={alices['job']['id']}", headers=world.as_("bob")).json()
    assert hidden["entries"] == []  # another team's job is not placed for you
    r = world.app.get("/v1/queue?limit=0", headers=world.as_("root"))
    assert r.status_code == 422 and "limit" in r.json()["error"]


def test_a_job_token_reports_its_own_progress_and_nothing_else(world: World) -> None:
    env = world.cluster.proc(world.own).spec.env
    token = env["GPUCLUSTER_JOB_TOKEN"]
    assert token == world.access.job_token(world.own) and world.cluster.proc(world.own).spec.user is None
    auth = {"Authorization": f"Bearer {token}"}
    assert world.app.post(f"/v1/jobs/{world.own}/progress", json={"step": 5}, headers=auth).status_code == 204
    r = world.app.post(f"/v1/jobs/{world.other}/progress", json={"step": 5}, headers=auth)
    assert r.status_code == 403 and "belongs to job" in r.json()["error"]
    r = world.app.get(f"/v1/jobs/{world.own}", headers=auth)
    assert r.status_code == 403 and "only report" in r.json()["error"]
    forged = tokens.JOB_PREFIX + f"{world.other}_" + token.rsplit("_", 1)[1]
    r = world.app.post(
        f"/v1/jobs/{world.other}/progress", json={"step": 5}, headers={"Authorization": f"Bearer {forged}"}
    )
    assert r.status_code == 401


def test_rate_limits_answer_429_with_when_to_retry(tmp_path: Path) -> None:
    w = make_world(tmp_path, rate_per_s=1.0)  # bursts of 2
    try:
        codes = [w.app.get("/v1/whoami", headers=w.as_("dave")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        r = w.app.get("/v1/whoami", headers=w.as_("dave"))
        assert r.headers["retry-after"] == "1" and "rate limit: more than 1 requests/s" in r.json()["error"]
        assert w.app.get("/v1/whoami", headers=w.as_("alice")).status_code == 200  # per token
        assert all(w.app.get("/v1/whoami", headers=w.as_("root")).status_code == 200 for _ in range(5))
        w.cluster.clock.advance(1.0)
        assert w.app.get("/v1/whoami", headers=w.as_("dave")).status_code == 200
    finally:
        w.cluster.close()


def test_a_root_head_refuses_a_submitter_without_a_unix_account(world: World) -> None:
    strict = AccessControl(world.cluster.store, world.cluster.clock, run_as_submitter=True)
    me = strict.authenticate(world.tokens["alice"])
    with pytest.raises(PermissionError, match="no account 'alice' on it"):
        strict.check_can_run(me)
    assert strict.run_as("alice") == "alice" and strict.run_as(None) is None


def test_an_account_found_is_not_looked_up_again_for_a_few_seconds_and_a_missing_one_always_is(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: pwd is asked at every submission on a root head (5% of its CPU, and the event
    loop waits on /etc/passwd). An account found is believed for ACCOUNT_SEEN_S of the head's
    clock, a missing one is asked every time, and any change to users forgets what was seen."""
    strict = AccessControl(world.cluster.store, world.cluster.clock, run_as_submitter=True)
    strict.update_user("alice", "root", None)  # an account every machine has
    asked: list[str] = []
    real = unix.account_exists

    def counted(name: str) -> bool:
        asked.append(name)
        return real(name)

    monkeypatch.setattr(unix, "account_exists", counted)
    alice = strict.authenticate(world.tokens["alice"])
    for _ in range(5):
        strict.check_can_run(alice)
    assert asked == ["root"]
    world.cluster.clock.advance(ACCOUNT_SEEN_S)
    strict.check_can_run(alice)
    assert asked == ["root", "root"]
    dave = strict.authenticate(world.tokens["dave"])  # no Unix account 'dave' here
    for _ in range(2):
        with pytest.raises(PermissionError, match="no account 'dave' on it"):
            strict.check_can_run(dave)
    assert asked == ["root", "root", "dave", "dave"]
    strict.update_user("alice", None, None)  # a change to users: nothing seen is kept
    strict.update_user("alice", "root", None)
    asked.clear()
    strict.check_can_run(strict.authenticate(world.tokens["alice"]))
    assert asked == ["root"]


def test_the_account_a_job_runs_as_is_read_once_and_each_change_is_seen_by_the_next_start(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18 (the head's CPU per job): `run_as` is asked at every job start; the owner's
    mapping is read from the store once, then kept until a change to users. Only the account's
    name is kept: the node looks its uid up at each start."""
    strict = AccessControl(world.cluster.store, world.cluster.clock, run_as_submitter=True)
    read = strict.store.unix_user
    reads: list[str] = []

    def counted(name: str) -> str | None:
        reads.append(name)
        return read(name)

    monkeypatch.setattr(strict.store, "unix_user", counted)
    assert [strict.run_as("alice") for _ in range(5)] == ["alice"] * 5
    assert reads == ["alice"]
    strict.update_user("alice", "root", None)  # an account every machine has
    assert strict.run_as("alice") == "root"
    strict.update_user("alice", None, None)  # back to the default: their own name
    assert strict.run_as("alice") == "alice"
    strict.update_user("dave", "root", None)
    strict.delete_user("dave")
    assert strict.run_as("dave") == "dave"
    assert reads == ["alice", "alice", "alice", "dave"]


def test_a_mapping_read_while_users_change_is_not_kept(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that read the old mapping just as a change committed (another thread) may use
    it that once, as it would have without a cache, but the next start reads the new one."""
    strict = AccessControl(world.cluster.store, world.cluster.clock, run_as_submitter=True)
    read = strict.store.unix_user

    def raced(name: str) -> str | None:
        old = read(name)
        monkeypatch.setattr(strict.store, "unix_user", read)
        strict.update_user(name, "root", None)  # committed while the first read was under way
        return old

    monkeypatch.setattr(strict.store, "unix_user", raced)
    assert strict.run_as("alice") == "alice"
    assert strict.run_as("alice") == "root"


@pytest.mark.backends("sqlite")  # reads the database file itself
def test_only_token_digests_are_stored(world: World) -> None:
    db = world.cluster.store.path
    raw = db.read_bytes() + (db.parent / (db.name + "-wal")).read_bytes()
    assert world.tokens["alice"].encode() not in raw
    with sqlite3.connect(db) as c:
        digests = {r[0] for r in c.execute("SELECT sha256 FROM tokens")}
    assert tokens.digest(world.tokens["alice"]) in digests


def test_a_schema_3_data_dir_gains_users_and_job_owners(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).close()
    with sqlite3.connect(db) as conn:
        for table in ("users", "memberships", "tokens", "audit"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("ALTER TABLE jobs DROP COLUMN owner")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    store = Store(db)
    try:
        access = AccessControl(store, lambda: 1.0, run_as_submitter=False)
        assert access.bootstrap("root", None) is not None
        record = store.get_job(store.create_job(JobSpec(command=["x"]), 1.0))
        assert record is not None and record.owner is None
    finally:
        store.close()
