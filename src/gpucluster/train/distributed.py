"""torch.distributed setup and teardown from the torchrun environment, with short timeouts and a
rendezvous prefix of its own for every attempt.

`init_process_group(init_method="env://")` would rendezvous under fixed keys with 30-minute
(gloo) or 10-minute (NCCL) timeouts. After a failure that is the trap this module avoids: a new
attempt must never read the keys of a dead one (peer addresses, NCCL unique ids) from a store
that outlived it, and a rank whose peer died must fail in seconds, not half an hour, so the
cluster can restart the job. So the store is built here, exactly as torch's env:// handler builds
it, and wrapped in a PrefixStore named after the attempt:

* gpucluster (per-GPU launch) sets GPUCLUSTER_RDZV_PREFIX = "gpucluster/job-J/attempt-A/" and
  rank 0 hosts the TCPStore on MASTER_PORT;
* under torchrun the elastic agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True) and may
  keep it across its own restarts, so TORCHELASTIC_RESTART_COUNT is appended to the prefix too.

Timeouts, overridable through the environment:
GPUCLUSTER_RDZV_TIMEOUT_S (default 60): how long ranks wait for each other to start;
GPUCLUSTER_COLLECTIVE_TIMEOUT_S (default 120): how long one collective may block. Keep it above
the slowest legitimate wait, such as rank 0 writing a large checkpoint while the others wait.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

# torch.distributed re-exports these without declaring it, which mypy --strict rejects; this is
# where they are defined in every torch version since 1.x.
from torch._C._distributed_c10d import PrefixStore, TCPStore

from gpucluster.launch.ranks import ENV_COLLECTIVE_TIMEOUT_S, ENV_RDZV_PREFIX, ENV_RDZV_TIMEOUT_S

DEFAULT_RDZV_TIMEOUT_S = 60.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job, and where its tensors live."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str | None  # None when running as a single plain process
    device: torch.device
    store_prefix: str | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def store_prefix(environ: Mapping[str, str] | None = None) -> str:
    """The rendezvous key prefix of this attempt (and of this torchrun restart, if any)."""
    env = os.environ if environ is None else environ
    base = env.get(ENV_RDZV_PREFIX) or "gpucluster/local/"
    if not base.endswith("/"):
        base += "/"
    return f"{base}restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def _seconds(environ: Mapping[str, str], name: str, given: float | None, default: float) -> float:
    if given is not None:
        return given
    raw = environ.get(name)
    return float(raw) if raw else default


def setup(
    *,
    backend: str | None = None,
    rdzv_timeout_s: float | None = None,
    collective_timeout_s: float | None = None,
    freeze_gc: bool = True,
) -> DistContext:
    """Join the job's process group from the torchrun variables, or run alone if there are none.

    The backend is NCCL when CUDA is available, gloo otherwise (or `backend`). With CUDA, the
    process's device is `cuda:LOCAL_RANK` among its visible GPUs (`cuda:0` when it sees one).

    `freeze_gc` calls `gc.freeze()` first: the objects that exist by now — mostly torch's own
    modules — leave the cyclic collector's reach, so full collections during training and the
    final ones at exit no longer walk them. A torch process then exits in about 0.5 s instead of
    1.2-1.6 s here, which is how fast the survivors of a failed rank get out of the way for the
    restart. The cost: a reference cycle among objects created before this call is never freed.
    """
    if freeze_gc:
        gc.freeze()
    _record_uncaught_exceptions()
    env = os.environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return DistContext(0, 0, 1, 1, None, device, None)

    rank = int(env["RANK"])
    world_size = int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available()
    chosen = backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        index = local_rank if local_rank < torch.cuda.device_count() else 0
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        # Let NCCL's watchdog abort a timed-out collective instead of hanging (torchrun's default too).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    else:
        device = torch.device("cpu")

    rdzv = timedelta(seconds=_seconds(env, ENV_RDZV_TIMEOUT_S, rdzv_timeout_s, DEFAULT_RDZV_TIMEOUT_S))
    collective = timedelta(
        seconds=_seconds(env, ENV_COLLECTIVE_TIMEOUT_S, collective_timeout_s, DEFAULT_COLLECTIVE_TIMEOUT_S)
    )
    prefix = store_prefix(env)
    store = _tcp_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), rank, world_size, rdzv)
    dist.init_process_group(
        backend=chosen,
        store=PrefixStore(prefix, store),
        rank=rank,
        world_size=world_size,
        timeout=collective,
    )
    atexit.unregister(_teardown_at_exit)  # once, however often setup() runs
    atexit.register(_teardown_at_exit)
    return DistContext(rank, local_rank, world_size, local_world_size, chosen, device, prefix)


def _teardown_at_exit() -> None:
    """`teardown` for a script that ends without calling it, most often on an uncaught exception
    (a CheckpointError from load_latest): groups left to the interpreter's own shutdown are
    destroyed with their gloo threads running, and the process aborts (SIGABRT, "terminate called
    without an active exception"), hiding the script's exit code 1 and its error behind a
    signal. Registered after init_process_group, so it runs before torch's own exit handlers.

    After a script's own `teardown` (a normal end) it waits for gloo's threads to settle
    (`settle_native_threads`): the one window left at a normal exit. Not after an error: a peer
    may be dead, gloo's workers then keep failing, and the survivors must exit at once for the
    restart."""
    settle = _torn_down_by_script
    with contextlib.suppress(Exception):
        teardown()
    if settle:
        with contextlib.suppress(Exception):
            settle_native_threads()


# The threads of torch's gloo backend that hold a collective's tensors, by their names
# (/proc/self/task/*/comm): its work queue's workers ("pt_gloo_runloop"). Its transport's event
# loop ("gloo_tcp_loop") moves raw bytes, never a tensor, and wakes on its own timeouts.
GLOO_THREAD_PREFIXES = ("pt_gloo",)


def _native_switches(prefixes: tuple[str, ...]) -> dict[str, str]:
    """Each named native thread's context-switch counts, keyed by its thread id."""
    counts: dict[str, str] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended between the listing and the read
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith(prefixes):
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                counts[tid] = "".join(line for line in f if "ctxt_switches" in line)
    return counts


def settle_native_threads(
    prefixes: tuple[str, ...] = GLOO_THREAD_PREFIXES, quiet_s: float = 0.02, timeout_s: float = 5.0
) -> bool:
    """Wait, with the GIL released, until the named native threads stop running; True once they
    have not run for `quiet_s`, False if they were still running after `timeout_s`.

    Why: a DDP model keeps its process group's C++ object — and gloo's threads — alive after
    `destroy_process_group` and after the model itself is freed (torch 2.13: the reducer leaks
    it), so those threads are still there when the interpreter finalizes. A gloo worker drops
    its reference to a finished collective's tensors a moment after the collective returns; if
    the last reference to a tensor that Python created dies there, the worker needs the GIL, and
    a thread that asks for the GIL while the interpreter finalizes is ended in the middle of C++
    code: the process aborts ("terminate called without an active exception", SIGABRT). A rank
    of a job that had finished training then turned the whole job into a failure (seen once in
    CI, rank 1 of 4 after its final checkpoint). Here, before finalization, every such thread
    gets the GIL it waits for (sleep releases it) and finishes; an idle worker waits on its
    queue and no longer switches. Linux only (/proc); elsewhere it returns True at once.
    """
    if not os.path.isdir("/proc/self/task"):
        return True
    deadline = time.monotonic() + timeout_s
    last = _native_switches(prefixes)
    while True:
        if not last:
            return True
        time.sleep(quiet_s)
        now = _native_switches(prefixes)
        if now == last:
            return True
        if time.monotonic() > deadline:
            return False
        last = now


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> TCPStore:
    """The job's TCPStore, built the way torch's env:// rendezvous builds it but with our timeout.

    Under torchrun the agent already hosts it at MASTER_ADDR:MASTER_PORT, so every rank is a
    client; otherwise rank 0 hosts it.
    """
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    return TCPStore(
        host,
        port,
        world_size,
        is_master=(rank == 0 and not agent_hosts_it),
        timeout=timeout,
        multi_tenant=True,
    )


# The gloo group async checkpoint writes use (CheckpointManager.save_sharded_async): one per
# process, made on first use, destroyed by `teardown` before the default group. Why here: a group
# whose last reference dies only when the interpreter exits is destroyed with its threads still
# running, and the process aborts ("terminate called without an active exception", exit -6).
_async_checkpoint_group: Any = None

# The script called `teardown` with a process group up: it ended normally (see _teardown_at_exit).
_torn_down_by_script = False


def async_checkpoint_group() -> Any:
    """The process's gloo group for background checkpoint writes (collective on first use)."""
    global _async_checkpoint_group
    if _async_checkpoint_group is None:
        _async_checkpoint_group = dist.new_group(backend="gloo")
    return _async_checkpoint_group


def teardown() -> None:
    """Leave the process group (a no-op when there is none), the async checkpoint group first."""
    global _async_checkpoint_group, _torn_down_by_script
    if dist.is_available() and dist.is_initialized():
        if _async_checkpoint_group is not None:
            dist.destroy_process_group(_async_checkpoint_group)
        dist.destroy_process_group()
        _torn_down_by_script = True
    _async_checkpoint_group = None


def _record_uncaught_exceptions() -> None:
    """An exception that ends the script is written to TORCHELASTIC_ERROR_FILE (set by torchrun
    and by gpucluster's --per-gpu), as torch's `@record` does: the head (or torchrun) then names
    it in the attempt's reason, e.g. "rank 0 exit code 1: CheckpointError: checkpoint ... cannot
    be loaded", instead of an exit code alone. Installed once; the previous hook still runs."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or getattr(sys.excepthook, "_gpucluster", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):  # torch's ErrorHandler format, which torchrun reads
            data = {
                "message": {
                    "message": f"{kind.__name__}: {error}",
                    "extraInfo": {
                        "py_callstack": "".join(traceback.format_exception(kind, error, tb)),
                        "timestamp": str(int(time.time())),
                    },
                }
            }
            with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                json.dump(data, f)
        previous(kind, error, tb)

    hook._gpucluster = True  # type: ignore[attr-defined]
    sys.excepthook = hook
