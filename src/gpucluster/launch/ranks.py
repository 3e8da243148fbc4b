"""From a multi-GPU allocation to the processes that torch.distributed expects.

Two launch modes, both derived from the same numbering so a job sees the same ranks either way:

* per-GPU (`per_gpu_envs`): the cluster starts one process per GPU itself and gives each one
  exactly the variables torchrun would (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  GROUP_RANK/NODE_RANK, MASTER_ADDR, MASTER_PORT, ...), so an unmodified torchrun script runs.
* per-node launcher (`launcher_commands`): the cluster starts one `torch.distributed.run`
  (torchrun) per node with --nnodes/--node-rank/--nproc-per-node/--master-addr/--master-port
  filled in, for users who want torchrun's own process management on each node.

Ranks are numbered node-major in allocation order: node 0's GPUs get ranks 0..k-1 in the order of
its `gpu_indices`, then node 1, and so on. Rank 0 therefore lives on the first slice's node, whose
address is MASTER_ADDR; in per-GPU mode rank 0 hosts the TCPStore on MASTER_PORT.

Every attempt of a job rendezvouses under its own store prefix (`rendezvous_prefix`, exported as
GPUCLUSTER_RDZV_PREFIX): a process left over from a dead attempt, or a store reused across
restarts, then can never hand a new attempt the old attempt's keys (peer addresses, NCCL ids) —
the trap where a restarted gloo group dials dead ports or waits 30 minutes. The head should also
pick a fresh MASTER_PORT per attempt (`pick_free_port`).

Everything here is pure except `pick_free_port`, which binds a socket and sits at the end.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from gpucluster.core.types import NodeSlice

# The variables, beyond torchrun's, that gpucluster sets for a training job and that
# `gpucluster.train` reads. Kept here (no torch import) so the head can use them too.
ENV_RDZV_PREFIX = "GPUCLUSTER_RDZV_PREFIX"
ENV_CHECKPOINT_DIR = "GPUCLUSTER_CHECKPOINT_DIR"
ENV_GRACE_PERIOD_S = "GPUCLUSTER_GRACE_PERIOD_S"
ENV_ATTEMPT = "GPUCLUSTER_ATTEMPT"
ENV_JOB_ID = "GPUCLUSTER_JOB_ID"
ENV_URL = "GPUCLUSTER_URL"
ENV_RDZV_TIMEOUT_S = "GPUCLUSTER_RDZV_TIMEOUT_S"
ENV_COLLECTIVE_TIMEOUT_S = "GPUCLUSTER_COLLECTIVE_TIMEOUT_S"

# "Requeue me": the job saved a checkpoint after SIGTERM and wants to run again later, as a new
# attempt of the same job. Chosen outside every range with a common meaning: 0-2 (success,
# error, usage), 64-78 (sysexits.h), 120 (Python's failure to flush at exit), 124-127 (timeout,
# shell), 128+n (killed by signal n) and 255. The head treats it as "preempted", never "failed".
REQUEUE_EXIT_CODE = 79

# torchrun's value: the signals its agent turns into SignalException (read by torch.distributed.elastic).
_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


@dataclass(frozen=True)
class RankPlacement:
    """Where one process of a job runs: its global and node-local rank and its GPU."""

    rank: int
    local_rank: int
    node_rank: int
    node: str
    gpu_index: int  # the NVML index of this process's GPU on `node`


@dataclass(frozen=True)
class ProcessEnv:
    """The environment of one process of a job.

    `env` must override whatever the job inherits; `defaults` apply only where the job's own
    environment lacks the variable (torchrun does the same with OMP_NUM_THREADS: it sets it to 1
    for several processes per node unless the user chose a value).
    """

    placement: RankPlacement
    env: Mapping[str, str]
    defaults: Mapping[str, str] = field(default_factory=dict)

    def apply(self, base: Mapping[str, str]) -> dict[str, str]:
        merged = dict(self.defaults)
        merged.update(base)
        merged.update(self.env)
        return merged


@dataclass(frozen=True)
class LauncherCommand:
    """One torchrun per node: its argv and the variables it needs beyond the job's environment."""

    node: str
    node_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]


def rendezvous_prefix(job_id: int, attempt: int) -> str:
    """The TCPStore key prefix of one attempt of one job: unique per attempt, stable across ranks."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return f"gpucluster/job-{job_id}/attempt-{attempt}/"


def placements(slices: Sequence[NodeSlice]) -> tuple[RankPlacement, ...]:
    """Number every GPU of the allocation: node-major, in allocation order."""
    _check_slices(slices)
    out: list[RankPlacement] = []
    for node_rank, s in enumerate(slices):
        for local_rank, gpu in enumerate(s.gpu_indices):
            out.append(RankPlacement(len(out), local_rank, node_rank, s.node, gpu))
    return tuple(out)


def master_addr(slices: Sequence[NodeSlice], addresses: Mapping[str, str]) -> str:
    """The address of rank 0's node, where the TCPStore is hosted."""
    _check_slices(slices)
    return _address(addresses, slices[0].node)


