"""Policy files (YAML) -> core.policy.Policy, with file:line errors.

    teams:
      vision: {weight: 2, org: research, quota: {H100-80GB: 16}, max_borrow: 8, max_lend: 4}
      nlp:    {weight: 1, org: research}
    orgs:
      research: {weight: 3}
    preemption: {enabled: true, grace_period: 30s, min_runtime: 5m, protected_classes: [critical]}
    #   serving_victims: checkpointed   # what service replicas may preempt: checkpointed, any, none
    #   shrink_elastic: true        # shrink elastic victims above their minimum before others (default)
    fair_share: {enabled: true, half_life: 7d}
    backfill:   {enabled: true, default_time_limit: 1h}
    priorities: true
    starvation_age: 7d          # left out: 7d under ordering mode las, 24h under age
    ordering: {mode: las, queues: [1h, 8h], promote_after: 7d, preempt: true, min_slice: 30m}
    #   within a team: least attained GPU-time first (core/attained.py; the default); mode: age
    #   for oldest first; runtime_model: gittins orders inside each queue by learned run times,
    #   taken in at most every relearn_every (10m; 0: every plan)
    unknown_teams: allow        # or reject: submissions must name a team listed here
    idle:   {after: 30m, threshold: 1, action: notify}     # or requeue, stop
    health: {max_temperature: 90, node_timeout: 60s, drain_on_ecc: true, drain_on_xid: true}
    prices: {H100-80GB: 3.60}   # money per GPU-hour per GPU model (accounting)
    budgets:
      vision: {period: 30d, money: 1000, on_exceed: finish}   # or gpu_hours: 500; period: month; stop
    containers: {mount_roots: [/data, /scratch]}   # where a container job's --mount may come from
    interactive:                # sessions (`gpucluster run`): their class, limits and idle reclaim
      max_gpus_per_user: 2      # one user's sessions, queued and running, hold at most this many GPUs
      time_limit: 8h            # a session's limit when it gives none, and the most it may ask for
      priority: high            # the class sessions start in (no grant needed)
      idle: {after: 30m, grace: 5m, threshold: 1, action: stop}   # GPUs idle AND no traffic; warn, then act
    limits:                     # per user and per class (core/limits.py); each field optional
      per_user: {max_running_gpus: 8, max_queued_jobs: 100, max_gpu_hours_in_flight: 64}
      users:                    # named users, overriding per_user field by field
        alice: {max_running_gpus: 16}
      per_class:                # each user's jobs of one class (low, normal, high, serving, critical)
        high: {max_running_gpus: 4}
    priority_grants:            # who may submit above normal (low, normal: every member)
      high:     {roles: [team-admin], teams: [vision], users: [alice]}
      serving:  {roles: [member]}   # services' replicas (plain jobs never get this class)
      critical: {}              # cluster admins only (they may use every class)
    resources: {cpus_per_gpu: 4, mem_per_gpu: 32GiB}   # what a job gets that gives no --cpus / --mem
    pools:                      # nodes only some teams or classes may use (a node in no pool: everyone's)
      h100-ib: {labels: [ib], teams: [vision], classes: [high, critical]}   # or nodes: [n1, n2]
      new-racks: {labels: [rack=r9], quotas: {vision: 16, nlp: 8}}   # GPUs each team may hold there

Without priority_grants (or for a class it leaves out): high is granted to team admins (of the
team submitted to), serving (services only) to every member, critical to cluster admins only.

A name instead of a path selects a shipped baseline: fifo, priority, default.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpucluster.core import policy as core
from gpucluster.core.accounting import MONTH, Accounting, Budget
from gpucluster.core.attained import Ordering
from gpucluster.core.pools import Pool
from gpucluster.core.selection import label_error
from gpucluster.core.types import Priority
from gpucluster.durations import parse_duration
from gpucluster.models import parse_memory_mb
from gpucluster.yamlfile import YamlFileError, line_of, read_yaml, validate

if TYPE_CHECKING:
    import yaml

PolicyFileError = YamlFileError

Duration = float | str
TeamName = str


def _seconds(v: Duration, field: str) -> float:
    s = parse_duration(v) if isinstance(v, str) else float(v)
    if s < 0:
        raise ValueError(f"{field} cannot be negative")
    return s


ClassName = Literal["low", "normal", "high", "serving", "critical"]


def _only_critical() -> list[ClassName]:
    return ["critical"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeamIn(_Strict):
    weight: float = Field(1.0, gt=0, le=1e6)
    org: str | None = None
    quota: dict[str, float] = Field(default_factory=dict, description="GPU model -> guaranteed GPUs")
    max_borrow: float | None = Field(None, ge=0)
    max_lend: float | None = Field(None, ge=0)

    @field_validator("quota")
    @classmethod
    def _quota(cls, v: dict[str, float]) -> dict[str, float]:
        for model, n in v.items():
            if n < 0:
                raise ValueError(f"quota for {model} cannot be negative")
        return v


class OrgIn(_Strict):
    weight: float = Field(1.0, gt=0, le=1e6)


class PreemptionIn(_Strict):
    enabled: bool = True
    grace_period: Duration = "30s"
    min_runtime: Duration = 0
    protected_classes: list[ClassName] = Field(default_factory=_only_critical)
    reclaim_quota: bool = True
    serving_victims: Literal["checkpointed", "any", "none"] = "checkpointed"
    shrink_elastic: bool = True

    @field_validator("grace_period", "min_runtime")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        _seconds(v, "duration")
        return v


class FairShareIn(_Strict):
    enabled: bool = True
    half_life: Duration = "7d"

    @field_validator("half_life")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        if _seconds(v, "half_life") <= 0:
            raise ValueError("half_life must be positive")
        return v


class BackfillIn(_Strict):
    enabled: bool = True
    default_time_limit: Duration = "1h"

    @field_validator("default_time_limit")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        if _seconds(v, "default_time_limit") <= 0:
            raise ValueError("default_time_limit must be positive")
        return v


class OrderingIn(_Strict):
    """ordering: {mode: las, queues: [1h, 8h], promote_after: 7d, preempt: true, min_slice: 30m,
    restart_cost: 1m, runtime_model: gittins, relearn_every: 10m} (core/attained.py). `queues`
    are GPU-time thresholds written as durations (`1h`: one GPU-hour: 1 GPU for an hour or 8 GPUs
    for 7.5 minutes); `promote_after: null` never promotes; `runtime_model: gittins` (mode las)
    orders inside a queue by the Gittins index of learned run times (core/gittins.py), `none` by
    age; `relearn_every` (gittins): how often queued jobs take in newly finished runs (0: at
    every plan).

    `las` is the default (issue 25). `preempt` left out means "under las, as
    `preemption.enabled`", so a file that switches preemption off (the fifo and priority
    baselines, a cluster that never stops a job) still loads, with LAS ordering and no LAS
    preemption; `preempt: true` with preemption off is refused."""

    mode: Literal["age", "las"] = "las"
    queues: list[Duration] = Field(default_factory=lambda: list[Duration](["1h", "8h"]))
    promote_after: Duration | None = "7d"
    preempt: bool | None = None
    min_slice: Duration = "30m"
    restart_cost: Duration = "1m"
    runtime_model: Literal["none", "gittins"] = "none"
    relearn_every: Duration = "10m"

    @model_validator(mode="after")
    def _gittins_needs_las(self) -> OrderingIn:
        if self.runtime_model != "none" and self.mode != "las":
            raise ValueError("runtime_model: gittins orders inside las's queues: it needs mode: las")
        return self

    @field_validator("queues")
    @classmethod
    def _queues(cls, v: list[Duration]) -> list[Duration]:
        got = [_seconds(x, "queues") for x in v]
        if not got or any(x <= 0 for x in got) or any(b <= a for a, b in pairwise(got)):
            raise ValueError("queues are positive GPU-time thresholds in ascending order, at least one (e.g. [1h, 8h])")
        return v

    @field_validator("promote_after", "min_slice", "restart_cost", "relearn_every")
    @classmethod
    def _dur(cls, v: Duration | None) -> Duration | None:
        if v is not None:
            _seconds(v, "ordering durations")  # "cannot be negative"
        return v

    def to_ordering(self, preemption_enabled: bool) -> Ordering:
        return Ordering(
            mode=self.mode,
            queues=tuple(_seconds(x, "queues") for x in self.queues),
            promote_after_s=None if self.promote_after is None else _seconds(self.promote_after, "promote_after"),
            preempt=self.preempt if self.preempt is not None else self.mode == "las" and preemption_enabled,
            min_slice_s=_seconds(self.min_slice, "min_slice"),
            restart_cost_s=_seconds(self.restart_cost, "restart_cost"),
            runtime_model=self.runtime_model,
            relearn_every_s=_seconds(self.relearn_every, "relearn_every"),
        )


def _percentage(v: float) -> float:
    """An idle threshold's check, for batch jobs' and sessions' `idle:` alike."""
    if not 0 <= v <= 100:
        raise ValueError("threshold is a percentage, 0 to 100")
    return v


