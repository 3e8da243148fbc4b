"""Runs jobs on the nodes of a Ray cluster, each process exactly where the scheduler placed it.

The scheduler picked nodes and GPU indices; this executor hands each node's share of an attempt
to that node's agent (`ray_agent.NodeAgent`, a detached actor pinned to the node), which starts
the processes with the local executor's shim: same environment, sessions, signals (SIGTERM,
grace, SIGKILL), exit records. Which node a process belongs to is its GPUCLUSTER_NODE.

Logs: a monitor thread asks every agent, every SYNC_EVERY_S, for the state of its attempts and
their new output from the head's offsets (one call per node), and appends it to the head's log
files, so `gpucluster logs` follows remote output live. A process reads as ended only once its
output has been copied in full. With a log cap (`--max-log-size`), both sides rotate at it with
the local executor's code: the shims on the node (the cap travels with each launch) and the
head's copy (`logfile.append_log`); offsets count every byte written, so they match on both.

Handle: {"ray": [{"node", "node_id", "actor", "handle" (the agent's local handle), "run_dir"
(on the node), "ranks" (global rank of each local process), "logs" (head side), "remote_logs"}],
"run_dir": head run dir} plus, for several processes, "ranks"/"expected"/"marker" as the local
executor's. `RUN_DIR/ray-launch.json` is written before the first agent call, so `recover`
finds the agents of an attempt whose launch the head did not live to record.

Telemetry: when a `RemoteFeed` is set (`telemetry`), the same round also asks every answering
agent, once per telemetry interval, for a reading of its GPUs (`NodeAgent.sample`, one call per
node, waited on with the sync calls) and hands it to the head's telemetry monitor.

A node's death is the inventory's business (the head stops its jobs as "node down" first); a
process there reads Lost only once the inventory knows the node is gone, or when its agent has
not answered for AGENT_SILENT_S while Ray still calls the node alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal as signals
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from gpucluster.executors._shim import write_json_atomic
from gpucluster.executors.base import (
    Handle,
    LaunchError,
    LaunchSpec,
    Lost,
    ProcessSpec,
    Running,
    Status,
    combined,
    expected_processes,
)
from gpucluster.executors.logfile import append_log, log_end
from gpucluster.executors.ray_agent import LOG_CHUNK
from gpucluster.executors.ray_nodes import CALL_TIMEOUT_S, RayInventory

if TYPE_CHECKING:
    from gpucluster.telemetry.remote import RemoteFeed

log = logging.getLogger("gpucluster.ray")

SYNC_EVERY_S = 0.25
AGENT_SILENT_S = 15.0  # an agent on a node Ray calls alive that does not answer for this long
MANIFEST = "ray-launch.json"
LAUNCH_TIMEOUT_S = 60.0


def node_run_dir(root: Path, job_id: int, attempt: int) -> Path:
    """Where a node's agent keeps its records of an attempt (the logs are in jobs/<id>/ beside)."""
    return root / "run" / str(job_id) / f"attempt-{attempt}"


