"""A stop the head asked for gives every rank the whole grace period (issue 17), end to end:
a real head, 4 real `--per-gpu` processes, where only rank 0 handles SIGTERM and saves for 3 s
while ranks 1-3 die of the signal (exit 143, the normal end). Before the fix their exits counted
as failures and rank 0 was SIGKILLed mid-save; plain torchrun and `--launcher torchrun` let it
finish. The script needs no torch: the grace is the head's business, not torch's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpucluster.models import Job
from tests.e2e.headproc import HeadProcess, wait_for

# Rank 0 saves for SAVE_S after SIGTERM, then exits "requeue me"; the others keep SIGTERM's default.
SCRIPT = """
import os, signal, sys, time
rank, attempt = os.environ["RANK"], int(os.environ["GPUCLUSTER_ATTEMPT"])
saved = os.path.join(os.environ["GPUCLUSTER_CHECKPOINT_DIR"], "saved")
if attempt > 1:
    print("resumed from", open(saved).read(), flush=True)
    sys.exit(0)
def save(*_):
    print("saving", flush=True)
    time.sleep(SAVE_S)
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    with open(saved + ".tmp", "w") as f:
        f.write("step 42")
    os.replace(saved + ".tmp", saved)
    print("saved", flush=True)
    sys.exit(79)
if rank == "0":
    signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""
SAVE_S = 3
# Generous: four Python processes start on two shared cores; the save itself takes SAVE_S.
TIMEOUT = 60.0


def test_a_requeue_lets_rank_0_finish_its_save_while_the_other_ranks_exit_143(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    head = head_factory(tmp_path / "data", grace="30s").start()
    script = tmp_path / "save_on_rank0.py"
    script.write_text(SCRIPT.replace("SAVE_S", str(SAVE_S)))
    logs = head.data_dir / "jobs"
    with head.client() as c:
        job = c.submit([sys.executable, str(script)], gpus=4, per_gpu=True, workdir=str(tmp_path)).id

        def ready() -> bool:
            paths = [logs / str(job) / "attempt-1" / f"rank-{r}" / "output.log" for r in range(4)]
            return all(p.exists() and "ready" in p.read_text() for p in paths)

        wait_for(ready, TIMEOUT, what="every rank to be ready")
        c.requeue(job)
        final: Job = wait_for(lambda: (j := c.job(job)).state.terminal and j, TIMEOUT, 0.1, what="the job to end")
        assert final.state.value == "succeeded" and final.attempt == 2, final.reason
        one, two = final.attempts
        assert two.outcome == "succeeded"
        assert one.outcome == "preempted", one.reason
        assert one.exit_codes[0] == 79 and one.exit_codes[1:] == [143, 143, 143], one.exit_codes
        assert one.work_lost_s == 0.0  # it checkpointed after being asked to stop
        assert final.restarts == 0
        assert "resumed from step 42" in c.logs(job, attempt=2)
        assert "saved" in c.logs(job, attempt=1)
