"""The cluster spec: what hardware to simulate, and the models around it.

A spec is one YAML file (see examples/clusters/ and README.md in this folder):

  name, node_groups (count, gpus_per_node, gpu_model, gpu_memory, nvlink_gbps, network_gbps,
  price_per_gpu_hour, power_idle_w, power_busy_w, labels, spares, cpus_per_node, memory_per_node),
  speeds (relative speed per GPU model), failures (rate, repair-time distribution, max_restarts,
  restart backoff), checkpoints (times, or size and storage bandwidth), allreduce, trace_fill, scheduler,
  drains (maintenance windows: which nodes, from when, for how long, and what their running jobs do).

Everything but node_groups has a documented default, so a three-line spec works. Errors carry
file:line of the offending key.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpucluster.core.restarts import MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S
from gpucluster.core.types import Gpu, Node, Priority
from gpucluster.sim.fields import Fields
from gpucluster.sim.yamlspec import Located, Path_, lay_over, load

# Llama 3 (16,384 H100, 54 days): 419 unexpected interruptions -> ~4.7e-4 failures per GPU-day.
LLAMA3_GPU_FAILURES_PER_DAY = 4.7e-4
MAX_NODES = 1_000_000
MAX_GPUS_PER_NODE = 64

CheckpointRule = float | Literal["young", "daly"] | None


@dataclass(frozen=True)
class Spares:
    """A node group's spare pool: nodes bought but not scheduled, that take a failed node's
    place. Hot spares are powered and join at once; cold ones after `cold_delay_s` (racked,
    booted, burnt in). A spare is out of the pool until the node it replaced is repaired.

    Why in the spec: without spares every failure idles the nodes a large job needs for the
    whole repair (Llama 3 in issue 26: 20% effective training time instead of ~90%), and how
    many to buy is a planning question."""

    hot: int = 0
    cold: int = 0
    cold_delay_s: float = 3600.0


@dataclass(frozen=True)
class RepairTime:
    """How long a failed node takes to repair: fixed, or drawn from a distribution (each
    failure draws from its own stream, seeded by the run's seed, so every policy sees the same)."""

    distribution: Literal["fixed", "exponential", "lognormal", "uniform"] = "fixed"
    a: float = 4 * 3600.0  # fixed: the time; exponential: the mean; lognormal: the median; uniform: min
    b: float = 0.0  # lognormal: sigma; uniform: max

    @property
    def mean_s(self) -> float:
        if self.distribution == "lognormal":
            return self.a * math.exp(self.b * self.b / 2.0)
        if self.distribution == "uniform":
            return (self.a + self.b) / 2.0
        return self.a

    def draw(self, rng: random.Random) -> float:
        if self.distribution == "exponential":
            return rng.expovariate(1.0 / self.a)
        if self.distribution == "lognormal":
            return rng.lognormvariate(math.log(self.a), self.b)
        if self.distribution == "uniform":
            return rng.uniform(self.a, self.b)
        return self.a


@dataclass(frozen=True)
class NodeGroup:
    name: str
    count: int
    gpus_per_node: int
    gpu_model: str
    gpu_memory_mb: int
    nvlink_gbps: float  # per GPU, inside a node
    network_gbps: float  # per node, between nodes
    price_per_gpu_hour: float
    power_idle_w: float
    power_busy_w: float
    # Node labels (ib, rack=r1) every node of the group has, as `gpucluster up --label` declares
    # them: what jobs' constraints select (core/selection.py).
    labels: frozenset[str] = frozenset()
    spares: Spares = Spares()
    # CPU cores and host memory (MiB) of each node, as `gpucluster up --cpus/--memory` declares
    # them: what jobs' `cpus`/`mem` take (None: not accounted, any request fits).
    cpus_per_node: float | None = None
    memory_per_node_mb: int | None = None

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_node

    def node_names(self) -> list[str]:
        width = len(str(max(self.count - 1, 0)))
        return [f"{self.name}-{i:0{width}d}" for i in range(self.count)]


@dataclass(frozen=True)
class FailureModel:
    """GPU failures as a Poisson process; a failure takes its whole node down for repair."""

    gpu_failures_per_day: float = LLAMA3_GPU_FAILURES_PER_DAY
    node_repair_s: float = 4 * 3600.0  # the repair time's mean (as `repair` draws it)
    max_restarts: int = 10  # attempts after the first; then the job fails, as on the live head
    repair: RepairTime = RepairTime()
    # The head's restart backoff (core/restarts.py) unless the spec plans with another.
    backoff_first_s: float = RESTART_BACKOFF_S
    backoff_max_s: float = MAX_RESTART_BACKOFF_S


@dataclass(frozen=True)
class CheckpointModel:
    """How jobs checkpoint: a fixed interval, the Young or Daly optimum, or never (None)."""

    interval: CheckpointRule = "daly"
    cost_s: float = 60.0  # writing one checkpoint (the job makes no progress meanwhile)
    restart_s: float = 120.0  # a restarted attempt loading its checkpoint before progressing
    # When the spec gives the checkpoint's size and the storage bandwidth instead of times:
    # cost = size / write bandwidth, restart = relaunch + size / read bandwidth (None: given as times).
    state_size_gb: float | None = None


@dataclass(frozen=True)
class AllReduceModel:
    """Optional slowdown of multi-node jobs by ring all-reduce of the gradients every step."""

    enabled: bool = False
    model_size_gb: float = 1.0  # gradient bytes all-reduced per step
    step_time_s: float = 1.0  # compute time of one step on one node


@dataclass(frozen=True)
class FillRules:
    """What to assume for fields a trace lacks (see fill.py)."""

    team: str = "default"
    priority_mix: tuple[tuple[Priority, float], ...] = ((Priority.NORMAL, 1.0),)
    gpu_type: str | None = None  # None: any model; "proportional": drawn by capacity; else a model
    time_limit_factor: float | None = None  # a limit of factor x the recorded run time; None: no limit
    # `2x..8x`: a factor drawn per job (seeded), the limit rounded up to a value people write
    time_limit_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class DrainWindow:
    """Nodes drained for a while, as `gpucluster drain NODE --until T` does on the head: from
    `start_s` (seconds after the first submission) they take no new job, for `duration_s` (None:
    to the end of the run). `requeue`: their running jobs are checkpointed and requeued at the
    start (what an admin's `gpucluster requeue` of each does), else they run to their end, as a
    drain alone lets them.

    Why in the spec: maintenance is planned capacity loss, a planning question like spares; the
    engine feeds the windows to the core's admission (`Snapshot.drained`), as the head does."""

    nodes: tuple[str, ...]
    start_s: float
    duration_s: float | None = None
    reason: str = "maintenance"
    requeue: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    groups: tuple[NodeGroup, ...]
    speeds: dict[str, float]
    failures: FailureModel = FailureModel()
    checkpoints: CheckpointModel = CheckpointModel()
    allreduce: AllReduceModel = AllReduceModel()
    fill: FillRules = FillRules()
    replan_every_s: float | None = None  # also plan on a timer (policies whose order ages)
    cycle_s: float | None = None  # plan only at multiples of this (a fixed scheduling cycle)
    source: str = ""
    currency: str = "USD"  # what price_per_gpu_hour is in: every cost in the report says it
    drains: tuple[DrainWindow, ...] = ()

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({g.gpu_model for g in self.groups}))

    def speed(self, model: str) -> float:
        return self.speeds.get(model, 1.0)

    def nodes(self) -> tuple[tuple[Node, NodeGroup], ...]:
        """Every node as the core's type, with its group; names are `group-NN`, sorted by group."""
        out = []
        for g in self.groups:
            for name in g.node_names():
                gpus = tuple(
                    Gpu(index=i, model=g.gpu_model, memory_mb=g.gpu_memory_mb, uuid=f"SIM-{name}-{i}")
                    for i in range(g.gpus_per_node)
                )
                node = Node(name=name, gpus=gpus, labels=g.labels, cpus=g.cpus_per_node, memory_mb=g.memory_per_node_mb)
                out.append((node, g))
        return tuple(out)