def per_gpu_envs(
    slices: Sequence[NodeSlice],
    addresses: Mapping[str, str],
    master_port: int,
    *,
    job_id: int,
    attempt: int,
    isolate_gpus: bool = False,
    max_restarts: int = 0,
    error_file: Callable[[RankPlacement], str] | None = None,
) -> tuple[ProcessEnv, ...]:
    """The torchrun environment of every process of a job that runs one process per GPU.

    CUDA_VISIBLE_DEVICES: by default each process sees all of its node's allocated GPUs (the
    node-local list, as NVML indices) and picks its own with `cuda:LOCAL_RANK`, exactly as under
    torchrun. That is the more compatible choice: scripts call `torch.cuda.set_device(LOCAL_RANK)`,
    use LOCAL_RANK == 0 for once-per-node work, and NCCL can see every local peer for its P2P and
    NVLink topology detection. `isolate_gpus=True` instead shows each process only its own GPU
    and sets LOCAL_RANK=0, like torchrun's --virtual-local-rank; use it only for scripts that
    assume device 0.

    torchrun's elastic variables are set too, so `torch.distributed.is_torchelastic_launched()`
    is True and libraries that read them behave as under torchrun: TORCHELASTIC_RUN_ID (the
    job), TORCHELASTIC_RESTART_COUNT (attempts before this one), TORCHELASTIC_MAX_RESTARTS (the
    job's --max-restarts), TORCHELASTIC_ERROR_FILE (where `@record` writes a failing rank's
    traceback: `error_file(placement)`, in the job's own directory) and
    TORCHELASTIC_USE_AGENT_STORE=False, the one value that differs from torchrun's: there is no
    agent here, rank 0 hosts the TCPStore itself, as `init_process_group("env://")` does then.
    """
    _check_port(master_port)
    places = placements(slices)
    addr = master_addr(slices, addresses)
    world = len(places)
    nnodes = len(slices)
    prefix = rendezvous_prefix(job_id, attempt)
    out: list[ProcessEnv] = []
    for p in places:
        local_gpus = slices[p.node_rank].gpu_indices
        local_world = len(local_gpus)
        visible = str(p.gpu_index) if isolate_gpus else ",".join(str(i) for i in local_gpus)
        env = {
            "RANK": str(p.rank),
            "LOCAL_RANK": "0" if isolate_gpus else str(p.local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world),
            "NODE_RANK": str(p.node_rank),
            # torchrun's names for the same numbers; some libraries read these.
            "GROUP_RANK": str(p.node_rank),
            "GROUP_WORLD_SIZE": str(nnodes),
            "ROLE_RANK": str(p.rank),
            "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default",
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(master_port),
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": ",".join(str(i) for i in local_gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            ENV_RDZV_PREFIX: prefix,
            "TORCHELASTIC_RUN_ID": f"gpucluster-job-{job_id}",
            "TORCHELASTIC_RESTART_COUNT": str(attempt - 1),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "False",
        }
        if error_file is not None:
            env["TORCHELASTIC_ERROR_FILE"] = error_file(p)
        defaults = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_SIGNALS_TO_HANDLE": _SIGNALS_TO_HANDLE}
        if local_world > 1:
            defaults["OMP_NUM_THREADS"] = "1"
        out.append(ProcessEnv(p, env, defaults))
    return tuple(out)


def launcher_commands(
    slices: Sequence[NodeSlice],
    addresses: Mapping[str, str],
    master_port: int,
    argv: Sequence[str],
    *,
    job_id: int,
    attempt: int,
    torchrun: Sequence[str] | None = None,
    rdzv_timeout_s: int = 60,
) -> tuple[LauncherCommand, ...]:
    """One torchrun command per node, with the job's own command after torchrun's options.

    `argv` is the command the user submitted, the same one per-GPU mode runs. A Python command
    (`python train.py ...`, `python -m pkg ...`, `python -u train.py` via --no-python) is handed
    to that same interpreter's `-m torch.distributed.run`, so the torchrun used is the one installed next to the job's
    torch; anything else runs through `torchrun --no-python`. `torchrun` overrides the launcher
    prefix (e.g. `("torchrun",)`). `rdzv_timeout_s` bounds how long node 0's torchrun waits for
    the other nodes (torchrun's static rendezvous waits 600 s by default).

    --max-restarts=0: the head restarts the whole job as a new attempt (fresh port, fresh store
    prefix), never torchrun, whose in-place restarts reuse its store. The static rendezvous
    (--master-addr/--master-port) makes node 0's torchrun host the store; every node must run
    the same number of processes, as torchrun requires.
    """
    _check_port(master_port)
    _check_slices(slices)
    if not argv:
        raise ValueError("argv is empty")
    sizes = {len(s.gpu_indices) for s in slices}
    if len(sizes) != 1:
        raise ValueError(f"torchrun needs the same number of GPUs on every node, got {sorted(sizes)}")
    (nproc,) = sizes
    launcher, script = _torchrun_split(argv, torchrun)
    addr = master_addr(slices, addresses)
    prefix = rendezvous_prefix(job_id, attempt)
    out: list[LauncherCommand] = []
    for node_rank, s in enumerate(slices):
        opts = (
            f"--nnodes={len(slices)}",
            f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc}",
            f"--master-addr={addr}",
            f"--master-port={master_port}",
            "--max-restarts=0",
            f"--rdzv-conf=timeout={rdzv_timeout_s}",
        )
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in s.gpu_indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            ENV_RDZV_PREFIX: prefix,
        }
        out.append(LauncherCommand(s.node, node_rank, (*launcher, *opts, *script), env))
    return tuple(out)


