"""Round 7's `Usage.at` brings the teams untouched since the last snapshot in one `accrue` call:
the very floats of the one-call-per-team way it replaced (kept here as the reference), at every
snapshot, over seeded random histories (teams first seen mid-run, several changes per instant,
snapshots at the same instant twice, idle stretches, teams of no GPUs)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.fairshare import accrue
from gpucluster.sim.scheduling import SimPolicy, Usage, load_policy


class ReferenceUsage:
    """The Usage of rounds 1-6: each team brought up to date on its own, at every snapshot."""

    def __init__(self, policy: SimPolicy) -> None:
        self._half_life = policy.core.fair_share_half_life_s
        self._value: dict[str, float] = {}
        self._at: dict[str, float] = {}
        self._gpus: dict[str, float] = {}

    def _bring(self, team: str, now: float) -> float:
        at = self._at.get(team, now)
        if now > at:
            got = accrue(
                {team: self._value.get(team, 0.0)}, [(team, self._gpus.get(team, 0.0))], now - at, self._half_life
            )
            self._value[team] = got[team]
        self._at[team] = now
        return self._value.get(team, 0.0)

    def change(self, team: str, gpus: float, now: float) -> None:
        self._bring(team, now)
        self._gpus[team] = self._gpus.get(team, 0.0) + gpus

    def at(self, now: float) -> dict[str, float]:
        return {team: self._bring(team, now) for team in sorted(self._at)}


@pytest.mark.parametrize("half_life", [None, 3600.0, 0.0])
@pytest.mark.parametrize("seed", range(6))
def test_usage_equals_the_per_team_reference_bit_for_bit(seed: int, half_life: float | None) -> None:
    rng = random.Random(seed)
    policy = load_policy("default")
    if half_life is not None:  # None: the default policy's week
        policy = replace(policy, core=replace(policy.core, fair_share_half_life_s=half_life))
    new, ref = Usage(policy), ReferenceUsage(policy)
    teams = [f"t{k:02d}" for k in range(rng.choice([1, 3, 50]))]
    running: dict[str, float] = {}
    now = rng.uniform(0, 1e6)
    snapshots = 0
    for _ in range(3000):
        now += rng.choice([0.0, 0.0, rng.uniform(0, 5), rng.uniform(0, 3600), rng.expovariate(1 / 60)])
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            team = rng.choice(teams)
            gpus = rng.choice([1.0, 2.0, 8.0, 0.25, 64.0])
            if running.get(team, 0.0) >= gpus and rng.random() < 0.5:
                gpus = -gpus
            running[team] = running.get(team, 0.0) + gpus
            new.change(team, gpus, now)
            ref.change(team, gpus, now)
        for _ in range(rng.choice([1, 1, 1, 2])):  # now and then two snapshots at one instant
            got, want = new.at(now), ref.at(now)
            assert list(got) == list(want)
            assert got == want, f"at {now}"
            assert all(got[t].hex() == want[t].hex() for t in want)  # the same bits, -0.0 included
            snapshots += 1
    assert snapshots > 3000
