"""POST /v1/jobs's lean path (api/submit_path.py, issue 18): a plain submission is answered
without FastAPI's routing, and every answer, success or error, is the one the app gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from gpucluster.api.app import MAX_BODY_BYTES, BodyLimit
from gpucluster.api.submit_path import SubmitPath
from gpucluster.auth import rules

from .authkit import World, make_world


def _lean_path(world: World) -> SubmitPath:
    """The SubmitPath inside create_app's wrappers (BodyLimit, then the audit log)."""
    app: Any = world.app.app
    while not isinstance(app, SubmitPath):
        app = app.app
    return app


def _without_lean_path(world: World) -> TestClient:
    """The same app, the same wrappers, no lean path: what every submission went through before."""
    return TestClient(BodyLimit(rules.AuditLog(_lean_path(world).api, world.access), MAX_BODY_BYTES))


def test_a_plain_submission_is_answered_without_the_apps_routing_and_others_reach_it(world: World) -> None:
    lean = _lean_path(world)
    inner = lean.app
    reached: list[str] = []

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(f"{scope.get('method')} {scope['path']}")
        await inner(scope, receive, send)

    lean.app = recording
    r = world.app.post("/v1/jobs", json={"command": ["true"], "gpus": 1}, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    assert reached == []
    job = world.cluster.store.get_job(r.json()["id"])
    assert job is not None and job.owner == "alice" and job.team == "vision"
    assert world.app.post("/v1/jobs", json={"gpus": -1}, headers=world.as_("alice")).status_code == 422
    assert world.app.get("/v1/jobs", headers=world.as_("alice")).status_code == 200
    assert reached == ["POST /v1/jobs", "GET /v1/jobs"]


def _answer(r: Any) -> tuple[int, Any, dict[str, str]]:
    body: Any = r.json() if r.headers.get("content-type") == "application/json" else r.text
    if r.status_code == 201:
        assert body["name"] == f"job-{body['id']}"
        body = {k: v for k, v in body.items() if k not in ("id", "name")}  # the two apps share one store
    headers = {k: v for k, v in r.headers.items() if k not in ("date", "content-length")}
    return r.status_code, body, headers


def test_every_answer_to_a_submission_is_the_apps_word_for_word(world: World) -> None:
    plain = {"command": ["true"], "gpus": 1}
    json_type = {"Content-Type": "application/json"}
    text = {"Content-Type": "text/plain"}
    cases: list[tuple[str, str | None, dict[str, Any]]] = [
        ("accepted", "alice", {"json": plain}),
        ("accepted, a team named", "bob", {"json": {**plain, "team": "nlp"}}),
        ("a team not theirs", "alice", {"json": {**plain, "team": "nlp"}}),
        ("a class above normal without its grant", "alice", {"json": {**plain, "priority": "high"}}),
        ("mounts without an image", "alice", {"json": {**plain, "mounts": ["/etc:/x"]}}),
        ("mounts outside the allowed roots", "alice", {"json": {**plain, "image": "x", "mounts": ["/etc:/x"]}}),
        ("a session on a head without them", "alice", {"json": {**plain, "interactive": True}}),
        ("no token", None, {"json": plain}),
        ("a job's own token", "job", {"json": plain}),
        ("no token and an invalid body", None, {"json": {"gpus": "many"}}),
        ("an invalid field", "alice", {"json": {**plain, "gpus": -1}}),
        ("an unknown field", "alice", {"json": {**plain, "gpu": 2}}),
        ("a list, not an object", "alice", {"json": [plain]}),
        ("not JSON", "alice", {"content": b"{command: true", "headers": json_type}),
        ("not UTF-8", "alice", {"content": b'{"command": ["\xff"]}', "headers": json_type}),
        ("an empty body", "alice", {"content": b"", "headers": json_type}),
        ("JSON without a content type", "alice", {"content": b'{"command": ["true"]}'}),
        ("JSON as text/plain", "alice", {"content": b'{"command": ["true"]}', "headers": text}),
        ("too large", "alice", {"content": b" " * (MAX_BODY_BYTES + 1), "headers": json_type}),
    ]
    reference = _without_lean_path(world)
    for name, who, kw in cases:
        headers = {**world.as_(who), **kw.pop("headers", {})}
        lean = world.app.post("/v1/jobs", headers=headers, **kw)
        full = reference.post("/v1/jobs", headers=headers, **kw)
        assert _answer(lean) == _answer(full), name
        assert lean.status_code < 500, (name, lean.text)


def test_the_rate_limit_applies_to_a_plain_submission(tmp_path: Path) -> None:
    world = make_world(tmp_path, rate_per_s=1.0)  # bursts of 2
    try:
        codes = [
            world.app.post("/v1/jobs", json={"command": ["true"]}, headers=world.as_("dave")).status_code
            for _ in range(3)
        ]
        assert codes == [201, 201, 429]
        r = world.app.post("/v1/jobs", json={"command": ["true"]}, headers=world.as_("dave"))
        assert r.headers["retry-after"] == "1" and "rate limit: more than 1 requests/s" in r.json()["error"]
    finally:
        world.cluster.close()
