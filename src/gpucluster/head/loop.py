"""The head loop: reconcile running jobs, then snapshot -> decide -> commit -> launch.

Order matters for crash safety. An allocation is committed (state `running`, attempt n) before
the process is launched, and the launch handle is committed after; a head that dies in between
finds, on restart, either the shim's own pid file (the job started: adopt it) or nothing after a
grace period (it never started: back to the queue). A job can therefore never run twice at once,
and a running job is never forgotten. Time is injected (`clock`) so tests drive it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

from gpucluster.core.fairshare import accrue
from gpucluster.core.policy import Policy
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.states import JobState
from gpucluster.core.types import Node, Wait
from gpucluster.durations import format_duration
from gpucluster.executors.base import Executor, Exited, LaunchError, LaunchSpec, Lost, Status
from gpucluster.head.paths import DataDir
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.queue_cache import QueueCache
from gpucluster.launch.env import job_env
from gpucluster.store import JobRecord, Store

log = logging.getLogger("gpucluster.head")

# A running job with no recorded launch and no shim pid file after this long never started.
LAUNCH_GRACE_S = 10.0
# Even when nothing seems to change, plan again this often (the safety net for missed events).
REPLAN_EVERY_S = 1.0
USAGE_SAVE_EVERY_S = 10.0


class Head:
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
    ) -> None:
        self.store = store
        self.executor = executor
        self.data_dir = data_dir
        self.clock = clock
        self._grace_override = grace_period_s
        self.policy_source = policy or PolicySource(None)
        self.head_url = head_url
        self.virtual_gpus = virtual_gpus
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.wake = threading.Event()
        self._stop = threading.Event()
        self.cycles = 0
        self._reasons: dict[int, Wait] = {}  # last wait reasons written, to write only changes
        self.queue_order: list[int] = []  # waiting jobs in the order the last plan considered them
        self.usage, saved_at = store.load_usage()
        self._usage_at = saved_at if saved_at is not None else clock()
        self._usage_saved_at = self._usage_at
        self.queue = QueueCache(store)
        self._capacity_changed = True  # a job ended or nodes changed: the last plan may be stale
        self._last_plan_at: float | None = None
        self.last_decide_s = 0.0
        self.last_cycle_at: float | None = None  # end of the last cycle that succeeded
        self.last_error: str | None = None  # why the last cycle failed, if it did

    @property
    def policy(self) -> Policy:
        return self.policy_source.policy

    @property
    def grace_period_s(self) -> float:
        return self._grace_override if self._grace_override is not None else self.policy.preemption.grace_period_s

    # ---- one cycle --------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        if self.policy_source.maybe_reload(now):
            self._capacity_changed = True
        running = self.store.list_jobs(states=[JobState.RUNNING])
        self._accrue_usage(running, now)
        for job in running:
            self._reconcile(job, now)
        self._schedule(self.clock())
        self.cycles += 1

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

    def _reconcile(self, job: JobRecord, now: float) -> None:
        handle = job.launch
        if handle is None:
            handle = self.executor.recover(self.data_dir.attempt_dir(job.id, job.attempt))
            if handle is None:
                if job.started_at is not None and now - job.started_at > LAUNCH_GRACE_S:
                    self.queue.invalidate()
                    self._capacity_changed = True
                    self.store.transition(
                        job.id,
                        JobState.QUEUED,
                        now,
                        "requeued: the head stopped before the process was launched",
                        expect=[JobState.RUNNING],
                        queued_at=now,
                        allocation=None,
                        started_at=None,
                    )
                return
            self.store.update_job(job.id, JobState.RUNNING, launch=handle)
        status = self.executor.poll(handle)
        if isinstance(status, Exited | Lost):
            self.executor.cleanup(handle)
            self._finish(job, status, now)
            return
        self._enforce_stop(job, handle, now)

    def _enforce_stop(self, job: JobRecord, handle: dict[str, object], now: float) -> None:
        limit = job.spec.time_limit
        assert job.started_at is not None
        if job.stop_reason is None and isinstance(limit, float) and now - job.started_at >= limit:
            self.store.request_stop(job.id, "time_limit", now)
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

    def _finish(self, job: JobRecord, status: Status, now: float) -> None:
        self._capacity_changed = True
        job = self._reload(job)
        if job.stop_reason == "preempt":
            self._requeue_preempted(job, status, now)
            return
        code: int | None = None
        if isinstance(status, Lost) and job.kill_sent:
            status = Exited(128 + signal.SIGKILL, signal.SIGKILL)
        if isinstance(status, Exited):
            code = status.exit_code
            how = f"killed by {signal.Signals(status.signal).name}" if status.signal else f"exit code {code}"
        if job.stop_reason == "cancel":
            state, reason = (
                JobState.CANCELLED,
                f"cancelled by user ({how})" if code is not None else "cancelled by user",
            )
        elif job.stop_reason == "time_limit":
            limit = format_duration(float(job.spec.time_limit or 0))
            state, reason = (
                JobState.FAILED,
                f"time limit {limit} exceeded ({how})" if code is not None else f"time limit {limit} exceeded",
            )
        elif isinstance(status, Lost):
            state, reason = JobState.FAILED, f"process lost: {status.reason}"
        elif code == 0:
            state, reason = JobState.SUCCEEDED, "exit code 0"
        else:
            state, reason = JobState.FAILED, how
        self.store.transition(job.id, state, now, reason, expect=[JobState.RUNNING], exit_code=code)

    def _requeue_preempted(self, job: JobRecord, status: Status, now: float) -> None:
        """`preempted`, then straight back to `queued`: same id, next start is a new attempt."""
        how = f" (exit code {status.exit_code})" if isinstance(status, Exited) else ""
        message = (job.stop_message or "preempted") + how
        if self.store.transition(job.id, JobState.PREEMPTED, now, message, expect=[JobState.RUNNING]):
            self.store.transition(
                job.id,
                JobState.QUEUED,
                now,
                "requeued after preemption",
                expect=[JobState.PREEMPTED],
                queued_at=now,
                allocation=None,
                launch=None,
                stop_reason=None,
                stop_requested_at=None,
                stop_message=None,
                term_sent=False,
                kill_sent=False,
            )
            self.queue.invalidate()

    # ---- scheduling -------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        nodes: tuple[Node, ...] = tuple(r.node for r in self.store.nodes())
        return Snapshot(
            nodes=nodes, running=tuple(self.store.running_jobs()), queued=self.queue.requests(), usage=dict(self.usage)
        )

    def _schedule(self, now: float) -> None:
        queue_changed = self.queue.refresh(now)
        due = self._last_plan_at is None or now - self._last_plan_at >= REPLAN_EVERY_S
        if not (queue_changed or self._capacity_changed or due):
            return  # nothing a new plan could differ on
        self._capacity_changed = False
        self._last_plan_at = now
        snap = self.snapshot()
        if not snap.queued:
            self.queue_order = []
            return
        started = time.perf_counter()
        plan = decide(snap, self.policy, now)
        self.last_decide_s = time.perf_counter() - started
        for p in plan.preemptions:
            if self.store.request_stop(p.job_id, "preempt", now, message=p.reason):
                log.info("job %s: %s", p.job_id, p.reason)
                self.wake.set()
        for start in plan.starts:
            self.queue.remove(start.job_id)
            self._start(start.job_id, start.allocation, now)
        self.queue_order = list(plan.waiting)
        changed = {k: v for k, v in plan.waiting.items() if self._reasons.get(k) != v}
        self.store.set_wait_reasons(changed)
        self._reasons = dict(plan.waiting)

    def _start(self, job_id: int, allocation: object, now: float) -> None:
        job = self.store.get_job(job_id)
        if job is None or job.state is not JobState.QUEUED:
            return
        attempt = job.attempt + 1
        ok = self.store.transition(
            job_id,
            JobState.RUNNING,
            now,
            f"started on {_describe(allocation)}",
            expect=[JobState.QUEUED],
            allocation=allocation,
            attempt=attempt,
            started_at=now,
            launch=None,
            stop_reason=None,
            stop_requested_at=None,
            term_sent=False,
            kill_sent=False,
        )
        if not ok:
            return  # cancelled between snapshot and start
        job = self._reload(job)
        assert job.allocation is not None
        slice_ = job.allocation.slices[0]
        spec = LaunchSpec(
            job_id=job_id,
            attempt=attempt,
            argv=job.spec.argv,
            env=job_env(
                base=self.base_env,
                user_env=job.spec.env,
                job_id=job_id,
                job_name=job.name,
                team=job.team,
                attempt=attempt,
                slice_=slice_,
                head_url=self.head_url,
                virtual_gpus=self.virtual_gpus,
                grace_period_s=self.grace_period_s,
            ),
            workdir=job.spec.workdir or self.base_env.get("HOME", "/"),
            run_dir=self.data_dir.attempt_dir(job_id, attempt),
            log_path=self.data_dir.log(job_id, attempt),
        )
        try:
            handle = self.executor.launch(spec)
        except (LaunchError, OSError) as e:
            self.store.transition(
                job_id, JobState.FAILED, self.clock(), f"could not start: {e}", expect=[JobState.RUNNING]
            )
            return
        self.store.update_job(job_id, JobState.RUNNING, launch=handle)

    # ---- lifecycle --------------------------------------------------------------------------

    def request_stop(self, job_id: int, reason: str) -> None:
        """Ask the loop to stop a running job (SIGTERM now, SIGKILL after the grace period)."""
        self.store.request_stop(job_id, reason, self.clock())
        self.wake.set()

    def run(self, interval_s: float = 0.1, batch_s: float = 0.01) -> None:
        """Cycle every `interval_s`, or sooner when woken.

        Wake-ups during the pause after a cycle share the next one, so a burst of submissions
        costs a few cycles, not one each. The pause is at least `batch_s` and grows with the cost
        of the last decision (x4), so planning a long queue never takes more than ~20% of the
        interpreter away from the API.
        """
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # keep the head alive; the store is the truth and the next tick retries
                log.exception("head cycle failed; retrying")
                self.last_error = f"{type(e).__name__}: {e}"
            else:
                self.last_error = None
                self.last_cycle_at = self.clock()
            self._stop.wait(max(batch_s, 4 * self.last_decide_s))
            self.wake.wait(interval_s)
            self.wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()


def _describe(allocation: object) -> str:
    slices = getattr(allocation, "slices", ())
    return "; ".join(f"{s.node} GPUs {','.join(map(str, s.gpu_indices))}" for s in slices)
