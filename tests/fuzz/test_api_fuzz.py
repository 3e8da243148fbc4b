"""Fuzz the whole API from its own OpenAPI document (schemathesis), over real HTTP against a real
`gpucluster up` process, as a member of one team and as a cluster admin.

Every operation gets schemathesis's coverage cases (boundaries, wrong types, missing fields and
parameters, no token) and fuzzed cases, and every answer must pass four checks: no server error,
a status the document declares for that operation, the declared content type, and a body that
matches the declared schema (errors too: an `ErrorBody` everywhere, see api/errors.py). Part of
the cases are pointed at things that exist (the member's own job, a cancelled one, another team's,
the node, a spare user and token), so that job, node and admin routes get past their 404s.

Nothing the fuzzer submits may ever run: it writes arbitrary commands, and a head started as
root runs them as their submitter's Unix account. So:
- the head's policy lets every team it knows use no GPU at all (`max_borrow: 0`, no quota) and
  refuses unknown teams at submission: every job is accepted, queued, considered by every
  scheduling cycle and left waiting with the reason "borrowing limit" (setup checks this on a
  node with every GPU free) -- only dispatch never happens, and no API call changes the policy;
- its one node is then drained as a second lock (the one call that would undo it, an undrain of
  that node, is not made);
- the fuzzing users run jobs as `nobody`, were one ever to start;
- the last test checks that no job ever started and no attempt directory exists.
Calls that would take this test's own identities away (revoking the tokens it uses, changing
or deleting their users) are not made either, and logs are read with `follow=false` (following a job
that never ends would wait forever).

The head's rate limit is high enough that the fuzzer is never throttled (429 stays a declared
answer of every signed-in operation). Derandomized; GPUCLUSTER_FUZZ_EXAMPLES (default 12) sets
the fuzzed cases per operation and role: about a minute in all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.headproc import HeadProcess, wait_for

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_EXAMPLES = int(os.environ.get("GPUCLUSTER_FUZZ_EXAMPLES", "12"))
NODE = "fuzz-node"
TEAM, OTHER_TEAM = "vision", "nlp"
# Every team the head knows may use no GPU: nothing submitted ever starts.
POLICY = f"""\
unknown_teams: reject
teams:
  {TEAM}: {{max_borrow: 0}}
  {OTHER_TEAM}: {{max_borrow: 0}}
  default: {{max_borrow: 0}}
