"""The environment of a job's process.

CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA number GPUs as NVML does; without it CUDA's default
"fastest first" order can make CUDA_VISIBLE_DEVICES=1 name a different GPU than the scheduler
allocated on a node with mixed models.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpucluster.core.types import NodeSlice

# The only variables of the head's own environment a job inherits: where programs are and how
# text is shown. Everything else (a database URL with its password, cloud credentials, tokens)
# stays the head's; a job that needs a variable names it with `--env`.
INHERITED = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM")
INHERITED_PREFIXES = ("LC_",)


def inherited(head_env: Mapping[str, str]) -> dict[str, str]:
    """The part of the head's environment every job gets (the allow-list above)."""
    return {k: v for k, v in head_env.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}


def job_env(
    *,
    base: Mapping[str, str],
    user_env: Mapping[str, str],
    job_id: int,
    job_name: str,
    team: str,
    attempt: int,
    slice_: NodeSlice,
    head_url: str,
    virtual_gpus: bool,
    grace_period_s: float = 30.0,
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    env = dict(base)
    env.update(user_env)
    visible = ",".join(str(i) for i in slice_.gpu_indices)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": visible,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPUCLUSTER_JOB_ID": str(job_id),
            "GPUCLUSTER_JOB_NAME": job_name,
            "GPUCLUSTER_TEAM": team,
            "GPUCLUSTER_ATTEMPT": str(attempt),
            "GPUCLUSTER_NODE": slice_.node,
            "GPUCLUSTER_NUM_GPUS": str(len(slice_.gpu_indices)),
            "GPUCLUSTER_URL": head_url,
            "GPUCLUSTER_VIRTUAL_GPUS": "1" if virtual_gpus else "0",
            "GPUCLUSTER_GRACE_PERIOD_S": f"{grace_period_s:g}",
        }
    )
    if checkpoint_dir is not None:
        env["GPUCLUSTER_CHECKPOINT_DIR"] = checkpoint_dir  # kept across every attempt of the job
    if slice_.share < 1:
        # A shared GPU: the job is told its share. Frameworks can cap themselves with it (e.g.
        # torch.cuda.set_per_process_memory_fraction(GPUCLUSTER_GPU_FRACTION)).
        env["GPUCLUSTER_GPU_FRACTION"] = f"{slice_.share:g}"
        if slice_.memory_mb is not None:
            env["GPUCLUSTER_GPU_MEMORY_LIMIT"] = str(slice_.memory_mb * 1024 * 1024)
    return env
