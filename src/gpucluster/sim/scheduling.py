"""The simulator's only door into the scheduling core.

Why one module: the simulator must run the very scheduler the head runs, never a copy. Every
call to `gpucluster.core.scheduler.decide` goes through `decide` here, every JobRequest and
RunningJob the simulator hands the core is built by `job_request` / `running_job` here, and the
policy is loaded by the head's own loader (`gpucluster.policyfile.load_policy`) and passed to the
core untouched. When the core grows new request fields, this file is the one to change.

Policies: `--policy` takes a policy YAML file (the same file `gpucluster up --policy` reads) or a
shipped name: `fifo`, `fifo-backfill`, `priority`, `default` (= `las`), `age`, `las` or `las-gittins` (see
gpucluster.core.policy); or `oracle-sjf`, a reference only the simulator can run (`ORACLE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpucluster.core import policy as core_policy
from gpucluster.core.accounting import Accounting
from gpucluster.core.attained import Ordering
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.cluster_state import running_job as running_job  # the one the simulator starts with
from gpucluster.core.fairshare import accrue
from gpucluster.core.policy import HostDefaults, Policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.rank_book import RankBook
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.restarts import restart_backoff
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.scheduler import decide as core_decide
from gpucluster.core.scheduler import gc_paused
from gpucluster.core.snapshot import RunningByClass, Snapshot
from gpucluster.core.types import Drain, JobRequest, Node, Plan, RunningJob
from gpucluster.policyfile import PolicyFileError, load_policy_file, parse_policy
from gpucluster.sim.errors import SimInputError
from gpucluster.sim.workload import TraceJob
from gpucluster.sim.yamlspec import Path_, dotted, lay_over
from gpucluster.waits_text import sentence
from gpucluster.yamlfile import read_yaml

# A reference, not a policy: shortest job first (by the trace's true remaining run time) with
# EASY backfill given perfect time limits, no classes, fair share or preemption. Only the
# simulator knows run times, so only it can run this; it shows how far from the best a policy
# that does not know them is (issue 25).
ORACLE = "oracle-sjf"
BUILTIN_POLICIES = (*core_policy.BUILTIN_POLICIES, ORACLE)


def oracle_policy() -> Policy:
    """`ORACLE`'s core policy: FIFO + backfill's, ordered by `Snapshot.expected_runtime`, with
    no starvation age (a pure SJF; `inf`: no job ever ages past the order)."""
    return replace(core_policy.fifo_backfill_policy(), ordering=Ordering(mode="sjf"), starvation_age_s=float("inf"))


@dataclass(frozen=True)
class SimPolicy:
    """A policy as the simulator holds it: a label for reports and the core's own object."""

    name: str
    source: str  # the file it came from, or "built-in"
    core: Policy
    # The file's `budgets:` (prices come from the cluster spec's node groups): teams over budget
    # are held as on the head, by the core's admission (Snapshot.holds).
    accounting: Accounting = field(default_factory=Accounting)
    # The reference oracle (`ORACLE`): the engine tells the core each job's true run time.
    oracle: bool = False

    @property
    def grace_period_s(self) -> float:
        return self.core.preemption.grace_period_s

    @property
    def fair_share(self) -> bool:
        return self.core.fair_share

    @property
    def has_quotas(self) -> bool:
        return any(t.quota or t.max_borrow is not None for t in self.core.teams.values())

    def entitlement(self, team: str) -> float:
        """The team's fair-share entitlement as the policy defines it (`Policy.share`); relative:
        callers normalise over the teams present (an unlisted team's share is computed against
        the listed teams and itself alone)."""
        return self.core.share(team)


def load_policy(arg: str, overrides: tuple[tuple[Path_, Any], ...] = ()) -> SimPolicy:
    """A shipped baseline, the reference oracle, or a policy YAML file, read by the head's own loader.

    `overrides`: (key path, value) laid over the file's mapping before the head's rules validate
    it (`--sweep policy.KEY=...`); only a file has a mapping to lay them over."""
    if overrides:
        return _overridden_policy(arg, overrides)
    if arg == ORACLE:
        return SimPolicy(name=arg, source="built-in reference (knows run times)", core=oracle_policy(), oracle=True)
    if arg in BUILTIN_POLICIES:
        core, accounting = load_policy_file(arg)
        return SimPolicy(name=arg, source="built-in", core=core, accounting=accounting)
    path = Path(arg)
    if not path.is_file():
        raise SimInputError(f"--policy {arg}: no such file, and not a shipped baseline ({', '.join(BUILTIN_POLICIES)})")
    try:
        core, accounting = load_policy_file(path)
        return SimPolicy(name=path.stem, source=str(path), core=core, accounting=accounting)
    except PolicyFileError as e:
        raise SimInputError(str(e)) from None


