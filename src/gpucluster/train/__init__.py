"""What a training script may import to behave well on the cluster (all of it optional).

    from gpucluster import train
    ctx = train.setup()                                  # torch.distributed from the torchrun env
    ckpt = train.CheckpointManager(train.checkpoint_dir(args.checkpoint_dir), keep=3)
    stop = train.preemption.install()                    # SIGTERM -> flag
    loaded = ckpt.load_latest()                          # resume (None on a first attempt)
    ...
    if stop.should_stop():                               # every rank agrees
        ckpt.save(state, step)
        train.teardown()
        train.exit_for_requeue()                         # exit code REQUEUE_EXIT_CODE

Modules: `distributed` (setup/teardown), `checkpoint` (atomic save/load, rotation, sharded),
`preemption` (SIGTERM), `progress` (reports to the head), `compression` (DDP comm hooks),
`env` (what the cluster sets). The same script runs under plain torchrun or alone.
"""

from __future__ import annotations

from gpucluster.train import compression, preemption, progress
from gpucluster.train.checkpoint import CheckpointError, CheckpointInfo, CheckpointManager, Loaded
from gpucluster.train.compression import register_compression
from gpucluster.train.distributed import DistContext, setup, teardown
from gpucluster.train.env import REQUEUE_EXIT_CODE, attempt, checkpoint_dir, grace_period_s
from gpucluster.train.preemption import Preemption, exit_for_requeue
from gpucluster.train.progress import ProgressReporter, report

__all__ = [
    "REQUEUE_EXIT_CODE",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "DistContext",
    "Loaded",
    "Preemption",
    "ProgressReporter",
    "attempt",
    "checkpoint_dir",
    "compression",
    "exit_for_requeue",
    "grace_period_s",
    "preemption",
    "progress",
    "register_compression",
    "report",
    "setup",
    "teardown",
]
