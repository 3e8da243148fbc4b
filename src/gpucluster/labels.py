"""How a job's GPU request reads to people, shared by the wire models (`JobSpec.gpus_label`) and
the CLI, which prints the head's JSON without building models (issue 19)."""

from __future__ import annotations


def gpu_count(gpus: float, gpu_memory: object) -> float:
    """GPUs the job holds: a whole number, or its share of one GPU (a fraction, or a memory share)."""
    return gpus if gpus < 1 or gpu_memory is not None else float(int(gpus))


def gpus_label(gpus: float, min_gpus: int | None, gpu_memory: object) -> str:
    """'2', '0.25', or '4..8' for an elastic job."""
    return f"{min_gpus}..{int(gpus)}" if min_gpus is not None else f"{gpu_count(gpus, gpu_memory):g}"


def gpu_types(gpu_type: str | list[str] | None) -> tuple[str, ...]:
    """A spec's GPU models in order of preference (one, several, or none: any)."""
    if gpu_type is None:
        return ()
    return (gpu_type,) if isinstance(gpu_type, str) else tuple(gpu_type)
