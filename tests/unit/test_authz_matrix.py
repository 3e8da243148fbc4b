"""The authorization matrix: every endpoint of the app x every kind of caller x own/other team.

The endpoint list comes from the app itself (its OpenAPI document), so a route added without an
access rule, or without a line in EXPECTED below, fails here with its name and what to do.
"""

from __future__ import annotations

from typing import Any

from gpucluster.auth.rules import ACCESS_KEY, JOB_RULES, Rule

from .authkit import SECRETS, World

# What each route must require. A new route goes here with the rule it needs.
EXPECTED: dict[tuple[str, str], Rule] = {
    ("GET", "/v1/health"): Rule.PUBLIC,
    ("POST", "/v1/jobs"): Rule.SIGNED_IN,
    ("POST", "/v1/jobs/dry-run"): Rule.SIGNED_IN,
    ("POST", "/v1/jobs/{job_id}/what-if"): Rule.JOB_VIEW,
    ("GET", "/v1/jobs"): Rule.SIGNED_IN,
    ("GET", "/v1/jobs/{job_id}"): Rule.JOB_VIEW,
    ("PATCH", "/v1/jobs/{job_id}"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/cancel"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/requeue"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/hold"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/release"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/array"): Rule.JOB_OPERATE,
    ("POST", "/v1/jobs/{job_id}/progress"): Rule.JOB_REPORT,
    ("GET", "/v1/jobs/{job_id}/logs"): Rule.JOB_VIEW,
    ("GET", "/v1/jobs/{job_id}/pipeline"): Rule.JOB_VIEW,  # steps of the caller's teams only
    ("GET", "/v1/queue"): Rule.SIGNED_IN,
    ("GET", "/v1/policy"): Rule.SIGNED_IN,
    ("GET", "/v1/nodes"): Rule.SIGNED_IN,
    ("GET", "/v1/whoami"): Rule.SIGNED_IN,
    ("GET", "/v1/admin/users"): Rule.CLUSTER_ADMIN,
    ("POST", "/v1/admin/users"): Rule.CLUSTER_ADMIN,
    ("PATCH", "/v1/admin/users/{name}"): Rule.CLUSTER_ADMIN,
    ("DELETE", "/v1/admin/users/{name}"): Rule.CLUSTER_ADMIN,
    ("PUT", "/v1/admin/users/{name}/membership"): Rule.CLUSTER_ADMIN,
    ("POST", "/v1/admin/users/{name}/tokens"): Rule.CLUSTER_ADMIN,
    ("GET", "/v1/admin/tokens"): Rule.CLUSTER_ADMIN,
    ("POST", "/v1/admin/tokens/{token_id}/revoke"): Rule.CLUSTER_ADMIN,
    ("GET", "/v1/admin/audit"): Rule.CLUSTER_ADMIN,
    ("POST", "/v1/nodes/{name}/drain"): Rule.CLUSTER_ADMIN,
    ("POST", "/v1/nodes/{name}/undrain"): Rule.CLUSTER_ADMIN,
    ("GET", "/v1/telemetry/samples"): Rule.SIGNED_IN,  # GPU readings name job ids only
    ("GET", "/v1/usage"): Rule.SIGNED_IN,  # rows of the caller's teams only
    ("GET", "/v1/usage/series"): Rule.SIGNED_IN,  # series of the caller's teams only
    ("GET", "/v1/budgets"): Rule.SIGNED_IN,  # budgets of the caller's teams only
    ("GET", "/metrics"): Rule.PUBLIC,  # Prometheus scrapes; labels are nodes, GPUs, teams: no job names
}

# Callers, relative to job `own` (alice's, team vision): None is no token at all.
CALLERS = [None, "job", "alice", "dave", "carol", "bob", "root"]
ALLOWED: dict[Rule, set[str | None]] = {
    Rule.PUBLIC: set(CALLERS),
    Rule.SIGNED_IN: {"alice", "dave", "carol", "bob", "root"},
    Rule.JOB_VIEW: {"alice", "dave", "carol", "root"},  # bob: other team
    Rule.JOB_OPERATE: {"alice", "carol", "root"},  # dave: same team, not his job, not team admin
    Rule.JOB_REPORT: {"job", "alice", "carol", "root"},
    Rule.CLUSTER_ADMIN: {"root"},
}


def endpoints(world: World) -> list[tuple[str, str, dict[str, Any]]]:
    doc = world.app.get("/openapi.json").json()
    return [
        (method.upper(), path, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]


def concrete(world: World, path: str, method: str = "GET") -> str:
    """A path with its parameters filled in: the job is alice's (team vision). A DELETE names no
    one real (the rule is checked before the lookup; a cluster admin gets 404), so deleting a
    user does not sign dave out for the endpoints after it."""
    values = {"job_id": world.own, "name": "dave" if method != "DELETE" else "n1", "token_id": world.spare_token}
    out = path
    while "{" in out:
        start, end = out.index("{"), out.index("}")
        key = out[start + 1 : end]
        out = out[:start] + str(values.get(key, "n1")) + out[end + 1 :]
    return out


def test_every_route_declares_the_rule_it_must_have(world: World) -> None:
    problems = []
    seen = set()
    for method, path, op in endpoints(world):
        seen.add((method, path))
        declared = op.get(ACCESS_KEY)
        expected = EXPECTED.get((method, path))
        if declared is None:
            problems.append(
                f"{method} {path} declares no access rule: add openapi_extra=allow(Rule.<who may call it>) "
                "(gpucluster.auth.rules), then a line in EXPECTED here"
            )
        elif expected is None:
            problems.append(f"{method} {path} ({declared}) is not in the authorization matrix: add it to EXPECTED")
        elif declared != expected.value:
            problems.append(f"{method} {path} declares {declared!r}, the matrix expects {expected.value!r}")
    problems += [f"{m} {p} is in EXPECTED but the app has no such route" for m, p in EXPECTED if (m, p) not in seen]
    assert not problems, "\n".join(problems)


def test_every_endpoint_for_every_caller_and_team(world: World) -> None:
    wrong = []
    for method, path, op in endpoints(world):
        rule = Rule(op.get(ACCESS_KEY, Rule.SIGNED_IN.value))
        url = concrete(world, path, method)
        for who in CALLERS:
            status = world.call(method, url, who, json={} if method in ("POST", "PUT", "PATCH") else None)
            if who in ALLOWED[rule]:
                ok = status not in (401, 403)
                want = "allowed"
            elif who is None:
                ok, want = status == 401, "401"
            elif rule in JOB_RULES and who == "bob":
                ok, want = status == 404, "404 (another team's job reads as missing)"
            else:
                ok, want = status == 403, "403"
            if not ok:
                wrong.append(f"{method} {url} ({rule.value}) as {who or 'nobody'}: {status}, expected {want}")
    assert not wrong, "\n".join(wrong)


def test_other_teams_see_nothing_of_a_job(world: World) -> None:
    """No GET endpoint shows bob (team nlp) anything of alice's job: name, command, env, logs."""
    (world.cluster.tmp / "jobs").mkdir(exist_ok=True)
    for method, path, _ in endpoints(world):
        if method != "GET":
            continue
        r = world.app.get(concrete(world, path), headers=world.as_("bob"))
        leaked = [s for s in SECRETS if s in r.text]
        assert not leaked, f"GET {path} shows bob {leaked}: {r.text[:300]}"
    listing = world.app.get("/v1/jobs", headers=world.as_("bob")).json()["jobs"]
    assert [j["id"] for j in listing] == [world.other]
    # ... while alice's own team sees it, and a cluster admin sees both.
    assert "secret-name" in world.app.get(f"/v1/jobs/{world.own}", headers=world.as_("dave")).text
    assert len(world.app.get("/v1/jobs", headers=world.as_("root")).json()["jobs"]) == 2