_TOP = (
    "name",
    "node_groups",
    "speeds",
    "failures",
    "checkpoints",
    "allreduce",
    "trace_fill",
    "scheduler",
    "currency",
    "drains",
)
UNLIMITED_RESTARTS = 1_000_000_000
_GROUP = (
    "name",
    "count",
    "gpus_per_node",
    "gpu_model",
    "gpu_memory",
    "nvlink_gbps",
    "network_gbps",
    "price_per_gpu_hour",
    "power_idle_w",
    "power_busy_w",
    "labels",
    "spares",
    "cpus_per_node",
    "memory_per_node",
)


def load_cluster_spec(path: Path, overrides: tuple[tuple[Path_, Any], ...] = ()) -> ClusterSpec:
    """Read and validate a cluster spec; raises SimInputError with file:line on any problem.

    `overrides`: values laid over the file's before it is validated (what `--sweep KEY=...`
    sets), so a swept value is checked by the same rules, with the same words, as one written
    in the file."""
    doc = load(path)
    if overrides:
        doc = _overridden(doc, overrides)
    if not isinstance(doc.data, dict):
        raise doc.error((), "a cluster spec is a mapping with at least node_groups (see examples/clusters/)")
    top = Fields(doc, (), _TOP)
    groups = _groups(doc, top)
    models = {g.gpu_model for g in groups}
    speeds = _speeds(doc, models)
    replan_every, cycle = _scheduler(doc)
    spec = ClusterSpec(
        name=top.text("name", path.stem),
        groups=groups,
        speeds=speeds,
        failures=_failures(doc),
        checkpoints=_checkpoints(doc),
        allreduce=_allreduce(doc),
        fill=_fill(doc, models),
        replan_every_s=replan_every,
        cycle_s=cycle,
        source=str(path),
        currency=top.text("currency", "USD"),
        drains=_drains(doc, groups),
    )
    return spec


