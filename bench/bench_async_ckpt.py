"""Asynchronous checkpoints (issue 17): training steps/s with no checkpoint, with
`CheckpointManager.save_sharded` (the step waits for the write) and with `save_sharded_async`
(torch.distributed.checkpoint's async save: the step waits only for the copy to CPU memory).

  .venv/bin/python bench/bench_async_ckpt.py [--repeats 3] [--steps 120] [--every 20] [--mb 64]

Two ranks (gloo on CPU, the environment `--per-gpu` gives them), each training a stack of Linear
layers holding `--mb` MiB of parameters (plus Adam's two moments: 3x that in the checkpoint) on a
small batch, saving every `--every` steps. The three variants run in rotation (A B C, B C A,
...) so drifting machine load hits all alike; the figure is rank 0's steps/s over the whole run,
median over repeats, and the ratio to the no-checkpoint run of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpucluster.core.types import NodeSlice  # noqa: E402
from gpucluster.launch.ranks import per_gpu_envs, pick_free_port  # noqa: E402

RANK = r"""
import json, sys, time, torch
from gpucluster import train
mode, steps, every, mb, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ctx = train.setup()
torch.manual_seed(0)
width = 1024
layers = max(1, mb * 2**20 // (width * width * 4))
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ckpt = train.CheckpointManager(out, keep=2)
x = torch.randn(8, width)
started = time.perf_counter()
stalls = []
for step in range(1, steps + 1):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode != "none" and step % every == 0:
        t = time.perf_counter()
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        (ckpt.save_sharded_async if mode == "async" else ckpt.save_sharded)(state, step)
        stalls.append(time.perf_counter() - t)
ckpt.wait_async()  # the last one is published before the process ends
elapsed = time.perf_counter() - started
if ctx.rank == 0:
    print(json.dumps({"steps_per_s": steps / elapsed, "stall_s": statistics_median(stalls) if stalls else 0.0}))
train.teardown()
""".replace("statistics_median", "__import__('statistics').median")


def run(mode: str, steps: int, every: int, mb: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK)
        port = pick_free_port("127.0.0.1")
        envs = per_gpu_envs((NodeSlice("n", (0, 1)),), {"n": "127.0.0.1"}, port, job_id=1, attempt=1)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "TORCHELASTIC_"))}
        base["PYTHONPATH"] = str(ROOT / "src")
        argv = [sys.executable, str(script), mode, str(steps), str(every), str(mb), str(Path(tmp) / "ckpt")]
        procs = [
            subprocess.Popen(argv, env=pe.apply(base), stdout=subprocess.PIPE, start_new_session=True) for pe in envs
        ]
        outs = [p.communicate(timeout=900)[0].decode() for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"{mode}: a rank failed: {[p.returncode for p in procs]}")
        return dict(json.loads(outs[0].strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--mb", type=int, default=64)
    args = ap.parse_args()
    modes = ["none", "sync", "async"]
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        order = modes[r % 3 :] + modes[: r % 3]
        for m in order:
            got[m].append(run(m, args.steps, args.every, args.mb))
        load.append(os.getloadavg()[0])
    print(f"2 ranks, {args.mb} MiB of parameters (x3 with Adam), save every {args.every} of {args.steps} steps")
    print(f"load average during the runs: {min(load):.2f}-{max(load):.2f}")
    for m in modes:
        sps = [g["steps_per_s"] for g in got[m]]
        ratio = [g["steps_per_s"] / n["steps_per_s"] for g, n in zip(got[m], got["none"], strict=True)]
        stall = statistics.median(g["stall_s"] for g in got[m])
        print(
            f"{m:>6}: {statistics.median(sps):7.2f} steps/s  (x{statistics.median(ratio):.2f} of no checkpoint)"
            f"  training paused per save: {stall:.3f} s"
        )


if __name__ == "__main__":
    main()
