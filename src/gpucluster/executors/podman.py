"""A container job's `podman run`: what a node needs, and the command line the job's shim runs.

Why Podman, run by the job's shim as the job's own Unix account: it is daemonless, so the
container is a child of the job's shim like a bare command is (the shim reaps it, records its exit
code, and outlives a head killed with -9: a restarted head adopts the shim and with it the
container). Run as the submitter it is rootless podman (`--userns=keep-id`: the submitter's uid
inside, never root in the image), whose reach is exactly the account's; a job already run as root
(a head without accounts) runs rootful podman as root, which is what its bare command would be.

The signals: the shim's keeper sends a stop (SIGTERM, ...) only to the job's process group, where
`podman run` passes it on once to the container (`--sig-proxy`, the default) and `--init`'s init
to the command, so a job's handler sees one SIGTERM as a bare job does; a kill is
`podman rm -f --time 0 NAME` as the job's account (the container's processes are the runtime's
children, not the shim's). The name is the job's attempt's (and rank's), so a restarted head or a
cleanup finds it.

What a node needs, checked by `gpucluster up` in one line (`describe_node`): podman, an OCI
runtime (runc or crun), and, on a host whose kernel mixes cgroup v1 and v2, a containers.conf
with `cgroup_manager = "cgroupfs"`, `runtime = "runc"` and `default_ulimits = []`
(`--container-config DIR` names a directory with containers.conf, storage.conf and
registries.conf for every container job of this node; the system's files otherwise). Rootless podman also needs the
account's subordinate ids in /etc/subuid and /etc/subgid (useradd adds them) for keep-id.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.containers import Mount, check_mounts

# Of the job's environment, what the image decides instead: its programs' PATH, and the home
# podman sets for the account (keep-id) or the image's user.
NOT_PASSED = frozenset({"PATH", "HOME", "HOSTNAME"})


@dataclass(frozen=True)
class ContainerNode:
    """This node's container runtime, as the head's config says."""

    podman: str = "podman"
    # CONTAINERS_CONF / CONTAINERS_STORAGE_CONF / CONTAINERS_REGISTRIES_CONF for every podman the
    # node runs (--container-config): a site's insecure or mirrored registries go in the last.
    config_env: dict[str, str] = field(default_factory=dict)
    # NVIDIA GPUs: NVML index -> UUID, given to the container through CDI (nvidia.com/gpu=UUID).
    gpu_uuids: dict[int, str] | None = None
    # Shared memory for NCCL and DataLoader workers: the node's own (--ipc=host), which needs
    # /dev/mqueue on the host (rootless podman mounts it); else a /dev/shm of this many bytes.
    host_ipc: bool = True
    shm_bytes: int = 8 << 30

    @staticmethod
    def from_config_dir(directory: Path | None, gpu_uuids: dict[int, str] | None = None) -> ContainerNode:
        env: dict[str, str] = {}
        if directory is not None:
            for name, var in (
                ("containers.conf", "CONTAINERS_CONF"),
                ("storage.conf", "CONTAINERS_STORAGE_CONF"),
                ("registries.conf", "CONTAINERS_REGISTRIES_CONF"),
            ):
                if (directory / name).is_file():
                    env[var] = str((directory / name).absolute())
        return ContainerNode(
            shutil.which("podman") or "podman",
            env,
            gpu_uuids,
            host_ipc=os.path.isdir("/dev/mqueue"),
            shm_bytes=_half_the_memory(),
        )


def _half_the_memory() -> int:
    """A tmpfs costs only what is written to it: half the node's memory, as large as NCCL may use."""
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
        return kib * 1024 // 2
    except (OSError, StopIteration, ValueError, IndexError):
        return 8 << 30


@dataclass(frozen=True)
class ContainerSpec:
    """What a job asked for: its image and extra mounts (already validated at submit)."""

    image: str
    mounts: tuple[str, ...] = ()


def container_name(instance: str, leaf: str) -> str:
    """`gpucluster-<instance>-job-12-attempt-3[-rank-0]`: one per process of an attempt, per head."""
    return f"gpucluster-{instance}-{leaf}"


