"""Gradient compression for DDP, chosen by one option, through DDP communication hooks.

DDP all-reduces gradients bucket by bucket; a communication hook replaces that all-reduce.
PyTorch ships the hooks used here (torch.distributed.algorithms.ddp_comm_hooks):

* "fp16" / "bf16": cast each bucket to 16 bits, all-reduce, cast back; half the bytes on the
  wire. bf16 keeps fp32's range (no overflow on large gradients). PyTorch's bf16 hook accepts
  only NCCL (>= 2.10); on other backends (gloo on CPUs) the same cast-reduce-cast runs here.
* "powersgd": low-rank approximation with error feedback (Vogels et al., 2019); far fewer bytes,
  at some compute cost. It runs plain all-reduce for the first `powersgd_start_iter` steps,
  which the paper recommends for accuracy.
* "none": DDP's own all-reduce.
"""

# No `from __future__ import annotations` here: DDP compares a hook's annotations with the real
# GradBucket and Future classes and rejects the strings that postponed evaluation would leave.
from typing import Any, Literal, cast, get_args

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # = dist.GradBucket, which mypy cannot see
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
        nccl = dist.get_backend(process_group) == "nccl"
        model.register_comm_hook(process_group, default_hooks.bf16_compress_hook if nccl else _bf16_hook)
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


def _bf16_hook(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """bf16 compression for any backend: PyTorch's own hook refuses all but NCCL."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    work = dist.all_reduce(compressed, group=group, async_op=True)
    assert work is not None

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return cast(torch.futures.Future[torch.Tensor], work.get_future().then(decompress))
