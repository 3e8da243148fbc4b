"""Rebuild the legacy databases here from the gpucluster commits that wrote them.

    for v in 1:68464b7 2:22c06cb 3:5a55af0; do
      d=/tmp/gpucluster-v${v%%:*}; mkdir -p $d && git archive ${v#*:} src | tar -x -C $d
      PYTHONPATH=$d/src .venv/bin/python tests/unit/legacy/make.py ${v%%:*}
    done

Each run imports that old version's store (PYTHONPATH), fills a database through its own API
with jobs in every state, and dumps it as SQL to vN.sql: the schema exactly as that version
created it, stamped `meta.schema` N, with no alembic_version table. test_store_migrations.py
loads the dumps and opens them with the current store.
"""

from __future__ import annotations

import inspect
import sqlite3
import sys
import tempfile
from pathlib import Path

from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, Gpu, Node, NodeSlice
from gpucluster.models import JobSpec
from gpucluster.store import Store

T0 = 1_700_000_000.0


def main(version: int) -> None:
    out = Path(__file__).resolve().parent / f"v{version}.sql"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "state.db"
        s = Store(db)
        gpus = tuple(Gpu(i, "H100-80GB", 81920, f"GPU-{i}") for i in range(8))
        s.put_node(Node("node0", gpus), True, T0)
        s.create_job(
            JobSpec(command=["python", "train.py", "--epochs", "10"], gpus=2, gpu_type="H100-80GB", name="train",
                    team="vision", priority="high", time_limit="2h", env={"WANDB_MODE": "offline"}),
            T0,
        )  # fmt: skip
        run = s.create_job(JobSpec(command=["sleep", "600"], name="held", team="nlp"), T0 + 1)
        ok = s.create_job(JobSpec(command=["true"], team="nlp"), T0 + 2)
        bad = s.create_job(JobSpec(command=["false"], name="broken"), T0 + 3)
        gone = s.create_job(JobSpec(command=["sleep", "1"], name="cancelled-in-queue", shell=False), T0 + 4)
        vanished_launch = {"pid": 2**22 + 7, "pgid": 2**22 + 7, "start_ticks": 1, "run_dir": "/nonexistent/run"}
        for job_id, gpu in ((run, 0), (ok, 1), (bad, 2)):
            s.transition(job_id, JobState.RUNNING, T0 + 10, "started", expect=[JobState.QUEUED],
                         allocation=Allocation((NodeSlice("node0", (gpu,)),)), attempt=1, started_at=T0 + 10,
                         launch=vanished_launch)  # fmt: skip
        ended = {"expect": [JobState.RUNNING]}
        if "ended_attempt" in inspect.signature(s.transition).parameters:
            from gpucluster.store.store import AttemptRecord

            alloc = Allocation((NodeSlice("node0", (2,)),))
            ended["ended_attempt"] = AttemptRecord(bad, 1, T0 + 10, T0 + 20, alloc, "failed", "exit 3", (3,), 10.0)
        s.transition(ok, JobState.SUCCEEDED, T0 + 15, "exited 0", expect=[JobState.RUNNING], exit_code=0)
        s.transition(bad, JobState.FAILED, T0 + 20, "exited 3", exit_code=3, **ended)
        s.transition(gone, JobState.CANCELLED, T0 + 5, "cancelled by user", expect=[JobState.QUEUED])
        if hasattr(s, "save_usage"):
            s.save_usage({"vision": 7200.0, "nlp": 30.0}, T0 + 30)
        s.close()
        with sqlite3.connect(db) as conn:
            out.write_text("\n".join(conn.iterdump()) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
