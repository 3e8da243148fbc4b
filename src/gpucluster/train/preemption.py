"""Preemption: learn about SIGTERM, finish the step, checkpoint, and ask to be requeued.

The cluster stops a job (preemption, `gpucluster requeue`, maintenance) with SIGTERM to every
process, then SIGKILL after the grace period, which it announces in GPUCLUSTER_GRACE_PERIOD_S.
The handler only records the signal (a flag, the time, the deadline) and runs light callbacks;
the training loop polls `should_stop()` between steps, saves, and exits with
REQUEUE_EXIT_CODE. Work is never done inside the signal handler, which may interrupt anything.

Under torch.distributed the ranks must agree on the step at which they stop, or some would
enter a collective the others never join. `should_stop()` therefore all-reduces the local flag
(MAX) across ranks — one tiny all-reduce per call — so if any rank got the signal, all stop at
the same step. Every rank must call it at the same steps; for very short steps (the CPU example:
a few milliseconds), calling it every few steps keeps that all-reduce out of the profile.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from gpucluster.launch.ranks import REQUEUE_EXIT_CODE
from gpucluster.train import env as train_env

Callback = Callable[[int], None]  # called with the signal number, in the main thread

_Handler = Callable[[int, FrameType | None], object] | int | None


class Preemption:
    """The SIGTERM flag of this process. Create one with `install()`."""

    def __init__(self, grace_period_s: float | None = None) -> None:
        self.grace_period_s = train_env.grace_period_s() if grace_period_s is None else grace_period_s
        self.received_at: float | None = None  # time.monotonic() of the first signal
        self.signum: int | None = None
        self._flag = threading.Event()
        self._callbacks: list[Callback] = []
        self._previous: dict[int, _Handler] = {}

    # --- signal side -----------------------------------------------------------------------

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> Preemption:
        """Handle `signals` (main thread only, as Python requires); returns self."""
        for s in signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()

    def on_preempt(self, callback: Callback) -> None:
        """Run `callback(signum)` when the signal arrives; keep it short (log, stop a data loader)."""
        self._callbacks.append(callback)

    def trigger(self, signum: int = signal.SIGTERM) -> None:
        """Act as if the signal arrived (also what the handler does)."""
        if self._flag.is_set():
            return
        self.received_at = time.monotonic()
        self.signum = signum
        self._flag.set()
        for cb in self._callbacks:
            cb(signum)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.trigger(signum)

    # --- training-loop side ----------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """This process got the signal (no communication)."""
        return self._flag.is_set()

    def should_stop(self) -> bool:
        """True on every rank as soon as any rank got the signal; collective under torch.distributed."""
        local = self._flag.is_set()
        try:
            import torch
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is optional for this module
            return local
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return local
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=_collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = bool(flag.item())
        if agreed and not local:
            self.trigger(signal.SIGTERM)  # a peer was signalled: stop the same way
        return agreed

    def remaining_s(self) -> float:
        """Seconds left before SIGKILL (the full grace period if no signal arrived yet)."""
        if self.received_at is None:
            return self.grace_period_s
        return max(0.0, self.grace_period_s - (time.monotonic() - self.received_at))


def _collective_device() -> str:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def install(grace_period_s: float | None = None) -> Preemption:
    """Start listening for SIGTERM; the grace period defaults to GPUCLUSTER_GRACE_PERIOD_S."""
    return Preemption(grace_period_s).install()


def exit_for_requeue() -> NoReturn:
    """Exit with REQUEUE_EXIT_CODE: "I saved a checkpoint; run me again later".

    The process ends as an interpreter exit would up to the point where the interpreter starts
    destroying objects — the script's other (non-daemon) threads finish, its atexit handlers run
    (`train.setup`'s teardown of the process groups among them), stdout and stderr are flushed —
    and then at once (`os._exit`). Why not `sys.exit`: it is called deep in the training loop,
    where the script still holds its DDP model, and through it the gloo process group and its
    native threads (`teardown` unregisters the group; the model keeps the object). Those were
    destroyed only in the interpreter's and the C++ runtime's own teardown, where the threads
    raced it: a rank now and then died of SIGABRT ("terminate called without an active
    exception", exit -6), which turned a requeue into a failure.
    """
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or a pipe nobody reads any more
            stream.flush()
    os._exit(REQUEUE_EXIT_CODE)
