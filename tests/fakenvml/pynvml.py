"""A fake `pynvml` (nvidia-ml-py) with scripted readings, for tests without a GPU.

Put this directory first on PYTHONPATH and a real `gpucluster up` believes it has NVIDIA GPUs;
or import it and set `STATE` directly. The readings come from `STATE`, or, when it is None, from
the JSON file named by $FAKE_NVML_STATE, re-read at every call so a test can change them while a
head runs:

    {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559, "memory_used_mb": 1000,
               "util": 50, "temp": 40, "power_w": 300, "sm_clock": 1980, "mem_clock": 2619,
               "ecc": 0, "xids": [79], "processes": [{"pid": 123, "memory_mb": 500}]}],
     "fail": null}

`xids` is the cumulative list of XID events of the GPU: each is delivered once through the event
set. `fail` (a message) makes every call raise NVMLError, like a driver gone away. A GPU without
"ecc" does not support ECC (NVMLError_NotSupported).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

STATE: dict[str, Any] | None = None
_delivered: dict[int, int] = {}

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_TOPOLOGY_MULTIPLE = 20
nvmlEventTypeXidCriticalError = 8
MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {value}")
        self.value = value


def _state() -> dict[str, Any]:
    if STATE is not None:
        s = STATE
    else:
        with open(os.environ["FAKE_NVML_STATE"]) as f:
            s = json.load(f)
    if s.get("fail"):
        raise NVMLError(NVML_ERROR_UNKNOWN, str(s["fail"]))
    return s


def _gpu(h: int) -> dict[str, Any]:
    return dict(_state()["gpus"][h])


def nvmlInit() -> None:
    _state()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    if i >= nvmlDeviceGetCount():
        raise NVMLError(2, "invalid argument")
    return i


def nvmlDeviceGetIndex(h: int) -> int:
    return h


def nvmlDeviceGetName(h: int) -> str:
    return str(_gpu(h).get("name", "NVIDIA H100 80GB HBM3"))


def nvmlDeviceGetUUID(h: int) -> str:
    return f"GPU-fake-{h}"


def nvmlDeviceGetMemoryInfo(h: int) -> SimpleNamespace:
    g = _gpu(h)
    total = int(g.get("memory_total_mb", 81559) * MIB)
    used = int(g.get("memory_used_mb", 0) * MIB)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetTopologyCommonAncestor(a: int, b: int) -> int:
    return 10


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=_gpu(h).get("util", 0), memory=0)


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    return int(_gpu(h).get("temp", 40))


def nvmlDeviceGetPowerUsage(h: int) -> int:
    return int(float(_gpu(h).get("power_w", 100)) * 1000)


def nvmlDeviceGetClockInfo(h: int, kind: int) -> int:
    g = _gpu(h)
    return int(g.get("sm_clock", 1980) if kind == NVML_CLOCK_SM else g.get("mem_clock", 2619))


def nvmlDeviceGetTotalEccErrors(h: int, error_type: int, counter: int) -> int:
    g = _gpu(h)
    if "ecc" not in g:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
    return int(g["ecc"])


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=int(p["memory_mb"] * MIB)) for p in _gpu(h).get("processes", [])
    ]


def nvmlEventSetCreate() -> str:
    return "event-set"


def nvmlDeviceRegisterEvents(h: int, types: int, event_set: str) -> None:
    pass


def nvmlEventSetFree(event_set: str) -> None:
    pass


def nvmlEventSetWait_v2(event_set: str, timeout_ms: int) -> SimpleNamespace:
    for i, g in enumerate(_state()["gpus"]):
        xids = g.get("xids", [])
        n = _delivered.get(i, 0)
        if n < len(xids):
            _delivered[i] = n + 1
            return SimpleNamespace(device=i, eventType=nvmlEventTypeXidCriticalError, eventData=xids[n])
    raise NVMLError(NVML_ERROR_TIMEOUT, "Timeout")


def gpu(**fields: Any) -> dict[str, Any]:
    """A scripted GPU with healthy defaults (for tests that set STATE)."""
    base: dict[str, Any] = {"util": 50, "temp": 45, "power_w": 300, "ecc": 0, "memory_used_mb": 1000}
    base.update(fields)
    return base


def reset(gpus: list[dict[str, Any]] | None = None) -> None:
    global STATE
    STATE = {"gpus": gpus or []} if gpus is not None else None
    _delivered.clear()
