"""Distributed training through the cluster, end to end (issue 4): a real head, the DDP example
(examples/ddp_classifier, 4 processes, gloo on CPU) submitted with the CLI, real processes.

1. `gpucluster submit --gpus 4 --per-gpu` runs it to its stated accuracy;
2. `gpucluster requeue` mid-run: it checkpoints, goes back to the queue, resumes as attempt 2
   from that checkpoint and ends with the same accuracy, having lost less than one checkpoint
   interval of work;
3. kill -9 of one rank: the others are killed, the job restarts (--max-restarts 1) from its last
   checkpoint and finishes; the time from the kill to training again is printed;
4. launcher mode (`--launcher torchrun`) requeued mid-run resumes the same way, although
   torchrun exits 1 after forwarding SIGTERM, and leaves none of its workers behind.

The example is deterministic for a given world size, so every interrupted-and-resumed run must
end with the accuracy of the uninterrupted one. One head serves the module; it and every job
process (found by their shims and their attempt's marker) are killed at the end, pass or fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucluster.models import Job
from tests.e2e.headproc import HeadProcess, cli, wait_for

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("sklearn") is None:
    pytest.skip("the DDP example needs torch and scikit-learn", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_classifier" / "train.py"
STATED_ACCURACY = 0.97  # examples/ddp_classifier/README.md
EPOCHS = 50  # 500 steps on 4 ranks: ~5 s of training here, long enough to interrupt mid-run
CHECKPOINT_EVERY = 50  # steps, the example's default
SAME = 0.005  # about two test images; in practice the accuracy is identical
TIMEOUT = 150.0

Event = dict[str, Any]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadProcess]:
    # A grace period long enough for a checkpoint on a loaded machine; the example exits within
    # a second of SIGTERM.
    h = HeadProcess(tmp_path_factory.mktemp("training") / "data", grace="30s")
    try:
        yield h.start()
    finally:
        h.stop()
        h.kill_jobs()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work")


def submit(head: HeadProcess, workdir: Path, *options: str) -> int:
    r = cli(head, "submit", *options, "--", sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), cwd=workdir)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[2])  # "submitted job N (name): queued"


def log_of(head: HeadProcess, job: int, attempt: int, rank: int = 0) -> Path:
    return head.data_dir / "jobs" / str(job) / f"attempt-{attempt}" / f"rank-{rank}" / "output.log"


def events(head: HeadProcess, job: int, attempt: int) -> list[Event]:
    """Rank 0's JSON events (in launcher mode node 0's log, which holds its workers' output)."""
    path = log_of(head, job, attempt)
    found: list[Event] = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(json.JSONDecodeError):  # a line being written
                    found.append(json.loads(line))
    return found


