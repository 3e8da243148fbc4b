"""What the cluster tells a training process through its environment, read in one place.

Every function falls back to something sensible when the variable is absent, so the same script
runs under gpucluster, under plain torchrun and as a single `python train.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpucluster.launch.ranks import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_GRACE_PERIOD_S,
    ENV_JOB_ID,
    ENV_URL,
    REQUEUE_EXIT_CODE,
)

DEFAULT_CHECKPOINT_DIR = "./checkpoints"
DEFAULT_GRACE_PERIOD_S = 30.0  # the head's default (`gpucluster up --grace-period`)

__all__ = [
    "DEFAULT_CHECKPOINT_DIR",
    "DEFAULT_GRACE_PERIOD_S",
    "REQUEUE_EXIT_CODE",
    "attempt",
    "checkpoint_dir",
    "grace_period_s",
    "head_url",
    "job_id",
]


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def attempt(environ: Mapping[str, str] | None = None) -> int:
    """This run's attempt number, 1 for the first run.

    gpucluster sets GPUCLUSTER_ATTEMPT; under torchrun alone, its restart count stands in.
    """
    env = _env(environ)
    if ENV_ATTEMPT in env:
        return int(env[ENV_ATTEMPT])
    return 1 + int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))


def checkpoint_dir(cli_value: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The job's checkpoint directory: the cluster's (kept across attempts), else the CLI's, else ./checkpoints."""
    env = _env(environ)
    value = env.get(ENV_CHECKPOINT_DIR) or cli_value or DEFAULT_CHECKPOINT_DIR
    return Path(value)


def grace_period_s(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between SIGTERM and SIGKILL: the time a preempted job has to checkpoint."""
    raw = _env(environ).get(ENV_GRACE_PERIOD_S)
    return float(raw) if raw else DEFAULT_GRACE_PERIOD_S


def job_id(environ: Mapping[str, str] | None = None) -> int | None:
    raw = _env(environ).get(ENV_JOB_ID)
    return int(raw) if raw else None


def head_url(environ: Mapping[str, str] | None = None) -> str | None:
    raw = _env(environ).get(ENV_URL)
    return raw.rstrip("/") if raw else None
