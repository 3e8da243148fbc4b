"""Read a node's GPUs through NVML (nvidia-ml-py): utilisation, memory, temperature, power, clocks,
volatile uncorrectable ECC errors, XID events, and each compute process's GPU memory.

The NVML module is a parameter (default: `pynvml`), so tests drive this code with a fake module
of scripted readings. Any single reading a GPU does not support (ECC on consumer boards, power on
some) is left None rather than failing the sample; a GPU that cannot be read at all is reported
with its error, which health treats as unhealthy only through the node-silence rule (the driver
may be restarting).

XIDs come from an NVML event set registered for critical XID errors, drained without waiting at
every sample; registration needs a driver that supports it (and usually root), else XIDs are
simply not seen and `xids_supported` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpucluster.telemetry.readings import GpuReading, NodeReading, ProcessUse

log = logging.getLogger("gpucluster.telemetry")

MIB = 1024 * 1024


class NvmlSource:
    """One node's GPUs through NVML. `read(now)` is one sample; call `close()` when done."""

    def __init__(self, node: str, nvml: ModuleType | Any | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.node = node
        self.nvml: Any = nvml
        self._handles: list[Any] | None = None
        self._events: Any = None
        self.xids_supported = False

    def _open(self) -> list[Any]:
        if self._handles is None:
            n = self.nvml
            n.nvmlInit()
            self._handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
            try:
                self._events = n.nvmlEventSetCreate()
                for h in self._handles:
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._events)
                self.xids_supported = True
            except n.NVMLError as e:
                log.info("XID events not available through NVML (%s); XIDs will not be watched", e)
                self._events = None
        return self._handles

    def close(self) -> None:
        if self._handles is None:
            return
        n = self.nvml
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except n.NVMLError:
            pass
        self._handles = None
        self._events = None

    def read(self, now: float, holders: object = None) -> NodeReading:
        """One sample of every GPU (`holders` is for synthetic sources; NVML sees for itself)."""
        n = self.nvml
        try:
            handles = self._open()
            xids = self._drain_xids(handles)
        except n.NVMLError as e:
            self.close()  # start over next time: the driver may have been reloaded
            return NodeReading(self.node, now, error=f"NVML: {e}")
        return NodeReading(self.node, now, tuple(self._gpu(i, h, xids.get(i, ())) for i, h in enumerate(handles)))

    def _drain_xids(self, handles: list[Any]) -> dict[int, tuple[int, ...]]:
        if self._events is None:
            return {}
        n = self.nvml
        out: dict[int, list[int]] = {}
        for _ in range(1000):  # bounded: a storm of events cannot hold the sampler forever
            try:
                ev = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError as e:
                if getattr(e, "value", None) == n.NVML_ERROR_TIMEOUT:
                    break
                raise
            if ev.eventType != n.nvmlEventTypeXidCriticalError:
                continue
            index = self._index_of(handles, ev.device)
            if index is not None:
                out.setdefault(index, []).append(int(ev.eventData))
        return {i: tuple(v) for i, v in out.items()}

    def _index_of(self, handles: list[Any], device: Any) -> int | None:
        for i, h in enumerate(handles):
            if h is device or h == device:
                return i
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except self.nvml.NVMLError:
            return None

    def _gpu(self, index: int, h: Any, xids: tuple[int, ...]) -> GpuReading:
        n = self.nvml

        def opt(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except n.NVMLError:
                return None

        try:
            mem = n.nvmlDeviceGetMemoryInfo(h)
        except n.NVMLError as e:
            return GpuReading(index=index, xids=xids, error=f"NVML: {e}")
        util = opt(lambda: n.nvmlDeviceGetUtilizationRates(h))
        power_mw = opt(lambda: n.nvmlDeviceGetPowerUsage(h))
        procs = opt(lambda: n.nvmlDeviceGetComputeRunningProcesses(h)) or []
        return GpuReading(
            index=index,
            utilization=float(util.gpu) if util is not None else None,
            memory_used_mb=mem.used / MIB,
            memory_total_mb=mem.total / MIB,
            temperature_c=_float(opt(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_mhz=_float(opt(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))),
            memory_clock_mhz=_float(opt(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))),
            ecc_uncorrectable=_int(
                opt(lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC))
            ),
            xids=xids,
            processes=tuple(
                # usedGpuMemory is None where the driver cannot tell (e.g. under some MIG setups).
                ProcessUse(pid=int(p.pid), memory_mb=(p.usedGpuMemory or 0) / MIB)
                for p in procs
            ),
        )


def _float(v: Any) -> float | None:
    return float(v) if v is not None else None


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None