class RayExecutor:
    def __init__(
        self,
        inventory: RayInventory,
        sync_every_s: float = SYNC_EVERY_S,
        max_log_bytes: int = 0,
        container_config: Path | None = None,
    ) -> None:
        self.inventory = inventory
        # `gpucluster up --container-config`: the same path on every node (its podman config).
        self.container_config = str(container_config) if container_config is not None else None
        self._every = sync_every_s
        self.max_log_bytes = max_log_bytes  # > 0: each process's log rotates past it (node and head)
        self._lock = threading.Lock()
        self._watched: dict[str, Handle] = {}  # head run dir -> handle
        self._status: dict[tuple[str, int], list[Status]] = {}  # (run dir, entry) -> per local process
        self._silent_since: dict[str, float] = {}  # Ray node id -> first unanswered sync
        self.telemetry: RemoteFeed | None = None  # set once the head's telemetry monitor exists
        self._last_sample = -1e18  # monotonic time of the last telemetry pull
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._monitor, name="ray-monitor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # ---- Executor ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.session:
            raise LaunchError("interactive sessions run on the head's own node (the local executor), not on Ray")
        multi = bool(spec.processes)
        procs = list(spec.processes) or [ProcessSpec(spec.argv, spec.env, spec.run_dir, spec.log_path)]
        by_node: dict[str, list[tuple[int, ProcessSpec]]] = defaultdict(list)
        for rank, p in enumerate(procs):
            node = p.env.get("GPUCLUSTER_NODE")
            if not node:
                raise LaunchError(f"process {rank} has no GPUCLUSTER_NODE: nowhere to run it")
            by_node[node].append((rank, p))
        entries: list[dict[str, Any]] = []
        local_specs = []
        for node, members in by_node.items():
            agent = self.inventory.agent(node)
            if agent is None:
                raise LaunchError(f"node {node} is not up in the Ray cluster")
            # On the node as on the head: the agent's records in run/ (root's alone), the job's
            # logs in jobs/<id>/, a directory of the job's account (head/paths.py).
            local_run = node_run_dir(Path(agent.root), spec.job_id, spec.attempt)
            local_job = Path(agent.root) / "jobs" / str(spec.job_id)
            local_logs = local_job / f"attempt-{spec.attempt}"
            if multi:
                local_procs = tuple(
                    ProcessSpec(p.argv, p.env, local_run / f"rank-{i}", local_logs / f"rank-{i}" / "output.log")
                    for i, (_, p) in enumerate(members)
                )
                local = LaunchSpec(
                    spec.job_id, spec.attempt, spec.argv, members[0][1].env, spec.workdir, local_run,
                    local_logs / "output.log", processes=local_procs, marker=spec.marker, user=spec.user,
                    job_dir=local_job, container=spec.container,
                )  # fmt: skip
            else:
                local = LaunchSpec(
                    spec.job_id, spec.attempt, spec.argv, spec.env, spec.workdir, local_run,
                    local_logs / "output.log", user=spec.user, job_dir=local_job, container=spec.container,
                )  # fmt: skip
            entries.append(
                {
                    "node": node,
                    "node_id": agent.node_id,
                    "actor": agent.actor,
                    "run_dir": str(local_run),
                    "ranks": [r for r, _ in members],
                    "logs": [str(p.log_path) for _, p in members],
                    "remote_logs": [str(lp.log_path) for lp in (local.processes or (local,))],
                }
            )
            local_specs.append(local)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        for p in procs:
            p.log_path.parent.mkdir(parents=True, exist_ok=True)
            p.log_path.touch()
            if self.max_log_bytes > 0:  # readers take it before the first rotation can happen
                Path(f"{p.log_path}.lock").touch()
        public = [{k: v for k, v in e.items() if k != "actor"} for e in entries]
        manifest = {"multi": multi, "expected": len(procs), "marker": spec.marker, "nodes": public}
        write_json_atomic(spec.run_dir / MANIFEST, manifest)  # before any process exists: `recover` reads it
        cap = self.max_log_bytes
        config = self.container_config
        refs = [e["actor"].launch.remote(local, cap, config) for e, local in zip(entries, local_specs, strict=True)]
        handles: list[Handle | None] = []
        error: str | None = None
        for e, ref in zip(entries, refs, strict=True):
            try:
                handles.append(ray.get(ref, timeout=LAUNCH_TIMEOUT_S))
            except LaunchError as ex:  # Ray re-raises the agent's exception as its own type too
                handles.append(None)
                error = error or _cause(ex)
            except (ray.exceptions.RayError, OSError) as ex:
                handles.append(None)
                error = error or f"node {e['node']}: {_cause(ex)}"
        handle: Handle = {
            "ray": [{**pub, "handle": h} for pub, h in zip(public, handles, strict=True) if h is not None],
            "run_dir": str(spec.run_dir),
        }
        if multi:
            handle["ranks"] = [{"rank": r} for e in handle["ray"] for r in e["ranks"]]
            handle["expected"] = len(procs)
            if spec.marker is not None:
                handle["marker"] = spec.marker
        if error is not None:
            self.signal(handle, signals.SIGKILL)
            self.cleanup(handle)
            raise LaunchError(error)
        self._watch(handle)
        return handle

    def recover(self, run_dir: Path) -> Handle | None:
        try:
            manifest = json.loads((run_dir / MANIFEST).read_text())
        except (FileNotFoundError, ValueError):
            return None
        entries = []
        found: list[int] = []
        for e in manifest["nodes"]:
            agent = self.inventory.agent(e["node"])
            if agent is None or agent.node_id != e["node_id"]:
                continue
            try:
                local = ray.get(agent.actor.recover.remote(e["run_dir"]), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayError:
                continue
            if local is None:
                continue
            entries.append({**e, "handle": local})
            found += [e["ranks"][int(r["rank"])] for r in local["ranks"]] if "ranks" in local else e["ranks"]
        if not entries:
            return None
        handle: Handle = {"ray": entries, "run_dir": str(run_dir)}
        if manifest["multi"]:
            handle["ranks"] = [{"rank": r} for r in sorted(found)]
            handle["expected"] = int(manifest["expected"])
            if manifest.get("marker"):
                handle["marker"] = manifest["marker"]
        self._watch(handle)
        return handle

    def poll(self, handle: Handle) -> Status:
        return combined(self.poll_ranks(handle))

    def poll_ranks(self, handle: Handle) -> list[Status]:
        self._watch(handle)
        out: list[Status] = [Lost("this rank was never started")] * expected_processes(handle)
        for i, e in enumerate(handle["ray"]):
            statuses = self._entry_status(handle, i, e)
            for local_i, rank in enumerate(e["ranks"]):
                if local_i < len(statuses):
                    out[rank] = statuses[local_i]
        return out

    def signal(self, handle: Handle, signum: int) -> None:
        self._call_all(handle, lambda actor, e: actor.signal.remote(e["handle"], signum))

    def cleanup(self, handle: Handle) -> None:
        self._call_all(handle, lambda actor, e: actor.cleanup.remote(e["handle"], e["run_dir"]))
        run_dir = str(handle["run_dir"])
        with self._lock:
            self._watched.pop(run_dir, None)
            for i in range(len(handle["ray"])):
                self._status.pop((run_dir, i), None)

    # ---- state of an attempt ----------------------------------------------------------------

    def _entry_status(self, handle: Handle, i: int, e: dict[str, Any]) -> list[Status]:
        n = len(e["ranks"])
        agent = self.inventory.agent(e["node"])
        if agent is None or agent.node_id != e["node_id"]:
            if self.inventory.starting(e["node_id"]):
                return [Running()] * n  # its agent is being found again after a head restart
            return [Lost(f"node {e['node']} is down")] * n
        silent = self._silent_since.get(agent.node_id)
        if silent is not None and time.monotonic() - silent > AGENT_SILENT_S:
            return [Lost(f"the gpucluster agent on node {e['node']} does not answer")] * n
        with self._lock:
            cached = self._status.get((str(handle["run_dir"]), i))
        return cached if cached is not None else [Running()] * n  # the first sync comes shortly

    def _watch(self, handle: Handle) -> None:
        with self._lock:
            self._watched.setdefault(str(handle["run_dir"]), handle)

    def _call_all(self, handle: Handle, call: Any) -> None:
        """Call every live agent of the attempt at once; a dead node has nothing left to reach."""
        refs = []
        for e in handle["ray"]:
            agent = self.inventory.agent(e["node"])
            if agent is not None and agent.node_id == e["node_id"]:
                refs.append(call(agent.actor, e))
        for ref in refs:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref, timeout=CALL_TIMEOUT_S)

    # ---- the monitor: states and logs of every watched attempt -------------------------------

    def _monitor(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.sync_once()
            except Exception:  # keep watching; the next round retries
                log.exception("ray monitor round failed")

    def sync_once(self) -> None:
        """One round: per agent, one call for the states and new output of all its attempts."""
        with self._lock:
            watched = list(self._watched.items())
        calls: dict[str, tuple[Any, list[tuple[str, int, dict[str, Any]]]]] = {}
        for run_dir, handle in watched:
            for i, e in enumerate(handle["ray"]):
                agent = self.inventory.agent(e["node"])
                if agent is None or agent.node_id != e["node_id"]:
                    continue
                calls.setdefault(agent.node_id, (agent.actor, []))[1].append((run_dir, i, e))
        samples = self._ask_samples()
        if not calls and not samples:
            return
        refs = {}
        asked: dict[str, list[list[int]]] = {}  # node id -> per item, the head's offset of each log
        for node_id, (actor, items) in calls.items():
            asked[node_id] = [[log_end(h) for h in e["logs"]] for _, _, e in items]
            args = [(e["handle"], list(zip(e["remote_logs"], offsets, strict=True)))
                    for (_, _, e), offsets in zip(items, asked[node_id], strict=True)]  # fmt: skip
            refs[node_id] = actor.sync.remote(args)
        waited = list(refs.values()) + list(samples.values())
        ready, _ = ray.wait(waited, num_returns=len(waited), timeout=CALL_TIMEOUT_S)
        done = set(ready)
        self._deliver_samples(samples, done)
        for node_id, ref in refs.items():
            if ref not in done:
                self._silent_since.setdefault(node_id, time.monotonic())
                continue
            try:
                results = ray.get(ref)
            except ray.exceptions.RayError:
                self._silent_since.setdefault(node_id, time.monotonic())
                continue
            self._silent_since.pop(node_id, None)
            for (run_dir, i, e), offsets, (statuses, chunks) in zip(
                calls[node_id][1], asked[node_id], results, strict=True
            ):
                statuses = list(statuses)
                for k, (path, chunk) in enumerate(zip(e["logs"], chunks, strict=True)):
                    # (offset, bytes); an agent of an older gpucluster answers the bytes from our offset
                    start, data = (offsets[k], chunk) if isinstance(chunk, bytes) else chunk
                    if data:
                        append_log(Path(path), start, data, self.max_log_bytes)
                    if len(data) >= LOG_CHUNK and k < len(statuses) and not isinstance(statuses[k], Running):
                        statuses[k] = Running()  # ended, but its output is not all here yet
                with self._lock:
                    if run_dir in self._watched:
                        self._status[(run_dir, i)] = statuses

    def _ask_samples(self) -> dict[str, Any]:
        """node name -> ObjectRef of its agent's GPU reading, when a telemetry pull is due."""
        feed = self.telemetry
        if feed is None or time.monotonic() - self._last_sample < feed.interval_s:
            return {}
        self._last_sample = time.monotonic()
        agents = {a.node: a for a in self.inventory.agents()}
        asks = feed.asks((a.node, a.gpus, a.virtual) for a in agents.values())
        refs = {}
        for node, ask in asks.items():
            try:
                refs[node] = agents[node].actor.sample.remote(ask)
            except AttributeError:  # a detached agent left by an older gpucluster: no readings
                log.debug("node %s: its agent cannot sample telemetry", node)
        return refs

    def _deliver_samples(self, samples: dict[str, Any], done: set[Any]) -> None:
        """Readings that came back in time go to the monitor; a missing one is the silence rule's."""
        feed = self.telemetry
        for node, ref in samples.items():
            if feed is None or ref not in done:
                continue
            try:
                feed.deliver(node, ray.get(ref))
            except ray.exceptions.RayError as e:
                log.warning("node %s: no telemetry reading (%s)", node, _cause(e))


def _cause(e: BaseException) -> str:
    """The agent's own message, without Ray's traceback wrapping."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return str(cause)
    return str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__


__all__ = ["RayExecutor"]
