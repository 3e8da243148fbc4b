"""Gradient compression for DDP, chosen by one option, through DDP communication hooks.

DDP all-reduces gradients bucket by bucket; a communication hook replaces that all-reduce.
PyTorch ships the hooks used here (torch.distributed.algorithms.ddp_comm_hooks):

* "fp16" / "bf16": cast each bucket to 16 bits, all-reduce, cast back; half the bytes on the
  wire. bf16 keeps fp32's range (no overflow on large gradients) but needs NCCL >= 2.10 on GPUs.
* "powersgd": low-rank approximation with error feedback (Vogels et al., 2019); far fewer bytes,
  at some compute cost. It runs plain all-reduce for the first `powersgd_start_iter` steps,
  which the paper recommends for accuracy.
* "none": DDP's own all-reduce.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

Compression = Literal["none", "fp16", "bf16", "powersgd"]
CHOICES: tuple[str, ...] = get_args(Compression)


def register_compression(
    model: DistributedDataParallel,
    kind: str,
    *,
    process_group: dist.ProcessGroup | None = None,
    powersgd_rank: int = 1,
    powersgd_start_iter: int = 10,
) -> Any:
    """Install the hook for `kind` on `model`; returns the hook's state (PowerSGD's), or None.

    Call it once, after wrapping the model in DDP and before the first backward pass.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if kind == "none":
        return None
    if kind == "fp16":
        model.register_comm_hook(process_group, default_hooks.fp16_compress_hook)
        return None
    if kind == "bf16":
        model.register_comm_hook(process_group, default_hooks.bf16_compress_hook)
        return None
    if kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_iter,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    raise ValueError(f"unknown gradient compression {kind!r}; allowed: {', '.join(CHOICES)}")
