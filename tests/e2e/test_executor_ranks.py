"""The local executor with several processes per attempt, on real processes: each rank under its
own shim and session, poll/signal/cleanup across all of them, recovery from the run dir after a
head crash (complete or cut short), and processes that left their session found by the marker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.executors.base import Exited, LaunchSpec, Lost, ProcessSpec, Running, complete
from gpucluster.executors.local import LocalExecutor, rank_dir
from tests.e2e.headproc import pid_alive, wait_for

PY = sys.executable
# A rank that records its pid, then starts a child in a session of its own (as torchrun does with
# its workers) that records its pid too, and sleeps.
RANK = """
import os, subprocess, sys, time
rank = os.environ["RANK"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(f"pid-{rank}", "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def spec(tmp: Path, n: int, argv: list[str] | None = None) -> LaunchSpec:
    run_dir = tmp / "attempt-1"
    marker = f"GPUCLUSTER_ATTEMPT_DIR={run_dir}"
    procs = tuple(
        ProcessSpec(
            argv or [PY, "-c", RANK],
            {"PATH": os.environ.get("PATH", ""), "RANK": str(r), "GPUCLUSTER_ATTEMPT_DIR": str(run_dir)},
            rank_dir(run_dir, r),
            rank_dir(run_dir, r) / "output.log",
        )
        for r in range(n)
    )
    return LaunchSpec(1, 1, ["x"], {}, str(tmp), run_dir, run_dir / "output.log", processes=procs, marker=marker)


def pids(tmp: Path, n: int) -> list[tuple[int, int]]:
    files = [tmp / f"pid-{r}" for r in range(n)]
    wait_for(lambda: all(f.exists() and " " in f.read_text() for f in files), 20, what="ranks to start")
    return [tuple(map(int, f.read_text().split())) for f in files]  # type: ignore[misc]


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[LocalExecutor]:
    ex = LocalExecutor()
    yield ex
    for f in tmp_path.glob("pid-*"):  # whatever a failed test left running
        for pid in map(int, f.read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for f in tmp_path.glob("attempt-1/rank-*/shim.json"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(json.loads(f.read_text())["pgid"]), signal.SIGKILL)


def test_each_rank_runs_under_its_own_shim_and_session_and_is_polled_and_killed(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    handle = executor.launch(spec(tmp_path, 3))
    assert [r["rank"] for r in handle["ranks"]] == [0, 1, 2] and handle["expected"] == 3
    assert len({r["pgid"] for r in handle["ranks"]}) == 3  # three sessions
    assert json.loads((tmp_path / "attempt-1" / "launch.json").read_text())["ranks"] == 3
    procs = pids(tmp_path, 3)
    assert executor.poll_ranks(handle) == [Running()] * 3

    os.kill(procs[1][0], signal.SIGKILL)  # kill -9 of one rank
    wait_for(lambda: isinstance(executor.poll_ranks(handle)[1], Exited), 10, what="rank 1 to be seen dead")
    statuses = executor.poll_ranks(handle)
    # killed straight, with no stop through the shim first: `stopped` is False
    assert statuses[1] == Exited(137, signal.SIGKILL, stopped=False) and statuses[0] == statuses[2] == Running()
    assert executor.poll(handle) == Running()

    executor.signal(handle, signal.SIGKILL)
    wait_for(lambda: not any(isinstance(s, Running) for s in executor.poll_ranks(handle)), 10, what="all to end")
    executor.cleanup(handle)
    # the children in sessions of their own are gone too: found by the attempt's marker
    wait_for(lambda: not any(pid_alive(p) for pair in procs for p in pair), 10, what="every process to die")


def test_sigterm_reaches_every_rank_and_each_exit_code_is_recorded(executor: LocalExecutor, tmp_path: Path) -> None:
    code = "import signal, sys, time, os; signal.signal(signal.SIGTERM, lambda *_: sys.exit(79 if os.environ['RANK'] != '1' else 0)); time.sleep(60)"  # noqa: E501
    handle = executor.launch(spec(tmp_path, 3, [PY, "-c", code]))
    wait_for(lambda: all((rank_dir(tmp_path / "attempt-1", r) / "shim.json").exists() for r in range(3)), 10)
    time.sleep(0.5)  # the handlers are installed
    executor.signal(handle, signal.SIGTERM)
    wait_for(lambda: not any(isinstance(s, Running) for s in executor.poll_ranks(handle)), 10, what="all to end")
    # each rank's shim saw the stop reach it before its command ended
    assert executor.poll_ranks(handle) == [Exited(79, stopped=True), Exited(0, stopped=True), Exited(79, stopped=True)]


def test_a_new_head_recovers_every_rank_from_the_run_dir(executor: LocalExecutor, tmp_path: Path) -> None:
    handle = executor.launch(spec(tmp_path, 2))
    pids(tmp_path, 2)
    fresh = LocalExecutor()  # a new head: not the parent of these shims
    found = fresh.recover(tmp_path / "attempt-1")
    assert found is not None and complete(found)
    assert [(r["rank"], r["pid"]) for r in found["ranks"]] == [(r["rank"], r["pid"]) for r in handle["ranks"]]
    assert found["marker"] == f"GPUCLUSTER_ATTEMPT_DIR={tmp_path / 'attempt-1'}"
    assert fresh.poll_ranks(found) == [Running(), Running()]
    fresh.signal(found, signal.SIGKILL)
    wait_for(lambda: not any(isinstance(s, Running) for s in fresh.poll_ranks(found)), 10, what="all to end")


def test_a_launch_cut_short_is_recovered_as_incomplete(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.launch(spec(tmp_path, 3))
    pids(tmp_path, 3)
    # As if the head died after starting ranks 0 and 1: rank 2 never existed.
    shim2 = rank_dir(tmp_path / "attempt-1", 2) / "shim.json"
    os.killpg(json.loads(shim2.read_text())["pgid"], signal.SIGKILL)
    shim2.unlink()
    found = LocalExecutor().recover(tmp_path / "attempt-1")
    assert found is not None and not complete(found)
    statuses = LocalExecutor().poll_ranks(found)
    assert statuses[:2] == [Running(), Running()] and isinstance(statuses[2], Lost)
    assert LocalExecutor().recover(tmp_path / "nothing-here") is None
