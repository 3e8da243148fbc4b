"""The head's accountant: GPU time, money and energy of every job attempt, budgets and max cost.

Why on the loop's thread, every few seconds: the loop already holds the running jobs each
cycle, and every attempt ends there, so accrual needs no locks and sees every end. Each step is
one transaction: running attempts accrue GPU-seconds and cost up to now, attempts that ended are
made final at their recorded end (exact, whenever the step runs; after a crash, at the next
head's first step), and telemetry samples stored since the last step add their energy and
utilisation to the attempt that held the GPU (by its share). A crash loses at most one step.

Budgets and `max_cost` apply the pure rules of core/accounting.py: a team over budget has its
queued jobs taken out of the scheduler's snapshot (held, with a reason in `why` and the queue),
and its running jobs stopped if its budget says `on_exceed: stop`; a job whose cost would pass
its `max_cost` before a stop could complete is stopped (stop reason "policy", ending `failed`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpucluster.core.accounting import (
    Accounting,
    Budget,
    Rate,
    Spend,
    budget_hold,
    over_budget,
    overlap,
    period_end,
    period_start,
    rate,
    share_on,
    would_exceed,
)
from gpucluster.core.events import Held, Released
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, JobRequest, Wait
from gpucluster.store import JobRecord
from gpucluster.store.accounting import ATTEMPTS_MARK, SAMPLES_MARK, RawSample, UsageRow, UsageStore
from gpucluster.waits_text import text

if TYPE_CHECKING:
    from gpucluster.head.loop import Head

log = logging.getLogger("gpucluster.accounting")

ACCRUE_EVERY_S = 5.0
# Attempts are looked for this far before the last step's time too (a clock that stepped back).
ATTEMPT_SLACK_S = 60.0

# A GPU at or under this utilisation (percent) in a sample is idle for `gpucluster usage`'s
# sessions column: the default idle threshold of the policy (`idle:`, `interactive.idle`).
IDLE_UTILIZATION = 1.0


class Accountant:
    def __init__(self, head: Head, prices: Mapping[str, float] | None = None) -> None:
        self.head = head
        self.usage = UsageStore(head.store)
        self.default_prices = dict(prices or {})  # `gpucluster up --price`
        self.open: dict[tuple[int, int], UsageRow] = self.usage.open_rows()
        self._rates: dict[tuple[int, int], Rate] = {}
        self._prior: dict[tuple[int, int], float] = {}  # cost of the job's other attempts
        marks = self.usage.marks()
        # A data dir from before accounting: count energy from now on, and every recorded attempt.
        self._samples_mark = int(marks.get(SAMPLES_MARK, self.usage.last_sample_id()))
        self._attempts_mark = float(marks.get(ATTEMPTS_MARK, 0.0))
        self._last_step: float | None = None
        self._config: Accounting | None = None
        self._models_of: tuple[object, dict[tuple[str, int], str]] | None = None
        self.held: dict[str, WaitFacts] = {}  # team -> why its new jobs are held (the wait's numbers)
        self._held_jobs: dict[int, WaitFacts] = {}  # queued job -> the hold written for it
        self.held_count: dict[str, int] = {}  # team -> its queued jobs held now
        self.totals: dict[tuple[str, str], list[float]] = {
            k: list(v) for k, v in self.usage.totals().items()
        }  # (team, model) -> [GPU-seconds, cost, energy J], for /metrics

    @property
    def config(self) -> Accounting:
        return self.head.policy_source.accounting.with_prices(self.default_prices)

    def models(self) -> dict[tuple[str, int], str]:
        """(node, GPU index) -> GPU model, rebuilt only when the store's node list changes."""
        nodes = self.head.store.nodes()
        if self._models_of is None or self._models_of[0] is not nodes:
            self._models_of = (nodes, {(r.node.name, g.index): g.model for r in nodes for g in r.node.gpus})
        return self._models_of[1]

    # ---- each cycle ---------------------------------------------------------------------------

    def step(self, running: Sequence[JobRecord], now: float) -> None:
        """Called by the loop every cycle after reconciling: max-cost checks every cycle (in
        memory), accrual and budgets every ACCRUE_EVERY_S or when the configuration changed."""
        config = self.config
        changed = config != self._config
        due = self._last_step is None or now - self._last_step >= ACCRUE_EVERY_S or now < self._last_step
        if due or changed:
            self.accrue(running, now, config)
            self._config = config
            self._last_step = now
            self._budgets(running, now, config)
        self._check_max_cost(running, now)

    def accrue(self, running: Sequence[JobRecord], now: float, config: Accounting | None = None) -> None:
        """One accrual step, in one transaction (see the module's docstring)."""
        config = config or self.config
        models = self.models()
        changed: dict[tuple[int, int], UsageRow] = {}
        before: dict[tuple[int, int], UsageRow | None] = {}
        live: set[tuple[int, int]] = set()
        for job in running:
            row = self._open_row(job, models, config)
            if row is None:
                continue
            live.add(row.key)
            before.setdefault(row.key, self.open.get(row.key))
            row = row.accrue(now, self._rates[row.key].cost_per_s)
            self.open[row.key] = changed[row.key] = row
        for ended in self.usage.ended_attempts(self._attempts_mark - ATTEMPT_SLACK_S):
            a = ended.record
            key = (a.job_id, a.attempt)
            if a.allocation is None or a.started_at is None:
                continue
            row = self.open.get(key)
            before.setdefault(key, row)
            r = rate(a.allocation, models, config.prices)
            if row is None:
                row = _new_row(a.job_id, a.attempt, ended.team, ended.owner, a.allocation, a.started_at, r, ended.kind)
            if a.outcome == "not_started":  # the process never ran: nothing to bill
                row = replace(row, accrued_until=a.ended_at, gpu_seconds=0.0, cost=0.0)
            else:
                row = _until(row, a.ended_at, r.cost_per_s)
            changed[key] = replace(row, final=True, outcome=a.outcome, work_lost_s=a.work_lost_s)
            self._forget(key)
        # An open row whose attempt is neither running nor recorded as ended (it cannot be found
        # any more): keep what was accrued and stop accruing.
        for key in [k for k in self.open if k not in live and k not in changed]:
            before.setdefault(key, self.open[key])
            changed[key] = replace(self.open[key], final=True, outcome="unknown")
            self._forget(key)
        samples = self.usage.new_samples(self._samples_mark)
        if samples:
            self._add_samples(samples, changed, before)
            self._samples_mark = samples[-1].id
        self.usage.save(
            list(changed.values()), {SAMPLES_MARK: str(self._samples_mark), ATTEMPTS_MARK: repr(float(now))}
        )
        self._attempts_mark = now
        for key, row in changed.items():
            self._count(before.get(key), row)

    def _open_row(self, job: JobRecord, models: dict[tuple[str, int], str], config: Accounting) -> UsageRow | None:
        """The running attempt's row (made on first sight), with its rate at the current prices."""
        if job.allocation is None or job.started_at is None or job.state is not JobState.RUNNING:
            return None
        key = (job.id, job.attempt)
        r = rate(job.allocation, models, config.prices)
        self._rates[key] = r
        row = self.open.get(key)
        if row is None:
            row = _new_row(job.id, job.attempt, job.team, job.owner, job.allocation, job.started_at, r, job.spec.kind)
            self.open[key] = row
            self._prior[key] = self.usage.cost_of_other_attempts(job.id, job.attempt)
        return row

    def _forget(self, key: tuple[int, int]) -> None:
        self.open.pop(key, None)
        self._rates.pop(key, None)
        self._prior.pop(key, None)

    def _add_samples(
        self,
        samples: Sequence[RawSample],
        changed: dict[tuple[int, int], UsageRow],
        before: dict[tuple[int, int], UsageRow | None],
    ) -> None:
        """Energy and utilisation of each sample to the attempt holding the GPU then, by share."""
        by_job: dict[int, list[UsageRow]] = {}
        for row in [*self.open.values(), *changed.values()]:
            by_job.setdefault(row.job_id, []).append(row)
        missing = {j for s in samples for j in s.jobs if j not in by_job}
        for row in self.usage.rows_of_jobs(missing):  # ended attempts whose samples came late
            by_job.setdefault(row.job_id, []).append(row)
        for s in samples:
            for job_id in s.jobs:
                rows = [r for r in by_job.get(job_id, ()) if r.started_at <= s.at + s.seconds]
                if not rows:
                    continue
                row = max(rows, key=lambda r: r.started_at)
                row = changed.get(row.key) or self.open.get(row.key) or row
                share = share_on(row.allocation, s.node, s.gpu) if row.allocation is not None else 0.0
                if share <= 0:
                    continue
                before.setdefault(row.key, row)
                held_s = s.seconds * share  # GPU-seconds of this GPU the job held in the sample
                new = replace(
                    row,
                    energy_j=row.energy_j + (s.power_w or 0.0) * held_s,
                    used_gpu_seconds=row.used_gpu_seconds + (s.utilization / 100.0 * held_s if s.utilization else 0.0),
                    sampled_gpu_seconds=row.sampled_gpu_seconds + (held_s if s.utilization is not None else 0.0),
                    idle_gpu_seconds=row.idle_gpu_seconds
                    + (held_s if s.utilization is not None and s.utilization <= IDLE_UTILIZATION else 0.0),
                )
                changed[row.key] = new
                if row.key in self.open:
                    self.open[row.key] = new
                rows_of_job = by_job[job_id]
                rows_of_job[:] = [new if r.key == new.key else r for r in rows_of_job]

    def _count(self, old: UsageRow | None, new: UsageRow) -> None:
        t = self.totals.setdefault((new.team, new.gpu_model), [0.0, 0.0, 0.0])
        t[0] += new.gpu_seconds - (old.gpu_seconds if old else 0.0)
        t[1] += new.cost - (old.cost if old else 0.0)
        t[2] += new.energy_j - (old.energy_j if old else 0.0)

    # ---- max cost ---------------------------------------------------------------------------

    def cost_so_far(self, job: JobRecord, now: float) -> float | None:
        """What the job has cost over all its attempts, up to `now` (None if not running)."""
        key = (job.id, job.attempt)
        row, r = self.open.get(key), self._rates.get(key)
        if row is None or r is None:
            return None
        return self._prior.get(key, 0.0) + row.cost + r.cost_per_s * max(0.0, now - row.accrued_until)

    def _check_max_cost(self, running: Sequence[JobRecord], now: float) -> None:
        for job in running:
            limit = job.spec.max_cost
            if limit is None or job.stop_reason is not None or job.state is not JobState.RUNNING:
                continue
            if (job.id, job.attempt) not in self.open:
                self._open_row(job, self.models(), self._config or self.config)
            spent = self.cost_so_far(job, now)
            r = self._rates.get((job.id, job.attempt))
            if spent is None or r is None:
                continue
            if would_exceed(limit, spent, r.cost_per_s, self.head.grace_period_s):
                message = (
                    f"stopped: its cost would exceed its max cost of {limit:g} "
                    f"({spent:.4f} spent, at {r.cost_per_s * 3600:.2f} per hour)"
                )
                if self.head.store.request_stop(job.id, "policy", now, message=message):
                    log.info("job %s: %s", job.id, message)
                    self.head.wake.set()

    # ---- budgets ----------------------------------------------------------------------------

    def spend(self, budgets: Iterable[Budget], now: float) -> dict[str, Spend]:
        """Each budget's team's spending in its current period."""
        budgets = list(budgets)
        if not budgets:
            return {}
        starts = {b.team: period_start(b, now) for b in budgets}
        out = {t: Spend() for t in starts}
        for row in self.usage.window(min(starts.values()), None, teams=list(starts)):
            f = overlap(row.started_at, row.accrued_until, starts[row.team], None)
            s = out[row.team]
            out[row.team] = Spend(s.money + row.cost * f, s.gpu_hours + row.gpu_seconds * f / 3600.0)
        return out

    def _budgets(self, running: Sequence[JobRecord], now: float, config: Accounting) -> None:
        spent = self.spend(config.budgets.values(), now)
        held: dict[str, WaitFacts] = {}
        for team, budget in config.budgets.items():
            hold = budget_hold(budget, spent[team], now)
            if hold is None:
                continue
            held[team] = hold
            if budget.on_exceed != "stop":
                continue
            why = over_budget(budget, spent[team])
            for job in running:
                if job.team != team or job.stop_reason is not None or job.state is not JobState.RUNNING:
                    continue
                if self.head.store.request_stop(job.id, "policy", now, message=f"stopped: {why}"):
                    log.info("job %s: stopped: %s", job.id, why)
                    self.head.wake.set()
        if held != self.held:
            released = set(self.held) - set(held)
            if released:
                log.info("budget: releasing the jobs of %s", ", ".join(sorted(released)))
            # Told to the cluster state as the simulator tells its budget holds (the snapshot
            # reads them there); this runs on the loop's thread, in its cycle.
            for team in sorted(released):
                self.head.cluster.apply(Released(team))
            for team, facts in held.items():
                if self.held.get(team) != facts:
                    self.head.cluster.apply(Held(team, facts))
            self.held = held
            self.head.nodes_changed()  # plan again now, with or without the held teams' jobs

    def note_holds(self, queued: tuple[JobRequest, ...]) -> None:
        """Record the hold reason of every queued job of a team over budget (once per change),
        and how many each team has held. The holding itself is the core's admission
        (core/admission.py): the loop hands `held` to the snapshot."""
        if not self.held:
            self._held_jobs.clear()
            self.held_count = {}
            return
        write: dict[int, Wait] = {}
        now_held: dict[int, WaitFacts] = {}
        count: dict[str, int] = {}
        for r in queued:
            why = self.held.get(r.team)
            if why is None:
                continue
            now_held[r.job_id] = why
            count[r.team] = count.get(r.team, 0) + 1
            if self._held_jobs.get(r.job_id) != why:
                write[r.job_id] = Wait(WaitReason.BUDGET, why)
        self.head.store.set_wait_reasons(write)
        for job_id in write:
            # The loop writes a wait reason only when it changes from the last it wrote: forget
            # that one, so a released job gets its scheduler's reason again even if unchanged.
            self.head._reasons.pop(job_id, None)
        self._held_jobs = now_held
        self.held_count = count

    def budget_report(self, now: float, teams: Iterable[str] | None = None) -> list[dict[str, object]]:
        """Each budget with its period, limits, spending so far and whether the team is held."""
        config = self.config
        visible = None if teams is None else set(teams)
        budgets = [b for t, b in sorted(config.budgets.items()) if visible is None or t in visible]
        spent = self.spend(budgets, now)
        out: list[dict[str, object]] = []
        for b in budgets:
            s = spent[b.team]
            out.append(
                {
                    "team": b.team,
                    "period": b.period,
                    "period_start": period_start(b, now),
                    "period_end": period_end(b, now),
                    "money_limit": b.money,
                    "money_spent": s.money,
                    "gpu_hours_limit": b.gpu_hours,
                    "gpu_hours_spent": s.gpu_hours,
                    "on_exceed": b.on_exceed,
                    "over": over_budget(b, s) is not None,
                    "held": text(WaitReason.BUDGET, self.held[b.team]) if b.team in self.held else None,
                    "held_jobs": self.held_count.get(b.team, 0),
                }
            )
        return out


def _new_row(
    job_id: int,
    attempt: int,
    team: str,
    owner: str | None,
    allocation: Allocation,
    started_at: float,
    r: Rate,
    kind: str = "batch",
) -> UsageRow:
    return UsageRow(
        kind=kind,
        job_id=job_id,
        attempt=attempt,
        team=team,
        owner=owner,
        gpu_model=r.model,
        gpus=r.gpus,
        allocation=allocation,
        started_at=started_at,
        accrued_until=started_at,
    )


def _until(row: UsageRow, end: float, cost_per_s: float) -> UsageRow:
    """The row accrued exactly to `end`: forward at the rate, or scaled back if accrual ran past
    it (a step between the end and its record)."""
    if end >= row.accrued_until:
        return row.accrue(end, cost_per_s)
    span = row.accrued_until - row.started_at
    f = max(0.0, end - row.started_at) / span if span > 0 else 0.0
    return replace(row, accrued_until=max(end, row.started_at), gpu_seconds=row.gpu_seconds * f, cost=row.cost * f)
