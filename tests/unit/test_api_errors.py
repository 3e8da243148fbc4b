"""What the API fuzzer (tests/fuzz) found, one regression test each: the answers it got that were
server errors, or that the OpenAPI document did not declare."""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster.api.errors import MAX_ID
from gpucluster.models import MAX_SQL_INT

from .authkit import World

TOO_BIG = str(2**64)  # past any SQL integer: once an OverflowError in the store, a 500


def _error_body(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert isinstance(body["error"], str) and body["error"] and isinstance(body["detail"], list)
    return dict(body)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/{}"),
        ("POST", "/v1/jobs/{}/cancel"),
        ("POST", "/v1/jobs/{}/requeue"),
        ("GET", "/v1/jobs/{}/logs"),
        ("POST", "/v1/admin/tokens/{}/revoke"),
    ],
)
def test_an_id_no_sql_integer_can_hold_is_a_422_not_a_500(world: World, method: str, path: str) -> None:
    for who in ("alice", "root") if "/jobs/" in path else ("root",):
        r = world.app.request(method, path.format(TOO_BIG), headers=world.as_(who))
        assert "less than or equal to" in _error_body(r, 422)["error"]
    # The largest id the store can hold is a plain "no such job".
    assert world.call("GET", f"/v1/jobs/{MAX_ID}", "alice") == 404


def test_ids_are_positive(world: World) -> None:
    assert (
        "greater than or equal to 1"
        in _error_body(world.app.get("/v1/jobs/0", headers=world.as_("root")), 422)["error"]
    )


@pytest.mark.parametrize("query", [f"offset={TOO_BIG}", f"attempt={TOO_BIG}", f"rank={TOO_BIG}"])
def test_log_positions_past_any_file_offset_are_a_422(world: World, query: str) -> None:
    _error_body(world.app.get(f"/v1/jobs/{world.own}/logs?{query}", headers=world.as_("alice")), 422)
    r = world.app.get(f"/v1/jobs/{world.own}/logs?offset={MAX_ID}", headers=world.as_("alice"))
    assert r.status_code == 200 and r.text == ""


@pytest.mark.parametrize("query", [f"gpu={TOO_BIG}", f"job={TOO_BIG}"])
def test_telemetry_filters_past_any_sql_integer_are_a_422(world: World, query: str) -> None:
    _error_body(world.app.get(f"/v1/telemetry/samples?{query}", headers=world.as_("alice")), 422)


@pytest.mark.parametrize(
    "path", ["/v1/jobs", "/v1/jobs/1/progress", "/v1/admin/users", "/v1/nodes/node0/drain", "/v1/admin/users/x/tokens"]
)
def test_a_body_that_is_not_text_is_a_400_in_the_one_error_shape(world: World, path: str) -> None:
    r = world.app.post(path, content=b"\xff\xfe{", headers={**world.as_("root"), "Content-Type": "application/json"})
    assert "parsing the body" in _error_body(r, 400)["error"]


def test_no_such_path_answers_in_the_one_error_shape(world: World) -> None:
    _error_body(world.app.get("/v1/no-such-thing", headers=world.as_("root")), 404)


def _doc(world: World) -> dict[str, Any]:
    return dict(world.app.get("/openapi.json").json())


def _responses(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, status, response)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        for status, response in op["responses"].items()
    ]


def test_every_signed_in_operation_declares_401_403_and_429(world: World) -> None:
    doc = _doc(world)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            declared = set(op["responses"])
            if op.get("x-access") == "public":
                # /metrics takes an optional token (a cluster admin's adds each team's spend): a bad one is a 401.
                optional_token = {"401"} if path == "/metrics" else set()
                assert not declared & {"401", "403", "429"} - optional_token, (method, path)
            else:
                assert {"401", "403", "429"} <= declared, (method, path, declared)
            if op.get("parameters") or "requestBody" in op:
                assert "422" in declared, (method, path)
            if "requestBody" in op:
                assert {"400", "413"} <= declared, (method, path)
            if method != "get":
                assert {"409", "503", "507"} <= declared, (method, path)


def test_every_error_is_declared_as_a_json_error_body(world: World) -> None:
    """Even where the success is text (a job's logs), and 422 included: the handler answers an
    ErrorBody, never FastAPI's own validation shape."""
    doc = _doc(world)
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for method, path, status, response in _responses(doc):
        if int(status) >= 400 and (method, path) != ("GET", "/v1/health"):
            assert response["content"] == error_body, (method, path, status)
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    logs = doc["paths"]["/v1/jobs/{job_id}/logs"]["get"]["responses"]
    assert list(logs["200"]["content"]) == ["text/plain"]


def test_health_declares_its_report_for_200_and_503(world: World) -> None:
    health = _doc(world)["paths"]["/v1/health"]["get"]["responses"]
    for status in ("200", "503"):
        assert health[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/HealthOut"}
    assert set(world.app.get("/v1/health").json()) == {
        "status",
        "problem",
        "version",
        "jobs",
        "last_cycle_age_s",
        "last_decide_s",
    }


@pytest.mark.parametrize("field", ["step", "checkpoint_step"])
def test_a_progress_step_past_any_sql_integer_is_a_422_not_a_500(world: World, field: str) -> None:
    """Once written as is: an OverflowError in the store, even for a job that is not running."""
    url = f"/v1/jobs/{world.own}/progress"
    r = world.app.post(url, json={field: 2**64}, headers=world.as_("job"))
    assert field in _error_body(r, 422)["error"]
    assert world.app.post(url, json={field: MAX_SQL_INT}, headers=world.as_("job")).status_code == 204
    assert world.app.get(f"/v1/jobs/{world.own}", headers=world.as_("alice")).json()["progress"][field] == MAX_SQL_INT


def test_job_listing_pages_filters_and_refuses_unstorable_text(world: World) -> None:
    """GET /v1/jobs?q=&limit=&offset= (the dashboard's jobs page): the text filter and the total
    stay inside the caller's teams, and a NUL in `q` is a 422 naming it, on every database."""
    page = world.app.get("/v1/jobs?q=secret&limit=1", headers=world.as_("bob")).json()
    assert page == {"jobs": [], "total": 0}  # alice's job matches, but bob is in nlp
    page = world.app.get("/v1/jobs?q=SECRET&limit=1", headers=world.as_("alice")).json()
    assert [j["id"] for j in page["jobs"]] == [world.own] and page["total"] == 1
    page = world.app.get("/v1/jobs?limit=1&offset=1", headers=world.as_("root")).json()
    assert [j["id"] for j in page["jobs"]] == [world.own] and page["total"] == 2  # the 2nd newest
    assert world.app.get("/v1/jobs", headers=world.as_("root")).json()["total"] is None  # no limit, no count
    assert (
        "q: contains a NUL" in _error_body(world.app.get("/v1/jobs?q=a%00b", headers=world.as_("alice")), 422)["error"]
    )