class IdleIn(_Strict):
    after: Duration = "30m"
    threshold: float = 1.0  # percent GPU utilisation at or under which a GPU is idle
    action: Literal["notify", "requeue", "stop"] = "notify"

    @field_validator("after")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        if _seconds(v, "after") <= 0:
            raise ValueError("after must be positive")
        return v

    @field_validator("threshold")
    @classmethod
    def _pct(cls, v: float) -> float:
        return _percentage(v)


class SessionIdleIn(_Strict):
    """interactive.idle: reclaim a session whose GPUs and terminal both sat idle for `after`."""

    after: Duration | None = None  # None: sessions are never reclaimed for idleness
    grace: Duration = "5m"  # between the warning in the terminal and the action
    threshold: float = 1.0
    action: Literal["stop", "notify"] = "stop"

    @field_validator("after", "grace")
    @classmethod
    def _dur(cls, v: Duration | None) -> Duration | None:
        if v is not None and _seconds(v, "idle durations") < 0:
            raise ValueError("idle durations cannot be negative")
        return v

    @field_validator("threshold")
    @classmethod
    def _pct(cls, v: float) -> float:
        return _percentage(v)


class InteractiveIn(_Strict):
    """interactive: the session class (core.policy.InteractivePolicy)."""

    max_gpus_per_user: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    time_limit: Duration | None = None
    priority: Literal["low", "normal", "high", "critical"] | None = None
    idle: SessionIdleIn = Field(default_factory=SessionIdleIn)

    @field_validator("time_limit")
    @classmethod
    def _limit(cls, v: Duration | None) -> Duration | None:
        if v is not None and _seconds(v, "time_limit") <= 0:
            raise ValueError("time_limit must be positive")
        return v

    def to_policy(self) -> core.InteractivePolicy:
        return core.InteractivePolicy(
            max_gpus_per_user=self.max_gpus_per_user,
            time_limit_s=_seconds(self.time_limit, "time_limit") if self.time_limit is not None else None,
            priority=self.priority,
            idle_after_s=_seconds(self.idle.after, "after") if self.idle.after is not None else None,
            idle_grace_s=_seconds(self.idle.grace, "grace"),
            idle_threshold=self.idle.threshold,
            idle_action=self.idle.action,
        )


