"""Elastic growth end to end (issue 17): a real head on 4 virtual GPUs and the DDP example
submitted with `--gpus 2..4 --per-gpu`. It starts on 2 beside a job holding the other 2; when
that job ends and the GPUs stay free (`grow_after: 1s` here), the head checkpoints it and
restarts it on 4; the example resumes from its checkpoint (renumbering its steps for the new
world size, which the old step-ordered rotation turned into lost checkpoints) and still reaches
its stated accuracy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.e2e.headproc import HeadProcess
from tests.e2e.test_training import EXAMPLE, STATED_ACCURACY, done, events, finished, tail, wait_event

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("sklearn") is None:
    pytest.skip("the DDP example needs torch and scikit-learn", allow_module_level=True)

POLICY = "elastic: {grow_after: 1s, grow_every: 1s, restart_cost: 0s}\n"


def test_an_elastic_job_grows_from_2_to_4_and_reaches_the_examples_accuracy(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # A grace long enough for a checkpoint on a loaded machine; the example exits within a second.
    head = head_factory(tmp_path / "data", gpus=4, grace="30s", extra_args=("--policy", str(policy))).start()
    go = tmp_path / "go"
    with head.client() as c:
        c.submit(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done"], gpus=2)  # holds 2 of the 4
        job = c.submit(
            [sys.executable, str(EXAMPLE), "--epochs", "60"], gpus="2..4", per_gpu=True, workdir=str(tmp_path)
        ).id
        wait_event(head, job, 1, lambda e: e["event"] == "step" and e["step"] >= 50)
        assert sum(len(s.gpu_indices) for s in c.job(job).allocation) == 2  # beside the blocker
        go.touch()  # the blocker ends: 2 GPUs free, nothing queued
        final = finished(head, job)
    assert final.state.value == "succeeded", f"{final.reason}\n{tail(head, job)}"
    one, two = final.attempts[:2]
    assert one.gpus == 2 and two.gpus == 4, final.attempts
    assert one.outcome == "preempted" and one.reason.startswith("resized: growing from 2 to 4 GPUs"), one.reason
    assert one.work_lost_s == 0.0  # it checkpointed after being asked to stop
    start = events(head, job, 2)[0]
    assert start["world_size"] == 4 and start["resumed_from"] is not None and start["resumed_from"] > 0
    result = done(head, job, final.attempt)
    assert result["test_accuracy"] >= STATED_ACCURACY
    assert final.restarts == 0  # a resize is no failure
