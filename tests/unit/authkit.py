"""A head's API with real users, teams and tokens, for the access tests: a real store and the
real app in process (TestClient), the fake executor, the hand-moved clock of headkit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi.testclient import TestClient

from gpucluster.api.app import create_app
from gpucluster.auth.control import AccessControl

from .headkit import Cluster, make_cluster

SECRETS = ("secret-name", "secret-command-arg", "secret-env-value")


@dataclass
class World:
    """vision: alice (member, submitted job `own`), dave (member), carol (team admin);
    nlp: bob (member, submitted job `other`); root: cluster admin."""

    cluster: Cluster
    access: AccessControl
    app: TestClient
    tokens: dict[str, str] = field(default_factory=dict)
    own: int = 0  # alice's job in vision, running, with secrets in its name, command and env
    other: int = 0  # bob's job in nlp
    spare_token: int = 0  # a token the revoke route may revoke

    def as_(self, who: str | None) -> dict[str, str]:
        """Headers for a caller: a user, "job" (job `own`'s own token), or None (no token)."""
        if who is None:
            return {}
        token = self.access.job_token(self.own) if who == "job" else self.tokens[who]
        return {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, who: str | None, **kw: object) -> int:
        return self.app.request(method, path, headers=self.as_(who), **kw).status_code  # type: ignore[arg-type]


def make_world(tmp_path: Path, rate_per_s: float = 0.0, store_target: Path | str | None = None) -> World:
    cluster = make_cluster(tmp_path, default_command=["true"], store_target=store_target)
    access = AccessControl(cluster.store, cluster.clock, rate_per_s=rate_per_s, run_as_submitter=False)
    root = access.bootstrap("root", None)
    assert root is not None
    tokens = {"root": root}
    for name, team, role in (
        ("alice", "vision", "member"),
        ("dave", "vision", "member"),
        ("carol", "vision", "team-admin"),
        ("bob", "nlp", "member"),
    ):
        _, tokens[name], _ = access.add_user(name, [team], role, None, None)
    _, spare = access.issue_token("dave", None, "to be revoked")
    cluster.head.identity = access  # jobs get their own token, as under `gpucluster up`
    world = World(cluster, access, TestClient(create_app(cluster.service, access)), tokens, spare_token=spare)
    own = world.app.post(
        "/v1/jobs",
        json={"command": ["echo", "secret-command-arg"], "name": "secret-name", "env": {"K": "secret-env-value"}},
        headers=world.as_("alice"),
    )
    assert own.status_code == 201, own.text
    world.own = own.json()["id"]
    other = world.app.post("/v1/jobs", json={"command": ["true"]}, headers=world.as_("bob"))
    assert other.status_code == 201, other.text
    world.other = other.json()["id"]
    cluster.tick_at(cluster.clock.t)  # both start
    return world
