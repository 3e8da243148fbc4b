"""kill -9 of one rank to training again, through a real head (issue 17): p50 of N trials.

  PYTHONPATH=src .venv/bin/python bench/bench_recovery.py [--trials 5] [--backoff 1s]

Each trial submits examples/ddp_classifier (4 processes, `--per-gpu --max-restarts 1`, gloo on
CPU) to a head started for the run (`gpucluster up --virtual-gpus 4 --restart-backoff B`),
waits for a checkpoint at step 100 or later, SIGKILLs rank 2's training process (not its shim),
and measures the time until the second attempt's first training step (rank 0's own event), with
its parts: the head noticing and killing the other ranks and requeueing the job (from the job's
events), the backoff, and the relaunch (process start, torch import, rendezvous, checkpoint load).
A fresh job per trial, so every restart is the first (the backoff does not double).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _head  # bench/ is not a package
from gpucluster.client import Client

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_classifier" / "train.py"


def events(head: _head.Head, job: int, attempt: int) -> list[dict[str, Any]]:
    path = head.data_dir / "jobs" / str(job) / f"attempt-{attempt}" / "rank-0" / "output.log"
    found = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith('{"event"'):
                with contextlib.suppress(json.JSONDecodeError):
                    found.append(json.loads(line))
    return found


def wait_event(head: _head.Head, job: int, attempt: int, pred: Any, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in events(head, job, attempt):
            if pred(e):
                return e
        time.sleep(0.01)
    raise RuntimeError(f"job {job} attempt {attempt}: event not seen in {timeout:.0f} s")


def trial(head: _head.Head, c: Client) -> dict[str, float]:
    job = c.submit([sys.executable, str(EXAMPLE), "--epochs", "100"], gpus=4, per_gpu=True, max_restarts=1).id
    try:
        wait_event(head, job, 1, lambda e: e["event"] == "checkpoint" and e["step"] >= 100)
        shim = json.loads((head.data_dir / "run" / str(job) / "attempt-1" / "rank-2" / "shim.json").read_text())
        side = shim["job_pgid"]
        (trainer,) = map(int, Path(f"/proc/{side}/task/{side}/children").read_text().split())
        killed = time.time()
        os.kill(trainer, signal.SIGKILL)
        first = wait_event(head, job, 2, lambda e: e["event"] == "step")
        start = next(e for e in events(head, job, 2) if e["event"] == "start")
        record = c.job(job)
        requeued = next(e.at for e in record.events if e.reason.startswith("rank 2 killed"))
        relaunched = next(e.at for e in record.events if e.state.value == "running" and e.at > requeued)
        return {
            "kill_to_training_s": first["t"] - killed,
            "kill_to_requeued_s": requeued - killed,
            "requeued_to_relaunched_s": relaunched - requeued,
            "relaunched_to_training_s": first["t"] - relaunched,
            "checkpoint_load_s": float(start["load_s"]),
        }
    finally:
        with contextlib.suppress(Exception):
            c.cancel(job)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--backoff", default="1s", help="gpucluster up --restart-backoff")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        head = _head.start(4, Path(tmp) / "data", Path(tmp) / "head.log", extra=("--restart-backoff", args.backoff))
        load = [os.getloadavg()[0]]
        try:
            with Client(head.url, token=head.token) as c:
                runs = []
                for i in range(args.trials):
                    r = trial(head, c)
                    runs.append(r)
                    load.append(os.getloadavg()[0])
                    print(f"trial {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
                    wait_idle(c)
        finally:
            head.stop()
    print(f"load average during the trials: {min(load):.2f}-{max(load):.2f}; restart backoff {args.backoff}")
    for key in runs[0]:
        print(f"p50 {key}: {statistics.median(r[key] for r in runs):.2f} s")


def wait_idle(c: Client, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and c.jobs(state=["running", "queued"]):
        time.sleep(0.2)


if __name__ == "__main__":
    main()