"""


# Changing or deleting a user acts on a user of its own, made for it: the spare user's token and
# job stay for the other operations (a delete would take both), and the fuzzing identities stay.
DOOMED = {("PATCH", "/v1/admin/users/{name}"): "fuzz-patched", ("DELETE", "/v1/admin/users/{name}"): "fuzz-doomed"}

SERVICE = "fuzz-svc"
DOOMED_SERVICES = {"member": "fuzz-svc-doomed-m", "admin": "fuzz-svc-doomed-a"}

# Operations no call can succeed on here: requeue and progress need a running job, and the one
# node stays drained.
ALLOWED_NEVER_OK = {
    *((who, f"POST /v1/jobs/{{job_id}}/{op}") for who in ("member", "admin") for op in ("requeue", "progress")),
    ("admin", "POST /v1/nodes/{name}/undrain"),
}


class Fixture:
    """The fuzz head and what exists on it before fuzzing starts."""

    def __init__(self, head: HeadProcess) -> None:
        self.head = head
        self.admin = self._headers(head.token)
        self.tokens: dict[str, str] = {}
        self.token_ids: set[int] = set()
        self.users = {"root"}
        self.job_ids: list[int] = []
        self.what_if_target = 0
        self.array_id = 0  # the member's array (hold, release, cancel and update take its id)
        self.admin_targets: dict[str, int] = {}
        self.spare_tokens: list[int] = []
        self.seen: dict[tuple[str, str], set[int]] = {}  # (who, operation) -> statuses answered

    @staticmethod
    def _headers(token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        r = httpx.post(f"{self.head.url}{path}", json=body, headers=headers or self.admin, timeout=30)
        assert r.status_code < 300, r.text
        return r.json()

    def add_user(self, name: str, teams: list[str], role: str) -> str:
        # A root head runs a user's jobs as their Unix account: `nobody`, were one ever to start.
        made = self.post("/v1/admin/users", {"name": name, "teams": teams, "role": role, "unix_user": "nobody"})
        self.tokens[name] = made["token"]
        self.token_ids.add(made["token_id"])
        self.users.add(name)
        return str(made["token"])

    def setup(self) -> Fixture:
        r = httpx.get(f"{self.head.url}/v1/whoami", headers=self.admin, timeout=30)
        self.token_ids.add(r.json()["token_id"])
        member = self._headers(self.add_user("fuzz-member", [TEAM], "member"))
        self.add_user("fuzz-admin", [TEAM], "cluster-admin")  # a team of its own: its submissions need none
        spare = self.post("/v1/admin/users", {"name": "fuzz-spare", "teams": [OTHER_TEAM], "unix_user": "nobody"})
        self.spare_tokens.append(spare["token_id"])
        for doomed in DOOMED.values():  # what PATCH and DELETE of a user act on (see _aim)
            self.post("/v1/admin/users", {"name": doomed, "teams": [OTHER_TEAM], "unix_user": "nobody"})
        own = self.post("/v1/jobs", {"command": ["true"], "name": "own"}, member)["id"]
        ended = self.post("/v1/jobs", {"command": ["true"], "gpus": 0.5}, member)["id"]
        self.post(f"/v1/jobs/{ended}/cancel", None, member)
        other = self.post("/v1/jobs", {"command": ["true"], "gpus": 2}, self._headers(spare["token"]))["id"]
        array = self.post("/v1/jobs", {"command": ["true"], "array": "0-2", "name": "arr"}, member)["array_id"]
        self.array_id = array
        self.job_ids = [own, ended, other, array]
        # A queued job of the member's only what-if points at: the member's own fuzzing cancels
        # `own` and the array early on, and a what-if is for a queued job (409 otherwise).
        self.what_if_target = self.post("/v1/jobs", {"command": ["true"], "name": "for-what-if"}, member)["id"]
        # Another team's queued jobs for the admin's cancel, hold and release, one each: the
        # member's fuzzing cannot touch them (another team's job), so they are still queued.
        spare_headers = self._headers(spare["token"])
        self.admin_targets = {
            op: self.post("/v1/jobs", {"command": ["true"], "name": f"for-{op}"}, spare_headers)["id"]
            for op in ("cancel", "hold", "release")
        }
        # ... and one for the admin's update (PATCH /v1/jobs/{job_id}: the last part of its path).
        self.admin_targets["{job_id}"] = self.post(
            "/v1/jobs", {"command": ["true"], "name": "for-update"}, spare_headers
        )["id"]
        # Services (their replicas are jobs, held like the others): one to read and update, and one
        # for each role's delete to remove.
        for svc in (SERVICE, *DOOMED_SERVICES.values()):
            self.post("/v1/services", {"name": svc, "command": ["true"], "gpus": 0.5}, member)
        # The policy alone holds them, on a node with every GPU free...
        for job_id in (own, other):
            job = wait_for(lambda j=job_id: self.job(j)["wait_reason"] and self.job(j), what="a scheduling cycle")
            assert job["state"] == "queued" and "borrow" in job["reason"], job
        # ... and the drained node is a second lock.
        self.post(f"/v1/nodes/{NODE}/drain", {"reason": "fuzzing: no job may start"})
        return self

    def job(self, job_id: int) -> Any:
        return httpx.get(f"{self.head.url}/v1/jobs/{job_id}", headers=self.admin, timeout=30).json()

    def check_nothing_ran(self) -> None:
        r = httpx.get(f"{self.head.url}/v1/jobs", headers=self.admin, timeout=60)
        assert r.status_code == 200, r.text
        jobs = r.json()["jobs"]
        assert len(jobs) >= len(self.job_ids)
        started = [j["id"] for j in jobs if j["started_at"] is not None or j["attempt"] > 0]
        assert started == [], f"jobs started on the fuzz head: {started}"
        assert not list(self.head.data_dir.glob("jobs/*/attempt-*")), "a job was launched"


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    base = tmp_path_factory.mktemp("fuzz")
    policy = base / "policy.yaml"
    policy.write_text(POLICY)
    head = HeadProcess(
        base / "data",
        gpus=4,
        extra_args=("--policy", str(policy), "--rate-limit", "1000000", "--telemetry-interval", "1s"),
    )
    head.args[head.args.index("--node-name") + 1] = NODE
    head.start()
    try:
        yield Fixture(head).setup()
    finally:
        head.stop()
        head.kill_jobs()


def _schema(fuzz: Fixture, who: str) -> Any:
    config = schemathesis.Config.from_dict(
        {
            "headers": {"Authorization": f"Bearer {fuzz.tokens[who]}"},
            "request-timeout": 20,
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
            "phases": {"stateful": {"enabled": False}},
            "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
        }
    )
    return schemathesis.openapi.from_url(f"{fuzz.head.url}/openapi.json", config=config)


@pytest.fixture(scope="module")
def member_schema(fuzz: Fixture) -> Any:
    return _schema(fuzz, "fuzz-member")


@pytest.fixture(scope="module")
def admin_schema(fuzz: Fixture) -> Any:
    return _schema(fuzz, "fuzz-admin")


def _aim(fuzz: Fixture, case: Any, who: str = "member") -> bool:
    """Point part of the cases at things that exist; False for a call that must not be made."""
    params = case.path_parameters or {}
    path = case.operation.path
    job_id = params.get("job_id")
    if isinstance(job_id, int) and job_id > 0 and job_id % 3:
        params["job_id"] = fuzz.job_ids[job_id % len(fuzz.job_ids)]
        if path == "/v1/jobs/{job_id}/array":
            params["job_id"] = fuzz.array_id  # only an array has a throttle to change
        op = path.rsplit("/", 1)[1]
        if who == "admin" and op in fuzz.admin_targets:
            params["job_id"] = fuzz.admin_targets[op]
        if op == "what-if":
            params["job_id"] = fuzz.what_if_target
        if case.query and "index" in case.query and job_id % 2:
            del case.query["index"]  # the whole job or array, not an element that may not exist
    token_id = params.get("token_id")
    if isinstance(token_id, int) and token_id > 0 and token_id % 2:
        params["token_id"] = fuzz.spare_tokens[0]
    name = params.get("name")
    if path.startswith("/v1/nodes/") and isinstance(name, str) and len(name) % 2:
        params["name"] = NODE
    if path.startswith("/v1/admin/users/") and isinstance(name, str) and len(name) % 2:
        params["name"] = DOOMED.get((case.method.upper(), path), "fuzz-spare")
    if path.startswith("/v1/services/") and isinstance(name, str) and len(name) % 2:
        params["name"] = DOOMED_SERVICES[who] if case.method.upper() == "DELETE" else SERVICE
    body = case.body if isinstance(getattr(case, "body", None), dict) else None
    if path == "/v1/services" and who == "admin" and body is not None and isinstance(body.get("name"), str):
        body["name"] = f"a{body['name']}"[:100]  # the generator is deterministic: the member took each name
    if path == "/v1/admin/users" and body is not None and isinstance(body.get("name"), str) and len(body["name"]) % 2:
        # A root head accepts a user only with an existing Unix account and known teams, which
        # drawn strings seldom are: half the named bodies get ones that exist, so a creation is
        # seen succeeding whatever the draw (it varied with the schema and the run's other tests).
        body["unix_user"], body["teams"] = "nobody", [OTHER_TEAM]
    if case.query and "follow" in case.query:
        case.query["follow"] = "false"
    if path == "/v1/nodes/{name}/undrain" and str(params.get("name")) == NODE:
        return False
    # Coverage cases may carry a path parameter as a string ("1"): compare as text.
    if path == "/v1/admin/tokens/{token_id}/revoke" and str(params.get("token_id")) in map(str, fuzz.token_ids):
        return False
    changes_user = path in ("/v1/admin/users/{name}/membership", "/v1/admin/users/{name}")
    return not (changes_user and case.method.upper() != "GET" and str(params.get("name")) in fuzz.users)


@pytest.fixture(autouse=True)
def _node_id(request: pytest.FixtureRequest) -> None:
    """schemathesis's lazy schemas (up to 4.32 at least) rename the test through the private
    `_nodeid` that pytest 9 no longer has: give them one."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


