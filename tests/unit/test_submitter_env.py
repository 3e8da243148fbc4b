"""The submitter's environment, as `sbatch --export=ALL` (issue 17): what the CLI and SDK take
from the caller's environment, where it stands in a job's environment, and who may read it back
(its owner and cluster admins: a teammate reads the job's spec, not the owner's shell)."""

from __future__ import annotations

import pytest

from gpucluster.core.types import NodeSlice
from gpucluster.launch.env import exportable, exported_env, inherited, job_env, parse_export

from .authkit import World

CALLER = {
    "PATH": "/home/alice/venv/bin:/usr/bin",
    "VIRTUAL_ENV": "/home/alice/venv",
    "PYTHONPATH": "/home/alice/lib",
    "HF_TOKEN": "hf-secret",
    "HOME": "/home/alice",
    "USER": "alice",
    "GPUCLUSTER_TOKEN": "gc-token",
    "GPUCLUSTER_DATABASE_URL": "postgresql://u:pw@db/gc",
    "CUDA_VISIBLE_DEVICES": "3",
    "RANK": "2",
    "TORCHELASTIC_RUN_ID": "x",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent",
    "PWD": "/somewhere",
    "BASH_FUNC_f%%": "() { :; }",
    "NUL": "a\x00b",
}


def test_all_sends_the_callers_environment_less_what_the_cluster_or_node_sets() -> None:
    sent = exported_env(CALLER, "ALL")
    assert sent == {
        "PATH": "/home/alice/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/home/alice/venv",
        "PYTHONPATH": "/home/alice/lib",
        "HF_TOKEN": "hf-secret",
    }


def test_none_sends_nothing_and_a_list_only_those_named() -> None:
    assert exported_env(CALLER, "NONE") is None
    assert exported_env(CALLER, "none") is None
    assert exported_env(CALLER, "PATH,VIRTUAL_ENV,MISSING") == {
        "PATH": "/home/alice/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/home/alice/venv",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("GPUCLUSTER_TOKEN", "GPUCLUSTER_TOKEN is set by the cluster or the node"),
        ("PATH,HOME", "HOME is set by the cluster or the node"),
        ("PATH,a-b", "'a-b' is not a variable name"),
        (",", "give ALL, NONE or a comma-separated list"),
    ],
)
def test_a_bad_export_is_one_clear_line(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_export(value)


def test_the_job_gets_the_submitters_path_and_venv_over_the_heads_under_env_and_the_cluster() -> None:
    env = job_env(
        base=inherited({"PATH": "/usr/sbin:/usr/bin", "LANG": "C.UTF-8", "DB_PASSWORD": "head-secret"}),
        user_env={"HF_TOKEN": "from --env"},
        submitter_env=exported_env(CALLER),
        job_id=1,
        job_name="j",
        team="t",
        attempt=1,
        slice_=NodeSlice("n", (0,)),
        head_url="http://h",
        virtual_gpus=True,
    )
    assert env["PATH"] == "/home/alice/venv/bin:/usr/bin" and env["VIRTUAL_ENV"] == "/home/alice/venv"
    assert env["PYTHONPATH"] == "/home/alice/lib" and env["LANG"] == "C.UTF-8"
    assert env["HF_TOKEN"] == "from --env"  # --env wins
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "DB_PASSWORD" not in env
    assert not exportable("GPUCLUSTER_URL") and exportable("WANDB_API_KEY")


def test_the_exported_environment_is_shown_to_its_owner_and_cluster_admins_only(world: World) -> None:
    secret = {"HF_TOKEN": "hf-secret-4d2", "PATH": "/home/alice/venv/bin:/usr/bin"}
    posted = world.app.post("/v1/jobs", json={"command": ["true"], "exported_env": secret}, headers=world.as_("alice"))
    assert posted.status_code == 201, posted.text
    job = posted.json()["id"]
    world.cluster.tick_at(world.cluster.clock.t + 1)
    for who in ("alice", "root"):
        got = world.app.get(f"/v1/jobs/{job}", headers=world.as_(who)).json()
        assert got["spec"]["exported_env"] == secret, who
    for who in ("dave", "carol"):  # teammates: a member and the team's admin
        got = world.app.get(f"/v1/jobs/{job}", headers=world.as_(who)).json()
        assert got["spec"]["exported_env"] is None, who
    for who in ("alice", "dave", "root"):  # lists and the queue never carry it
        listed = world.app.get("/v1/jobs", headers=world.as_(who)).text
        assert "hf-secret-4d2" not in listed
    queued = world.app.post(
        "/v1/jobs", json={"command": ["true"], "gpus": 8, "exported_env": secret}, headers=world.as_("alice")
    )
    world.cluster.tick_at(world.cluster.clock.t + 1)
    assert "hf-secret-4d2" not in world.app.get("/v1/queue", headers=world.as_("dave")).text
    assert queued.status_code == 201
    assert "hf-secret-4d2" not in world.app.post(f"/v1/jobs/{job}/cancel", headers=world.as_("carol")).text


def test_the_head_refuses_reserved_names_in_an_exported_environment(world: World) -> None:
    r = world.app.post(
        "/v1/jobs", json={"command": ["true"], "exported_env": {"GPUCLUSTER_TOKEN": "x"}}, headers=world.as_("alice")
    )
    assert r.status_code == 422 and "GPUCLUSTER_TOKEN is set by the cluster" in r.json()["error"]


def test_the_job_is_launched_with_the_exported_environment(world: World) -> None:
    posted = world.app.post(
        "/v1/jobs",
        json={"command": ["python"], "exported_env": {"VIRTUAL_ENV": "/v", "PATH": "/v/bin"}},
        headers=world.as_("alice"),
    )
    job = posted.json()["id"]
    world.cluster.tick_at(world.cluster.clock.t + 1)
    env = world.cluster.proc(job).spec.env
    assert (env["VIRTUAL_ENV"], env["PATH"]) == ("/v", "/v/bin")