def tail(head: HeadProcess, job: int) -> str:
    parts = []
    for f in sorted((head.data_dir / "jobs" / str(job)).glob("attempt-*/rank-*/output.log")):
        parts.append(f"--- {f.relative_to(head.data_dir)}\n{f.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def wait_event(head: HeadProcess, job: int, attempt: int, pred: Callable[[Event], bool]) -> Event:
    def found() -> Event | None:
        return next((e for e in events(head, job, attempt) if pred(e)), None)

    try:
        return wait_for(found, TIMEOUT, 0.02, what=f"an event of job {job} attempt {attempt}")  # type: ignore[no-any-return]
    except AssertionError:
        raise AssertionError(f"no such event; logs:\n{tail(head, job)}") from None


def finished(head: HeadProcess, job: int) -> Job:
    with head.client() as c:
        try:
            return wait_for(lambda: (j := c.job(job)).state.terminal and j, TIMEOUT, 0.1, what=f"job {job} to end")  # type: ignore[no-any-return]
        except AssertionError:
            raise AssertionError(f"job {job} did not end: {c.job(job)}\n{tail(head, job)}") from None


def done(head: HeadProcess, job: int, attempt: int) -> Event:
    return next(e for e in events(head, job, attempt) if e["event"] == "done")


def attempt_pids(head: HeadProcess, job: int) -> list[int]:
    """Every process still carrying one of the job's attempt markers."""
    needle = f"\0GPUCLUSTER_ATTEMPT_DIR={head.data_dir}/run/{job}/".encode()
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle in b"\0" + f.read():
                        out.append(int(entry.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def reference(head: HeadProcess, workdir: Path) -> Job:
    """The example, uninterrupted, through `gpucluster submit --gpus 4 --per-gpu`."""
    return finished(head, submit(head, workdir, "--gpus", "4", "--per-gpu", "--name", "ddp"))


def test_the_4_process_example_reaches_its_stated_accuracy(head: HeadProcess, reference: Job) -> None:
    job = reference
    assert job.state.value == "succeeded", f"{job.reason}\n{tail(head, job.id)}"
    assert job.reason == "exit code 0 on all 4 ranks"
    start = events(head, job.id, 1)[0]
    assert (start["event"], start["world_size"], start["attempt"], start["resumed_from"]) == ("start", 4, 1, None)
    result = done(head, job.id, 1)
    assert result["steps"] == EPOCHS * 10
    assert result["test_accuracy"] >= STATED_ACCURACY
    (a,) = job.attempts
    assert (a.outcome, a.exit_codes, a.gpus) == ("succeeded", [0, 0, 0, 0], 4)
    # rank 0 reported its progress to the head
    assert job.progress is not None and job.progress.step == EPOCHS * 10
    assert job.progress.checkpoint_step == EPOCHS * 10
    # logs: rank 0 by default, any rank with --rank
    logs = cli(head, "logs", str(job.id))
    assert logs.returncode == 0 and '"event": "done"' in logs.stdout
    assert cli(head, "logs", str(job.id), "--rank", "3").returncode == 0
    bad = cli(head, "logs", str(job.id), "--rank", "4")
    assert bad.returncode == 1 and "no rank 4" in bad.stderr
    shown = cli(head, "show", str(job.id)).stdout
    assert "one process per GPU" in shown and f"progress:   step {EPOCHS * 10}" in shown and "#1 " in shown
    # the example reports its loss and accuracy (gpucluster.train.report): stored, shown
    metrics = {m.name: m for m in job.metrics}
    assert metrics["accuracy"].reported[-1] == pytest.approx(result["test_accuracy"], abs=1e-4)
    assert metrics["accuracy"].steps[-1] == EPOCHS * 10 and metrics["loss"].reported
    assert "metrics:" in shown and "accuracy 0.9" in shown


def test_requeue_mid_run_checkpoints_waits_resumes_and_loses_less_than_a_checkpoint_interval(
    head: HeadProcess, workdir: Path, reference: Job
) -> None:
    job = submit(head, workdir, "--gpus", "4", "--per-gpu", "--name", "requeued")
    wait_event(head, job, 1, lambda e: e["event"] == "step" and e["step"] >= 100)
    r = cli(head, "requeue", str(job))
    assert r.returncode == 0 and "requeueing" in r.stdout, r.stderr
    final = finished(head, job)
    assert final.state.value == "succeeded" and final.attempt == 2, f"{final.reason}\n{tail(head, job)}"

    first = events(head, job, 1)
    preempted = next(e for e in first if e["event"] == "preempted")
    assert 100 <= preempted["step"] < EPOCHS * 10
    start = events(head, job, 2)[0]
    assert (start["event"], start["attempt"], start["resumed_from"]) == ("start", 2, preempted["step"])
    assert done(head, job, 2)["test_accuracy"] == pytest.approx(done(head, reference.id, 1)["test_accuracy"], abs=SAME)

    history = [(e.state.value, e.reason) for e in final.events]
    i = history.index(("preempted", "requeued by user (exit code 79 on all 4 ranks)"))
    assert [s for s, _ in history[i : i + 3]] == ["preempted", "queued", "running"]
    one, two = final.attempts
    assert (one.outcome, one.exit_codes) == ("preempted", [79, 79, 79, 79])
    assert (two.outcome, two.exit_codes) == ("succeeded", [0, 0, 0, 0])
    saves = [e["t"] for e in first if e["event"] == "checkpoint"]
    interval = statistics.median(b - a for a, b in itertools.pairwise(saves))  # ~0.5 s here
    assert one.work_lost_s is not None and 0 <= one.work_lost_s < interval, (one.work_lost_s, interval)


def test_kill_9_of_one_rank_restarts_the_whole_job_from_its_last_checkpoint(
    head: HeadProcess, workdir: Path, reference: Job
) -> None:
    job = submit(head, workdir, "--gpus", "4", "--per-gpu", "--max-restarts", "1", "--name", "crashy")
    saved = wait_event(head, job, 1, lambda e: e["event"] == "checkpoint" and e["step"] >= 150)
    shim = json.loads((head.data_dir / "run" / str(job) / "attempt-1" / "rank-2" / "shim.json").read_text())
    side = shim["job_pgid"]  # the shim's job side, whose child is the training process
    (trainer,) = map(int, Path(f"/proc/{side}/task/{side}/children").read_text().split())
    killed_at = time.time()
    os.kill(trainer, signal.SIGKILL)  # rank 2's training process, not its shim
    final = finished(head, job)
    assert final.state.value == "succeeded" and final.attempt == 2, f"{final.reason}\n{tail(head, job)}"
    assert final.restarts == 1

    one, two = final.attempts
    assert (one.outcome, one.reason) == ("failed", "rank 2 killed by SIGKILL")
    assert one.exit_codes[2] == 137
    assert one.work_lost_s is not None and 0 <= one.work_lost_s < time.time() - killed_at
    assert two.outcome == "succeeded"
    reasons = [e.reason for e in final.events]
    assert "rank 2 killed by SIGKILL; restart 1 of 1 in 1s" in reasons  # the default backoff

    start = events(head, job, 2)[0]
    assert start["resumed_from"] >= saved["step"] and start["resumed_from"] % CHECKPOINT_EVERY == 0
    first_step = next(e for e in events(head, job, 2) if e["event"] == "step")
    requeued = next(e.at for e in final.events if e.reason.startswith("rank 2 killed"))
    print(
        f"\nkill -9 of rank 2 -> training again through the cluster: {first_step['t'] - killed_at:.1f} s "
        f"(all ranks down and requeued {requeued - killed_at:.2f} s, "
        f"relaunched {(two.started_at or 0) - killed_at:.1f} s, "
        f"checkpoint loaded in {start['load_s']:.2f} s)"
    )
    # The figure printed above is the measurement; this bound only catches a restart that waits for
    # something (a lease, a timeout) instead of acting. 30 s was tuned to an idle machine (35 s
    # were seen at load 12-27); torch's import alone takes several times longer on busy cores.
    assert first_step["t"] - killed_at < 120
    assert done(head, job, 2)["test_accuracy"] == pytest.approx(done(head, reference.id, 1)["test_accuracy"], abs=SAME)
    assert attempt_pids(head, job) == []


def test_launcher_mode_requeued_mid_run_resumes_and_leaves_no_worker_behind(
    head: HeadProcess, workdir: Path, reference: Job
) -> None:
    job = submit(head, workdir, "--gpus", "4", "--launcher", "torchrun", "--name", "torchrun")
    wait_event(head, job, 1, lambda e: e["event"] == "step" and e["step"] >= 100)
    assert len(attempt_pids(head, job)) >= 5  # torchrun, 4 workers in sessions of their own (the shim has no job env)
    with head.client() as c:
        c.requeue(job)
    final = finished(head, job)
    assert final.state.value == "succeeded" and final.attempt == 2, f"{final.reason}\n{tail(head, job)}"
    one, _ = final.attempts
    # torchrun exits 1 after forwarding SIGTERM, yet the head requeues: it asked for the stop
    assert one.outcome == "preempted" and one.reason.startswith("requeued by user")
    preempted = next(e for e in events(head, job, 1) if e["event"] == "preempted")
    assert events(head, job, 2)[0]["resumed_from"] == preempted["step"]
    assert done(head, job, 2)["test_accuracy"] == pytest.approx(done(head, reference.id, 1)["test_accuracy"], abs=SAME)
    wait_for(lambda: attempt_pids(head, job) == [], 10, what="every process of the job to be gone")
