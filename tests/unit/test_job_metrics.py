"""Training metrics a script reports (gpucluster.train.report; issue 17): stored per attempt
through the progress endpoint with the job's own token, shown in GET /v1/jobs/{id}, exported on
/metrics to a cluster admin, refused with the field's reason when malformed."""

from __future__ import annotations

from .authkit import World


def test_metrics_are_stored_per_attempt_shown_and_exported(world: World) -> None:
    job = world.own
    post = world.app.post(
        f"/v1/jobs/{job}/progress",
        json={"step": 10, "metrics": {"loss": 0.5, "tokens_per_s": 1000.0}, "metrics_step": 10},
        headers=world.as_("job"),
    )
    assert post.status_code == 204, post.text
    world.cluster.tick_at(world.cluster.clock.t + 1)
    world.app.post(f"/v1/jobs/{job}/progress", json={"step": 20, "metrics": {"loss": 0.25}}, headers=world.as_("job"))
    got = world.app.get(f"/v1/jobs/{job}", headers=world.as_("dave")).json()  # a teammate sees them
    series = {(m["attempt"], m["name"]): m for m in got["metrics"]}
    assert series[(1, "loss")]["reported"] == [0.5, 0.25] and series[(1, "loss")]["steps"] == [10, 20]
    assert series[(1, "tokens_per_s")]["reported"] == [1000.0]
    scraped = world.app.get("/metrics", headers=world.as_("root")).text
    assert f'gpucluster_job_metric{{job="{job}",name="loss",team="vision"}} 0.25' in scraped
    assert "gpucluster_job_metric{" not in world.app.get("/metrics").text  # teams' own, like their spend


def test_a_malformed_metric_is_refused_with_its_reason(world: World) -> None:
    r = world.app.post(f"/v1/jobs/{world.own}/progress", json={"metrics": {"bad name": 1.0}}, headers=world.as_("job"))
    assert r.status_code == 422 and "metric name 'bad name' is not valid" in r.json()["error"]
    many = {f"m{i}": 1.0 for i in range(33)}
    r = world.app.post(f"/v1/jobs/{world.own}/progress", json={"metrics": many}, headers=world.as_("job"))
    assert r.status_code == 422 and "at most 32 metrics" in r.json()["error"]