class ElasticIn(_Strict):
    """elastic: {enabled: true, grow_after: 60s, grow_every: 5m, restart_cost: 60s} (core/elastic.py)."""

    enabled: bool = True
    grow_after: Duration = "60s"
    grow_every: Duration = "5m"
    restart_cost: Duration = "60s"

    @field_validator("grow_after", "grow_every", "restart_cost")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        _seconds(v, "elastic durations")  # "cannot be negative"
        return v

    def to_policy(self) -> core.ElasticPolicy:
        return core.ElasticPolicy(
            enabled=self.enabled,
            grow_after_s=_seconds(self.grow_after, "grow_after"),
            grow_every_s=_seconds(self.grow_every, "grow_every"),
            restart_cost_s=_seconds(self.restart_cost, "restart_cost"),
        )


class ResourcesIn(_Strict):
    """resources: {cpus_per_gpu: 4, mem_per_gpu: 32GiB}: a job that gives no --cpus or --mem asks
    for this much per GPU (core.HostDefaults); 0 (the default): none reserved, none limited."""

    cpus_per_gpu: float = Field(default=0.0, ge=0, le=4096)
    mem_per_gpu: str | int = 0

    @field_validator("mem_per_gpu")
    @classmethod
    def _mem(cls, v: str | int) -> str | int:
        if v not in (0, "0"):
            parse_memory_mb(v)
        return v

    def to_defaults(self) -> core.HostDefaults:
        mem = 0 if self.mem_per_gpu in (0, "0") else parse_memory_mb(self.mem_per_gpu)
        return core.HostDefaults(cpus_per_gpu=self.cpus_per_gpu, mem_per_gpu_mb=mem)


