"""Health rules, pure: a node's reading -> the problems of its GPUs.

- Uncorrectable ECC errors (volatile count above 0): the GPU's memory returned bad data; it needs
  a reset (sticky: stays until an operator undrains the node).
- A fatal XID (the driver reports the GPU needs a reset or fell off the bus; list below, from
  NVIDIA's XID catalogue; XIDs such as 13 or 31 are usually the application's own fault and are
  not judged): sticky as well.
- Temperature over the policy's maximum: clears by itself when the GPU cools down.
- A node that reported and then went silent is judged by the monitor (it needs a clock).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.core.policy import HealthPolicy
from gpucluster.telemetry.readings import NodeReading

FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

ECC, XID, TEMPERATURE, SILENT = "ecc", "xid", "temperature", "silent"
STICKY = frozenset({ECC, XID})


@dataclass(frozen=True)
class Problem:
    gpu: int
    kind: str
    message: str

    @property
    def sticky(self) -> bool:
        return self.kind in STICKY


def gpu_problems(reading: NodeReading, policy: HealthPolicy) -> list[Problem]:
    fatal = policy.fatal_xids if policy.fatal_xids is not None else frozenset(FATAL_XIDS)
    out: list[Problem] = []
    for g in reading.gpus:
        if policy.drain_on_ecc and g.ecc_uncorrectable:
            n = g.ecc_uncorrectable
            out.append(Problem(g.index, ECC, f"GPU {g.index}: {n} uncorrectable ECC error{'s' if n != 1 else ''}"))
        bad = [x for x in g.xids if x in fatal]
        if policy.drain_on_xid and bad:
            what = FATAL_XIDS.get(bad[0])
            out.append(Problem(g.index, XID, f"GPU {g.index}: fatal XID {bad[0]}" + (f" ({what})" if what else "")))
        t = g.temperature_c
        if t is not None and t > policy.max_temperature_c:
            out.append(
                Problem(g.index, TEMPERATURE, f"GPU {g.index} at {t:.0f} C, over {policy.max_temperature_c:g} C")
            )
    return out