def _overridden_policy(arg: str, overrides: tuple[tuple[Path_, Any], ...]) -> SimPolicy:
    swept = ", ".join(f"policy.{dotted(p)}" for p, _ in overrides)
    if arg in BUILTIN_POLICIES:
        raise SimInputError(
            f"--sweep {swept}: --policy {arg} is a shipped baseline, not a file: values are swept inside "
            "a policy file (--policy mine.yaml)"
        )
    load_policy(arg)  # the file as written first: its own errors, without the sweep
    path = Path(arg)
    try:
        data, node = read_yaml(path, "policy file")
        pol, accounting = parse_policy(lay_over(data, overrides, path, "policy."), path, node)
    except PolicyFileError as e:
        # pydantic's words for a key the file's rules do not have; a swept key is typed by hand
        raise SimInputError(str(e).replace("Extra inputs are not permitted", "unknown key in a policy file")) from None
    return SimPolicy(name=path.stem, source=str(path), core=pol, accounting=accounting)


def job_request(
    job: TraceJob,
    queued_at: float | None = None,
    not_before: float | None = None,
    host: HostDefaults | None = None,
    oracle: bool = False,
) -> JobRequest:
    """The queued job as the core sees it; built when it arrives and when it is requeued (with
    when it re-entered the queue and, after a failure, the end of its backoff, as the head does).
    Its CPUs and host memory: the trace's, else the policy's per GPU (`host`), as the head
    fills them in at submit. `oracle`: its time limit is its true run time (the reference's
    perfect limits, for backfill), or its own limit if that is shorter; the engine ends it by its
    own limit either way."""
    cpus, mem = job.cpus, job.mem_mb
    if host is not None and (cpus is None or mem is None):
        cpus, mem = host.resolve(job.gpus, cpus, mem)
    limit = job.time_limit
    if oracle:
        limit = job.duration if limit is None else min(limit, job.duration)
    return JobRequest(
        job_id=job.job_id,
        gpus=job.gpus,
        gpu_types=job.gpu_types,
        priority=job.priority,
        queued_at=queued_at,
        not_before=not_before,
        submitted_at=job.submit,
        team=job.team,
        gpu_memory_mb=job.gpu_memory_mb,
        min_gpu_memory_mb=job.min_gpu_memory_mb,
        time_limit_s=limit,
        nodes=job.nodes,
        min_gpus=job.min_gpus,
        user=job.user,
        selection=job.selection,
        after=job.after,
        array_id=job.array_id,
        cpus=cpus or 0.0,
        mem_mb=mem or 0,
    )


def restart_delay(restart: int) -> float:
    """How long the `restart`-th restart after a failure waits: the live head's rule (core/restarts.py)."""
    return restart_backoff(restart)


def stopping(job: RunningJob) -> RunningJob:
    """The same running job once a stop (preemption) is under way."""
    return replace(job, stopping=True)


def snapshot(
    nodes: tuple[Node, ...],
    running: tuple[RunningJob, ...],
    queued: tuple[JobRequest, ...],
    usage: dict[str, float],
    capacity: CapacityIndex | None = None,
    queue_index: QueueIndex | None = None,
    preempted_for: dict[int, int] | None = None,
    holds: dict[str, WaitFacts] | None = None,
    attained: dict[int, float] | None = None,
    expected_runtime: dict[int, float] | None = None,
    runtime_dist: Mapping[int, RunDistribution] | None = None,
    drains: Mapping[str, Drain] | None = None,
    drained: AbstractSet[str] | None = None,
    rank_book: RankBook | None = None,
    running_by_class: RunningByClass | None = None,
) -> Snapshot:
    """The core's input. `capacity`: the engine's index kept across calls, as the head keeps
    one, so free GPUs are updated from the jobs that changed rather than rebuilt; `queue_index`
    likewise for the queue sorted into lines (the plan is the same with or without either).
    `attained`: job id -> GPU-seconds of its ended attempts; `expected_runtime`: job id -> run
    seconds (the oracle's); read by the core only when the policy's ordering ranks jobs;
    `runtime_dist`: job id -> learned run times of jobs like it (`runtime_model: gittins`).
    `drains`: node -> its drain (the spec's `drains:` windows open now), admitted by the core
    as the head's drained nodes are; `drained`: the drained nodes (the engine's cluster state
    keeps both), by default those of `drains`. `rank_book`: the Gittins ranks kept across calls
    (core/rank_book.py; the plan is the same without it); `running_by_class`: `running` by
    class, kept by the engine's cluster state (likewise)."""
    return Snapshot(
        nodes=nodes,
        running=running,
        queued=queued,
        usage=usage,
        capacity=capacity,
        queue_index=queue_index,
        preempted_for=preempted_for or {},
        holds=holds or {},
        attained=attained or {},
        expected_runtime=expected_runtime or {},
        runtime_dist=runtime_dist or {},
        drained=frozenset(drained) if drained is not None else frozenset(drains or ()),
        drains=dict(drains) if drains else {},
        rank_book=rank_book,
        running_by_class=running_by_class,
    )