class HealthIn(_Strict):
    max_temperature: float = 90.0  # degrees Celsius
    node_timeout: Duration = "60s"
    drain_on_ecc: bool = True
    drain_on_xid: bool = True
    fatal_xids: list[int] | None = None

    @field_validator("max_temperature")
    @classmethod
    def _temp(cls, v: float) -> float:
        if not 0 < v <= 200:
            raise ValueError("max_temperature is in degrees Celsius, above 0 and at most 200")
        return v

    @field_validator("node_timeout")
    @classmethod
    def _dur(cls, v: Duration) -> Duration:
        if _seconds(v, "node_timeout") <= 0:
            raise ValueError("node_timeout must be positive")
        return v


class BudgetIn(_Strict):
    period: Duration = "30d"  # a duration (periods counted from the Unix epoch, UTC) or "month"
    money: float | None = Field(None, ge=0, allow_inf_nan=False)
    gpu_hours: float | None = Field(None, ge=0, allow_inf_nan=False)
    on_exceed: Literal["finish", "stop"] = "finish"  # what the team's running jobs do once over

    @field_validator("period")
    @classmethod
    def _period(cls, v: Duration) -> Duration:
        if v == MONTH:
            return v
        if _seconds(v, "period") < 60:
            raise ValueError("period is a duration of at least 1m (e.g. 1d, 30d) or 'month'")
        return v

    def to_budget(self, team: str) -> Budget:
        if self.period == MONTH:
            return Budget(team, MONTH, None, self.money, self.gpu_hours, self.on_exceed)
        s = _seconds(self.period, "period")
        label = self.period if isinstance(self.period, str) else f"{s:g}s"
        return Budget(team, label, s, self.money, self.gpu_hours, self.on_exceed)


def _prices(v: dict[str, float]) -> dict[str, float]:
    for model, price in v.items():
        if not model.strip():
            raise ValueError("a price needs a GPU model name")
        if not 0 <= price < float("inf"):
            raise ValueError(f"price for {model} must be a number, 0 or more (money per GPU-hour)")
    return v


GRANTED_CLASSES = ("high", "serving", "critical")


class GrantIn(_Strict):
    """Who may submit one class: members of `teams`, callers with one of `roles` in the team
    they submit to (member: every member), and `users` by name."""

    teams: list[str] = Field(default_factory=list)
    roles: list[Literal["member", "team-admin", "cluster-admin"]] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)

    def to_grant(self) -> core.Grant:
        return core.Grant(frozenset(self.teams), frozenset(self.roles), frozenset(self.users))


