"""Container images and mounts: what is refused at submit, and the `podman run` a node builds."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpucluster.containers import check_image, local_image, outside_roots, parse_mount
from gpucluster.executors.podman import ContainerNode, ContainerSpec, describe_node, run_options
from gpucluster.launch.env import host_limits
from gpucluster.models import JobSpec
from gpucluster.policyfile import PolicyFileError, load_policy


@pytest.mark.parametrize(
    "image",
    [
        "python",
        "python:3.11-slim",
        "ghcr.io/org/team/img:v1.2",
        "localhost:5000/img@sha256:" + "a" * 64,
        "docker://nvcr.io/nvidia/pytorch:24.01-py3",
        "docker-archive:/data/env.tar",
        "oci-archive:/data/env.tar:latest",
    ],
)
def test_valid_image_references_are_accepted(image: str) -> None:
    assert check_image(image)


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("Python:3", "not a valid reference"),
        ("img:", "not a valid reference"),
        ("a b", "not a valid reference"),
        ("img@sha256:xyz", "not a valid reference"),
        ("docker-archive:env.tar", "needs an absolute path"),
        ("", "1-1024 characters"),
    ],
)
def test_bad_image_references_are_refused_with_what_a_valid_one_is(image: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_image(image)


def test_mounts_parse_and_refuse_what_podman_would_misread() -> None:
    m = parse_mount("/data/sets/:/data:ro")
    assert (m.source, m.target, m.read_only, str(m)) == ("/data/sets", "/data", True, "/data/sets:/data:ro")
    assert not parse_mount("/a:/b").read_only
    for bad, words in [
        ("data:/d", "absolute"),
        ("/a:/b:rx", "ro or rw"),
        ("/a/../etc:/b", "'..'"),
        ("/a,b:/c", "','"),
        ("/a:/proc/x", "may not be"),
        ("/a", "SRC:DST"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_mount(bad)


def test_the_policys_roots_decide_which_sources_may_be_mounted() -> None:
    mounts = [parse_mount("/data/a:/a"), parse_mount("/scratch/b:/b")]
    assert outside_roots(mounts, ["/data", "/scratch/"]) is None
    assert outside_roots([parse_mount("/datax:/a")], ["/data"]) is not None  # a prefix is not a root
    why = outside_roots(mounts, [])
    assert why is not None and "none: the policy allows no mounts" in why and "mount_roots" in why


def test_job_spec_validates_image_and_mounts(tmp_path: Path) -> None:
    spec = JobSpec(command=["true"], image="python:3.11", mounts=["/data/x/:/x:ro"])
    assert spec.mounts == ["/data/x:/x:ro"]
    with pytest.raises(ValidationError, match="give an image too"):
        JobSpec(command=["true"], mounts=["/a:/b"])
    with pytest.raises(ValidationError, match="not a valid reference"):
        JobSpec(command=["true"], image="UPPER")


def test_policy_file_containers_section(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("containers:\n  mount_roots: [/data, /scratch]\n")
    assert load_policy(f).mount_roots == ("/data", "/scratch")
    f.write_text("containers:\n  mount_roots: [data]\n")
    with pytest.raises(PolicyFileError, match="absolute path"):
        load_policy(f)


def test_local_archives_become_transports_with_absolute_paths(tmp_path: Path) -> None:
    docker = tmp_path / "env.tar"
    with tarfile.open(docker, "w") as tar:
        tar.add(__file__, "manifest.json")
    oci = tmp_path / "oci.tar"
    with tarfile.open(oci, "w") as tar:
        tar.add(__file__, "oci-layout")
    assert local_image("./env.tar", tmp_path) == f"docker-archive:{docker}"
    assert local_image(str(oci), Path("/")) == f"oci-archive:{oci}"
    assert local_image("python:3.11", tmp_path) == "python:3.11"
    assert local_image("oci-archive:/x.tar", tmp_path) == "oci-archive:/x.tar"


def _options(
    node: ContainerNode, env: dict[str, str], as_root: bool = False, mounts: tuple[str, ...] = ()
) -> list[str]:
    options, _ = run_options(node, ContainerSpec("img", mounts), name="n", env=env, workdir="/w", as_root=as_root)
    return options


def test_run_options_pass_variable_names_only_and_mount_the_jobs_own_paths() -> None:
    env = {"SECRET": "s3cret", "PATH": "/host/bin", "GPUCLUSTER_CHECKPOINT_DIR": "/jobs/1/checkpoints"}
    options = _options(ContainerNode(), env, mounts=("/data:/data:ro",))
    assert "--env=SECRET" in options and "--env=GPUCLUSTER_CHECKPOINT_DIR" in options
    assert not any("s3cret" in o for o in options)
    assert "--env=PATH" not in options  # the image's PATH
    assert "--volume=/w:/w" in options and "--volume=/jobs/1/checkpoints:/jobs/1/checkpoints" in options
    assert "--volume=/data:/data:ro" in options
    assert "--userns=keep-id" in options and "--user=0:0" not in options  # never root in the image
    assert "--user=0:0" in _options(ContainerNode(), env, as_root=True)
    assert {"--rm", "--network=host", "--ipc=host", "--init", "--pull=never", "--name=n"} <= set(options)
    assert "--shm-size=1024m" in _options(ContainerNode(host_ipc=False, shm_bytes=1 << 30), env)


def test_a_rootful_container_gets_the_jobs_cpus_and_memory_as_podman_limits() -> None:
    """Rootful podman's container lives in podman's own cgroup, not the job's: the limits the
    executor writes into the job's cgroup (GPUCLUSTER_CPUS, GPUCLUSTER_MEMORY_LIMIT in bytes,
    from launch/env.py `host_limits`) go to `podman run` as --cpus and --memory."""
    env: dict[str, str] = {}
    host_limits(env, 2.5, 4096, {})
    options = _options(ContainerNode(), env, as_root=True)
    assert "--cpus=2.5" in options and f"--memory={4096 * 1024 * 1024}" in options
    assert options.index("--cpus=2.5") < options.index("--env=GPUCLUSTER_CPUS")  # options, before the image
    only_cpus: dict[str, str] = {}
    host_limits(only_cpus, 4, 0, {})
    options = _options(ContainerNode(), only_cpus, as_root=True)
    assert "--cpus=4" in options and not any(o.startswith("--memory") for o in options)
    # A job that asked for neither runs uncapped, as a bare job does.
    assert not any(o.startswith(("--cpus", "--memory")) for o in _options(ContainerNode(), {}, as_root=True))
    # Rootless: the container stays in the job's cgroup, which holds the limits already.
    assert not any(o.startswith(("--cpus", "--memory")) for o in _options(ContainerNode(), env, as_root=False))


def test_nvidia_gpus_go_in_through_cdi_numbered_from_zero_inside() -> None:
    node = ContainerNode(gpu_uuids={0: "GPU-a", 1: "GPU-b", 2: "GPU-c"})
    options, changes = run_options(
        node, ContainerSpec("img"), name="n", env={"CUDA_VISIBLE_DEVICES": "2,0"}, workdir="/w", as_root=False
    )
    assert [o for o in options if o.startswith("--device")] == [
        "--device=nvidia.com/gpu=GPU-c",
        "--device=nvidia.com/gpu=GPU-a",
    ]
    assert changes == {"CUDA_VISIBLE_DEVICES": "0,1"}
    # Virtual GPUs: the same variables as a bare job, no devices.
    options, changes = run_options(
        ContainerNode(), ContainerSpec("img"), name="n", env={"CUDA_VISIBLE_DEVICES": "3"}, workdir="/w", as_root=False
    )
    assert changes == {} and not any(o.startswith("--device") for o in options)


def test_up_says_in_one_line_what_a_node_lacks_for_containers(tmp_path: Path) -> None:
    missing = describe_node(ContainerNode(podman="/nonexistent/podman"))
    assert missing.startswith("containers: no podman") and "\n" not in missing
    if shutil.which("podman") is None or Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return  # the rest is about podman on a host that mixes cgroup v1 and v2
    conf = tmp_path / "containers.conf"
    conf.write_text("[engine]\n")
    line = describe_node(ContainerNode(config_env={"CONTAINERS_CONF": str(conf)}))
    assert "mixes cgroup v1 and v2" in line and 'cgroup_manager = "cgroupfs"' in line and "default_ulimits" in line
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n')
    line = describe_node(ContainerNode(config_env={"CONTAINERS_CONF": str(conf)}))
    assert line.startswith("containers: podman version") and "runc, cgroupfs" in line, line
