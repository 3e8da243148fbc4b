"""Tenant isolation at the API (issue 14): another team's job reads as a missing one on every
per-job endpoint; no team's spend is shown to whoever may not see it (/metrics, /v1/policy);
text that cannot be stored is refused at the field, and one bad submission fails alone in a
batched commit; YAML files with executable tags answer one line.

The real app and store in process (authkit's world: alice in vision, bob in nlp, root)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpucluster.api.app import create_app
from gpucluster.head.submit_batcher import SubmitBatcher
from gpucluster.jobfile import JobFileError, read_job_file
from gpucluster.models import JobSpec
from gpucluster.policyfile import PolicyFileError, load_policy
from gpucluster.store import Store
from gpucluster.store.telemetry import GpuSample

from .authkit import World

SPEND = ("gpucluster_team_cost_total", "gpucluster_team_gpu_hours_total", "gpucluster_team_fair_share_usage")


# ---- another team's job is a missing job -----------------------------------------------------


def _missing(world: World, method: str, path: str, job_id: int, **kw: object) -> dict[str, object]:
    r = world.app.request(method, path.format(job_id), headers=world.as_("bob"), **kw)  # type: ignore[arg-type]
    assert r.status_code == 404, f"{method} {path.format(job_id)}: {r.status_code} {r.text}"
    return dict(r.json())


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/jobs/{}", None),
        ("GET", "/v1/jobs/{}/logs", None),
        ("GET", "/v1/jobs/{}/logs?follow=true", None),
        ("POST", "/v1/jobs/{}/cancel", None),
        ("POST", "/v1/jobs/{}/requeue", None),
        ("POST", "/v1/jobs/{}/requeue?state=running", None),
        ("POST", "/v1/jobs/{}/cancel?state=queued", None),
        ("POST", "/v1/jobs/{}/hold?state=queued", None),
        ("GET", "/v1/jobs/{}/pipeline", None),
        ("POST", "/v1/jobs/{}/progress", {"step": 1}),
    ],
)
def test_another_teams_job_answers_as_a_missing_one(world: World, method: str, path: str, body: object) -> None:
    missing_id = 10_000
    theirs = _missing(world, method, path, world.own, json=body)
    nothing = _missing(world, method, path, missing_id, json=body)
    assert theirs == {"error": f"no job with id {world.own}", "detail": []}
    assert nothing == {"error": f"no job with id {missing_id}", "detail": []}


def test_the_queue_places_no_job_of_another_team(world: World) -> None:
    queued = world.app.post("/v1/jobs", json={"command": ["true"], "gpus": 8}, headers=world.as_("alice")).json()
    world.cluster.tick_at(world.cluster.clock.t + 1)
    mine = world.app.get(f"/v1/queue?job={queued['id']}", headers=world.as_("alice")).json()
    assert [e["job"]["id"] for e in mine["entries"]] == [queued["id"]]
    theirs = world.app.get(f"/v1/queue?job={queued['id']}", headers=world.as_("bob")).json()
    nothing = world.app.get("/v1/queue?job=10000", headers=world.as_("bob")).json()
    assert theirs == nothing == {"entries": [], "total": 0}


# ---- spend -------------------------------------------------------------------------------------


def _accrue(world: World) -> None:
    world.cluster.tick_at(world.cluster.clock.t + 3600)  # both jobs ran an hour: usage for both teams


def test_metrics_show_team_spend_to_a_cluster_admin_only(world: World) -> None:
    _accrue(world)
    public = world.app.get("/metrics")
    assert public.status_code == 200 and "gpucluster_gpu_healthy" in public.text
    assert not [s for s in SPEND if s in public.text]
    member = world.app.get("/metrics", headers=world.as_("alice"))
    assert member.status_code == 200 and not [s for s in SPEND if s in member.text]
    admin = world.app.get("/metrics", headers=world.as_("root"))
    assert all(s in admin.text for s in SPEND[:2]) and 'team="nlp"' in admin.text
    bad = world.app.get("/metrics", headers={"Authorization": "Bearer gc_nonsense"})
    assert bad.status_code == 401


def test_a_head_may_publish_team_spend_in_metrics(world: World) -> None:
    from fastapi.testclient import TestClient

    _accrue(world)
    app = TestClient(create_app(world.cluster.service, world.access, public_team_usage=True))
    assert "gpucluster_team_gpu_hours_total" in app.get("/metrics").text


def test_policy_shows_a_member_the_usage_of_their_own_teams_only(world: World) -> None:
    _accrue(world)
    teams = {t["name"]: t for t in world.app.get("/v1/policy", headers=world.as_("bob")).json()["teams"]}
    assert teams["nlp"]["usage_gpu_hours"] > 0 and teams["nlp"]["running_gpus"] == 1
    assert teams["vision"]["usage_gpu_hours"] is None and teams["vision"]["running_gpus"] is None
    assert teams["vision"]["weight"] == 1  # the policy itself is everyone's to read
    everything = world.app.get("/v1/policy", headers=world.as_("root")).json()["teams"]
    assert all(t["usage_gpu_hours"] > 0 for t in everything if t["name"] in ("nlp", "vision"))


# ---- text that cannot be stored ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"env": {"K": "\ud800"}}, "env"),
        ({"name": "a\udfff"}, "name"),
        ({"command": ["echo", "x\ud800y"]}, "command"),
        ({"workdir": "/tmp/\ud800"}, "workdir"),
        ({"workdir": "/tmp/a\x00b"}, "workdir"),
        ({"gpu_type": "H100\x00"}, "gpu_type"),
    ],
)
def test_unstorable_text_is_a_422_naming_the_field(world: World, fields: dict[str, object], field: str) -> None:
    # As a client sends it: JSON with the escape \\ud800 (ASCII on the wire, a lone surrogate once read).
    body = json.dumps({"command": ["true"], **fields})
    headers = {**world.as_("alice"), "Content-Type": "application/json"}
    r = world.app.post("/v1/jobs", content=body, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(f"{field}: contains a "), r.json()
    assert r.json()["detail"][0]["field"] == field


def test_valid_unicode_is_stored_as_it_is(world: World) -> None:
    r = world.app.post(
        "/v1/jobs", json={"command": ["echo", "naïve 😀"], "env": {"K": "ü"}}, headers=world.as_("alice")
    )
    assert r.status_code == 201, r.text
    got = world.app.get(f"/v1/jobs/{r.json()['id']}", headers=world.as_("alice")).json()["spec"]
    assert got["command"] == ["echo", "naïve 😀"] and got["env"] == {"K": "ü"}


def _unstorable() -> JobSpec:
    """A spec that passed no validation (as a bug in it would let through): it cannot be stored."""
    return JobSpec.model_construct(**{**JobSpec(command=["true"]).__dict__, "name": "bad\ud800"})


def test_one_bad_item_fails_alone_in_a_group_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        good = JobSpec(command=["true"], name="good")
        out = store.create_jobs_each([(good, 1.0), (_unstorable(), 1.0), (good, 1.0)], ["a", "b", "c"])
        assert isinstance(out[1], Exception)
        assert isinstance(out[0], int) and isinstance(out[2], int)
        assert [r.id for r in store.list_jobs()] == [out[0], out[2]]
    finally:
        store.close()


def test_the_submit_batcher_answers_each_submission_for_itself(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    committed: list[bool] = []
    batcher = SubmitBatcher(store, on_committed=lambda specs: committed.append(True))

    async def submit_all() -> list[int | BaseException]:
        specs = [JobSpec(command=["true"]) for _ in range(20)]
        specs[7] = _unstorable()
        return await asyncio.gather(*(batcher.submit(s, 1.0, "u") for s in specs), return_exceptions=True)

    try:
        out = asyncio.run(asyncio.wait_for(submit_all(), 30))
        assert [isinstance(o, BaseException) for o in out] == [n == 7 for n in range(20)]
        assert len(store.list_jobs()) == 19 and committed
    finally:
        batcher.close()
        store.close()


# ---- YAML with tags that would run code --------------------------------------------------------

UNSAFE = 'command: !!python/object/apply:os.system ["touch {}"]\n'


def test_an_unsafe_job_file_is_one_line_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "job.yaml"
    path.write_text(UNSAFE.format(marker))
    with pytest.raises(JobFileError) as e:
        read_job_file(path)
    assert str(e.value) == (
        f"{path}:1:10: job file has the tag 'tag:yaml.org,2002:python/object/apply:os.system', which is not "
        "allowed: only plain YAML values (text, numbers, true/false, lists, mappings)"
    )
    assert not marker.exists()


def test_an_unsafe_policy_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("teams:\n  a: !!python/name:os.system\n")
    with pytest.raises(PolicyFileError) as e:
        load_policy(path)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{path}:2:6: policy file has the tag")


# ---- a body that stalls --------------------------------------------------------------------------


def test_a_stalled_request_body_is_408(world: World) -> None:
    """The app as the server calls it: a body that starts and then stalls is cut off (the real
    timeout is 30 s; this one is shortened on the app's outer layer)."""
    app = world.app.app
    app.read_timeout_s = 0.3  # type: ignore[union-attr]
    token = world.tokens["alice"].encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/jobs",
        "raw_path": b"/v1/jobs",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", b"Bearer " + token), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent: list[dict[str, object]] = []

    async def run() -> None:
        chunks = [{"type": "http.request", "body": b'{"command": ', "more_body": True}]

        async def receive() -> dict[str, object]:
            if chunks:
                return chunks.pop()
            await asyncio.Event().wait()  # the rest never comes
            raise AssertionError("unreachable")

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        await asyncio.wait_for(app(scope, receive, send), 10)  # type: ignore[arg-type, operator]

    asyncio.run(run())
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"]) == {"error": "the request body stalled for 0.3 s", "detail": []}  # type: ignore[arg-type]


# ---- GPU readings tell another team's jobs nothing -------------------------------------------


def test_gpu_samples_name_only_the_callers_jobs_and_job_filter_is_team_scoped(world: World) -> None:
    """A GPU's readings are the node's; which job held it, and a job's own readings, are its team's."""
    now = world.cluster.clock.t
    world.cluster.head.telemetry.add_samples(
        [GpuSample("n1", 0, now, 1.0, jobs=(world.own,), utilization=97.0, power_w=300.0)]
    )
    theirs = world.app.get("/v1/telemetry/samples", headers=world.as_("bob"))
    assert theirs.status_code == 200, theirs.text
    assert [(s["utilization"], s["jobs"]) for s in theirs.json()["samples"]] == [(97.0, [])]
    mine = world.app.get("/v1/telemetry/samples", headers=world.as_("alice")).json()["samples"]
    assert [s["jobs"] for s in mine] == [[world.own]]
    assert world.app.get(f"/v1/telemetry/samples?job={world.own}", headers=world.as_("alice")).status_code == 200
    probe = world.app.get(f"/v1/telemetry/samples?job={world.own}", headers=world.as_("bob"))
    assert (probe.status_code, probe.json()["error"]) == (404, f"no job with id {world.own}")
    admin = world.app.get(f"/v1/telemetry/samples?job={world.own}", headers=world.as_("root")).json()["samples"]
    assert [s["jobs"] for s in admin] == [[world.own]]