member = schemathesis.pytest.from_fixture("member_schema")
admin = schemathesis.pytest.from_fixture("admin_schema")


def _call(fuzz: Fixture, case: Any, who: str) -> None:
    if _aim(fuzz, case, who):
        response = case.call_and_validate(checks=CHECKS)
        fuzz.seen.setdefault((who, case.operation.label), set()).add(response.status_code)


@member.parametrize()
def test_fuzz_as_a_member(case: Any, fuzz: Fixture) -> None:
    _call(fuzz, case, "member")


@admin.parametrize()
def test_fuzz_as_a_cluster_admin(case: Any, fuzz: Fixture) -> None:
    _call(fuzz, case, "admin")


def test_the_fuzzing_got_past_the_front_door(fuzz: Fixture) -> None:
    """Every operation answered the admin with success at least once, and the member too where a
    member may call it: the cases reached the routes' own logic, not only 401/403/404/422."""
    if not fuzz.seen:
        pytest.skip("needs the two fuzzing tests above in the same run")
    ops = {op for _, op in fuzz.seen}
    assert len(ops) >= 26, sorted(ops)
    never = {(who, op) for (who, op), statuses in fuzz.seen.items() if not any(s < 300 for s in statuses)}
    admin_only = {op for op in ops if op.split(" ", 1)[1].startswith(("/v1/admin/", "/v1/nodes/"))}
    unexpected = never - {("member", op) for op in admin_only} - ALLOWED_NEVER_OK
    assert not unexpected, {f"{who} {op}": sorted(fuzz.seen[who, op]) for who, op in sorted(unexpected)}


def test_no_fuzzed_job_ever_started(fuzz: Fixture) -> None:
    fuzz.check_nothing_ran()
