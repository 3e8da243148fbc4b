"""`settle_native_threads`: a distributed rank waits, before the interpreter finalizes, until
gloo's worker threads stop running (the SIGABRT at a normal exit; see its docstring). The waits
here are events: a worker thread records when it stopped, and the settle must not return before.
A real gloo job's workers settle too (tests/train/test_distributed.py runs the exit path)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpucluster.train.distributed import settle_native_threads

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc/self/task")

NAME = "pt_gloo_fake"


def _named(name: str) -> None:
    """Give the calling thread an OS name, as torch's C++ threads have."""
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name)


def _worker(busy: threading.Event, done: threading.Event, stopped: list[float], park: threading.Event) -> None:
    """Run in short bursts (as a worker finishing collectives does) until told, then wait on a queue."""
    _named(NAME)
    busy.set()
    while not done.is_set():
        time.sleep(0.001)
    stopped.append(time.monotonic())
    park.wait()


def test_it_returns_only_after_the_workers_stopped_running() -> None:
    busy, done, park = threading.Event(), threading.Event(), threading.Event()
    stopped: list[float] = []
    t = threading.Thread(target=_worker, args=(busy, done, stopped, park), daemon=True)
    t.start()
    try:
        assert busy.wait(60)
        threading.Timer(0.3, done.set).start()  # stops while the settle below is waiting
        # quiet_s is generous: a worker that a busy machine does not schedule for that long
        # would look settled
        assert settle_native_threads((NAME,), quiet_s=0.25, timeout_s=60)
        assert stopped, "settled while the worker was still running"
    finally:
        done.set()
        park.set()
        t.join(60)


def test_a_worker_that_never_stops_is_given_up_on() -> None:
    busy, done, park = threading.Event(), threading.Event(), threading.Event()
    t = threading.Thread(target=_worker, args=(busy, done, [], park), daemon=True)
    t.start()
    try:
        assert busy.wait(60)
        assert settle_native_threads((NAME,), quiet_s=0.05, timeout_s=0.5) is False
    finally:
        done.set()
        park.set()
        t.join(60)


def test_no_such_threads_returns_at_once() -> None:
    assert settle_native_threads(("no_thread_has_this_name",), quiet_s=60, timeout_s=60)
