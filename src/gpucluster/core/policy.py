"""The scheduling policy: teams, organisations, quotas, priority classes, preemption, backfill.

Pure data. The YAML loader with line-precise errors is `gpucluster.policyfile`; the live head
and the simulator hand the same `Policy` object to `decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.core.attained import AGE_ORDER, Ordering, RuntimeModel
from gpucluster.core.attained import LAS_STARVATION_AGE_S as LAS_STARVATION_AGE_S
from gpucluster.core.pools import Pool
from gpucluster.core.types import Priority

DEFAULT_TEAM = "default"


@dataclass(frozen=True)
class Team:
    name: str
    weight: float = 1.0
    org: str | None = None
    quota: dict[str, float] = field(default_factory=dict)  # GPU model -> guaranteed GPUs
    max_borrow: float | None = None  # GPUs beyond its quota it may use; None = any idle
    max_lend: float | None = None  # of its idle guaranteed GPUs, at most this many are lent; None = all


@dataclass(frozen=True)
class Org:
    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class Preemption:
    enabled: bool = True
    grace_period_s: float = 30.0
    min_runtime_s: float = 0.0
    # Classes never preempted, whatever the priority of the job that wants their GPUs.
    protected_classes: frozenset[Priority] = frozenset({Priority.CRITICAL})
    reclaim_quota: bool = True  # a team below its guaranteed quota may stop borrowers
    # What a service replica (the serving class) may preempt by class: "checkpointed", running
    # jobs of lower classes that have saved a checkpoint (they resume from it, so a scale-up of
    # a model service costs training only the work since then); "any", every lower-class job;
    # "none", nothing (replicas go first in line but wait for free GPUs). Quota reclaim is not
    # limited by it: a team below its guarantee reclaims whatever class asks.
    serving_victims: str = "checkpointed"
    # Shrink an elastic victim above its minimum (it restarts smaller at once) before stopping
    # others whole (core/shrink.py).
    shrink_elastic: bool = True


@dataclass(frozen=True)
class IdlePolicy:
    """What to do with a job that holds GPUs it does not use (telemetry, issue 7).

    A job whose every GPU stays at or under `threshold` percent utilisation for `after_s` is
    flagged idle; `action` then says what happens: notify (the flag only), requeue (checkpoint
    and back to the queue, like a preemption) or stop (it ends `failed` with that reason).
    """

    after_s: float = 1800.0
    threshold: float = 1.0
    action: str = "notify"  # notify | requeue | stop


@dataclass(frozen=True)
class InteractivePolicy:
    """The session class (`gpucluster run`): what a session may hold and when it is reclaimed.

    A session starts at `priority` (no grant needed: the class is the policy's), gets `time_limit_s`
    when it asks for none and may not ask for more; one user's sessions hold at most
    `max_gpus_per_user` GPUs together (queued ones count). Idle reclaim needs both signals: its
    GPUs at or under `idle_threshold` percent AND no terminal or forwarded traffic, for
    `idle_after_s`; the user is then warned in their terminal, and after `idle_grace_s` more of
    the same, `idle_action` happens (stop; notify: the warning only). None: no such limit.
    """

    max_gpus_per_user: float | None = None
    time_limit_s: float | None = None
    priority: str | None = None
    idle_after_s: float | None = None
    idle_grace_s: float = 300.0
    idle_threshold: float = 1.0
    idle_action: str = "stop"  # stop | notify


@dataclass(frozen=True)
class ElasticPolicy:
    """When a running elastic job below its maximum is grown (core/elastic.py): GPUs free, with
    nothing queued, for `grow_after_s`; at most once per `grow_every_s` of a job's run; and only
    when the time saved beats `restart_cost_s`, what a checkpoint-and-restart costs."""

    enabled: bool = True
    grow_after_s: float = 60.0
    grow_every_s: float = 300.0
    restart_cost_s: float = 60.0


@dataclass(frozen=True)
class HostDefaults:
    """What a job that does not say gets of CPU cores and host memory (`resources:` in the
    policy file): so much per GPU it asks for, as Slurm's DefCpuPerGPU and DefMemPerGPU. Zero
    (the default): nothing is reserved for it, and nothing limits it (no cgroup cap). Applied
    at submit and written into the job's spec, so a later policy change moves no queued job."""

    cpus_per_gpu: float = 0.0
    mem_per_gpu_mb: int = 0

    def resolve(self, gpus: float, cpus: float | None, mem_mb: int | None) -> tuple[float | None, int | None]:
        """The job's (cpus, MiB) once the defaults fill what it left out (None: still nothing).
        A CPU-only job (0 GPUs) gets nothing filled: the defaults are per GPU, and it states
        what it needs itself."""
        if gpus == 0:
            return cpus, mem_mb
        if cpus is None and self.cpus_per_gpu > 0:
            cpus = max(0.01, round(self.cpus_per_gpu * gpus, 2))
        if mem_mb is None and self.mem_per_gpu_mb > 0:
            mem_mb = max(1, int(self.mem_per_gpu_mb * gpus))
        return cpus, mem_mb


@dataclass(frozen=True)
class HealthPolicy:
    """When telemetry marks a GPU or a node unhealthy, which drains its node (issue 7)."""

    max_temperature_c: float = 90.0
    # A node that reported telemetry and then stays silent this long is unhealthy.
    node_timeout_s: float = 60.0
    drain_on_ecc: bool = True
    drain_on_xid: bool = True
    # XIDs that mean the GPU needs a reset; None: gpucluster.telemetry.health.FATAL_XIDS.
    fatal_xids: frozenset[int] | None = None


@dataclass(frozen=True)
class Limit:
    """One set of limits on a user's jobs (None: no such limit). `max_running_gpus`: GPUs their
    running jobs hold together; `max_gpu_hours_in_flight`: the sum over their running jobs of
    GPUs x time limit left (Slurm's GrpTRESRunMins; a job without a time limit counts the
    policy's `default_time_limit_s` in full for as long as it runs, since its end is unknown);
    `max_queued_jobs`: jobs queued at once (an array counts its elements; checked at submit)."""

    max_running_gpus: float | None = None
    max_queued_jobs: int | None = None
    max_gpu_hours_in_flight: float | None = None

    @property
    def empty(self) -> bool:
        return self.max_running_gpus is None and self.max_queued_jobs is None and self.max_gpu_hours_in_flight is None


@dataclass(frozen=True)
class Limits:
    """Per-user and per-class limits (issue 16; Slurm's QOS MaxTRESPerUser, MaxSubmitJobsPerUser).

    `per_user` holds for every user; `users` overrides it field by field for named users (a field
    a named user leaves out is `per_user`'s). `per_class` holds for each user's jobs of one
    priority class, on top of the per-user limits. Enforced by core/limits.py (running GPUs and
    GPU-hours in flight, before `decide` plans) and at submit (queued jobs, in the store's write
    transaction)."""

    per_user: Limit = field(default_factory=Limit)
    users: dict[str, Limit] = field(default_factory=dict)
    per_class: dict[Priority, Limit] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether any running limit is set (what `decide` checks before doing any work)."""
        every = [self.per_user, *self.users.values(), *self.per_class.values()]
        return any(x.max_running_gpus is not None or x.max_gpu_hours_in_flight is not None for x in every)

    @property
    def limits_queued(self) -> bool:
        every = [self.per_user, *self.users.values(), *self.per_class.values()]
        return any(x.max_queued_jobs is not None for x in every)

    def of_user(self, user: str, name: str) -> tuple[float, str] | None:
        """The per-user limit `name` (a `Limit` field) for `user` and the policy path that sets it."""
        own = self.users.get(user)
        if own is not None:
            value = getattr(own, name)
            if value is not None:
                return float(value), f"limits.users.{user}.{name}"
        value = getattr(self.per_user, name)
        return (float(value), f"limits.per_user.{name}") if value is not None else None

    def of_class(self, priority: Priority, name: str) -> tuple[float, str] | None:
        """The per-class limit `name` for each user's jobs of `priority`, and its policy path."""
        limit = self.per_class.get(priority)
        value = getattr(limit, name) if limit is not None else None
        return (float(value), f"limits.per_class.{priority.label}.{name}") if value is not None else None


# Roles a grant may name: every member of the team submitted to, its admins, cluster admins.
MEMBER, TEAM_ADMIN, CLUSTER_ADMIN = "member", "team-admin", "cluster-admin"


@dataclass(frozen=True)
class Grant:
    """Who may submit jobs of one priority class above normal to a team (issue 14).

    Why: a class above normal goes first in line and preempts lower classes, and `critical` is
    never preempted; left open to every member, any of them could take other teams' GPUs at
    will. Like Slurm's QOS tied to associations, the policy says who holds each class: members
    of `teams`, callers whose role in the team submitted to is in `roles`, and `users` by name.
    Cluster admins may use every class. Low and normal are open to every member.
    """

    teams: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()

    def admits(self, team: str, role: str | None, user: str) -> bool:
        """`role`: the caller's role in `team` (None: not a member)."""
        if user in self.users:
            return True
        if role is None:
            return False
        return team in self.teams or MEMBER in self.roles or role in self.roles

    def describe(self) -> str:
        parts = [
            *(["every member"] if MEMBER in self.roles else []),
            *(["team admins"] if TEAM_ADMIN in self.roles else []),
            *([f"members of {', '.join(sorted(self.teams))}"] if self.teams else []),
            *([f"users {', '.join(sorted(self.users))}"] if self.users else []),
        ]
        return ", ".join(parts) + (" and cluster admins" if parts else "cluster admins only")


# What holds when the policy names no grant for a class: team admins may submit high jobs to
# their team; every member may run services at the serving class (plain jobs never may, and what
# replicas may preempt is `Preemption.serving_victims`: by default only checkpointed work);
# critical is for cluster admins only.
DEFAULT_GRANTS: dict[Priority, Grant] = {
    Priority.HIGH: Grant(roles=frozenset({TEAM_ADMIN})),
    Priority.SERVING: Grant(roles=frozenset({MEMBER})),
    Priority.CRITICAL: Grant(),
}


def _default_grants() -> dict[Priority, Grant]:
    return dict(DEFAULT_GRANTS)


@dataclass(frozen=True)
class Policy:
    teams: dict[str, Team] = field(default_factory=lambda: {DEFAULT_TEAM: Team(DEFAULT_TEAM)})
    orgs: dict[str, Org] = field(default_factory=dict)
    preemption: Preemption = field(default_factory=Preemption)
    fair_share_half_life_s: float = 7 * 86400.0
    fair_share: bool = True  # off: FIFO within a priority class (a baseline)
    priorities: bool = True  # off: one class for all (a FIFO baseline)
    backfill: bool = True
    default_time_limit_s: float = 3600.0  # for reservations, when a job has no limit
    starvation_age_s: float = LAS_STARVATION_AGE_S  # a job waiting this long goes first in line
    allow_unknown_teams: bool = True  # unknown teams get weight 1 and no quota
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    elastic: ElasticPolicy = field(default_factory=ElasticPolicy)
    # Directories a container job may bind-mount from (checked at submit; `decide` never reads it).
    mount_roots: tuple[str, ...] = ()
    interactive: InteractivePolicy = field(default_factory=InteractivePolicy)
    # Who may submit each class above normal (checked at submit; `decide` never reads it).
    priority_grants: dict[Priority, Grant] = field(default_factory=_default_grants)
    # Per-user and per-class limits (core/limits.py; queued-job limits are checked at submit).
    limits: Limits = field(default_factory=Limits)
    # Node pools: nodes only some teams or classes may use (core/pools.py).
    pools: tuple[Pool, ...] = ()
    # CPUs and host memory per GPU for a job that does not say (applied at submit).
    host: HostDefaults = field(default_factory=HostDefaults)
    # Order inside a team's line: by attained service (the default, core/attained.py) or by age.
    ordering: Ordering = field(default_factory=Ordering)

    # Teams not listed, made on first use: `team()` is called per queued job per cycle, and a
    # new Team each time cost ~1 us x millions of calls at scale.
    _unlisted: dict[str, Team] = field(default_factory=dict, init=False, repr=False, compare=False)
    # `share` per team, worked out once: it walks every team and org, and fair share asks it for
    # each team in line every cycle (the policy never changes; a new file is a new Policy).
    _shares: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def team(self, name: str) -> Team:
        t = self.teams.get(name)
        if t is None:
            t = self._unlisted.get(name)
            if t is None:
                t = self._unlisted[name] = Team(name)
        return t

    def share(self, team: str) -> float:
        """The team's entitled fraction of the cluster: org share x team share within its org."""
        got = self._shares.get(team)
        if got is None:
            got = self._shares[team] = self._share(team)
        return got

    def _share(self, team: str) -> float:
        t = self.team(team)
        known = list(self.teams.values()) if team in self.teams else [*self.teams.values(), t]
        if t.org is None or t.org not in self.orgs:
            top = [x for x in known if x.org is None or x.org not in self.orgs]
            total = sum(x.weight for x in top) + sum(o.weight for o in self.orgs.values())
            return t.weight / total if total > 0 else 0.0
        orgs_total = sum(o.weight for o in self.orgs.values()) + sum(
            x.weight for x in known if x.org is None or x.org not in self.orgs
        )
        siblings = sum(x.weight for x in known if x.org == t.org)
        org_share = self.orgs[t.org].weight / orgs_total if orgs_total > 0 else 0.0
        return org_share * (t.weight / siblings if siblings > 0 else 0.0)

    def shares_of(self, names: list[str]) -> dict[str, float]:
        """Entitled shares of `names` (the policy's teams plus any outside it) taken together, so
        they sum to 1 over the policy's teams, its orgs and these outsiders.

        Why not `share` per name: that weighs each team outside the policy as if it were the only
        one, which is right for ranking one team, but a listing of all of them (`policy show`, the
        dashboard) then summed to 150% with two outsiders."""
        unlisted = [self.team(n) for n in names if n not in self.teams]
        if not unlisted:
            return {n: self.share(n) for n in names}
        joined = Policy(teams={**self.teams, **{t.name: t for t in unlisted}}, orgs=self.orgs)
        return {n: joined.share(n) for n in names}

    def may_use(self, priority: Priority, team: str, role: str | None, user: str, cluster_admin: bool) -> bool:
        """Whether a caller (their role in `team`, None if none) may submit `priority` to `team`."""
        if priority <= Priority.NORMAL or cluster_admin:
            return True
        return self.priority_grants.get(priority, Grant()).admits(team, role, user)

    def allowed_classes(self, team: str, role: str | None, user: str, cluster_admin: bool) -> list[Priority]:
        return [p for p in Priority if self.may_use(p, team, role, user, cluster_admin)]

    @property
    def preempts_for_attained_service(self) -> bool:
        """Whether a job may stop one of its own class for attained service: `las` ordering with
        `ordering.preempt`, and preemption on (what the scheduler acts on, and what the head shows)."""
        return self.preemption.enabled and self.ordering.mode == "las" and self.ordering.preempt

    def preemptible(self, priority: Priority) -> bool:
        return priority not in self.preemption.protected_classes

    def may_preempt_by_class(self, asker: Priority, victim_checkpointed: bool) -> bool:
        """Whether a job of class `asker` may take a lower-class job's GPUs for its class alone
        (quota reclaim aside): the serving class only as `preemption.serving_victims` allows."""
        if asker != Priority.SERVING:
            return True
        rule = self.preemption.serving_victims
        return rule == "any" or (rule == "checkpointed" and victim_checkpointed)


# The starvation age of `age` ordering: a day (the default's before issue 25).
A_DAY_S = 86400.0


def fifo_policy() -> Policy:
    """Baseline: first come, first served; no priorities, fair share, backfill or preemption."""
    return _age_baseline(priorities=False, backfill=False)


def fifo_backfill_policy() -> Policy:
    """Baseline: FIFO with EASY backfill (a later job may start if it does not delay the first's
    reserved start); no priorities, fair share or preemption."""
    return _age_baseline(priorities=False, backfill=True)


def _age_baseline(priorities: bool, backfill: bool) -> Policy:
    """A baseline: no fair share, no preemption, ordered by age with a day's starvation age, as
    every baseline was before `las` became the default (so its figures stay comparable)."""
    return Policy(
        fair_share=False,
        priorities=priorities,
        backfill=backfill,
        preemption=Preemption(enabled=False),
        ordering=AGE_ORDER,
        starvation_age_s=A_DAY_S,
    )


def age_policy() -> Policy:
    """The default before issue 25: classes, fair share, quotas, backfill and preemption by class
    as `default`, but oldest first inside a team's line, and a day's starvation age."""
    return Policy(ordering=AGE_ORDER, starvation_age_s=A_DAY_S)


def las_policy() -> Policy:
    """Least-attained-service ordering and its preemption (core/attained.py): the default,
    spelled out, so `las` keeps meaning this if the default moves on."""
    return _las("none")


def las_gittins_policy() -> Policy:
    """`las` ordering inside each attained-service queue by the Gittins index of the run times
    the cluster learned from its finished jobs (core/gittins.py)."""
    return _las("gittins")


def _las(runtime_model: RuntimeModel) -> Policy:
    ordering = Ordering(mode="las", preempt=True, promote_after_s=LAS_STARVATION_AGE_S, runtime_model=runtime_model)
    return Policy(ordering=ordering, starvation_age_s=LAS_STARVATION_AGE_S)


def priority_policy() -> Policy:
    """Baseline: strict priority, FIFO within a class; no fair share, backfill or preemption."""
    return _age_baseline(priorities=True, backfill=False)


BUILTIN_POLICIES = {
    "fifo": fifo_policy,
    "fifo-backfill": fifo_backfill_policy,
    "priority": priority_policy,
    "default": Policy,
    "age": age_policy,
    "las": las_policy,
    "las-gittins": las_gittins_policy,
}
