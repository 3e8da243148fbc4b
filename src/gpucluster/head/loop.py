"""The head loop: reconcile running jobs, then snapshot -> decide -> commit -> launch.

Split by concern: this module is the loop's mechanics (cycles, reconciling, stops, applying the
plan and the lifecycle's answer to the store); head/recovery.py is crash recovery (adopting or
requeueing what a previous head left), head/launch_specs.py what to start for an attempt, and
head/attempts.py how an attempt's processes ended, in data and in words.

Order matters for crash safety. An allocation is committed (state `running`, attempt n) before
the process is launched, and the launch handle is committed after; a head that dies in between
finds, on restart, either the shim's own pid file (the job started: adopt it) or nothing after a
grace period (it never started: back to the queue). A job can therefore never run twice at once,
and a running job is never forgotten. Time is injected (`clock`) so tests drive it.

A distributed job's attempt is several processes (one per GPU, or one launcher per node). The
executor records how many before starting the first, so a head that died halfway through
starting them finds, on restart, an incomplete set: after the grace period it kills those that
did start and requeues the job. While an attempt runs, a process that fails (an exit code other
than 0 or REQUEUE_EXIT_CODE, or gone without a trace) gets the others SIGKILLed at once, and
the reason is made durable first (stop_reason "failure"). An ended attempt is recorded in the
same transaction as the state change that ends it. A failed job with restarts left
(`max_restarts`) goes back to the queue with a backoff (`not_before`); a requeue (`gpucluster
requeue`) is a preemption the user asked for.

The head holds the database's lease (store/lease.py) and `run` renews it, every third of its
duration, before a cycle: a cycle runs only after a renewal that succeeded when one was due. A
head that finds the lease taken over (LeaseLost, from a renewal or any write) stops cycling for
good: it reconciles, starts and stops nothing, and says why in its log and /v1/health. While
the database is unreachable (DatabaseUnavailable) the loop retries with a backoff and carries
on by itself when it is back.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from gpucluster.containers import stored_name
from gpucluster.core.admission import admit
from gpucluster.core.cluster_state import ClusterState
from gpucluster.core.elastic import grow
from gpucluster.core.events import PolicyChanged
from gpucluster.core.fairshare import accrue
from gpucluster.core.lifecycle import AttemptResult, Exit, Next, StopReason, Why, after_attempt
from gpucluster.core.limits import within_limits
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.queue_index import highest_queued_class
from gpucluster.core.restarts import RESTART_BACKOFF_S
from gpucluster.core.scheduler import certainly_idle, decide, gc_paused
from gpucluster.core.snapshot import Snapshot, held_back_after
from gpucluster.core.states import JobState
from gpucluster.core.types import JobRequest, Start, Wait
from gpucluster.durations import format_duration
from gpucluster.executors.base import (
    Executor,
    Exited,
    Handle,
    LaunchError,
    LaunchSpec,
    Lost,
    Running,
    Status,
    as_handle,
)
from gpucluster.executors.logfile import read_job_file
from gpucluster.head import latency
from gpucluster.head.accounting import Accountant
from gpucluster.head.attempts import (
    codes_text,
    describe_allocation,
    describe_end,
    exit_of,
    how_ended,
    is_failure,
    newest_entry,
    resources_used,
    stop_reached,
    unit_of,
    work_lost,
)
from gpucluster.head.estimates import EstimateRefresher
from gpucluster.head.gates import Gates
from gpucluster.head.idle_wake import IdleBar, idle_bar, needs_plan
from gpucluster.head.images import ImageSightings
from gpucluster.head.inventory import NodeInventory, stop_jobs_on_lost_nodes
from gpucluster.head.kept_ranks import KeptRanks
from gpucluster.head.launch_specs import launch_spec
from gpucluster.head.node_feed import NodeFeed
from gpucluster.head.paths import DataDir
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.queue_cache import QueueCache
from gpucluster.head.recovery import adopt_launch, requeue_left_preempted
from gpucluster.head.running_cache import CHECK_ATTEMPTS, CHECK_WAIT_S, RunningCache
from gpucluster.head.runtime_model import RuntimeModel
from gpucluster.head.update import same_request
from gpucluster.launch.env import inherited
from gpucluster.models import JobSpec
from gpucluster.store import AttemptRecord, DatabaseUnavailable, DataDirUnwritable, JobRecord, LeaseLost, Store
from gpucluster.store.lease import RENEW_FRACTION
from gpucluster.store.store import overlapped
from gpucluster.store.telemetry import TelemetryStore
from gpucluster.telemetry.loopstats import LoopStats

if TYPE_CHECKING:
    from gpucluster.auth.jobs import JobIdentity

log = logging.getLogger("gpucluster.head")

# Even when nothing seems to change, plan again this often (the safety net for missed events).
REPLAN_EVERY_S = 1.0
# Set (not "0"): every plan first checks the event-fed cluster state against the store (tests;
# `gpucluster up --debug` sets it).
CHECK_STATE_ENV = "GPUCLUSTER_CHECK_STATE"
USAGE_SAVE_EVERY_S = 10.0
# While the database is unreachable, cycles are retried after 0.2 s, doubling up to this.
OUTAGE_RETRY_MAX_S = 2.0
# Restarts after failures back off by core/restarts.py's rule (1 s doubling, at most 5 minutes;
# `gpucluster up --restart-backoff` sets the first wait), the rule the simulator uses too.
_NOT_BEFORE = attrgetter("not_before")
SESSION_NOT_REQUEUED = "ended: an interactive session is not requeued after a preemption; start a new one"


class Head:
    # Leave a cycle's waits to the periodic replan when nothing could start (`_schedule`). Off
    # only in the test that compares such a head with one that plans in full every cycle.
    skip_idle_plans = True

    def __init__(
        self,
        *,
        store: Store,
        executor: Executor,
        data_dir: DataDir,
        clock: Callable[[], float],
        grace_period_s: float | None = None,
        policy: PolicySource | None = None,
        head_url: str = "",
        virtual_gpus: bool = False,
        base_env: Mapping[str, str] | None = None,
        restart_backoff_s: float = RESTART_BACKOFF_S,
        node_addresses: Mapping[str, str] | None = None,
        prices: Mapping[str, float] | None = None,
    ) -> None:
        self.store = store
        self.executor = executor
        # Set by a head shutting down with `--on-shutdown stop`: start nothing while it stops jobs.
        self.hold_starts = False
        self.data_dir = data_dir
        self.clock = clock
        self._grace_override = grace_period_s
        self._planning: tuple[Policy, Policy] | None = None  # (policy, it with the head's grace)
        self.policy_source = policy or PolicySource(None)
        self.head_url = head_url
        self.virtual_gpus = virtual_gpus
        # What every job inherits from the head: an allow-list of the head's environment.
        self.base_env = inherited(os.environ if base_env is None else base_env)
        self.restart_backoff_s = restart_backoff_s
        # Where each node's processes reach rank 0 (MASTER_ADDR); the local executor runs
        # every process on this machine.
        self.node_addresses = dict(node_addresses or {})
        self.wake = threading.Event()
        self.start_lock = threading.Lock()  # a start's read-and-commit vs `gpucluster update`'s commit
        self._stop = threading.Event()
        self.cycles = 0
        # Jobs may be left `preempted` (not yet requeued) by a previous head that died, or by a
        # cycle that failed (a full disk) between the two commits of a preemption.
        self._preempted_left = True
        self._reasons: dict[int, Wait] = {}  # last wait reasons written, to write only changes
        self.queue_order: list[int] = []  # waiting jobs in the order the last plan considered them
        # Job preempted -> the job it was preempted for, while that job is queued: the scheduler
        # considers the victim only after it (Snapshot.preempted_for). In memory only: a new
        # head forgets it, and a victim may then rank ahead once, which quotas bound (README).
        self.preempted_for: dict[int, int] = {}
        # Where container images are, for placement's tie-breaker (head/images.py).
        self.images = ImageSightings()
        self.usage, saved_at = store.load_usage()
        self._usage_at = saved_at if saved_at is not None else clock()
        self._usage_saved_at = self._usage_at
        # The cluster state fed by events (core/cluster_state.py): the queue and its told index,
        # kept from what the loop reads and does (head/queue_cache.py), not re-sorted each cycle,
        # and the running jobs, read back only when the store says a write touched them
        # (head/running_cache.py), not parsed whole each cycle.
        self.cluster = ClusterState()
        self.queue = QueueCache(store, self.cluster)
        self.running = RunningCache(store, self.cluster)
        # Check mode (tests, `gpucluster up --debug`): each plan first compares the state with a
        # fresh build from the store and raises StateMismatch on a difference.
        self.check_state = os.environ.get(CHECK_STATE_ENV, "") not in ("", "0")
        self.gates = Gates(self)  # holds, dependencies, array throttles (issue 20)
        self.limit_waits: dict[int, Wait] = {}  # jobs at their user's limits in the last snapshot (issue 16)
        self.last_snapshot: Snapshot | None = None  # the last admitted snapshot planned on
        self.runtime = RuntimeModel(store)  # run times learned from finished jobs (issue 24)
        # Gittins ranks and their inputs kept across plans, as the simulator keeps them (head/kept_ranks.py).
        self.ranks = KeptRanks(store, self.runtime)
        self.estimates = EstimateRefresher(  # learned start/stop latency and run times
            latency=lambda: latency.from_store(store), runs=self.runtime.runs
        )
        self._capacity_changed = True  # a job ended or nodes changed: the last plan may be stale
        self._free_since: float | None = None  # GPUs free with nothing queued since (elastic growth)
        self._last_plan_at: float | None = None
        self._next_release: float | None = None  # the earliest backoff of a queued job that ends after the last plan
        self.last_decide_s = 0.0
        self.idle_skips = 0  # cycles that planned nothing because nothing could start (`_schedule`)
        # The last such cycle's view, set by the loop's thread and read by the submit writer's:
        # which submissions need a plan before the periodic one (head/idle_wake.py). None: any.
        self.idle_bar: IdleBar | None = None
        self._skipped_change = False  # such a cycle was for a change (the estimates replay for it)
        self.last_cycle_at: float | None = None  # end of the last cycle that succeeded
        self.last_error: str | None = None  # why the last cycle failed, if it did
        self.lease_lost: str | None = None  # why this head stopped for good: another head took the lease
        self.on_lease_lost: Callable[[], None] | None = None  # `gpucluster up`: stop what else writes
        self._lease_renewed_at: float | None = None  # clock() of the last renewal (None: claimed, not renewed)
        self.outage_retry_s = 0.0  # the backoff while the database is unreachable; 0: it is reachable
        self.identity: JobIdentity | None = None  # set by `gpucluster up`: jobs' own tokens, Unix accounts
        self.inventory: NodeInventory | None = None  # set by `gpucluster up --ray`: nodes join and leave
        self.telemetry = TelemetryStore(store)  # drain state (read every plan), samples, health
        # Nodes and drains told to the cluster state as events (head/node_feed.py); the inventory
        # is set after construction (`up --ray`), so its down nodes are asked for at each tell.
        self.node_feed = NodeFeed(store, self.telemetry, self.cluster, self._down_nodes)
        self.stats = LoopStats()  # cycle time and waits, for /metrics
        # GPU time, cost and energy per attempt; budgets and max cost (head/accounting.py)
        self.accounting = Accountant(self, prices)

    @property
    def policy(self) -> Policy:
        return self.policy_source.policy

    @property
    def planning_policy(self) -> Policy:
        """The policy `decide` and the estimates plan with: the policy in force, with the grace
        period this head really gives a stopping job (`up --grace-period` overrides the
        policy's). Planned with the policy's own, a stopping job's GPUs were expected back 30 s
        on when they came back in 2, and reservations and estimates said so."""
        policy = self.policy
        if self._grace_override is None or self._grace_override == policy.preemption.grace_period_s:
            return policy
        if self._planning is None or self._planning[0] is not policy:
            changed = replace(policy.preemption, grace_period_s=self._grace_override)
            self._planning = (policy, replace(policy, preemption=changed))
        return self._planning[1]

    @property
    def grace_period_s(self) -> float:
        return self._grace_override if self._grace_override is not None else self.policy.preemption.grace_period_s

    # ---- one cycle --------------------------------------------------------------------------

    def tick(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        if self.policy_source.maybe_reload(now):
            self.cluster.apply(PolicyChanged(self.policy))
            self._capacity_changed = True
        if self.inventory is not None and self.inventory.refresh(now):
            self._capacity_changed = True
        if self.telemetry.end_drains_due(now):  # drains with a planned end (drain --until) that came
            self._capacity_changed = True
        if self.node_feed.refresh(now):  # nodes or drains changed (by this head or another process)
            self._capacity_changed = True
        if self._preempted_left:
            requeue_left_preempted(self, now)
            self._preempted_left = False
        self.running.refresh(now)  # what was told since (records included): no full read each cycle
        running = self.running.records()
        if self.inventory is not None:
            running = stop_jobs_on_lost_nodes(self, self.inventory, running, now)
        self._accrue_usage(running, now)
        ended = [e for e in (self._reconcile(job, now) for job in running) if e is not None]
        if ended:
            self._finish_all(ended, now)
        self.accounting.step(running, now)
        self._schedule(self.clock())
        self.cycles += 1
        self.stats.cycle(time.perf_counter() - started)

    def _down_nodes(self) -> frozenset[str]:
        return self.inventory.down() if self.inventory is not None else frozenset()

    def submitted(self, specs: Sequence[JobSpec]) -> None:
        """Submissions were committed (head/submit_batcher.py): plan for them now, unless the
        last plan found nothing could start and these cannot change that (head/idle_wake.py);
        the periodic cycle then reads them."""
        if needs_plan(self.idle_bar, specs):
            self.wake.set()

    def nodes_changed(self) -> None:
        """A node was drained, undrained or changed: plan again now."""
        self._capacity_changed = True
        self.wake.set()

    def _accrue_usage(self, running: list[JobRecord], now: float) -> None:
        """Fair-share memory: decay old usage, add the GPU-seconds of running jobs; saved every 10 s."""
        elapsed = now - self._usage_at
        if elapsed <= 0:
            return
        per_team = [(j.team, j.allocation.gpu_count) for j in running if j.allocation is not None]
        self.usage = accrue(self.usage, per_team, elapsed, self.policy.fair_share_half_life_s)
        self._usage_at = now
        if now - self._usage_saved_at >= USAGE_SAVE_EVERY_S:
            self.store.save_usage(self.usage, now)
            self._usage_saved_at = now

    def _reconcile(self, job: JobRecord, now: float) -> tuple[JobRecord, Handle, list[Status]] | None:
        """A running job's check: stops enforced now; an attempt whose every process ended is
        cleaned up and returned, for the caller to record with the cycle's other ends."""
        handle = as_handle(job.launch) if job.launch is not None else adopt_launch(self, job, now)
        if handle is None:
            return None
        statuses = self.executor.poll_ranks(handle)
        if not any(isinstance(s, Running) for s in statuses):
            self.executor.cleanup(handle)
            image = stored_name(job.spec.image) if job.spec.image else None
            if image and job.allocation is not None and not any(isinstance(s, Exited) and s.final for s in statuses):
                # It had its image (a pull that failed is `final`): placement may prefer these nodes.
                self.images.seen(image, {s.node for s in job.allocation.slices})
            return job, handle, statuses
        if not self._stop_on_rank_failure(job, handle, statuses, now):
            self._enforce_stop(job, handle, now)
        return None

    def _stop_on_rank_failure(self, job: JobRecord, handle: Handle, statuses: list[Status], now: float) -> bool:
        """One process of a multi-process attempt failed: SIGKILL the others now. True if so.

        Not while a stop the head asked for (requeue, preemption, cancel, time limit, policy) is
        under way: its SIGTERM makes ranks exit 143 or by the signal, the normal end, while
        another rank (often rank 0 alone) may still be saving. The head's intent judges that
        attempt, and every rank gets the whole grace period before the SIGKILL (`_enforce_stop`).
        """
        if "ranks" not in handle or job.kill_sent:
            return False
        if job.term_sent and job.stop_reason not in (None, StopReason.FAILURE):
            return False
        failed = next(((r, s) for r, s in enumerate(statuses) if is_failure(s)), None)
        if failed is None:
            return False
        message = f"{unit_of(job)} {failed[0]} {how_ended(failed[1])}" + self._error_of(job, failed[0])
        # Durable before the kill, so the outcome names the rank that failed even if the head
        # dies now; a stop already under way (a preemption, a cancel) keeps its own outcome.
        if self.store.request_stop(job.id, StopReason.FAILURE, now, message=message, failed_rank=failed[0]):
            log.info("job %s: %s; stopping the other processes", job.id, message)
        self.executor.signal(handle, signal.SIGKILL)
        self.store.update_job(job.id, JobState.RUNNING, term_sent=True, kill_sent=True)
        return True

    def _error_of(self, job: JobRecord, rank: int) -> str:
        """': <error>' from a failed rank's error file (TORCHELASTIC_ERROR_FILE: torch's `@record`
        and gpucluster.train write the exception that ended it), or '' when it left none."""
        if not job.spec.per_gpu:
            return ""
        raw = read_job_file(self.data_dir.log(job.id, job.attempt, rank).parent / "error.json")
        if not raw:
            return ""
        try:
            message = json.loads(raw)["message"]
            text = message["message"] if isinstance(message, dict) else message
        except (ValueError, KeyError, TypeError):
            return ""
        line = " ".join(str(text).split())
        return f": {line[:300]}" if line else ""

    def _enforce_stop(self, job: JobRecord, handle: Handle, now: float) -> None:
        limit = job.spec.time_limit
        assert job.started_at is not None
        if job.stop_reason is None and isinstance(limit, float) and now - job.started_at >= limit:
            self.store.request_stop(job.id, StopReason.TIME_LIMIT, now)
            job = self._reload(job)
        if job.stop_reason is None or job.stop_requested_at is None:
            return
        if not job.term_sent:
            self.executor.signal(handle, signal.SIGTERM)
            self.store.update_job(job.id, JobState.RUNNING, term_sent=True)
        elif not job.kill_sent and now - job.stop_requested_at >= self.grace_period_s:
            self.executor.signal(handle, signal.SIGKILL)
            self.store.update_job(job.id, JobState.RUNNING, kill_sent=True)

    def _reload(self, job: JobRecord) -> JobRecord:
        fresh = self.store.get_job(job.id)
        assert fresh is not None
        return fresh

    def _finish_all(self, ended: list[tuple[JobRecord, Handle, list[Status]]], now: float) -> None:
        """The ends of a cycle in one transaction, not one each (issue 18: the head's CPU per
        job); nothing in `_finish` acts outside the store on what it writes. Each job's record
        as the store has it in that transaction: the running record may predate a stop another
        thread asked for since (its reason, message and failed rank decide how the attempt
        ended). The kept record where nothing wrote to the job since (`RunningCache.unchanged`),
        the others read again, in one query."""
        with self.store.batch():
            ids = [job.id for job, _, _ in ended]
            kept = self.running.unchanged(ids)
            fresh = self._read_in_batch([i for i in ids if i not in kept]) if len(kept) < len(ids) else {}
            for job, handle, statuses in ended:
                record = kept.get(job.id) or fresh.get(job.id) or self._reload(job)
                self._finish(record, handle, statuses, now)

    def _finish(self, job: JobRecord, handle: Handle, statuses: list[Status], now: float) -> None:
        """Every process of the attempt has ended: what happens next is the lifecycle's
        (core/lifecycle.py); this applies it to the store and says it in the job's events.
        `job`: its record as it is now, read in the cycle's transaction of ends."""
        self._capacity_changed = True
        if job.kill_sent:  # a process that vanished after our SIGKILL was killed by it
            statuses = [Exited(128 + signal.SIGKILL, signal.SIGKILL) if isinstance(s, Lost) else s for s in statuses]
        stop = StopReason(job.stop_reason) if job.stop_reason is not None else None
        codes = tuple(s.exit_code if isinstance(s, Exited) else None for s in statuses)
        # The rank that failed first, recorded when it did (the others were killed after it).
        told = job.failed_rank if stop in (StopReason.FAILURE, StopReason.CANCEL) else None
        if told is not None and not 0 <= told < len(statuses):
            told = None
        bad = told if told is not None else next((r for r, s in enumerate(statuses) if is_failure(s)), None)
        first_bad = statuses[bad] if bad is not None else None
        # An executor's word that no restart would help (an image that cannot be pulled).
        final = any(isinstance(s, Exited) and s.final for s in statuses)
        after = after_attempt(
            stop,
            exit_of(codes, first_bad, final),
            signalled=stop_reached(job.term_sent, statuses),
            restarts=job.restarts,
            max_restarts=job.spec.max_restarts,
            first_backoff_s=self.restart_backoff_s,
        )
        if after.why is Why.PREEMPTED:
            self._requeue_preempted(job, statuses, now, after)
            return
        if after.why is Why.ASKED_REQUEUE:
            # It checkpointed and asked to run again without being asked to stop (someone
            # else sent SIGTERM): requeued like a preemption, after a backoff.
            self._requeue_preempted(job, statuses, now, after, message="the job asked to be requeued")
            return
        multi = "ranks" in handle
        status = first_bad or statuses[0]
        code = status.exit_code if isinstance(status, Exited) else None
        how = describe_end(statuses, unit_of(job)) if multi else how_ended(status)
        if multi and bad is not None and stop is None:  # all ended at once: say why
            how += self._error_of(job, bad)
        ended = self._ended_attempt(job, now, codes, statuses)
        if after.why is Why.CANCELLED:
            if told is not None and job.stop_message:
                how = job.stop_message  # cancelled while a failed rank was being handled
            reason = f"cancelled by user ({how})" if code is not None else "cancelled by user"
        elif after.why is Why.TIME_LIMIT:
            limit = format_duration(float(job.spec.time_limit or 0))
            reason = f"time limit {limit} exceeded ({how})" if code is not None else f"time limit {limit} exceeded"
        elif after.why is Why.POLICY:  # telemetry (over its memory share, idle) or accounting
            what = job.stop_message or "stopped by policy"
            reason = f"{what} ({how})" if code is not None else what
        elif after.why is Why.SUCCEEDED:
            reason = how
        else:
            if stop is StopReason.FAILURE and job.stop_message:
                how = job.stop_message  # the process that failed first, not those killed after
            elif isinstance(status, Lost) and not multi:
                how = f"process lost: {status.reason}"
            self._fail_or_restart(job, how, code, ended, now, after)
            return
        self.store.transition(
            job.id,
            after.state,
            now,
            reason,
            expect=[JobState.RUNNING],
            ended_attempt=ended(after.attempt.value, reason),
            exit_code=code,
        )

    def _fail_or_restart(
        self,
        job: JobRecord,
        how: str,
        code: int | None,
        ended: Callable[[str, str], AttemptRecord],
        now: float,
        after: Next,
    ) -> None:
        """A failed attempt: back to the queue after a backoff while restarts are left, else failed
        (at once for a failure no restart would help: an image that cannot be pulled). `after` is
        the lifecycle's answer."""
        limit = job.spec.max_restarts
        if not after.requeued:
            reason = how if after.why is Why.FAILED else f"{how}; no restarts left ({job.restarts} of {limit} used)"
            self.store.transition(
                job.id,
                after.state,
                now,
                reason,
                expect=[JobState.RUNNING],
                ended_attempt=ended(after.attempt.value, how),
                exit_code=code,
            )
            return
        n, delay = after.restart, after.backoff_s
        # Read whole next cycle whatever the outcome: a commit whose answer the database lost
        # (it went away) may have written the row, its id below what the queue has read.
        self.queue.invalidate()
        if self.store.transition(
            job.id,
            after.state,
            now,
            f"{how}; restart {n} of {limit} in {format_duration(delay)}",
            expect=[JobState.RUNNING],
            ended_attempt=ended(after.attempt.value, how),
            exit_code=code,
            restarts=n,
            queued_at=now,
            not_before=now + delay,
            **_REQUEUED,
        ):
            log.info("job %s: %s; restart %s of %s in %.0f s", job.id, how, n, limit, delay)

    def _requeue_preempted(
        self, job: JobRecord, statuses: list[Status], now: float, after: Next, message: str | None = None
    ) -> None:
        """`preempted`, then straight back to `queued`: same id, next start is a new attempt.

        Two writes, in the transaction of the cycle's ends (`tick`): a head that dies there
        leaves neither, and the next one ends the attempt again. A job left `preempted` (by a
        head that committed each write alone, or a failed requeue) is requeued by the next
        head's first cycle (or the next cycle: `requeue_left_preempted`), its backoff kept in
        not_before.
        """
        codes = tuple(s.exit_code if isinstance(s, Exited) else None for s in statuses)
        how = codes_text(codes, unit_of(job))
        message = (message or job.stop_message or "preempted") + (f" ({how})" if how else "")
        ended = self._ended_attempt(job, now, codes, statuses)
        not_before = now + after.backoff_s if after.backoff_s else None
        if self.store.transition(
            job.id,
            JobState.PREEMPTED,
            now,
            message,
            expect=[JobState.RUNNING],
            ended_attempt=ended(after.attempt.value, message),
            not_before=not_before,
        ):
            self._requeue_after_preemption(job.id, now, not_before)

    def _requeue_after_preemption(self, job_id: int, now: float, not_before: float | None) -> None:
        job = self.store.get_job(job_id)
        if job is not None and job.spec.interactive:
            # A session is not requeued: it would start again as a fresh shell, later, with nobody
            # at its terminal, and hold GPUs for no one. Its owner starts a new one.
            self.store.transition(job_id, JobState.CANCELLED, now, SESSION_NOT_REQUEUED, expect=[JobState.PREEMPTED])
            return
        self.queue.invalidate()  # before: a commit whose answer was lost may have requeued it (_fail_or_restart)
        self.store.transition(
            job_id,
            JobState.QUEUED,
            now,
            "requeued after preemption",
            expect=[JobState.PREEMPTED],
            queued_at=now,
            not_before=not_before,
            **_REQUEUED,
        )

    def _ended_attempt(
        self, job: JobRecord, now: float, codes: tuple[int | None, ...], statuses: list[Status]
    ) -> Callable[[str, str], AttemptRecord]:
        used = resources_used(statuses)
        return lambda outcome, reason: replace(self._attempt_record(job, now, outcome, reason, codes), **used)

    def _attempt_record(
        self, job: JobRecord, now: float, outcome: str, reason: str, codes: tuple[int | None, ...]
    ) -> AttemptRecord:
        lost = None
        if AttemptResult(outcome).loses_work:
            lost = work_lost(job, now, newest_entry(self.data_dir.checkpoints(job.id)))
        return AttemptRecord(
            job_id=job.id,
            attempt=job.attempt,
            started_at=job.started_at,
            ended_at=now,
            allocation=job.allocation,
            outcome=outcome,
            reason=reason,
            exit_codes=codes,
            work_lost_s=lost,
        )

    # ---- scheduling -------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The snapshot to plan on, admitted (core/admission.py): no new jobs on drained or down
        nodes, none of a team over budget. The head plans on it after admission (its estimates
        and elastic growth read the same view); `decide` would admit a raw one the same way.
        Its queue is the eligible one (core/eligibility.py via head/gates.py): no job held by its
        user, waiting on a dependency or over its array's throttle; nor one beyond its user's limits
        (core/limits.py), whose waits are kept in `limit_waits` to be recorded with the plan's."""
        self.running.refresh(self.clock())  # what the store told of since (starts, stops, ends)
        self.node_feed.refresh(self.clock())  # nodes and drains, told to the state (head/node_feed.py)
        nodes = self.node_feed.nodes
        every = self.queue.requests()
        queued = self.gates.eligible(every, self.clock(), len(self.cluster.gated))  # not held, blocked or throttled
        self.accounting.note_holds(queued)  # the held jobs' reasons, in `why` and the queue
        if self.preempted_for:  # forget preemptors that started or left the queue
            ids = {r.job_id for r in queued if r.team not in self.accounting.held}
            self.preempted_for = {v: p for v, p in self.preempted_for.items() if p in ids}
        ordering = self.policy.ordering
        running = self.running.jobs()  # the state's running jobs, in id order
        snap = Snapshot(
            nodes=nodes,
            running=running,
            queued=queued,
            usage=dict(self.usage),
            # The state's told index (core/cluster_state.py), as the simulator's: its starts, ends
            # and stops are the events that keep `running` above, so a plan applies those rather
            # than comparing every running job with the last plan's (O(running jobs) a plan).
            # Checked by count: a running set of another size falls back to that comparison.
            capacity=self.cluster.capacity,
            # The told index holds every queued job: with some kept back, the cycle sorts the
            # eligible ones itself, as admission and limits do for theirs. Handed the index, it
            # was diffed down to them, and a later cycle whose eligible count matched it (a job
            # submitted meanwhile, blocked) planned on the wrong jobs: a job after an array
            # started after its first element.
            queue_index=self.cluster.queue_index if len(queued) == len(every) else None,
            preempted_for=dict(self.preempted_for),
            drained=self.node_feed.drained,
            holds=dict(self.cluster.holds),  # budget holds, told by head/accounting.py
            drains=dict(self.cluster.drains),
            images=self.images.by_image(),
            # Only an attained-service ordering reads it (core/attained.py): no query otherwise.
            attained=self.ranks.attained(ordering),
            # Only `runtime_model: gittins` reads it (core/gittins.py): learned run times, and
            # the ranks kept across plans (core/rank_book.py), both kept as the simulator keeps them.
            runtime_dist=(
                self.runtime.distributions(queued, nodes, self.clock(), ordering.relearn_every_s)
                if ordering.gittins
                else {}
            ),
            rank_book=self.ranks.book_for(ordering),
            # ... and its running jobs by class, kept from the same events (the LAS victim pool's).
            running_by_class=self.cluster.running_by_class(running),
        )
        admitted, self.limit_waits = within_limits(admit(snap)[0], self.policy, self.clock())
        return admitted

    def _schedule(self, now: float) -> None:
        if self.hold_starts:
            return
        self.running.refresh(now)  # first: an end read after its requeue would unqueue it
        queue_changed = self.queue.refresh(now)
        if self.check_state:
            queue_changed = self._check_state(now) or queue_changed
        due = self._last_plan_at is None or now - self._last_plan_at >= REPLAN_EVERY_S
        # A backoff that ends is an event, as in the simulator: the job may start at that very
        # instant, not at the next periodic replan.
        released = self._next_release is not None and now >= self._next_release
        changed = queue_changed or self._capacity_changed or released
        # A change whose estimates the replay's throttle held back: plan once it allows them.
        if not (changed or due or self.estimates.pending(now)):
            return  # nothing a new plan could differ on
        self._capacity_changed = False
        snap = self.snapshot()
        # What `submit --dry-run` plans on, on API threads (head/dry_run.py): without what the loop keeps writing.
        self.last_snapshot = self.ranks.for_other_threads(snap)
        # Over every queued job at each plan, so at C speed: `filter` drops None (most have no
        # backoff), then keeps the times after now (a generator here cost 30 ms at 100,000).
        after = float(now).__lt__  # float: an int's __lt__ answers NotImplemented (truthy) to a float
        self._next_release = min(filter(after, filter(None, map(_NOT_BEFORE, snap.queued))), default=None)
        self._grow_elastic(snap, now)
        idle = self.skip_idle_plans and snap.queued and not (due or released)
        self.idle_bar = None  # planned below, or skipped with a new bar
        if idle and certainly_idle(snap, self.planning_policy, now):
            # Every GPU busy and no one to preempt: the plan would start and stop nothing, so
            # only the waits (positions, estimates) would change. They wait for the periodic
            # replan, at most REPLAN_EVERY_S after the last full one (the same staleness the
            # estimates' throttle allows); a new job meanwhile has no wait recorded yet. Why:
            # while submissions streamed in, these cycles were a third of the head's CPU.
            self.idle_skips += 1
            self._skipped_change = self._skipped_change or changed  # the replan plans for it
            if snap.capacity is not None:  # submissions like these queued need not wake the loop
                self.idle_bar = idle_bar(
                    snap.capacity.current(snap.nodes, snap.running),
                    highest_queued_class(snap.queued, snap.queue_index),
                )
            return
        self._last_plan_at = now
        changed, self._skipped_change = changed or self._skipped_change, False
        if not snap.queued:
            self.queue_order = []
            self._record_waits({**self.gates.waits, **self.limit_waits})
            return
        started = time.perf_counter()
        # The collector paused for the cycle, by the loop's choice (decide never touches it):
        # its passes over a 100,000-job snapshot made a cycle at 10,000 nodes 1.6x slower
        # (bench/bench_core_cycle.py); the API threads only miss cyclic collection for it.
        with gc_paused():
            plan = decide(snap, self.planning_policy, now)
        self.last_decide_s = time.perf_counter() - started
        if self.check_state:  # the kept ranks and distributions against a whole working-out
            self.ranks.check(snap, self.planning_policy.ordering, now, self.node_feed.nodes)
        stopped = []
        for p in plan.preemptions:
            if self.store.request_stop(p.job_id, StopReason.PREEMPT, now, message=p.reason):
                log.info("job %s: %s", p.job_id, p.reason)
                stopped.append(p.job_id)
                self.wake.set()
        # The started jobs' requests, looked up before their starts take them out of the queue
        # (not found by a pass over the 100,000 queued after).
        starting = [r for r in map(self.cluster.queued.get, (s.job_id for s in plan.starts)) if r is not None]
        if plan.starts:
            self._start_all(plan.starts, now)
        if plan.starts and self.gates.awaits_start:
            self._capacity_changed = True  # a job waiting for one of these to start may go now
        # a preemptor that starts holds nothing back any more
        self.preempted_for = held_back_after(self.preempted_for, plan, stopped)
        if plan.starts:
            self._observe_waits(starting, now)
        self.queue_order = list(plan.waiting)
        # every job's estimated start, replayed soon after a change (head/estimates.py)
        waiting = self.estimates.waits(snap, self.planning_policy, now, plan, changed=changed)
        self._record_waits({**waiting, **self.gates.waits, **self.limit_waits})

    def _check_state(self, now: float) -> bool:
        """Check mode: the queue, running jobs, nodes and drains fed by events equal a fresh read
        of the store.
        Another thread (an API submit or cancel) may commit between the two reads, so a difference is read
        again, after what was told meanwhile, before it is called a mismatch: once, or while
        writes that may change a running job keep overlapping the reads (`store.overlapped`, up
        to CHECK_ATTEMPTS times). True if a second read changed the queue."""
        changed = False
        for attempt in range(CHECK_ATTEMPTS):
            before = self.store.running_changes()
            self.running.refresh(now)  # what other threads told of, before the fresh read
            # Up to the last id the queue read: a later submission is the next read's (read_so_far).
            nodes, drains = self.node_feed.fresh()
            fresh = ClusterState.build(
                queued=self.queue.read_so_far(self.store.queued_requests()),
                running=self.store.running_jobs(),
                nodes=nodes,
                drains=drains,
                holds=dict(self.accounting.held),  # what the budgets say now (not a store read)
            )
            self.queue.requests()  # applies removals told from other threads
            if not self.cluster.differences(fresh):
                break
            if attempt == CHECK_ATTEMPTS - 1 or (attempt and not overlapped(before, self.store.running_changes())):
                self.cluster.check(fresh, "the head's cluster state")  # StateMismatch, naming each difference
            changed = self.queue.refresh(now) or changed
            self.node_feed.refresh(now, recheck=True)
            self.store.wait_running_changes_told(CHECK_WAIT_S)
        self.running.check_records(now)
        return changed

    def _record_waits(self, waiting: dict[int, Wait]) -> None:
        """Write the waits that changed since the last ones written. Identity first: the
        estimates give an equal wait as the same object from cycle to cycle
        (head/estimates.py), so the value comparison runs only for the few that are not."""
        last = self._reasons.get
        changed = {k: v for k, v in waiting.items() if (old := last(k)) is not v and old != v}
        self.store.set_wait_reasons(changed)
        self._reasons = waiting

    def _grow_elastic(self, snap: Snapshot, now: float) -> None:
        """Grow a running elastic job below its maximum once GPUs have stayed free, with nothing
        queued, long enough (core/elastic.py): checkpoint-and-restart, like a requeue, at the
        larger size. `_free_since` is when that became true without a break."""
        growable = any(
            r.max_gpus is not None and not r.stopping and r.allocation.gpu_count < r.max_gpus for r in snap.running
        )
        waiting = any(j.not_before is None or j.not_before <= now for j in snap.queued)
        if not growable or waiting or not self.policy.elastic.enabled:
            self._free_since = None
            return
        capacity = Capacity(snap.nodes, snap.running)
        if not any(capacity.free_count(m) for m in {g.model for n in snap.nodes for g in n.gpus}):
            self._free_since = None
            return
        if self._free_since is None:
            self._free_since = now
        for resize in grow(snap, self.policy, now, self._free_since):
            if self.store.request_stop(resize.job_id, "preempt", now, message=resize.reason):
                log.info("job %s: %s", resize.job_id, resize.reason)
                self._free_since = None  # the next growth waits for GPUs to stay free again
                self.wake.set()

    def _observe_waits(self, started: Sequence[JobRequest], now: float) -> None:
        for r in started:
            self.stats.started(r.team, r.priority.label, now - (r.queued_at or r.submitted_at))

    def _start_all(self, starts: Sequence[Start], now: float) -> None:
        """Start a plan's jobs: every start committed (`running`, its allocation) in one
        transaction, then each launched, then every launch recorded in a second one.

        Two commits a cycle, not two a job (issue 18: the head's CPU per job). Crash safety is
        the one-job order's: an allocation is durable before its launch, so a head that dies
        mid-way never launches a job the store does not show running; one that dies after a
        launch and before its record finds the job by its shim's files (adopt_launch), as it
        did between one job's launch and record. Under the lock `gpucluster update` takes for
        its commit (head/service.py): a job changed after this cycle's snapshot is not started
        on a plan made for its old request."""
        committed: list[tuple[JobRecord, LaunchSpec | LaunchError | OSError]] | None = None
        try:
            planned = [(s, self.queue.started(s.job_id, s.allocation, now)) for s in starts]
            with self.start_lock:
                with self.store.batch():
                    jobs = self._read_in_batch([s.job_id for s in starts])
                    tried = (self._commit_start(s, p, jobs.get(s.job_id), now) for s, p in planned)
                    committed = [c for c in tried if c is not None]
                self._launch_all(committed)
        except BaseException:
            if committed is None:
                # Told as started, but the starts did not commit (the database went away): the
                # queue is read whole next cycle, so the jobs are planned again, not lost for
                # until the next full reload (check mode caught that after a PostgreSQL restart).
                self.queue.invalidate()
            raise
        finally:
            # Told as started (by the queue); read back, as the store has them, whether the
            # starts committed or not (a start that found its job changed or gone writes nothing).
            for s in starts:
                self.running.told(s.job_id)

    def _launch_all(self, committed: list[tuple[JobRecord, LaunchSpec | LaunchError | OSError]]) -> None:
        """Launch committed starts, then record every launch in one transaction: what did
        launch is recorded even if a later launch raised."""
        launched: list[tuple[JobRecord, Handle | LaunchError | OSError]] = []
        try:
            for job, spec in committed:
                launched.append((job, self._launch(spec)))
        finally:
            with self.store.batch():
                for job, outcome in launched:
                    self._record_launch(job, outcome)

    def _read_in_batch(self, job_ids: list[int]) -> dict[int, JobRecord]:
        """The records of a cycle's starting (or ending) jobs, in one query, not one per job
        (issue 18: the head's CPU per job). Read inside the cycle's `Store.batch()`, which holds
        the store's write lock: no other writer can commit between this read and the block's
        writes, so each record is as fresh as a read of its own just before its write, and the
        block's own writes touch no other job of the list."""
        return {j.id: j for j in self.store.list_jobs(ids=job_ids)}

    def _commit_start(
        self, start: Start, planned: JobRequest | None, job: JobRecord | None, now: float
    ) -> tuple[JobRecord, LaunchSpec | LaunchError | OSError] | None:
        """One start's commit, in `_start_all`'s transaction: the job as committed and its launch
        spec (or why there is none), or None if the job may not start after all (`planned`: the
        request it was planned on, as the queue had it; `job`: its record, read in the
        transaction, None if it is gone)."""
        if job is None or job.state is not JobState.QUEUED:
            return None
        if planned is not None and not same_request(planned, job.request()):
            self.queue.invalidate()  # changed since the snapshot: planned again next cycle
            self._capacity_changed = True
            return None
        started: dict[str, Any] = {
            "allocation": start.allocation,
            "attempt": job.attempt + 1,
            "started_at": now,
            "launch": None,
            "stop_reason": None,
            "stop_requested_at": None,
            "stop_message": None,
            "failed_rank": None,
            "term_sent": False,
            "kill_sent": False,
            "not_before": None,
        }
        # The record as it will be committed, made here rather than read back, and the launch
        # spec made from it before the commit (it reads the store: the Unix account the job runs
        # as, an array element's values): a database that goes away right after the commit must
        # not stop the launch, or the committed attempt would wait out LAUNCH_GRACE_S and be
        # requeued as a second attempt of a job that never ran.
        job = replace(job, state=JobState.RUNNING, **started)
        spec: LaunchSpec | LaunchError | OSError
        try:
            spec = self._launch_spec(job)
        except (LaunchError, OSError) as e:
            spec = e  # recorded as the attempt's end once the start is committed
        ok = self.store.transition(
            job.id,
            JobState.RUNNING,
            now,
            f"started on {describe_allocation(start.allocation)}",
            expect=[JobState.QUEUED],
            **started,
        )
        return (job, spec) if ok else None  # not ok: cancelled between snapshot and start

    def _launch(self, spec: LaunchSpec | LaunchError | OSError) -> Handle | LaunchError | OSError:
        """A committed start's launch: its handle, or why it could not start."""
        if not isinstance(spec, LaunchSpec):
            return spec
        try:
            return self.executor.launch(spec)
        except (LaunchError, OSError) as e:
            return e

    def _record_launch(self, job: JobRecord, outcome: Handle | LaunchError | OSError) -> None:
        """A launch's record: its handle, or the attempt's end when it could not start."""
        if not isinstance(outcome, BaseException):
            self.store.update_job(job.id, JobState.RUNNING, launch=outcome)
            return
        reason = f"could not start: {outcome}"
        after = after_attempt(None, Exit.LAUNCH_ERROR)
        self.store.transition(
            job.id,
            after.state,
            self.clock(),
            reason,
            expect=[JobState.RUNNING],
            ended_attempt=self._attempt_record(job, self.clock(), after.attempt.value, reason, ()),
        )

    def _launch_spec(self, job: JobRecord) -> LaunchSpec:
        return launch_spec(self, job)

    # ---- lifecycle --------------------------------------------------------------------------

    def request_stop(self, job_id: int, reason: str, message: str | None = None) -> bool:
        """Ask the loop to stop a running job (SIGTERM now, SIGKILL after the grace period).

        False if the job is not running or another stop is already under way.
        """
        ok = self.store.request_stop(job_id, reason, self.clock(), message=message)
        self.wake.set()
        return ok

    def run(self, interval_s: float = 0.1, batch_s: float = 0.01) -> None:
        """Cycle every `interval_s`, or sooner when woken.

        Wake-ups during the pause after a cycle share the next one, so a burst of submissions
        costs a few cycles, not one each. The pause is at least `batch_s` and grows with the cost
        of the last decision (x4), so planning a long queue never takes more than ~20% of the
        interpreter away from the API.
        """
        while not self._stop.is_set():
            if self.lease_lost is not None:
                self._stop.wait()  # for good: this head changes nothing any more
                continue
            try:
                self._keep_lease()
                self.tick()
            except LeaseLost as e:
                self._lose_lease(str(e))
                continue
            except DatabaseUnavailable as e:  # the store logs it once; retried after a backoff
                self._preempted_left = True
                self.last_error = str(e)
                self.outage_retry_s = min(max(0.2, 2 * self.outage_retry_s), OUTAGE_RETRY_MAX_S)
                self._stop.wait(self.outage_retry_s)
                continue
            except DataDirUnwritable as e:  # said once per change, not a stack trace every cycle
                self._preempted_left = True
                if self.last_error != str(e):
                    log.error("head cycle failed: %s; retrying", e)
                self.last_error = str(e)
            except Exception as e:  # keep the head alive; the store is the truth and the next tick retries
                self._preempted_left = True
                log.exception("head cycle failed; retrying")
                self.last_error = f"{type(e).__name__}: {e}"
            else:
                if self.outage_retry_s:
                    log.info("head: the database is back; scheduling resumed")
                self.outage_retry_s = 0.0
                self.last_error = None
                self.last_cycle_at = self.clock()
            self._stop.wait(max(batch_s, 4 * self.last_decide_s))
            self.wake.wait(interval_s)
            self.wake.clear()

    def _keep_lease(self) -> None:
        """Renew the database's lease when a third of it has passed since the last renewal."""
        lease = self.store.lease
        if lease is None:
            return  # no lease claimed (tests, tools): nothing to keep
        now = self.clock()
        if self._lease_renewed_at is not None and now - self._lease_renewed_at < lease.duration_s / RENEW_FRACTION:
            return
        self.store.renew()
        self._lease_renewed_at = now

    def _lose_lease(self, why: str) -> None:
        """Another head took the lease over: stop for good, touching no job (they are its now)."""
        self.lease_lost = why
        self.last_error = why
        log.error("head stopped scheduling: %s", why)
        if self.on_lease_lost is not None:
            try:
                self.on_lease_lost()
            except Exception:
                log.exception("stopping after the lease was lost failed")

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()


# Fields reset when a job goes back to the queue.
_REQUEUED: dict[str, Any] = {
    "allocation": None,
    "launch": None,
    "stop_reason": None,
    "stop_requested_at": None,
    "stop_message": None,
    "failed_rank": None,
    "term_sent": False,
    "kill_sent": False,
}