class AttemptOutcome(Enum):
    """How one attempt of a multi-process job ended, from its processes' exit codes."""

    SUCCEEDED = "succeeded"  # every process exited 0
    REQUEUE = "requeue"  # the job checkpointed and asked to run again (REQUEUE_EXIT_CODE)
    FAILED = "failed"  # anything else: a crash, a lost peer, a kill


def attempt_outcome(exit_codes: Sequence[int]) -> AttemptOutcome:
    """Classify an attempt once all of its processes have ended.

    REQUEUE needs every process to have ended with 0 or REQUEUE_EXIT_CODE and at least one with
    the latter: `gpucluster.train` makes all ranks agree before they stop, so a mix with any
    other code means a rank died and the checkpoint may be missing. Signals count as failures
    whichever way they are reported (-N from Popen, 128+N from a shell). The head still knows
    better when it sent SIGTERM itself: a torchrun launcher (launcher mode) exits 1 after
    forwarding SIGTERM to its workers, however cleanly they checkpointed.
    """
    if not exit_codes:
        raise ValueError("no exit codes")
    if all(c == 0 for c in exit_codes):
        return AttemptOutcome.SUCCEEDED
    if all(c in (0, REQUEUE_EXIT_CODE) for c in exit_codes):
        return AttemptOutcome.REQUEUE
    return AttemptOutcome.FAILED


def _torchrun_split(argv: Sequence[str], torchrun: Sequence[str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split a user command into (launcher prefix, what follows torchrun's options)."""
    first = os.path.basename(argv[0])
    is_python = first.startswith("python") and not first.endswith((".py", "-config"))
    if is_python and len(argv) >= 2:
        launcher = tuple(torchrun) if torchrun else (argv[0], "-m", "torch.distributed.run")
        rest = tuple(argv[1:])
        if rest[0] == "-m":
            return launcher, ("--module", *rest[1:])
        if rest[0].startswith("-"):  # interpreter flags (-u, -X ...): torchrun runs the command as is
            return launcher, ("--no-python", *argv)
        return launcher, rest
    launcher = tuple(torchrun) if torchrun else ("torchrun",)
    return launcher, ("--no-python", *argv)


def _check_slices(slices: Sequence[NodeSlice]) -> None:
    if not slices:
        raise ValueError("an allocation needs at least one node slice")
    for s in slices:
        if not s.gpu_indices:
            raise ValueError(f"node {s.node} has no GPUs in the allocation")
    nodes = [s.node for s in slices]
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"a node appears twice in the allocation: {nodes}")


def _check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise ValueError(f"master port must be in 1..65535, got {port}")


def _address(addresses: Mapping[str, str], node: str) -> str:
    try:
        return addresses[node]
    except KeyError:
        raise ValueError(f"no address known for node {node!r}") from None


# --- the one function here with I/O --------------------------------------------------------


def pick_free_port(host: str = "") -> int:
    """A TCP port on `host` that the kernel will not hand to anyone else for a minute, while a
    server that binds it with SO_REUSEADDR (torch's TCPStore, uvicorn, PostgreSQL, Go's net) can.

    Why not simply "bind port 0, read it, close": between that close and rank 0's bind, any other
    process's bind(0) or outgoing connect() may be given the same port, and TCPStore fails at once
    with EADDRINUSE (a fresh-clone CI run lost a 4-rank test that way: rank 0 died, the others
    timed out on the rendezvous). So the port is left reserved by the kernel itself: we listen on
    it, connect to it and close the accepted end first, which leaves that end in TIME_WAIT (60 s
    on Linux). While a TIME_WAIT socket holds the port, the kernel's own picks (bind to port 0,
    the ephemeral port of a connect) skip it and a plain bind fails; a bind with SO_REUSEADDR,
    which every listening server sets, is allowed. The listener sets SO_REUSEADDR too, since the
    TIME_WAIT entry inherits it and only then lets the server in. Call it on the master node.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        port: int = listener.getsockname()[1]
        target = "127.0.0.1" if host in ("", "0.0.0.0") else host
        with socket.create_connection((target, port), timeout=5) as client:
            accepted, _ = listener.accept()
            # The accepted end closes first: the active closer is the one left in TIME_WAIT.
            accepted.close()
            with contextlib.suppress(OSError):
                client.recv(1)  # its FIN has arrived: the accepted end is past FIN_WAIT_1
        return port
