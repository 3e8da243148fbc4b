"""The telemetry monitor: one thread, its own cadence, off the scheduling path.

Each `step(now)`:
1. reads every node's source (NVML or synthetic; remote nodes may push readings via `ingest`),
   and attributes each GPU process to a running job (by pid through the executor's handles, or
   directly for synthetic readings);
2. buffers one sample per GPU, written in one transaction every `flush_s`, and downsamples the
   store every `downsample_s` (raw for 1 h, minute means for a day, hour means until retention);
3. judges health (ECC, fatal XID, temperature; a node silent for the policy's `node_timeout`),
   records each unhealthy GPU with why, and drains its node (no new jobs; running jobs go on).
   Temperature and silence clear by themselves and so does the drain they caused; ECC and XID
   problems stay until an operator undrains the node;
4. checks every running job: a fractional job using more GPU memory than its share is stopped
   with that reason; a job whose GPUs all sit at or under the idle threshold for the policy's
   `idle.after` is flagged, and requeued or stopped if the policy says so.

Everything the scheduler must obey goes through the store (drain state, stop requests) and wakes
the head; the head never waits for telemetry. The clock is injected and `step` is public, so
tests drive the monitor by hand next to the hand-driven head.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from gpucluster.core.policy import HealthPolicy, IdlePolicy
from gpucluster.durations import format_duration
from gpucluster.head import sessions
from gpucluster.head.loop import Head
from gpucluster.store import StoreError
from gpucluster.store.telemetry import NODE_WIDE, GpuProblem, GpuSample, Holding, JobFlag, TelemetryStore
from gpucluster.telemetry.attribution import PidResolver, job_groups
from gpucluster.telemetry.health import SILENT, STICKY, gpu_problems
from gpucluster.telemetry.readings import GpuReading, NodeReading
from gpucluster.telemetry.session_idle import SESSION, Probe, SessionReclaim
from gpucluster.telemetry.synthetic import Holders, LoadBook

log = logging.getLogger("gpucluster.telemetry")

IDLE = "idle"
# A fractional job's allowance over its memory share: the CUDA context (a few hundred MiB) is
# counted by NVML but not by the allocator limit a job sets from GPUCLUSTER_GPU_MEMORY_LIMIT.
MEMORY_SLACK_MB = 512
# Stop reason the head ends a job with, failed, its message as the reason (see head/loop.py).
POLICY_STOP = "policy"


class Source(Protocol):
    node: str

    def read(self, now: float, holders: Holders | None = None) -> NodeReading: ...

    def close(self) -> None: ...


class Resolver(Protocol):
    def resolve(self, pids: Iterable[int], groups: Mapping[int, int]) -> dict[int, int]: ...


@dataclass(frozen=True)
class GpuNow:
    """The latest reading of one GPU and the jobs holding it then."""

    node: str
    reading: GpuReading
    at: float
    jobs: tuple[int, ...]


@dataclass(frozen=True)
class JobGpuUse:
    node: str
    gpu: int
    utilization: float | None  # the whole GPU's
    memory_mb: float | None  # the job's own processes on it, where attributable


@dataclass(frozen=True)
class JobUsage:
    at: float
    gpus: tuple[JobGpuUse, ...]
    idle_since: float | None


class TelemetryMonitor:
    def __init__(
        self,
        head: Head,
        sources: Iterable[Source],
        *,
        interval_s: float = 5.0,
        flush_s: float = 10.0,
        downsample_s: float = 60.0,
        raw_s: float = 3600.0,
        minute_s: float = 86400.0,
        retention_s: float = 30 * 86400.0,
        resolver: Resolver | None = None,
        loads: LoadBook | None = None,
        clock: Callable[[], float] | None = None,
        session_probe: Probe | None = None,
    ) -> None:
        self.head = head
        self.store: TelemetryStore = head.telemetry
        self.sources = list(sources)
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.downsample_s = downsample_s
        self.raw_s, self.minute_s, self.retention_s = raw_s, minute_s, retention_s
        self.resolver: Resolver = resolver or PidResolver()
        self.loads = loads or LoadBook()
        self.clock = clock or head.clock
        start = self.clock()
        # Nodes whose silence is judged: those with a source here, and those that pushed a reading.
        self.last_ok: dict[str, float] = {s.node: start for s in self.sources}
        self.last_error: dict[str, str] = {}
        self.gpus: dict[tuple[str, int], GpuNow] = {}
        self.jobs: dict[int, JobUsage] = {}
        self._idle_since: dict[int, float] = {}
        self._buffer: list[GpuSample] = []
        self._last_at: dict[str, float] = {}
        self._last_flush = start
        self._last_downsample = start
        self._pushed: list[NodeReading] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.steps = 0
        self.last_step_s = 0.0
        self.sessions = SessionReclaim(
            lambda: self.head.policy.interactive,
            self.head.request_stop,
            self.store.set_flag,
            lambda job_id: self.store.clear_flag(job_id, IDLE),
            probe=session_probe or sessions.quiet_s,
        )

    # ---- inputs -----------------------------------------------------------------------------

    def ingest(self, reading: NodeReading) -> None:
        """A reading pushed by a remote node's sampler; judged at the next step."""
        with self._lock:
            self._pushed.append(reading)

    def report_load(self, job_id: int, utilization: float | None, memory_mb: float | None) -> None:
        """A job's own report of its load (synthetic source for virtual GPUs)."""
        self.loads.report(job_id, utilization, memory_mb, self.clock())

    # ---- one round --------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        running = self.store.holdings()
        holders: dict[str, dict[int, list[tuple[int, float]]]] = {}
        for j in running:
            for s in j.allocation.slices:
                for i in s.gpu_indices:
                    holders.setdefault(s.node, {}).setdefault(i, []).append((j.id, s.share))
        groups = job_groups((j.id, j.launch) for j in running)
        readings = []
        for src in self.sources:
            try:
                readings.append(src.read(now, holders.get(src.node, {})))
            except Exception as e:  # a broken source must not stop the others
                log.exception("telemetry source for %s failed", src.node)
                readings.append(NodeReading(src.node, now, error=f"{type(e).__name__}: {e}"))
        with self._lock:
            pushed, self._pushed = self._pushed, []
        readings += pushed
        problems: dict[str, list[tuple[int, str, str]]] = {}
        for r in readings:
            if r.error is not None:
                self.last_error[r.node] = r.error
                continue
            self.last_ok[r.node] = max(self.last_ok.get(r.node, r.at), r.at)
            self.last_error.pop(r.node, None)
            self._record(r, holders.get(r.node, {}), groups)
            problems[r.node] = [(p.gpu, p.kind, p.message) for p in gpu_problems(r, self.health_policy)]
        for node, last in self.last_ok.items():
            silent = now - last
            if silent > self.health_policy.node_timeout_s:
                why = f"no telemetry for {format_duration(silent)}"
                if node in self.last_error:
                    why += f" ({self.last_error[node]})"
                problems.setdefault(node, []).append((NODE_WIDE, SILENT, why))
            else:
                problems.setdefault(node, [])
        self._judge_health(problems, now)
        self._check_jobs(running, now)
        self.loads.keep_only({j.id for j in running})
        if now - self._last_flush >= self.flush_s:
            self.flush(now)
        if now - self._last_downsample >= self.downsample_s:
            self._last_downsample = now
            self.store.downsample(now, self.raw_s, self.minute_s, self.retention_s)
        self.steps += 1

    def flush(self, now: float | None = None) -> None:
        with self._lock:
            batch, self._buffer = self._buffer, []
        self._last_flush = self.clock() if now is None else now
        self.store.add_samples(batch)

    @property
    def health_policy(self) -> HealthPolicy:
        return self.head.policy.health

    @property
    def idle_policy(self) -> IdlePolicy:
        return self.head.policy.idle

    def _record(self, r: NodeReading, holders: Holders, groups: Mapping[int, int]) -> None:
        pids = [p.pid for g in r.gpus for p in g.processes if p.pid is not None and p.job_id is None]
        owner = self.resolver.resolve(pids, groups) if pids else {}
        prev = self._last_at.get(r.node)
        # The period a sample stands for: since the previous one, at most a few intervals (a
        # long gap means nothing was known meanwhile, and must not count as energy).
        seconds = min(r.at - prev, 3 * self.interval_s) if prev is not None and r.at > prev else self.interval_s
        self._last_at[r.node] = r.at
        samples = []
        for g in r.gpus:
            jobs = tuple(sorted({j for j, _ in holders.get(g.index, ())}))
            procs = tuple(
                p if p.job_id is not None or p.pid is None else replace(p, job_id=owner.get(p.pid)) for p in g.processes
            )
            g = replace(g, processes=procs)
            self.gpus[(r.node, g.index)] = GpuNow(r.node, g, r.at, jobs)
            if g.error is None:
                samples.append(
                    GpuSample(
                        node=r.node,
                        gpu=g.index,
                        at=r.at,
                        seconds=seconds,
                        jobs=jobs,
                        utilization=g.utilization,
                        memory_used_mb=g.memory_used_mb,
                        temperature_c=g.temperature_c,
                        power_w=g.power_w,
                        sm_clock_mhz=g.sm_clock_mhz,
                        memory_clock_mhz=g.memory_clock_mhz,
                    )
                )
        with self._lock:
            self._buffer.extend(samples)

    # ---- health -----------------------------------------------------------------------------

    def _judge_health(self, found: dict[str, list[tuple[int, str, str]]], now: float) -> None:
        known = self.store.problems()
        clear = []
        for node, listed in found.items():
            problems = _one_per_gpu(listed)
            current = {gpu for gpu, _, _ in problems}
            for (n, gpu), p in known.items():
                # Sticky problems stay until an undrain; the others go when no longer seen.
                if n == node and p.kind not in STICKY and gpu not in current:
                    clear.append((n, gpu))
            for gpu, kind, message in problems:
                old = known.get((node, gpu))
                if old is None or (old.problem != message and (old.kind == kind or old.kind not in STICKY)):
                    if old is None:
                        log.warning("node %s unhealthy: %s", node, message)
                    self.store.set_problem(GpuProblem(node, gpu, kind, message, old.since if old else now))
        self.store.clear_problems(clear)
        by_node: dict[str, list[GpuProblem]] = {}
        for p in self.store.problems().values():
            by_node.setdefault(p.node, []).append(p)
        states = self.store.node_states()
        changed = False
        for node in set(by_node) | {n for n, s in states.items() if s.drained and s.source == "health"}:
            st = states.get(node)
            mine = sorted(by_node.get(node, []), key=lambda p: p.gpu)
            if mine:
                if st is not None and st.drained and st.source == "user":
                    continue  # an operator's drain keeps its own reason; the problems show beside it
                reason = "; ".join(p.problem for p in mine)
                was_drained = st is not None and st.drained
                if self.store.set_drained(node, True, reason, "health", now) and not was_drained:
                    log.warning("node %s drained: %s", node, reason)
                    changed = True
            elif st is not None and st.drained and st.source == "health":
                self.store.set_drained(node, False, "healthy again", "health", now)
                log.info("node %s healthy again; undrained", node)
                changed = True
        if changed:
            self.head.nodes_changed()

    def undrain(self, node: str, now: float) -> bool:
        """An operator's undrain: also forgets the node's problems (sticky ones included) and
        restarts its silence clock; a problem still present is found again at the next step."""
        self.store.clear_problems([k for k in self.store.problems() if k[0] == node])
        if node in self.last_ok:
            self.last_ok[node] = max(self.last_ok[node], now)
        return self.store.set_drained(node, False, "undrained by user", "user", now)

    # ---- jobs -------------------------------------------------------------------------------

    def _check_jobs(self, running: list[Holding], now: float) -> None:
        policy = self.idle_policy
        flagged = {f.job_id for f in self.store.flags() if f.flag == IDLE}
        live = set()
        for job in running:
            live.add(job.id)
            uses = []
            for s in job.allocation.slices:
                for i in s.gpu_indices:
                    g = self.gpus.get((s.node, i))
                    mem = None
                    if g is not None:
                        own = [p.memory_mb for p in g.reading.processes if p.job_id == job.id]
                        mem = sum(own) if own else None
                    uses.append(JobGpuUse(s.node, i, g.reading.utilization if g else None, mem))
                    if (
                        s.share < 1
                        and s.memory_mb is not None
                        and mem is not None
                        and mem > s.memory_mb + MEMORY_SLACK_MB
                        and job.stop_reason is None
                    ):
                        message = (
                            f"stopped: used {_gib(mem)} of GPU memory on {s.node} GPU {i}, "
                            f"over its share of {_gib(s.memory_mb)}"
                        )
                        if self.head.request_stop(job.id, POLICY_STOP, message):
                            log.warning("job %s %s", job.id, message)
            known = [u.utilization for u in uses]
            session = job.kind == SESSION
            threshold = self.head.policy.interactive.idle_threshold if session else policy.threshold
            idle = bool(known) and all(u is not None and u <= threshold for u in known)
            since: float | None = None
            if idle:
                since = self._idle_since.setdefault(job.id, now)
            else:
                self._idle_since.pop(job.id, None)
            self.jobs[job.id] = JobUsage(now, tuple(uses), since)
            if session:  # both signals, the session class's rule (telemetry/session_idle.py)
                self.sessions.check(job, since, now)
                flagged.discard(job.id)  # its flag is the session rule's to clear
                continue
            if since is not None and now - since >= policy.after_s:
                if job.id not in flagged:
                    idle_for = format_duration(now - since)
                    message = f"its GPUs were at or under {policy.threshold:g}% utilisation for {idle_for}"
                    self.store.set_flag(JobFlag(job.id, IDLE, since, message))
                    log.info("job %s idle: %s", job.id, message)
                    flagged.add(job.id)
                    self._act_on_idle(job, policy, now - since)
            elif since is None and job.id in flagged:
                self.store.clear_flag(job.id, IDLE)
                flagged.discard(job.id)
        for job_id in flagged - live:
            self.store.clear_flag(job_id, IDLE)
        self.sessions.keep_only(live)
        for job_id in [j for j in self.jobs if j not in live]:
            del self.jobs[job_id]
            self._idle_since.pop(job_id, None)

    def _act_on_idle(self, job: Holding, policy: IdlePolicy, idle_s: float) -> None:
        if job.stop_reason is not None or policy.action == "notify":
            return
        how = f"its GPUs were idle for {format_duration(idle_s)}"
        if policy.action == "requeue":
            self.head.request_stop(job.id, "preempt", f"requeued: {how}")
        else:
            self.head.request_stop(job.id, POLICY_STOP, f"stopped: {how}")

    # ---- thread -----------------------------------------------------------------------------

    def run(self) -> None:
        said = None
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                self.step()
            except StoreError as e:  # the database is down or the lease lost: the store said so; once here
                if str(e) != said:
                    log.warning("telemetry step failed: %s", e)
                said = str(e)
            except Exception:  # the next step retries; telemetry must never take the head down
                log.exception("telemetry step failed")
            else:
                said = None
            self.last_step_s = time.perf_counter() - started
            self._stop.wait(self.interval_s)
        try:
            self.flush()
        except StoreError as e:
            log.warning("telemetry: last flush failed: %s", e)
        except Exception:
            log.exception("telemetry: last flush failed")
        for s in self.sources:
            s.close()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="telemetry", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


_SEVERITY = {"ecc": 0, "xid": 1, "temperature": 2, SILENT: 3}


def _one_per_gpu(problems: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The store keeps one problem per GPU: the most severe kind, with every message."""
    by_gpu: dict[int, list[tuple[int, str, str]]] = {}
    for p in problems:
        by_gpu.setdefault(p[0], []).append(p)
    out = []
    for gpu, ps in by_gpu.items():
        ps.sort(key=lambda p: _SEVERITY.get(p[1], 9))
        out.append((gpu, ps[0][1], "; ".join(p[2] for p in ps)))
    return out
