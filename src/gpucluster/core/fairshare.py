"""Decayed GPU usage per team: the memory fair share ranks teams by.

Usage halves every `half_life` seconds, so a team that ran big last month is not punished
forever, and yesterday's burst still counts today. Pure arithmetic: the head persists the
numbers, the simulator keeps them in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    if elapsed_s <= 0 or half_life_s <= 0:
        return value
    return float(value * 0.5 ** (elapsed_s / half_life_s))


def accrue(
    usage: Mapping[str, float],
    running: Iterable[tuple[str, float]],
    elapsed_s: float,
    half_life_s: float,
) -> dict[str, float]:
    """Usage after `elapsed_s` more seconds: old usage decays, running GPUs add GPU-seconds.

    The GPU-seconds of the interval are added undecayed: for intervals of seconds against a
    half-life of days the difference is far below measurement noise.
    """
    out = {team: decay(v, elapsed_s, half_life_s) for team, v in usage.items()}
    for team, gpus in running:
        out[team] = out.get(team, 0.0) + gpus * max(elapsed_s, 0.0)
    return out
