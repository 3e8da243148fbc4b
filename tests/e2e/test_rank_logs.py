"""`gpucluster logs JOB --all-ranks [--follow]` (issue 17): every rank's lines, each prefixed
`[rank N] ` as torchrun's --tee shows them, from a real head and real `--per-gpu` processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpucluster.ranklogs import LinePrefixer, prefix_lines
from tests.e2e.headproc import CLI, HeadProcess, cli, wait_for
from tests.e2e.test_jobs import finished

# Each rank says hello, waits for a file (so a follow starts while it runs), then says bye
# in two writes, the second finishing the line.
SCRIPT = """
import os, sys, time
rank = os.environ["RANK"]
print(f"hello from {rank}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.stdout.write(f"bye "); sys.stdout.flush(); time.sleep(0.2); print(f"from {rank}", flush=True)
"""
TIMEOUT = 60.0  # three Python processes start on two shared cores


def test_prefixes_whole_lines_only() -> None:
    p = LinePrefixer("[rank 1] ")
    assert p.feed("a\nb") == "[rank 1] a\n"
    assert p.feed("c") == ""
    assert p.feed("\n") == "[rank 1] bc\n"
    assert p.feed("tail") == "" and p.flush() == "[rank 1] tail\n" and p.flush() == ""
    assert prefix_lines("x\ny", "[rank 0] ") == "[rank 0] x\n[rank 0] y\n"


def test_all_ranks_shows_and_follows_every_ranks_lines(head: HeadProcess, tmp_path: Path) -> None:
    script, go = tmp_path / "hello.py", tmp_path / "go"
    script.write_text(SCRIPT)
    with head.client() as c:
        job = c.submit([sys.executable, str(script), str(go)], gpus=3, per_gpu=True, workdir=str(tmp_path)).id
        wait_for(lambda: all(f"hello from {r}" in c.logs(job, rank=r) for r in range(3)), TIMEOUT, what="3 hellos")
    now = cli(head, "logs", str(job), "--all-ranks")
    assert now.returncode == 0, now.stderr
    assert now.stdout == "[rank 0] hello from 0\n[rank 1] hello from 1\n[rank 2] hello from 2\n"
    follow = subprocess.Popen(
        [*CLI, "logs", str(job), "--all-ranks", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "GPUCLUSTER_URL": head.url},
    )
    try:
        go.touch()
        out, err = follow.communicate(timeout=TIMEOUT)  # ends by itself when the attempt ends
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    lines = out.splitlines()
    for r in range(3):
        assert [ln for ln in lines if ln.startswith(f"[rank {r}] ")] == [
            f"[rank {r}] hello from {r}",
            f"[rank {r}] bye from {r}",
        ], out
    assert finished(head, job, TIMEOUT).state.value == "succeeded"
    both = cli(head, "logs", str(job), "--all-ranks", "--rank", "1")
    assert both.returncode == 1 and "--all-ranks and --rank" in both.stderr and "Traceback" not in both.stderr
