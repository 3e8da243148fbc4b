"""GPU discovery through NVML, and virtual GPUs for machines without one.

Virtual GPUs let the whole system (scheduling, isolation via CUDA_VISIBLE_DEVICES, accounting)
run on a laptop and in CI; only the device behind the index is missing.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gpucluster.core.types import Gpu
from gpucluster.errors import GpuclusterError


class NoGpus(RuntimeError, GpuclusterError):
    """NVML is unavailable or reports no GPU; the message says which, in one line."""


def discover_nvml() -> list[Gpu]:
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NoGpus(f"nvidia-ml-py is not installed ({e})") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NoGpus(f"no NVIDIA driver found (NVML: {e})") from e
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            gpus.append(Gpu(index=i, model=model_name(name, int(mem)), memory_mb=int(mem), uuid=uuid))
        gpus = _with_nvml_domains(pynvml, gpus)
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise NoGpus("the NVIDIA driver reports no GPUs")
    return gpus


def nvml_minor_numbers() -> dict[int, int]:
    """NVML index -> the minor number of its /dev/nvidia<N> (what the device cgroup names); empty
    where NVML cannot tell. The two usually agree, but nothing guarantees it."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver (any NVML error): no devices to fence
        return {}
    try:
        return {
            i: int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        }
    except (pynvml.NVMLError, AttributeError):
        return {}
    finally:
        pynvml.nvmlShutdown()


def _with_nvml_domains(pynvml: Any, gpus: list[Gpu]) -> list[Gpu]:
    """Group GPUs that share a PCIe switch or better (NVLink/NVSwitch islands included).

    NVML reports, for each pair, their closest common ancestor; pairs at or below
    NVML_TOPOLOGY_MULTIPLE (several PCIe switches, no CPU crossing) are joined, and each
    connected group becomes a domain. Any NVML error leaves the GPUs without domains: the
    scheduler then treats them as equal, which is safe.
    """
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
        parent = list(range(len(gpus)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i in range(len(gpus)):
            for j in range(i + 1, len(gpus)):
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                if level <= pynvml.NVML_TOPOLOGY_MULTIPLE:
                    parent[root(j)] = root(i)
    except (pynvml.NVMLError, AttributeError):
        return gpus
    return [replace(g, domain=f"pci{root(k)}") for k, g in enumerate(gpus)]


def model_name(nvml_name: str, memory_mb: int) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100-80GB': the short form users type in --gpu-type."""
    core = nvml_name.replace("NVIDIA", "").replace("Tesla", "").strip()
    tokens = [t for t in re.split(r"[\s_]+", core) if t]
    model = next((t for t in tokens if re.search(r"\d", t)), tokens[0] if tokens else "GPU")
    return f"{model}-{round(memory_mb / 1024)}GB"


def memory_from_type(gpu_type: str, default_mb: int = 16 * 1024) -> int:
    """The memory a virtual GPU type names ('H100-80GB' -> 80 GiB), else the default."""
    m = re.search(r"(\d+)\s*G[Bi]?B?$", gpu_type, re.IGNORECASE)
    return int(m.group(1)) * 1024 if m else default_mb


def virtual_gpus(
    count: int, gpu_type: str, memory_mb: int | None, node: str, per_domain: int | None = None
) -> list[Gpu]:
    """Declared GPUs; `per_domain` groups consecutive indices into topology domains of that size."""
    mem = memory_mb if memory_mb is not None else memory_from_type(gpu_type)
    return [
        Gpu(
            index=i,
            model=gpu_type,
            memory_mb=mem,
            uuid=f"VGPU-{node}-{i}",
            domain=f"domain{i // per_domain}" if per_domain else None,
        )
        for i in range(count)
    ]
