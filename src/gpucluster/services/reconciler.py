"""Keeps each service's replicas alive, probed, scaled and on its newest revision.

A thread of the head, one pass every `interval_s`: read each service's replica rows and their
jobs, probe the running ones (GET the readiness path), tell the gateway which are ready, ask the
autoscaler how many there should be, then start, drain or stop replicas to get there. Every
decision is made again from the store at each pass, so a head that restarts picks up where the
last one stopped (replica rows, jobs and the service's revision are durable; probes are redone).

Replacing: a replica whose job ended, or that answered its probe once and then failed it
`UNREADY_LIMIT` times in a row, is stopped and a new one started. A replica not ready within
`startup_timeout_s` of its job starting is stopped; if the service has never had a ready
replica, the service fails with that reason (a command that can never serve).

Draining: a replica leaving (scale-down, rolling update) first gets no new requests, then is
stopped once its requests in flight are answered (or after `DRAIN_TIMEOUT_S`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucluster.core.states import JobState
from gpucluster.head.service import ClusterService, Conflict, NotFound
from gpucluster.services.autoscaler import Autoscaler, ScaleBounds
from gpucluster.services.listeners import listener_uids
from gpucluster.services.runtime import Access, Runtimes
from gpucluster.services.spec import REPLICA_PORT_BASE, ReplicaOut, ServiceSpec, replica_name
from gpucluster.store.services import ReplicaRecord, ServiceGone, ServiceRecord, ServiceStore
from gpucluster.store.store import DatabaseUnavailable, JobRecord, LeaseLost

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gpucluster.services")
# httpx logs every request at INFO: four probes a second per replica would flood the head's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 2.0
READY_PROBE_S = 1.0  # a ready replica is probed this often; one not ready at every pass
UNREADY_LIMIT = 3  # failed probes in a row before a once-ready replica is replaced
DRAIN_TIMEOUT_S = 60.0
PORT_SPAN = 20000
PROBES_AT_ONCE = 16
RATE_WINDOW_S = 2.0  # requests per second over this, for a target_rps


@dataclass
class _Probe:
    ready_once: bool = False
    fails: int = 0
    ok: bool = False  # the last probe's answer
    at: float = 0.0  # when it was made


class Reconciler:
    def __init__(
        self,
        cluster: ClusterService,
        runtimes: Runtimes,
        clock: Callable[[], float] = time.time,
        interval_s: float = INTERVAL_S,
        port_free: Callable[[int], bool] | None = None,
        probe: Callable[[str], bool] | None = None,
    ) -> None:
        """`port_free` and `probe` (GET a URL: ready?) are this node's sockets and HTTP unless
        a test gives its own."""
        self.cluster = cluster
        self.services = ServiceStore(cluster.store)
        self.runtimes = runtimes
        self.clock = clock
        self.interval_s = interval_s
        self.port_free = port_free or _port_free_here
        self.ephemeral = ephemeral_ports()  # replicas' ports skip it (_free_port)
        self._probe_fn = probe
        self._probes: dict[int, _Probe] = {}
        self._scalers: dict[str, Autoscaler] = {}
        self._desired: dict[str, int] = {}
        self._phases: dict[int, str] = {}
        self._last_exit: dict[str, str] = {}
        self._first_started: dict[str, float] = {}
        self._backoff_until: dict[str, float] = {}
        self._early_exits: dict[str, int] = {}
        self._failed: set[str] = set()  # failed in this pass: start nothing more for them
        self._stop = threading.Event()
        self.wake = threading.Event()
        # Made at the first probe (`_client`), and httpx imported then: a head without services
        # never loads it (services/gateway.py's docstring says why).
        self._http: httpx.Client | None = None
        self._http_lock = threading.Lock()  # probes run in the pool's threads
        self._pool = ThreadPoolExecutor(PROBES_AT_ONCE, thread_name_prefix="probe")
        self._thread: threading.Thread | None = None

    # ---- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="services", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)
        if self._http is not None:
            self._http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.cluster.head.lease_lost is not None:
                break  # another head holds the database: its reconciler runs the services now
            try:
                self.tick()
            except (DatabaseUnavailable, LeaseLost):
                pass  # the store says it once per outage; the next pass retries
            except Exception:  # one bad pass must not end the services
                log.exception("services: reconcile pass failed; retrying")
            self.wake.wait(self.interval_s)
            self.wake.clear()

    # ---- one pass -------------------------------------------------------------------------------

    def tick(self) -> None:
        known = self.runtimes.names()  # before the read: a service created after it is not dropped
        records = self.services.all()
        live = {s.name for s in records if s.state == "running"}
        for name in known:
            if name not in live:
                self.runtimes.drop_service(name)
        self._failed &= {s.name for s in records if s.state != "running"}
        used = {r.port for r in self.services.replicas()}
        for svc in records:
            if svc.state == "running":
                self._reconcile(svc, used)
            else:
                self._wind_down(svc)

    def _wind_down(self, svc: ServiceRecord) -> None:
        """A failed or deleted service: stop what is left of its replicas (a head that died midway
        through a failure or a delete left them running), then drop their rows (and a deleted
        service's own row). Durable state first, so no crash leaves a replica nobody stops."""
        left = False
        for r in self.services.replicas(svc.name):
            job = self.cluster.store.get_job(r.job_id) if r.job_id is not None else None
            if job is not None and not job.state.terminal:
                left = True
                if job.stop_reason is None:
                    self._stop_job(job.id)
            elif job is None and r.job_id is None:
                # Its job may exist under its name (the head died between submit and record).
                name = replica_name(svc.name, r.id)
                found = [j for j in self.cluster.store.list_jobs(text=name) if j.name == name]
                if found and not found[0].state.terminal:
                    self.services.set_replica_job(r.id, found[0].id)
                    left = True
                    continue
                self.services.remove_replica(r.id)
            else:
                self.services.remove_replica(r.id)
        if not left and svc.state == "deleting":
            self.services.delete(svc.name)

    def desired(self, name: str) -> int:
        return self._desired.get(name, 0)

    def phase(self, replica_id: int) -> str:
        return self._phases.get(replica_id, "queued")

    def describe(self, svc: ServiceRecord) -> list[ReplicaOut]:
        _, per = self.runtimes.in_flight(svc.name)
        return [
            ReplicaOut(
                id=r.id,
                job_id=r.job_id,
                port=r.port,
                revision=r.revision,
                phase=self.phase(r.id),  # type: ignore[arg-type]
                in_flight=per.get(r.id, 0),
            )
            for r in self.services.replicas(svc.name)
        ]

    def _reconcile(self, svc: ServiceRecord, used_ports: set[int]) -> None:
        now = self.clock()
        spec = svc.spec
        endpoints: list[tuple[int, str, str]] = []
        live: list[tuple[ReplicaRecord, str]] = []  # (replica, phase) of those not leaving
        _, per_flight = self.runtimes.in_flight(svc.name)
        present: list[tuple[ReplicaRecord, JobRecord]] = []
        for r in self.services.replicas(svc.name):
            job = self._job_of(svc, r)
            if job is None or job.state.terminal:
                self._gone(svc, r, job)
            else:
                present.append((r, job))
        # Probes in parallel: one replica that hangs costs the pass one probe timeout, not one each.
        probes = {
            r.id: self._pool.submit(self._check, svc, job, r.port)
            for r, job in present
            if job.state is JobState.RUNNING and r.draining_since is None and self._due(svc.name, r.id, now)
        }
        for r, job in present:
            probed = probes[r.id].result() if r.id in probes else None
            phase = self._phase(svc, r, job, now, per_flight.get(r.id, 0), probed)
            if phase is None:
                continue  # stopped just now
            self._phases[r.id] = phase
            if job.state is JobState.RUNNING:
                endpoints.append((r.id, self._url(job, r.port), phase))
            if phase != "draining":
                live.append((r, phase))
        self.runtimes.set_service(svc.name, Access(svc.team, spec.public), endpoints)
        if any(p == "ready" for _, p in live):
            self._early_exits.pop(svc.name, None)
            self._backoff_until.pop(svc.name, None)
            if not svc.ready_once:
                self.services.mark_ready_once(svc.name)
        elif not svc.ready_once and now - self._first_started.get(svc.name, now) > spec.startup_timeout_s:
            last = self._last_exit.get(svc.name)
            self._fail(
                svc,
                f"no replica answered GET {spec.readiness} with 2xx/3xx within its startup timeout "
                f"({spec.startup_timeout_s:g} s)" + (f"; last: {last}" if last else ""),
            )
            return
        total, _ = self.runtimes.in_flight(svc.name)
        scaler = self._scalers.get(svc.name)
        if scaler is None:
            # A new service starts with one replica at least; one a restarted head finds keeps
            # what it has (a service scaled to zero stays there until a request comes).
            have = len(live) if svc.ready_once else max(1, len(live))
            initial = max(spec.min_replicas, min(spec.max_replicas, have))
            scaler = self._scalers[svc.name] = Autoscaler(initial, now)
        scaler.observe(now, total, self.runtimes.rate(svc.name, RATE_WINDOW_S) if spec.target_rps else 0.0)
        bounds = ScaleBounds(
            spec.min_replicas, spec.max_replicas, spec.target_concurrency, spec.scale_down_delay_s, spec.target_rps
        )
        want = scaler.desired(now, bounds)
        self._desired[svc.name] = want
        self._converge(svc, live, want, now, used_ports)

    def _converge(
        self, svc: ServiceRecord, live: list[tuple[ReplicaRecord, str]], want: int, now: float, used: set[int]
    ) -> None:
        old = [(r, p) for r, p in live if r.revision < svc.revision]
        new = [(r, p) for r, p in live if r.revision >= svc.revision]
        if old:
            # Rolling: one new replica at a time; an old one leaves once a new one is ready.
            target = max(want, 1)
            if len(new) < target and all(p == "ready" for _, p in new):
                self._add(svc, used, now)
            ready_new = sum(1 for _, p in new if p == "ready")
            if ready_new > 0 and ready_new + len(old) > target:
                victim = min(old, key=lambda rp: rp[1] == "ready")  # a not-ready old one first
                self._leave(svc, victim[0], victim[1], now)
            return
        if len(live) < want:
            for _ in range(want - len(live)):
                self._add(svc, used, now)
        elif len(live) > want:
            _, per = self.runtimes.in_flight(svc.name)
            # Not-ready ones first (nothing to drain), then the least busy.
            order = sorted(live, key=lambda rp: (rp[1] == "ready", per.get(rp[0].id, 0), -rp[0].id))
            for r, p in order[: len(live) - want]:
                self._leave(svc, r, p, now)

    # ---- one replica ----------------------------------------------------------------------------

    def _job_of(self, svc: ServiceRecord, r: ReplicaRecord) -> JobRecord | None:
        store = self.cluster.store
        if r.job_id is not None:
            return store.get_job(r.job_id)
        # The row was written and the head died before its job's id was: find the job by name.
        name = replica_name(svc.name, r.id)
        found = [j for j in store.list_jobs(text=name) if j.name == name]
        if found:
            self.services.set_replica_job(r.id, found[0].id)
            return found[0]
        return self._submit(svc, r)

    def _due(self, name: str, replica_id: int, now: float) -> bool:
        """Probe now? A ready replica every READY_PROBE_S (the gateway reports a failed
        connection at once), one not (yet) ready at every pass."""
        probe = self._probes.get(replica_id)
        if probe is None or not probe.ok or now - probe.at >= READY_PROBE_S:
            return True
        return self.runtimes.phase_of(name, replica_id) == "unready"

    def _check(self, svc: ServiceRecord, job: JobRecord, port: int) -> bool:
        url = self._url(job, port) + svc.spec.readiness
        if self._probe_fn is not None:
            return self._probe_fn(url)
        return self._owns_port(svc, job, port) and self._probe(url)

    def _phase(
        self, svc: ServiceRecord, r: ReplicaRecord, job: JobRecord, now: float, in_flight: int, probed: bool | None
    ) -> str | None:
        """The replica's phase now, stopping it where it must go; `probed`: this pass's probe
        result, None to keep the last one (a ready replica between its probes)."""
        spec = svc.spec
        if r.draining_since is not None:
            if in_flight == 0 or now - r.draining_since > DRAIN_TIMEOUT_S or job.state is not JobState.RUNNING:
                self._stop_job(job.id)
            return "draining"
        if job.state is not JobState.RUNNING:
            return "queued"
        started = job.started_at or now
        self._first_started.setdefault(svc.name, started)
        probe = self._probes.setdefault(r.id, _Probe())
        if probed is not None:
            probe.ok, probe.at = probed, now
        if probe.ok:
            probe.ready_once, probe.fails = True, 0
            return "ready"
        if probe.ready_once:
            if probed is not None:
                probe.fails += 1
            if probe.fails >= UNREADY_LIMIT:
                log.info("service %s: replica job %d failed %d probes; replacing it", svc.name, job.id, probe.fails)
                self._stop_job(job.id)
            return "unready"
        if svc.ready_once and now - started > spec.startup_timeout_s:
            log.info(
                "service %s: replica job %d not ready in %g s; replacing it", svc.name, job.id, spec.startup_timeout_s
            )
            self._stop_job(job.id)
            return None
        return "starting"

    def _gone(self, svc: ServiceRecord, r: ReplicaRecord, job: JobRecord | None) -> None:
        self.services.remove_replica(r.id)
        self._phases.pop(r.id, None)
        if job is not None and r.draining_since is None:
            what = f"replica job {job.id} ended ({job.state.value}: {job.reason or 'no reason given'})"
            self._last_exit[svc.name] = what
            log.info("service %s: %s; replacing it", svc.name, what)
            if not self._probes.get(r.id, _Probe()).ready_once:
                n = self._early_exits[svc.name] = self._early_exits.get(svc.name, 0) + 1
                self._backoff_until[svc.name] = self.clock() + min(30.0, 0.5 * 2 ** (n - 1))
        self._probes.pop(r.id, None)

    def _fail(self, svc: ServiceRecord, why: str) -> None:
        log.warning("service %s failed: %s", svc.name, why)
        self._failed.add(svc.name)
        self.services.set_state(svc.name, "failed", why)  # durable first: _wind_down finishes it
        self.runtimes.drop_service(svc.name)
        self._wind_down(self.services.get(svc.name) or svc)

    def _add(self, svc: ServiceRecord, used: set[int], now: float) -> None:
        if svc.name in self._failed or now < self._backoff_until.get(svc.name, 0.0):
            return  # replicas exited before they were ready: not a new one each pass
        port = self._free_port(svc.spec, used)
        used.add(port)
        try:
            r = self.services.add_replica(svc.name, port, svc.revision)
        except ServiceGone:
            return
        self._submit(svc, r)

    def _submit(self, svc: ServiceRecord, r: ReplicaRecord) -> JobRecord | None:
        job_spec = svc.spec.replica_job(r.id, r.port)
        try:
            job = self.cluster.submit(job_spec, svc.owner)
        except Exception as e:  # the cluster refuses it now (a policy change): the service says why
            self.services.remove_replica(r.id)
            self._fail(svc, f"a replica could not be submitted: {e}")
            return None
        self.services.set_replica_job(r.id, job.id)
        return self.cluster.store.get_job(job.id)

    def _leave(self, svc: ServiceRecord, r: ReplicaRecord, phase: str, now: float) -> None:
        if phase == "ready":
            self.services.set_draining(r.id, now)  # no new requests; stopped once its own are answered
            self._phases[r.id] = "draining"
            self.runtimes.set_service(
                svc.name,
                Access(svc.team, svc.spec.public),
                [(e_id, url, "draining" if e_id == r.id else p) for e_id, url, p in self._endpoints(svc.name)],
            )
        elif r.job_id is not None:
            self.services.set_draining(r.id, now)
            self._stop_job(r.job_id)

    def _endpoints(self, name: str) -> list[tuple[int, str, str]]:
        with self.runtimes._lock:
            svc = self.runtimes._services.get(name)
            return [(e.replica_id, e.url, e.phase) for e in svc.endpoints.values()] if svc else []

    def _stop_job(self, job_id: int) -> None:
        with contextlib.suppress(Conflict, NotFound):  # it ended meanwhile
            self.cluster.cancel(job_id)

    # ---- helpers --------------------------------------------------------------------------------

    def _url(self, job: JobRecord, port: int) -> str:
        host = "127.0.0.1"
        inventory = getattr(self.cluster.head, "inventory", None)
        if job.allocation is not None and job.allocation.slices and inventory is not None:
            host = inventory.address(job.allocation.slices[0].node) or host
        return f"http://{host}:{port}"

    def _owns_port(self, svc: ServiceRecord, job: JobRecord, port: int) -> bool:
        """Whether the socket on the replica's port is its job's account's (this node only: a Ray
        node's sockets are not visible here). Another account's listener there is never routed to."""
        if getattr(self.cluster.head, "inventory", None) is not None:
            return True
        uids = listener_uids(port)
        if not uids:
            return True  # nobody listens yet (the probe fails), or no /proc to ask
        expected = self._uid_of(svc.owner)
        if expected is None or expected in uids:
            return True
        log.warning(
            "service %s: port %d of replica job %d is held by uid %s, not the replica's account (uid %d)",
            svc.name,
            port,
            job.id,
            ",".join(map(str, sorted(uids))),
            expected,
        )
        return False

    def _uid_of(self, owner: str | None) -> int | None:
        identity = getattr(self.cluster.head, "identity", None)
        if identity is None:
            return os.geteuid()
        account = identity.run_as(owner)
        if account is None:
            return os.geteuid()  # jobs run as the head's own account
        try:
            return pwd.getpwnam(account).pw_uid
        except KeyError:
            return None

    def _client(self) -> httpx.Client:
        import httpx  # at the first probe, not with the module (see `__init__`)

        with self._http_lock:
            if self._http is None:
                self._http = httpx.Client(timeout=PROBE_TIMEOUT_S, limits=httpx.Limits(max_connections=PROBES_AT_ONCE))
            return self._http

    def _probe(self, url: str) -> bool:
        import httpx  # at the first probe, not with the module (see `__init__`)

        try:
            return 200 <= self._client().get(url).status_code < 400
        except httpx.HTTPError:
            return False

    def _free_port(self, spec: ServiceSpec, used: set[int]) -> int:
        """The first port from the spec's (or the default base) up that no replica holds and
        nothing listens on. Ports in the kernel's ephemeral range are skipped unless the spec's
        own port lies in it: between this probe and the replica's bind, any outgoing connection
        on the node (a probe, a job's download) may be handed that port, and the replica would
        fail to start for a reason its owner cannot see."""
        base = spec.port or REPLICA_PORT_BASE
        low, high = self.ephemeral
        skip_ephemeral = not low <= base <= high
        for port in range(base, min(base + PORT_SPAN, 65536)):
            if skip_ephemeral and low <= port <= high:
                continue
            if port not in used and self.port_free(port):
                return port
        raise RuntimeError("no free port for a replica")


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for the local port of an outgoing connection (Linux's default where
    it cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return (32768, 60999)
    return (low, high)


def _port_free_here(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
