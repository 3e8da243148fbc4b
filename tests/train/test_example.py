"""The DDP example end to end: real processes, 4 ranks, gloo on CPU.

The per-GPU launches use exactly the environment `gpucluster.launch.ranks` produces, so these
tests are what the head's integration will do, minus the head: SIGTERM and requeue, kill -9 of
one rank and a relaunch, a crash inside a checkpoint write. The example is deterministic for a
given world size, so every interrupted-and-resumed run must end with the accuracy of the
uninterrupted one.
"""

from __future__ import annotations

import importlib.util
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("sklearn") is None:
    pytest.skip("scikit-learn (its digits dataset) is not installed", allow_module_level=True)

from gpucluster.launch.ranks import REQUEUE_EXIT_CODE
from gpucluster.train.checkpoint import ENV_TEST_CRASH_AT_STEP
from tests.train.cluster import STATED_ACCURACY, Event, Launcher, Run
from tests.train.fakehead import FakeHead

CHECKPOINT_EVERY = 50  # the example's default
TOTAL_STEPS = 200  # 20 epochs x 10 steps on 4 ranks
SAME = 0.005  # about two test images; in practice the accuracy is identical


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launch = Launcher(tmp_path)
    yield launch
    launch.stop_all()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Event:
    """One uninterrupted run under plain torchrun."""
    launch = Launcher(tmp_path_factory.mktemp("reference"))
    try:
        run = launch.torchrun()
        assert run.wait(120) == [0], run.log_tail()
        return run.done()
    finally:
        launch.stop_all()


def _start(run: Run) -> Event:
    return run.wait_for(lambda e: e["event"] == "start")


def _checkpoints(run: Run) -> list[int]:
    return [e["step"] for e in run.events() if e["event"] == "checkpoint"]


def test_plain_torchrun_reaches_the_stated_accuracy(reference: Event) -> None:
    assert reference["steps"] == TOTAL_STEPS
    assert reference["test_accuracy"] >= STATED_ACCURACY


def test_requeue_checkpoints_resumes_and_loses_nothing(launcher: Launcher, reference: Event) -> None:
    head = FakeHead()
    try:
        env = {"GPUCLUSTER_URL": head.url, "GPUCLUSTER_GRACE_PERIOD_S": "10"}
        first = launcher.per_gpu(attempt=1, env=env)
        first.wait_for(lambda e: e["event"] == "step" and e["step"] >= 60)
        first.signal(signal.SIGTERM, ranks=[1, 2, 3])  # rank 0, the writer, learns it from its peers
        assert first.wait(30) == [REQUEUE_EXIT_CODE] * 4, first.log_tail()
        preempted = next(e for e in first.events() if e["event"] == "preempted")
        assert 60 <= preempted["step"] < TOTAL_STEPS

        second = launcher.per_gpu(attempt=2, env=env)
        assert second.wait(120) == [0] * 4, second.log_tail()
    finally:
        head.close()
    start = _start(second)
    assert start["attempt"] == 2
    lost = preempted["step"] - start["resumed_from"]
    assert 0 <= lost < CHECKPOINT_EVERY
    done = second.done()
    assert done["steps"] == TOTAL_STEPS
    assert done["steps_this_attempt"] == TOTAL_STEPS - start["resumed_from"]
    assert done["test_accuracy"] >= STATED_ACCURACY
    assert abs(done["test_accuracy"] - reference["test_accuracy"]) <= SAME

    # Progress reached the head: the preemption checkpoint, then the resumed run's steps.
    bodies = [b for path, b in head.posts if path == "/v1/jobs/1/progress"]
    # (the example also reports its loss and accuracy with them: gpucluster.train.report)
    assert bodies and {"step", "checkpoint_at", "checkpoint_step"} <= set(bodies[0])
    assert set(bodies[0]) <= {"step", "checkpoint_at", "checkpoint_step", "metrics", "metrics_step"}
    assert any(b["checkpoint_step"] == preempted["step"] for b in bodies)
    assert bodies[-1]["step"] == TOTAL_STEPS


def test_crash_mid_checkpoint_then_kill_9_each_restart_from_the_last_good_checkpoint(
    launcher: Launcher, reference: Event
) -> None:
    """Three attempts, as the head's restarts will run them.

    1. Rank 0 is SIGKILLed halfway through writing the step-100 checkpoint (test hook): the
       others fail fast, the torn file is never loaded, step 50 stays loadable.
    2. Resumes from step 50; rank 2 gets kill -9 after the step-150 checkpoint: the others fail
       fast (gloo sees the dead peer; not the 20 s collective timeout, let alone 30 minutes).
    3. Resumes from step 150 and ends with the accuracy of the uninterrupted run.
    """
    first = launcher.per_gpu(attempt=1, env={ENV_TEST_CRASH_AT_STEP: "100"})
    codes = first.wait(60)
    assert codes[0] == -signal.SIGKILL and all(c not in (0, REQUEUE_EXIT_CODE) for c in codes), codes
    names = sorted(p.name for p in launcher.checkpoint_dir.iterdir())
    assert names[0].startswith(".tmp-00000002-step-000000000100-attempt-1.pt")
    assert names[1:] == ["00000001-step-000000000050-attempt-1.pt"]

    second = launcher.per_gpu(attempt=2)
    assert _start(second)["resumed_from"] == 50
    second.wait_for(lambda e: e["event"] == "checkpoint" and e["step"] == 150)
    second.wait_for(lambda e: e["event"] == "step" and e["step"] >= 160)
    killed_at = time.monotonic()
    second.signal(signal.SIGKILL, ranks=[2])
    codes = second.wait(30)
    failed_within = time.monotonic() - killed_at
    assert codes[2] == -signal.SIGKILL
    assert all(c not in (0, REQUEUE_EXIT_CODE) for c in codes), codes
    # Fast means before the 20 s collective timeout (they saw the dead peer, not waited it out);
    # a tighter bound (10 s) failed at 11.8 s on a machine whose two cores were busy.
    assert failed_within < 20, f"survivors took {failed_within:.1f}s to fail"

    third = launcher.per_gpu(attempt=3)
    assert third.wait(120) == [0] * 4, third.log_tail()
    assert _start(third)["resumed_from"] == max(_checkpoints(second)) == 150
    done = third.done()
    assert done["steps"] == TOTAL_STEPS
    assert abs(done["test_accuracy"] - reference["test_accuracy"]) <= SAME
