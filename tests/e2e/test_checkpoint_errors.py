"""A checkpoint that cannot be loaded fails the attempt with the reason (issue 17), end to end:
a real head, 2 `--per-gpu` ranks with gloo on CPU. Before, `load_latest()` skipped every
checkpoint it could not read (with only a warning) and the job trained again from step 0.
Attempt 1 saves, damages its checkpoint and fails; attempt 2 must not start over: every rank
raises CheckpointError, and the head's reason names the file and why (from the rank's error
file, TORCHELASTIC_ERROR_FILE, which gpucluster.train writes)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.e2e.headproc import HeadProcess
from tests.e2e.test_jobs import finished

if importlib.util.find_spec("torch") is None:
    pytest.skip("gpucluster.train needs torch", allow_module_level=True)

SCRIPT = """
import sys
from gpucluster import train
ctx = train.setup()
ckpt = train.CheckpointManager(keep=2)
if train.attempt() == 1:
    saved = ckpt.save({"step": 7}, step=7)
    if ctx.rank == 0:
        saved.path.write_bytes(b"a disk that lost it")
    train.teardown()
    sys.exit(3)  # a failure: restarted (--max-restarts 1)
loaded = ckpt.load_latest()
print("resumed from", loaded.info.step if loaded else "scratch", flush=True)
"""
TIMEOUT = 120.0  # two attempts of two torch processes each on two shared cores


def test_an_unreadable_checkpoint_fails_the_attempt_with_the_reason(head: HeadProcess, tmp_path: Path) -> None:
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    with head.client() as c:
        job = c.submit([sys.executable, str(script)], gpus=2, per_gpu=True, max_restarts=1, workdir=str(tmp_path)).id
        final = finished(head, job, TIMEOUT)
        logs = c.logs(job, attempt=2)
    assert final.state.value == "failed" and final.attempt == 2, final.reason
    assert "resumed from scratch" not in logs
    # Every rank raises it; the reason names the one the head saw fail first.
    assert re.match(r"rank [01] exit code 1: CheckpointError: checkpoint ", final.reason), final.reason
    assert "-step-000000000007-attempt-1.pt cannot be loaded" in final.reason, final.reason
    assert final.attempts[1].reason == final.reason.split("; no restarts left")[0]
