"""The environment of a job's process.

CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA number GPUs as NVML does; without it CUDA's default
"fastest first" order can make CUDA_VISIBLE_DEVICES=1 name a different GPU than the scheduler
allocated on a node with mixed models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module for exported_env: it must not load the core's types (issue 18)
    from gpucluster.core.types import NodeSlice

# The only variables of the head's own environment a job inherits: where programs are and how
# text is shown. Everything else (a database URL with its password, cloud credentials, tokens)
# stays the head's; a job that needs a variable names it with `--env`.
INHERITED = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM")
INHERITED_PREFIXES = ("LC_",)


def inherited(head_env: Mapping[str, str]) -> dict[str, str]:
    """The part of the head's environment every job gets (the allow-list above)."""
    return {k: v for k, v in head_env.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}


# ---- the submitter's environment (sbatch --export=ALL), chosen on the submitting side ----------

# Never sent from the caller's environment: what the cluster sets (its own variables, the GPUs,
# its token and database URL among GPUCLUSTER_*), torchrun's per-process numbers (a stale RANK
# from the caller's shell would mislead a single-process job), the account's identity (the node
# sets HOME, USER and LOGNAME of the account the job runs as), and the caller's session (its
# terminal, its ssh agent socket, its display: meaningless, or a door, elsewhere).
NOT_EXPORTED_PREFIXES = (
    "GPUCLUSTER_",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "TORCHELASTIC_",
    "SSH_",
    "XDG_SESSION_",
    "BASH_FUNC_",
)
NOT_EXPORTED = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "HOME",
        "USER",
        "LOGNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "PROMPT_COMMAND",
        "COLUMNS",
        "LINES",
        "MAIL",
        "DISPLAY",
        "XAUTHORITY",
        "XDG_RUNTIME_DIR",
        "DBUS_SESSION_BUS_ADDRESS",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOWID",
    }
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_VALUE = 32768  # models.MAX_ENV_VALUE (not imported: this module stays free of pydantic)
_MAX_VARS = 512


def exportable(name: str) -> bool:
    """May the caller's variable `name` travel with a job (see NOT_EXPORTED)?"""
    return bool(_NAME.fullmatch(name)) and name not in NOT_EXPORTED and not name.startswith(NOT_EXPORTED_PREFIXES)


def parse_export(value: str) -> str | list[str]:
    """`--export` as sbatch spells it: ALL, NONE, or NAME,NAME,... (ValueError with the reason)."""
    word = value.strip()
    if word.upper() in ("ALL", "NONE"):
        return word.upper()
    names = [n.strip() for n in word.split(",") if n.strip()]
    if not names:
        raise ValueError("--export: give ALL, NONE or a comma-separated list of variable names")
    for n in names:
        if not _NAME.fullmatch(n):
            raise ValueError(f"--export: {n!r} is not a variable name (A-Z, 0-9, _)")
        if not exportable(n):
            raise ValueError(f"--export: {n} is set by the cluster or the node, not taken from your environment")
    return names


def exported_env(caller_env: Mapping[str, str], export: str | Sequence[str] = "ALL") -> dict[str, str] | None:
    """What the CLI and SDK send of the caller's environment: None for NONE, else the variables
    named (ALL: every one) that may travel (`exportable`) and that the head would store (no NUL,
    at most 32 KiB each, at most 512, the first in name order)."""
    if isinstance(export, str):
        export = parse_export(export)
    if export == "NONE":
        return None
    wanted = sorted(caller_env) if export == "ALL" else list(export)
    out: dict[str, str] = {}
    for name in wanted:
        value = caller_env.get(name)
        if value is None or not exportable(name) or "\x00" in value or len(value) > _MAX_VALUE:
            continue
        if len(out) == _MAX_VARS:
            break
        out[name] = value
    return out


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
    submitter_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The head's allow-list, under the submitter's exported environment (so their PATH, venv and
    PYTHONPATH win, as in their shell), under `--env`, under the cluster's own variables."""
    env = dict(base)
    env.update(submitter_env or {})
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
    host_limits(env, slice_.cpus, slice_.host_memory_mb, user_env)
    return env


# Thread pools that size themselves from the machine's cores unless told (OpenMP, MKL, OpenBLAS,
# numexpr): on a node shared by jobs each would start one thread per core of the whole machine,
# so a job with --cpus 4 on a 128-core node would run 128 threads in a 4-CPU quota. Set to the
# job's CPUs, as Slurm sets OMP_NUM_THREADS from --cpus-per-task, unless the user sets them.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def host_limits(env: dict[str, str], cpus: float, memory_mb: int, user_env: Mapping[str, str]) -> None:
    """Tell one process of a job its CPUs and host memory: GPUCLUSTER_CPUS and
    GPUCLUSTER_MEMORY_LIMIT (bytes), which the executor also writes into the process's cgroup
    (cpu.max, memory.max), and the thread pools' sizes (`THREAD_VARS`) where `--env` set none.
    Nothing for a process that asked for neither (its GPUs alone: no cap)."""
    for name in ("GPUCLUSTER_CPUS", "GPUCLUSTER_MEMORY_LIMIT"):
        env.pop(name, None)
    if cpus > 0:
        env["GPUCLUSTER_CPUS"] = f"{cpus:g}"
        threads = str(max(1, int(cpus)))
        for name in THREAD_VARS:
            if name not in user_env:
                env[name] = threads
    if memory_mb > 0:
        env["GPUCLUSTER_MEMORY_LIMIT"] = str(memory_mb * 1024 * 1024)