def _overridden(doc: Located, overrides: tuple[tuple[Path_, Any], ...]) -> Located:
    return Located(doc.source, lay_over(doc.data, overrides, doc.source), doc.lines)


def _groups(doc: Located, top: Fields) -> tuple[NodeGroup, ...]:
    items = top.sequence("node_groups")
    groups: list[NodeGroup] = []
    seen: set[str] = set()
    total_nodes = 0
    for i, _ in enumerate(items):
        f = Fields(doc, ("node_groups", i), _GROUP)
        name = f.text("name", f"group{i}")
        if name in seen:
            raise f.fail("name", f"two node groups are named {name!r}; node names must be unique")
        seen.add(name)
        # A CPU-only group (gpus_per_node 0) hosts only CPU-only jobs: it needs no GPU model,
        # and must state its CPUs or memory (a node accounting neither takes no CPU-only job).
        per_node = f.integer("gpus_per_node", minimum=0, maximum=MAX_GPUS_PER_NODE)
        model = f.text("gpu_model", "none" if per_node == 0 else None)
        if per_node == 0 and f.raw("cpus_per_node") is None and f.raw("memory_per_node") is None:
            raise f.fail("gpus_per_node", "is 0 (a CPU-only group): give cpus_per_node and/or memory_per_node")
        idle = f.number("power_idle_w", 50.0)
        busy = f.number("power_busy_w", 300.0)
        if busy < idle:
            raise f.fail("power_busy_w", f"is below power_idle_w ({busy:g} < {idle:g})")
        g = NodeGroup(
            name=name,
            count=f.integer("count", minimum=1, maximum=MAX_NODES),
            gpus_per_node=per_node,
            gpu_model=model,
            gpu_memory_mb=f.memory_mb("gpu_memory", "80GiB"),
            nvlink_gbps=f.number("nvlink_gbps", 300.0, minimum=0.001),
            network_gbps=f.number("network_gbps", 100.0, minimum=0.001),
            price_per_gpu_hour=f.number("price_per_gpu_hour", 0.0),
            power_idle_w=idle,
            power_busy_w=busy,
            labels=_labels(f),
            spares=_spares(doc, ("node_groups", i)),
            cpus_per_node=None if f.raw("cpus_per_node") is None else f.number("cpus_per_node", minimum=0.01),
            memory_per_node_mb=None if f.raw("memory_per_node") is None else f.memory_mb("memory_per_node"),
        )
        total_nodes += g.count
        if total_nodes > MAX_NODES:
            raise f.fail("count", f"the spec declares more than {MAX_NODES} nodes in all")
        groups.append(g)
    return tuple(groups)


def _labels(f: Fields) -> frozenset[str]:
    """A group's `labels: [ib, rack=r1]`, checked as `up --label` checks them."""
    from gpucluster.models import check_node_labels

    raw = f.raw("labels")
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise f.fail("labels", "must be a list of labels, e.g. [ib, rack=r1]")
    try:
        return frozenset(check_node_labels(raw))
    except ValueError as e:
        raise f.fail("labels", str(e)) from None