class PoolIn(_Strict):
    """pools: {name: {nodes: [n1], labels: [ib], teams: [vision], classes: [high], quotas: {vision: 8}}}:
    the nodes named or carrying all the labels; who may use them (teams, classes left out: all);
    the most GPUs each team named under quotas may hold on them at once."""

    nodes: list[str] = Field(default_factory=list, max_length=100_000)
    labels: list[str] = Field(default_factory=list, max_length=64)
    teams: list[str] | None = None
    classes: list[ClassName] | None = None
    quotas: dict[str, float] = Field(default_factory=dict, max_length=10_000)

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, v: dict[str, float]) -> dict[str, float]:
        for team, gpus in v.items():
            if not 0 <= gpus < float("inf"):
                raise ValueError(f"quota of team {team!r} must be a number of GPUs, 0 or more (got {gpus!r})")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        for label in v:
            why = label_error(label)
            if why is not None:
                raise ValueError(why)
        return v

    def to_pool(self, name: str) -> Pool:
        return Pool(
            name,
            frozenset(self.nodes),
            frozenset(self.labels),
            frozenset(self.teams) if self.teams is not None else None,
            frozenset(Priority.parse(c) for c in self.classes) if self.classes is not None else None,
            tuple(sorted(self.quotas.items())),
        )


class ContainersIn(_Strict):
    """containers: {mount_roots: [/data, /scratch]}: where a container job's --mount may come from."""

    mount_roots: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("mount_roots")
    @classmethod
    def _roots(cls, v: list[str]) -> list[str]:
        for root in v:
            if not root.startswith("/") or ".." in root.split("/"):
                raise ValueError(f"mount root {root!r} must be an absolute path without '..'")
        return v


class LimitIn(_Strict):
    """One set of limits (limits.per_user, limits.users.NAME, limits.per_class.CLASS)."""

    max_running_gpus: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_queued_jobs: int | None = Field(default=None, ge=1)
    max_gpu_hours_in_flight: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    def to_limit(self) -> core.Limit:
        return core.Limit(self.max_running_gpus, self.max_queued_jobs, self.max_gpu_hours_in_flight)


class LimitsIn(_Strict):
    """limits: per_user (everyone), users (named users, field by field over per_user), per_class."""

    per_user: LimitIn = Field(default_factory=LimitIn)
    users: dict[str, LimitIn] = Field(default_factory=dict)
    per_class: dict[ClassName, LimitIn] = Field(default_factory=dict)

    def to_limits(self) -> core.Limits:
        return core.Limits(
            per_user=self.per_user.to_limit(),
            users={name: x.to_limit() for name, x in self.users.items()},
            per_class={Priority.parse(c): x.to_limit() for c, x in self.per_class.items()},
        )


