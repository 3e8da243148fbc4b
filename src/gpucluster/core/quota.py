"""Guaranteed quotas and borrowing: who may use idle GPUs beyond their guarantee.

A team below its quota on a GPU model is within its guarantee and may reclaim borrowed GPUs by
preemption. Above it, the team borrows: only up to its `max_borrow`, and only GPUs that their
owners lend (a team with `max_lend` keeps the rest of its idle guarantee free for itself).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpucluster.core.policy import Policy, Team
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.types import Allocation, Gpu, RunningJob


@dataclass(frozen=True)
class _Terms:
    """What a `QuotaBook` reads of its policy's teams, in flat look-ups (quota checks run for
    every queued job on every model it accepts). Read only."""

    has_quotas: bool
    quota: dict[tuple[str, str], float]  # (team, model) -> its quota
    quota_teams: dict[str, list[str]]  # model -> teams with a quota of it
    max_borrow: dict[str, float]
    # Nothing to check at all: `refusal` is always None without borrowing and lending limits
    # (a quota alone refuses nothing; it only ranks and reclaims).
    unlimited: bool
    lenders: dict[str, Team]  # teams with a lending cap

    @classmethod
    def of(cls, policy: Policy) -> _Terms:
        teams = policy.teams
        quota = {(name, m): q for name, t in teams.items() for m, q in t.quota.items()}
        quota_teams: dict[str, list[str]] = {}
        for (name, m), q in quota.items():
            if q > 0:
                quota_teams.setdefault(m, []).append(name)
        max_borrow = {name: t.max_borrow for name, t in teams.items() if t.max_borrow is not None}
        return cls(
            has_quotas=any(t.quota for t in teams.values()),
            quota=quota,
            quota_teams=quota_teams,
            max_borrow=max_borrow,
            unlimited=not (max_borrow or any(t.max_lend is not None for t in teams.values())),
            lenders={name: t for name, t in teams.items() if t.max_lend is not None},
        )


# The last policy's terms, by the policy's identity (a policy is never changed in place: a new
# one replaces it). Why: a cycle makes a book, and working these out over every team each time
# was most of making one (~3 of ~4 us a cycle on whole Philly, ~140,000 cycles).
_last: tuple[Policy, _Terms] | None = None


def _terms_of(policy: Policy) -> _Terms:
    global _last
    last = _last  # one read: another thread may replace it meanwhile, never half-way
    if last is not None and last[0] is policy:
        return last[1]
    terms = _Terms.of(policy)
    _last = (policy, terms)
    return terms


class QuotaBook:
    def __init__(self, policy: Policy, running: Iterable[RunningJob], gpus: dict[tuple[str, int], Gpu]) -> None:
        self.policy = policy
        self._gpus = gpus
        self.used: dict[str, dict[str, float]] = {}
        terms = _terms_of(policy)
        self.has_quotas = terms.has_quotas
        self._quota = terms.quota
        self._quota_teams = terms.quota_teams
        self._max_borrow = terms.max_borrow
        self.unlimited = terms.unlimited
        # Idle guarantee each lend-capped team keeps for itself, per model, kept up to date by
        # `add` so `protected` costs O(1) per job rather than O(teams).
        self._lenders = terms.lenders
        self._kept: dict[str, dict[str, float]] = {}
        self._kept_total: dict[str, float] = {}
        for name, t in self._lenders.items():
            for model in t.quota:
                self._set_kept(name, model)
        # Without quotas and limits nothing reads what teams use (`within_quota` needs a quota,
        # `refusal` returns at once, borrowing is asked only by a team reclaiming its quota):
        # skip summing it over every running job, each cycle.
        if not self.has_quotas and self.unlimited:
            return
        # What the running jobs hold (60,000 of them at scale, every cycle): `add`, inlined for
        # teams without a lending cap, whose sums are all it changes (same order, same floats).
        used = self.used
        for job in running:
            if job.team in self._lenders:
                self.add(job.team, job.allocation)
                continue
            per_team = used.get(job.team)
            if per_team is None:
                per_team = used[job.team] = {}
            for s in job.allocation.slices:
                node, share = s.node, s.share
                for i in s.gpu_indices:
                    g = gpus.get((node, i))
                    if g is not None:
                        per_team[g.model] = per_team.get(g.model, 0.0) + share

    def _set_kept(self, team: str, model: str) -> None:
        t = self._lenders[team]
        assert t.max_lend is not None
        unused = t.quota.get(model, 0.0) - self.used.get(team, {}).get(model, 0.0)
        kept = max(0.0, unused - t.max_lend)
        per_model = self._kept.setdefault(model, {})
        self._kept_total[model] = self._kept_total.get(model, 0.0) - per_model.get(team, 0.0) + kept
        per_model[team] = kept

    def add(self, team: str, allocation: Allocation, sign: float = 1.0) -> None:
        per_team = self.used.setdefault(team, {})
        for s in allocation.slices:
            for i in s.gpu_indices:
                g = self._gpus.get((s.node, i))
                if g is not None:
                    per_team[g.model] = per_team.get(g.model, 0.0) + sign * s.share
                    if team in self._lenders:
                        self._set_kept(team, g.model)

    def remove(self, team: str, allocation: Allocation) -> None:
        self.add(team, allocation, -1.0)

    def quota(self, team: str, model: str) -> float:
        return self._quota.get((team, model), 0.0)

    def within_quota(self, team: str, model: str, gpus: float) -> bool:
        q = self._quota.get((team, model), 0.0)
        return q > 0 and self.used.get(team, {}).get(model, 0.0) + gpus <= q + 1e-9

    def beyond_quota(self, model: str, except_team: str) -> dict[str, float]:
        """GPUs of `model` each team with a quota of it holds beyond that quota (0: it is within
        its guarantee), but `except_team`. What preemption may take from a team whose guarantee
        protects the rest (`core.preempt`)."""
        used = self.used
        return {
            t: max(0.0, used.get(t, {}).get(model, 0.0) - self._quota[(t, model)])
            for t in self._quota_teams.get(model, ())
            if t != except_team
        }

    def limits_borrowing(self, team: str) -> bool:
        """Whether the team has a borrowing limit at all (most do not: skip the check)."""
        return team in self._max_borrow

    def borrowing(self, team: str, model: str) -> bool:
        return self.used.get(team, {}).get(model, 0.0) > self.quota(team, model) + 1e-9

    def protected(self, model: str, except_team: str) -> float:
        """Idle guaranteed GPUs of `model` that their teams do not lend to others."""
        return self._kept_total.get(model, 0.0) - self._kept.get(model, {}).get(except_team, 0.0)

    def borrow_refusal(self, team: str, model: str, gpus: float) -> WaitFacts | None:
        """Why the team's own borrowing limit refuses `gpus` more GPUs of `model` now, if it does.

        Freeing other teams' GPUs cannot change this, so it is also a reason never to preempt.
        """
        if team not in self._max_borrow or self.within_quota(team, model, gpus):
            return None
        t = self.policy.team(team)
        assert t.max_borrow is not None
        over = sum(max(0.0, used - t.quota.get(m, 0.0)) for m, used in self.used.get(team, {}).items() if m != model)
        used_m = self.used.get(team, {}).get(model, 0.0)
        over += max(0.0, used_m + gpus - t.quota.get(model, 0.0))
        if over > t.max_borrow + 1e-9:
            return WaitFacts(variant="borrow_limit", team=team, used=over, limit=t.max_borrow)
        return None

    def refusal(self, team: str, model: str, gpus: float, free: int) -> WaitFacts | None:
        """Why the team may not take `gpus` more GPUs of `model` now, with `free` idle; None if it may."""
        if self.unlimited:
            return None
        if self.within_quota(team, model, gpus):
            return None
        limit = self.borrow_refusal(team, model, gpus)
        if limit is not None:
            return limit
        protected = self.protected(model, team)
        if protected > 0 and free - protected < gpus - 1e-9:
            return WaitFacts(variant="protected", model=model, free=free, protected=protected)
        return None