def run_options(
    node: ContainerNode,
    spec: ContainerSpec,
    *,
    name: str,
    env: Mapping[str, str],
    workdir: str,
    as_root: bool,
) -> tuple[list[str], dict[str, str]]:
    """The options of `podman run` (before the image) and the environment changes for the job.

    Only variable *names* are on the command line (`-e NAME` takes the value from podman's own
    environment, which is the job's): a secret in `--env` never shows in `ps`."""
    env_changes: dict[str, str] = {}
    options = [
        "--rm",
        f"--name={name}",
        # One of this name is left only by a launch of this very attempt that a head crash cut
        # short before the shim recorded itself (the next head starts it again): it must go.
        "--replace",
        "--stop-timeout=1",  # what that replacing waits for the old one (the job's grace has passed)
        "--network=host",
        "--ipc=host" if node.host_ipc else f"--shm-size={node.shm_bytes // (1 << 20)}m",
        "--init",  # an init as pid 1 passes signals on to the command and reaps its children
        "--pull=never",  # the shim pulls first, as a phase of its own with its own error
        "--log-driver=none",  # the output goes to the job's log through the shim, not podman's
        f"--workdir={workdir}",
    ]
    options += ["--user=0:0"] if as_root else ["--userns=keep-id"]
    if as_root:
        # Rootful podman puts the container in a cgroup of its own (under machine.slice or
        # libpod_parent), out of the job's, so the CPUs and memory the executor writes into the
        # job's cgroup (local.apply_host_limits) would not bind it: podman sets the same ones.
        # Rootless podman's container stays below the job's shim, in the job's cgroup.
        cpus = env.get("GPUCLUSTER_CPUS")
        if cpus:
            options.append(f"--cpus={cpus}")
        memory = env.get("GPUCLUSTER_MEMORY_LIMIT")
        if memory:
            options.append(f"--memory={memory}")
    mounts: list[Mount] = check_mounts(list(spec.mounts))
    targets = {m.target for m in mounts}
    own = [workdir, env.get("GPUCLUSTER_CHECKPOINT_DIR")]
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        own.append(os.path.dirname(error_file))
    for path in dict.fromkeys(p for p in own if p and p not in targets and p != "/"):
        options.append(f"--volume={path}:{path}")
    options += [f"--volume={m}" for m in mounts]
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if node.gpu_uuids is not None and visible:
        indices = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        options += [f"--device=nvidia.com/gpu={node.gpu_uuids[i]}" for i in indices if i in node.gpu_uuids]
        # Inside, CDI shows only the job's GPUs, numbered from 0.
        env_changes["CUDA_VISIBLE_DEVICES"] = ",".join(str(n) for n in range(len(indices)))
    names = sorted(n for n in {**env, **env_changes} if n not in NOT_PASSED)
    options += [f"--env={n}" for n in names]
    return options, env_changes


# ---- what a node has: `gpucluster up` says it in one line --------------------------------------


def _hybrid_cgroups(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """Whether the host mixes cgroup v1 controllers and v2 (or is v1 only): podman's systemd
    manager and its default ulimits fail there without the settings in the module docstring."""
    return not (root / "cgroup.controllers").exists()


def describe_node(node: ContainerNode, *, run: Sequence[str] | None = None) -> str:
    """One line: whether container jobs can run here, and what is missing if not."""
    podman = shutil.which(node.podman)
    if podman is None:
        return "containers: no podman on this node: jobs with --image will fail (install podman and runc)"
    try:
        version = subprocess.run(
            list(run or [podman, "--version"]), capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"containers: {podman} does not run ({e}): jobs with --image will fail"
    runtime = next((r for r in ("runc", "crun") if shutil.which(r)), None)
    if runtime is None:
        return f"containers: {version} but no OCI runtime (runc or crun): jobs with --image will fail"
    conf_path = node.config_env.get("CONTAINERS_CONF") or "/etc/containers/containers.conf"
    try:
        with open(conf_path, "rb") as f:
            conf = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        conf = {}
    engine, ctrs = conf.get("engine", {}), conf.get("containers", {})
    if _hybrid_cgroups():
        missing = []
        if engine.get("cgroup_manager") != "cgroupfs":
            missing.append('cgroup_manager = "cgroupfs"')
        if engine.get("runtime") not in ("runc", None) or not shutil.which("runc"):
            missing.append('runtime = "runc" (installed)')
        if ctrs.get("default_ulimits") != []:
            missing.append("default_ulimits = []")
        if missing:
            return (
                f"containers: {version}, but this host mixes cgroup v1 and v2 and {conf_path} lacks "
                f"{', '.join(missing)}: jobs with --image will fail (see README, Containers)"
            )
    manager = engine.get("cgroup_manager") or "default"
    return f"containers: {version} ({engine.get('runtime') or runtime}, {manager} cgroups), config {conf_path}"