class PolicyIn(_Strict):
    teams: dict[TeamName, TeamIn] = Field(default_factory=dict)
    orgs: dict[str, OrgIn] = Field(default_factory=dict)
    preemption: PreemptionIn = Field(default_factory=PreemptionIn)
    fair_share: FairShareIn = Field(default_factory=FairShareIn)
    backfill: BackfillIn = Field(default_factory=BackfillIn)
    priorities: bool = True
    # Left out: a week under `ordering.mode: las` (the default), a day under `age`
    # (core/attained.py's LAS_STARVATION_AGE_S says why a week).
    starvation_age: Duration | None = None
    unknown_teams: Literal["allow", "reject"] = "allow"
    idle: IdleIn = Field(default_factory=IdleIn)
    health: HealthIn = Field(default_factory=HealthIn)
    elastic: ElasticIn = Field(default_factory=ElasticIn)
    interactive: InteractiveIn = Field(default_factory=InteractiveIn)
    prices: dict[str, float] = Field(default_factory=dict, description="GPU model -> money per GPU-hour")
    budgets: dict[TeamName, BudgetIn] = Field(default_factory=dict)
    priority_grants: dict[str, GrantIn] = Field(default_factory=dict)
    containers: ContainersIn = Field(default_factory=ContainersIn)
    limits: LimitsIn = Field(default_factory=LimitsIn)
    pools: dict[str, PoolIn] = Field(default_factory=dict)
    resources: ResourcesIn = Field(default_factory=ResourcesIn)
    ordering: OrderingIn = Field(default_factory=OrderingIn)

    _check_prices = field_validator("prices")(_prices)

    @field_validator("starvation_age")
    @classmethod
    def _age(cls, v: Duration | None) -> Duration | None:
        if v is not None and _seconds(v, "starvation_age") <= 0:
            raise ValueError("starvation_age must be positive")
        return v

    def problems(self) -> list[tuple[list[str], str]]:
        """Cross-field mistakes, each with the path of the field to point at."""
        out: list[tuple[list[str], str]] = []
        for name, team in self.teams.items():
            if team.org is not None and team.org not in self.orgs:
                known = ", ".join(sorted(self.orgs)) or "none defined"
                out.append(
                    (["teams", name, "org"], f"team {name} names org {team.org!r}, which is not under orgs: ({known})")
                )
        for name, budget in self.budgets.items():
            if budget.money is None and budget.gpu_hours is None:
                out.append((["budgets", name], f"budget of team {name} needs money: or gpu_hours: (or both)"))
        for cls, grant in self.priority_grants.items():
            if cls not in GRANTED_CLASSES:
                out.append(
                    (
                        ["priority_grants", cls],
                        f"{cls!r} cannot be granted: low and normal are open to every member; "
                        f"grants are for {', '.join(GRANTED_CLASSES[:-1])} and {GRANTED_CLASSES[-1]}",
                    )
                )
                continue
            for name in grant.teams:
                if self.teams and name not in self.teams:
                    out.append(
                        (
                            ["priority_grants", cls, "teams"],
                            f"{cls} is granted to team {name!r}, which is not under teams: "
                            f"({', '.join(sorted(self.teams))})",
                        )
                    )
        for name, pool in self.pools.items():
            if not pool.nodes and not pool.labels:
                out.append((["pools", name], f"pool {name} needs nodes: [...] or labels: [...] to say which nodes"))
            for member in pool.teams or ():
                if self.teams and member not in self.teams:
                    known = ", ".join(sorted(self.teams))
                    out.append(
                        (
                            ["pools", name, "teams"],
                            f"pool {name} names team {member!r}, which is not under teams: ({known})",
                        )
                    )
            for member in pool.quotas:
                if self.teams and member not in self.teams:
                    known = ", ".join(sorted(self.teams))
                    out.append(
                        (
                            ["pools", name, "quotas"],
                            f"pool {name} gives a quota to team {member!r}, which is not under teams: ({known})",
                        )
                    )
                elif pool.teams is not None and member not in pool.teams:
                    out.append(
                        (
                            ["pools", name, "quotas"],
                            f"pool {name} gives a quota to team {member!r}, which its teams: do not admit; "
                            "add it to teams: or drop its quota",
                        )
                    )
        if self.ordering.preempt is True and not self.preemption.enabled:
            out.append(
                (
                    ["ordering", "preempt"],
                    "ordering.preempt needs preemption.enabled: true (or set ordering.preempt: false)",
                )
            )
        if self.unknown_teams == "reject" and not self.teams:
            out.append((["unknown_teams"], "reject needs at least one team under teams:"))
        return out

    def to_policy(self) -> core.Policy:
        teams = {
            name: core.Team(name, t.weight, t.org, dict(t.quota), t.max_borrow, t.max_lend)
            for name, t in self.teams.items()
        }
        if not teams:
            teams = {core.DEFAULT_TEAM: core.Team(core.DEFAULT_TEAM)}
        p = self.preemption
        return core.Policy(
            teams=teams,
            orgs={name: core.Org(name, o.weight) for name, o in self.orgs.items()},
            preemption=core.Preemption(
                enabled=p.enabled,
                grace_period_s=_seconds(p.grace_period, "grace_period"),
                min_runtime_s=_seconds(p.min_runtime, "min_runtime"),
                protected_classes=frozenset(Priority.parse(c) for c in p.protected_classes),
                reclaim_quota=p.reclaim_quota,
                serving_victims=p.serving_victims,
                shrink_elastic=p.shrink_elastic,
            ),
            fair_share_half_life_s=_seconds(self.fair_share.half_life, "half_life"),
            fair_share=self.fair_share.enabled,
            priorities=self.priorities,
            backfill=self.backfill.enabled,
            default_time_limit_s=_seconds(self.backfill.default_time_limit, "default_time_limit"),
            starvation_age_s=self._starvation_age_s(),
            allow_unknown_teams=self.unknown_teams == "allow",
            idle=core.IdlePolicy(
                after_s=_seconds(self.idle.after, "after"), threshold=self.idle.threshold, action=self.idle.action
            ),
            health=core.HealthPolicy(
                max_temperature_c=self.health.max_temperature,
                node_timeout_s=_seconds(self.health.node_timeout, "node_timeout"),
                drain_on_ecc=self.health.drain_on_ecc,
                drain_on_xid=self.health.drain_on_xid,
                fatal_xids=frozenset(self.health.fatal_xids) if self.health.fatal_xids is not None else None,
            ),
            elastic=self.elastic.to_policy(),
            mount_roots=tuple(self.containers.mount_roots),
            interactive=self.interactive.to_policy(),
            priority_grants={
                **core.DEFAULT_GRANTS,
                **{Priority.parse(c): g.to_grant() for c, g in self.priority_grants.items()},
            },
            limits=self.limits.to_limits(),
            pools=tuple(p.to_pool(name) for name, p in sorted(self.pools.items())),
            host=self.resources.to_defaults(),
            ordering=self.ordering.to_ordering(self.preemption.enabled),
        )

    def _starvation_age_s(self) -> float:
        if self.starvation_age is not None:
            return _seconds(self.starvation_age, "starvation_age")
        return core.LAS_STARVATION_AGE_S if self.ordering.mode == "las" else core.A_DAY_S

    def to_accounting(self) -> Accounting:
        return Accounting(dict(self.prices), {t: b.to_budget(t) for t, b in self.budgets.items()})