def _speeds(doc: Located, models: set[str]) -> dict[str, float]:
    f = Fields(doc, (), _TOP)
    raw = f.mapping("speeds")
    speeds: dict[str, float] = {}
    for model, value in raw.items():
        path = ("speeds", model)
        if str(model) not in models:
            raise doc.error(path, f"no node group has this GPU model; models here: {', '.join(sorted(models))}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise doc.error(path, f"a relative speed must be a number above 0 (1.0 = as in the trace); got {value!r}")
        speeds[str(model)] = float(value)
    return speeds


def _spares(doc: Located, group: Path_) -> Spares:
    f = Fields(doc, (*group, "spares"), ("hot", "cold", "cold_delay"))
    d = Spares()
    delay = f.duration("cold_delay", d.cold_delay_s)
    if delay < 0:
        raise f.fail("cold_delay", "must be at least 0 (how long a cold spare takes to join)")
    return Spares(
        hot=f.integer("hot", 0, maximum=MAX_NODES),
        cold=f.integer("cold", 0, maximum=MAX_NODES),
        cold_delay_s=delay,
    )


def _failures(doc: Located) -> FailureModel:
    f = Fields(
        doc,
        ("failures",),
        ("gpu_failures_per_day", "node_repair_time", "max_restarts", "restart_backoff"),
    )
    d = FailureModel()
    repair = _repair(doc, f)
    first, most = _backoff(doc)
    restarts = f.raw("max_restarts")
    if isinstance(restarts, str) and restarts.strip().lower() in ("unlimited", "none", "never"):
        max_restarts = UNLIMITED_RESTARTS
    else:
        if isinstance(restarts, str):
            raise f.fail("max_restarts", f"must be a whole number or unlimited; got {restarts!r}")
        max_restarts = f.integer("max_restarts", d.max_restarts, maximum=1_000_000)
    return FailureModel(
        gpu_failures_per_day=f.number("gpu_failures_per_day", d.gpu_failures_per_day),
        node_repair_s=repair.mean_s,
        max_restarts=max_restarts,
        repair=repair,
        backoff_first_s=first,
        backoff_max_s=most,
    )


_DISTRIBUTIONS = {
    "fixed": ("time",),
    "exponential": ("mean",),
    "lognormal": ("median", "sigma"),
    "uniform": ("min", "max"),
}


def _repair(doc: Located, f: Fields) -> RepairTime:
    """`node_repair_time: 4h`, or a distribution: `{distribution: exponential, mean: 4h}`,
    `{distribution: lognormal, median: 2h, sigma: 1.0}`, `{distribution: uniform, min: 1h, max: 8h}`."""
    if not isinstance(f.raw("node_repair_time"), dict):
        seconds = f.duration("node_repair_time", FailureModel().node_repair_s)
        if seconds < 0:
            raise f.fail("node_repair_time", "must be at least 0")
        return RepairTime("fixed", seconds)
    path = ("failures", "node_repair_time")
    kind = str(f.raw("node_repair_time").get("distribution", "fixed")).strip().lower()
    if kind not in _DISTRIBUTIONS:
        raise doc.error(
            (*path, "distribution"), f"unknown distribution {kind!r}; use one of: {', '.join(_DISTRIBUTIONS)}"
        )
    keys = _DISTRIBUTIONS[kind]
    g = Fields(doc, path, ("distribution", *keys))
    for key in keys:
        if not g.has(key):
            raise g.fail(key, f"is required for a {kind} repair time (give {' and '.join(keys)})")
    if kind == "lognormal":
        median = g.duration("median", 0)
        if median <= 0:
            raise g.fail("median", "must be above 0")
        return RepairTime("lognormal", median, g.number("sigma", minimum=0.0))
    if kind == "uniform":
        low, high = g.duration("min", 0), g.duration("max", 0)
        if not 0 <= low <= high:
            raise g.fail("max", f"must be at least min ({low:g} s) and min at least 0; got {high:g} s")
        return RepairTime("uniform", low, high)
    value = g.duration(keys[0], 0)
    if value < 0 or (kind == "exponential" and value == 0):
        raise g.fail(keys[0], "must be above 0")
    return RepairTime(kind, value)  # type: ignore[arg-type]


def _backoff(doc: Located) -> tuple[float, float]:
    """`restart_backoff: {first: 1s, max: 300s}`: how long a restart after a failure waits,
    doubling from `first` per restart up to `max` (default: the head's own rule)."""
    f = Fields(doc, ("failures", "restart_backoff"), ("first", "max"))
    first = f.duration("first", RESTART_BACKOFF_S)
    most = f.duration("max", MAX_RESTART_BACKOFF_S if first <= MAX_RESTART_BACKOFF_S else first)
    if first < 0:
        raise f.fail("first", "must be at least 0 (0: restart at once)")
    if most < first:
        raise f.fail("max", f"must be at least first ({first:g} s); got {most:g} s")
    return first, most


_STORAGE = ("state_size_gb", "write_gb_per_s", "read_gb_per_s", "relaunch")


def _checkpoints(doc: Located) -> CheckpointModel:
    """Checkpoint and restart times, given as times (`cost`, `restart`) or from the checkpoint's
    size and the storage's bandwidth (`state_size_gb`, `write_gb_per_s`, `read_gb_per_s`,
    `relaunch`): cost = size / write bandwidth, restart = relaunch + size / read bandwidth."""
    f = Fields(doc, ("checkpoints",), ("interval", "cost", "restart", *_STORAGE))
    d = CheckpointModel()
    interval = parse_checkpoint_rule(f, "interval", d.interval)
    if not any(f.has(k) for k in _STORAGE):
        return CheckpointModel(
            interval=interval, cost_s=f.duration("cost", d.cost_s), restart_s=f.duration("restart", d.restart_s)
        )
    for given in ("cost", "restart"):
        if f.has(given):
            raise f.fail(
                given,
                "give either cost and restart as times, or state_size_gb with write_gb_per_s and "
                "read_gb_per_s (the times are then worked out), not both",
            )
    for key in ("state_size_gb", "write_gb_per_s", "read_gb_per_s"):
        if not f.has(key):
            raise f.fail(key, "is required with state_size_gb (checkpoint size in GB, storage bandwidth in GB/s)")
    size = f.number("state_size_gb", minimum=0.0)
    write = f.number("write_gb_per_s", minimum=1e-9)
    read = f.number("read_gb_per_s", minimum=1e-9)
    relaunch = f.duration("relaunch", 0)
    if relaunch < 0:
        raise f.fail("relaunch", "must be at least 0")
    return CheckpointModel(interval=interval, cost_s=size / write, restart_s=relaunch + size / read, state_size_gb=size)


def parse_checkpoint_rule(f: Fields, key: str, default: CheckpointRule) -> CheckpointRule:
    raw = f.raw(key) if key in f.data else default
    if raw is None or raw is False or (isinstance(raw, str) and raw.strip().lower() in ("none", "never", "off")):
        return None
    if isinstance(raw, str) and raw.strip().lower() in ("young", "daly"):
        return "young" if raw.strip().lower() == "young" else "daly"
    seconds = f.duration(key, 0)
    if seconds <= 0:
        raise f.fail(key, "a checkpoint interval must be above 0; use none to turn checkpoints off")
    return seconds


def _allreduce(doc: Located) -> AllReduceModel:
    f = Fields(doc, ("allreduce",), ("enabled", "model_size_gb", "step_time"))
    d = AllReduceModel()
    step = f.duration("step_time", d.step_time_s)
    if step <= 0:
        raise f.fail("step_time", "must be above 0")
    return AllReduceModel(
        enabled=f.boolean("enabled", d.enabled),
        model_size_gb=f.number("model_size_gb", d.model_size_gb),
        step_time_s=step,
    )


def _fill(doc: Located, models: set[str]) -> FillRules:
    f = Fields(doc, ("trace_fill",), ("team", "priority", "gpu_type", "time_limit"))
    d = FillRules()
    mix = d.priority_mix
    if f.has("priority"):
        raw = f.raw("priority")
        if isinstance(raw, str):
            try:
                mix = ((Priority.parse(raw), 1.0),)
            except ValueError as e:
                raise f.fail("priority", str(e)) from None
        else:
            parts = []
            for name, weight in f.mapping("priority").items():
                path = ("trace_fill", "priority", name)
                try:
                    p = Priority.parse(str(name))
                except ValueError as e:
                    raise doc.error(path, str(e)) from None
                if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
                    raise doc.error(path, f"a share must be a number of at least 0; got {weight!r}")
                parts.append((p, float(weight)))
            if not parts or sum(w for _, w in parts) <= 0:
                raise f.fail("priority", "give a share above 0 to at least one priority, e.g. {normal: 1}")
            mix = tuple(sorted(parts, key=lambda pw: -int(pw[0])))
    gpu_type: str | None = None
    if f.has("gpu_type"):
        text = f.text("gpu_type")
        if text == "proportional":
            gpu_type = text
        elif text != "any":
            if text not in models:
                raise f.fail(
                    "gpu_type", f"no node group has {text!r}; use any, proportional or one of: {sorted(models)}"
                )
            gpu_type = text
    factor: float | None = None
    factors: tuple[float, float] | None = None
    if f.has("time_limit"):
        text = str(f.raw("time_limit")).strip().lower()
        if ".." in text:
            factors = _factor_range(f, text)
        elif text not in ("none", "off"):
            try:
                factor = float(text.removesuffix("x"))
            except ValueError:
                factor = -1.0
            if not text.endswith("x") or not factor >= 1.0:
                raise f.fail(
                    "time_limit",
                    f"give none, or a factor of the recorded run time of at least 1, e.g. 2x; got {text!r}",
                )
    return FillRules(
        team=f.text("team", d.team),
        priority_mix=mix,
        gpu_type=gpu_type,
        time_limit_factor=factor,
        time_limit_range=factors,
    )


def _factor_range(f: Fields, text: str) -> tuple[float, float]:
    """`2x..8x`: both ends factors of at least 1, the first not above the second."""
    lo_text, _, hi_text = text.partition("..")
    try:
        lo, hi = float(lo_text.strip().removesuffix("x")), float(hi_text.strip().removesuffix("x"))
    except ValueError:
        lo = hi = -1.0
    if not (lo_text.strip().endswith("x") and hi_text.strip().endswith("x") and 1.0 <= lo <= hi):
        raise f.fail(
            "time_limit",
            f"a range is two factors of the recorded run time, at least 1, low first, e.g. 2x..8x; got {text!r}",
        )
    return lo, hi


_DRAIN = ("nodes", "start", "duration", "reason", "running")
_RUNNING = ("finish", "requeue")


def _drains(doc: Located, groups: tuple[NodeGroup, ...]) -> tuple[DrainWindow, ...]:
    """`drains:` a list of windows: `{nodes: [a100-03, h100], start: 2h, duration: 4h, reason:
    firmware, running: finish}`. A name in `nodes` is a node (`group-NN`, as the spec names
    them) or a whole node group."""
    raw = doc.data.get("drains")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise doc.error(("drains",), "must be a list of windows, e.g. [{nodes: [g-0], start: 2h, duration: 4h}]")
    by_group = {g.name: g.node_names() for g in groups}
    names = {n for ns in by_group.values() for n in ns}
    out = []
    for i, _ in enumerate(raw):
        f = Fields(doc, ("drains", i), _DRAIN)
        listed = f.raw("nodes")
        if isinstance(listed, str):
            listed = [listed]
        if not isinstance(listed, list) or not listed or not all(isinstance(n, str) for n in listed):
            raise f.fail("nodes", "must be a list of node names (group-NN) or node group names, e.g. [g-0, g-1]")
        nodes: list[str] = []
        for name in listed:
            if name in by_group:
                nodes.extend(by_group[name])
            elif name in names:
                nodes.append(name)
            else:
                raise f.fail(
                    "nodes",
                    f"no node or node group is named {name!r}; nodes are named group-NN "
                    f"(groups: {', '.join(sorted(by_group))})",
                )
        if not f.has("start"):
            raise f.fail("start", "is required: when the drain begins, after the first submission (e.g. 2h)")
        start = f.duration("start", 0)
        if start < 0:
            raise f.fail("start", "must be at least 0 (seconds after the first submission)")
        duration = None
        if f.has("duration") and str(f.raw("duration")).strip().lower() not in ("none", "forever"):
            duration = f.duration("duration", 0)
            if duration <= 0:
                raise f.fail("duration", "must be above 0; leave it out (or none) to drain until the end of the run")
        running = f.text("running", "finish").lower()
        if running not in _RUNNING:
            raise f.fail(
                "running",
                f"must be finish (jobs run to their end) or requeue (checkpoint and requeue); got {running!r}",
            )
        out.append(
            DrainWindow(
                nodes=tuple(dict.fromkeys(nodes)),
                start_s=start,
                duration_s=duration,
                reason=f.text("reason", "maintenance"),
                requeue=running == "requeue",
            )
        )
    return tuple(out)


def _scheduler(doc: Located) -> tuple[float | None, float | None]:
    """(replan_every, cycle) in seconds; None when not set."""
    f = Fields(doc, ("scheduler",), ("replan_every", "cycle"))
    out: list[float | None] = []
    for key in ("replan_every", "cycle"):
        if not f.has(key):
            out.append(None)
            continue
        seconds = f.duration(key, 0)
        if seconds <= 0:
            raise f.fail(key, "must be above 0 (leave it out to plan whenever something changes)")
        out.append(seconds)
    return out[0], out[1]
