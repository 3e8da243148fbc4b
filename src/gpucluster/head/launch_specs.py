"""What to start for a job's attempt: one process, or one per rank (or node launcher).

Split out of head/loop.py (the loop commits the allocation, then asks this for the launch spec
and hands it to the executor): the job's environment from its allocation, the ranks' addresses
and a fresh rendezvous port, the per-rank log and error files; an array element's own
environment and command (head/gates.py), a container job's image and mounts, a session's PTY.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpucluster.executors.base import LaunchError, LaunchSpec, ProcessSpec
from gpucluster.executors.podman import ContainerSpec
from gpucluster.launch.env import host_limits, job_env
from gpucluster.launch.ranks import launcher_commands, per_gpu_envs, pick_free_port
from gpucluster.store import JobRecord

if TYPE_CHECKING:
    from gpucluster.head.loop import Head

# Every process of a distributed attempt has this in its environment (the attempt's run dir, so
# unique to one data dir, job and attempt): the executor finds by it the processes that left
# their process group, such as torchrun's workers.
ENV_ATTEMPT_MARKER = "GPUCLUSTER_ATTEMPT_DIR"


def launch_spec(head: Head, job: JobRecord) -> LaunchSpec:
    """What to start for the job's current attempt: one process, or one per rank."""
    job = head.gates.element(job)  # an array element: its index, count and sweep values
    assert job.allocation is not None
    slices = job.allocation.slices
    attempt = job.attempt
    checkpoints = head.data_dir.checkpoints(job.id)  # made by the job's own processes
    envs = {
        s.node: job_env(
            base=head.base_env,
            user_env=job.spec.env,
            submitter_env=job.spec.exported_env,
            job_id=job.id,
            job_name=job.name,
            team=job.team,
            attempt=attempt,
            slice_=s,
            head_url=head.head_url,
            virtual_gpus=head.virtual_gpus,
            grace_period_s=head.grace_period_s,
            checkpoint_dir=str(checkpoints),
        )
        for s in slices
    }
    if head.identity is not None:
        extra = head.identity.job_env(job)
        for env in envs.values():
            env.update(extra)
    run_dir = head.data_dir.run_dir(job.id, attempt)
    spec = LaunchSpec(
        job_id=job.id,
        attempt=attempt,
        argv=job.spec.argv,
        env=envs[slices[0].node],
        workdir=job.spec.workdir or "~",  # the home of the account it runs as
        run_dir=run_dir,
        log_path=head.data_dir.log(job.id, attempt),
        user=head.identity.run_as(job.owner) if head.identity is not None else None,
        job_dir=head.data_dir.job_dir(job.id),
        container=ContainerSpec(job.spec.image, tuple(job.spec.mounts)) if job.spec.image else None,
        session=job.spec.interactive,
    )
    if job.spec.interactive:
        # The session's command leads a session of its own (its PTY's), out of the shim's
        # process group: the marker finds what it leaves, as it finds torchrun's workers.
        spec.env[ENV_ATTEMPT_MARKER] = str(run_dir)
        return replace(spec, marker=f"{ENV_ATTEMPT_MARKER}={run_dir}")
    if not job.spec.distributed:
        return spec
    marker = f"{ENV_ATTEMPT_MARKER}={run_dir}"
    for env in envs.values():
        env[ENV_ATTEMPT_MARKER] = str(run_dir)
    addresses = {s.node: node_address(head, s.node) for s in slices}
    # A fresh port every attempt (a dead attempt's store is never dialled), free on rank 0's node.
    port = head.inventory.free_port(slices[0].node) if head.inventory is not None else pick_free_port()
    argvs: list[tuple[str, list[str], dict[str, str]]]
    try:
        if job.spec.per_gpu:
            argvs = [
                (pe.placement.node, job.spec.argv, pe.apply(envs[pe.placement.node]))
                for pe in per_gpu_envs(
                    slices,
                    addresses,
                    port,
                    job_id=job.id,
                    attempt=attempt,
                    max_restarts=job.spec.max_restarts,
                    # next to the rank's log, in the job's directory, where its processes write
                    error_file=lambda p: str(head.data_dir.log(job.id, attempt, p.rank).parent / "error.json"),
                )
            ]
        else:
            argvs = [
                (c.node, list(c.argv), {**envs[c.node], **c.env})
                for c in launcher_commands(slices, addresses, port, job.spec.argv, job_id=job.id, attempt=attempt)
            ]
    except ValueError as e:
        raise LaunchError(str(e)) from None
    _split_host_limits(job, argvs)
    processes = tuple(
        ProcessSpec(argv, env, run_dir / f"rank-{r}", head.data_dir.log(job.id, attempt, r))
        for r, (_, argv, env) in enumerate(argvs)
    )
    return replace(spec, processes=processes, marker=marker)


def _split_host_limits(job: JobRecord, argvs: list[tuple[str, list[str], dict[str, str]]]) -> None:
    """Each process of a node its part of the node's CPUs and memory: a job's cgroup is one per
    process (per rank), so a node's slice is divided among the processes started there."""
    assert job.allocation is not None
    per_node: dict[str, int] = {}
    for node, _, _ in argvs:
        per_node[node] = per_node.get(node, 0) + 1
    for s in job.allocation.slices:
        n = per_node.get(s.node, 0)
        if n <= 1 or not (s.cpus or s.host_memory_mb):
            continue
        for node, _, env in argvs:
            if node == s.node:
                host_limits(env, round(s.cpus / n, 2), s.host_memory_mb // n, job.spec.env)


def node_address(head: Head, node: str) -> str:
    known = head.inventory.address(node) if head.inventory is not None else None
    return known or head.node_addresses.get(node, "127.0.0.1")