def load_policy(source: str | Path) -> core.Policy:
    """A policy from a YAML file, or a shipped baseline by name (fifo, priority, default)."""
    return load_policy_file(source)[0]


def load_policy_file(source: str | Path) -> tuple[core.Policy, Accounting]:
    """The scheduling policy and the accounting section (prices, budgets) of one policy file.

    Accounting is not part of `core.Policy`, which `decide` reads: prices and budgets are applied
    by the head (holding a team's jobs takes them out of the snapshot), not by the scheduler."""
    if isinstance(source, str) and source in core.BUILTIN_POLICIES:
        return core.BUILTIN_POLICIES[source](), Accounting()
    path = Path(source)
    data, node = read_yaml(path, "policy file")
    return parse_policy(data, path, node)


def parse_policy(data: Any, path: Path, node: yaml.Node | None) -> tuple[core.Policy, Accounting]:
    """`load_policy_file` after the reading: a policy file's parsed mapping (errors at `node`'s
    lines). Apart so the simulator can sweep values laid over a file's mapping (`--sweep
    policy.KEY=...`) through the same rules as the head."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyFileError(f"{path}: a policy is a mapping (teams:, preemption:, ...), not {type(data).__name__}")
    parsed: PolicyIn = validate(PolicyIn, data, path, node)
    problems = parsed.problems()
    if problems:
        raise PolicyFileError(
            "\n".join(f"{path}:{line_of(node, loc) or 0}: {'.'.join(loc)}: {msg}" for loc, msg in problems)
        )
    return parsed.to_policy(), parsed.to_accounting()