def can_change_anything(policy: SimPolicy, free_gpus: float) -> bool:
    """False when a plan could hold no start and no preemption, so the call can be skipped
    without changing any decision: no GPU has any share free, and the policy never preempts.
    (The simulator does not need the wait reasons such a plan would carry.)"""
    return free_gpus > 1e-9 or policy.core.preemption.enabled


def decide(snap: Snapshot, policy: SimPolicy, now: float, reasons: bool = False) -> Plan:
    """One scheduling cycle of the real core. The simulator reads only the starts and
    preemptions, so by default the core stops once nothing else in line could start
    (`reasons=False`, the same starts and preemptions as the head's full cycle); `reasons=True`
    when a wait's message is wanted (see `Engine._infeasible`).

    The garbage collector is paused for the cycle, by this caller's choice (the head's loop makes
    the same one around its call): its passes over the snapshot cost 10-20% of a cycle."""
    with gc_paused():
        return core_decide(snap, policy.core, now, reasons=reasons)


def preemptions(plan: Plan) -> tuple[int, ...]:
    """Job ids the plan stops."""
    return tuple(p.job_id for p in plan.preemptions)


def preempted_for(plan: Plan) -> dict[int, int]:
    """Job the plan stops -> the job it stops it for (`Snapshot.preempted_for`)."""
    return {p.job_id: p.for_job for p in plan.preemptions}


def wait_message(plan: Plan, job_id: int) -> str:
    wait = plan.waiting.get(job_id)
    return sentence(wait) if wait is not None else "no reason given"


class Usage:
    """Decayed GPU-seconds per team, the fair-share memory the head keeps (head/loop.py), kept
    here per team and brought up to date lazily with the core's own `fairshare.accrue`: a team's
    figure changes only when its running GPUs change or a snapshot needs it.

    Every snapshot brings every team up to date (`at`), and between two snapshots only the teams
    whose running GPUs changed were brought anywhere else (`change`). So the others were all
    last brought to the same time, and `at` brings them in one pass of `accrue`'s arithmetic
    with the decay factor worked out once (one `accrue` call per team was ~0.25 ms a
    snapshot for 50 teams). `accrue` works each team out on its own (its value, its GPUs, the
    same elapsed time), so the floats are those of one call per team: the same values at the
    same times, by the same operations (tests/sim/test_usage.py compares the bits)."""

    def __init__(self, policy: SimPolicy) -> None:
        self._half_life = policy.core.fair_share_half_life_s
        self._value: dict[str, float] = {}
        self._at: dict[str, float] = {}
        self._gpus: dict[str, float] = {}
        self._teams: list[str] = []  # every team seen, sorted
        self._synced: float | None = None  # when the last `at` brought every team
        self._moved: set[str] = set()  # teams brought (or first seen) at another time since then

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
        """The team's running GPUs change by `gpus` at `now`."""
        if team not in self._at:
            self._teams = sorted([*self._teams, team])
        self._bring(team, now)
        self._moved.add(team)
        self._gpus[team] = self._gpus.get(team, 0.0) + gpus

    def at(self, now: float) -> dict[str, float]:
        """Every team's usage at `now`, by team name."""
        moved, synced, value = self._moved, self._synced, self._value
        if synced is not None and now < synced:  # time went back (never in a run): team by team
            self._synced = now
            moved.clear()
            return {t: self._bring(t, now) for t in self._teams}
        if synced is not None and now > synced:
            group = [t for t in self._teams if t not in moved] if moved else self._teams
            if group:
                # `accrue` of each team alone, written out for the group: decay by the same
                # factor (`decay` computes `value * 0.5 ** (elapsed / half_life)`, and the
                # power is evaluated before the product, so computing it once changes no bit),
                # then the interval's GPU-seconds added. tests/sim/test_usage.py checks the bits
                # against calls of `accrue` itself.
                elapsed, half_life, gpus = now - synced, self._half_life, self._gpus
                add = max(elapsed, 0.0)
                if half_life <= 0:
                    for t in group:
                        value[t] = value.get(t, 0.0) + gpus.get(t, 0.0) * add
                else:
                    factor = 0.5 ** (elapsed / half_life)
                    for t in group:
                        value[t] = value.get(t, 0.0) * factor + gpus.get(t, 0.0) * add
        for t in moved:
            self._bring(t, now)
        moved.clear()
        self._synced = now
        self._at = dict.fromkeys(self._teams, now)
        return {t: value.get(t, 0.0) for t in self._teams}
