"""A small MLP classifier trained on scikit-learn's digits (8x8 handwritten digits, shipped with
scikit-learn, nothing downloaded) with DistributedDataParallel, using gpucluster.train for
checkpoints, resume, preemption and progress reports.

Runs unmodified:
    python train.py                                        # one process
    torchrun --nproc-per-node 4 train.py                   # plain torchrun
    gpucluster submit --gpus 4 --per-gpu -- python train.py  # the cluster's per-GPU launch

Training is deterministic for a given world size: every rank draws the same seeded permutation
per epoch and takes its own stride of it, and a resumed run skips exactly the batches already
done in the interrupted epoch, so an interrupted-and-resumed run ends with the same weights as
an uninterrupted one. Resumed on a different number of processes (elastic), it restarts the
interrupted epoch with the saved weights. Rank 0 prints one JSON object per line (events: start, step, checkpoint,
preempted, done) for logs and tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpucluster import train


class DigitsNet(nn.Module):
    """64 pixels -> 256 -> 256 -> 10 classes, ReLU: 83k parameters.

    A CNN gains nothing measurable on 8x8 images here and trains twice as slowly on CPUs.
    """

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.layers(x)
        return logits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="used when GPUCLUSTER_CHECKPOINT_DIR is not set")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    p.add_argument("--grad-compression", choices=train.compression.CHOICES, default="none")
    p.add_argument("--log-every", type=int, default=10, help="steps between step events")
    p.add_argument(
        "--stop-check-every", type=int, default=5, help="steps between checks for preemption (one tiny all-reduce)"
    )
    return p.parse_args(argv)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits (64 pixel values 0..16) and their labels, from scikit-learn's own copy.

    The file scikit-learn ships is read directly: `import sklearn.datasets` costs ~1 s of CPU per
    process, which four processes starting at once on a small machine feel. If scikit-learn ever
    moves the file, its loader is used instead.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        data = np.loadtxt(path, delimiter=",")
        return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target.astype(np.int64)


def load_data(seed: int, test_fraction: float = 0.25) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stratified, seeded train/test split (the same on every rank), pixels standardized with
    the training set's statistics (worth about one point of accuracy for an MLP)."""
    x, y = digits()
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        test[members[: round(len(members) * test_fraction)]] = True
    mean, std = x[~test].mean(axis=0), x[~test].std(axis=0) + 1.0  # +1: some border pixels are always 0
    x = ((x - mean) / std).astype(np.float32)
    as_t = torch.from_numpy
    return as_t(x[~test]), as_t(y[~test]), as_t(x[test]), as_t(y[test])


def emit(ctx: train.DistContext, event: str, **fields: Any) -> None:
    if ctx.is_main:
        print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    pred = model(x).argmax(dim=1)
    model.train()
    return float((pred == y).float().mean().item())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = train.setup()
    stop = train.preemption.install()
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    x_tr, y_tr = x_tr.to(ctx.device), y_tr.to(ctx.device)

    net = DigitsNet().to(ctx.device)
    model: nn.Module = net
    if ctx.distributed:
        ddp = DistributedDataParallel(net, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        train.register_compression(ddp, args.grad_compression)
        model = ddp
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)

    per_rank = len(x_tr) // ctx.world_size
    steps_per_epoch = per_rank // args.batch_size  # every rank runs the same number of steps
    total = steps_per_epoch * args.epochs

    ckpt = train.CheckpointManager(train.checkpoint_dir(args.checkpoint_dir), keep=args.keep)
    reporter = train.ProgressReporter(enabled=ctx.is_main)
    step = 0
    load_started = time.perf_counter()
    loaded = ckpt.load_latest(map_location=ctx.device)
    if loaded is not None:
        net.load_state_dict(loaded.state["model"])
        opt.load_state_dict(loaded.state["optimizer"])
        step = int(loaded.state["step"])
        if loaded.state["world_size"] != ctx.world_size:
            # Restarted on a different number of processes (elastic): the weights carry over,
            # the data stride does not; start over at the beginning of the interrupted epoch.
            step = step // int(loaded.state["steps_per_epoch"]) * steps_per_epoch
        reporter.report(step, checkpoint_at=loaded.info.saved_at, checkpoint_step=int(loaded.state["step"]))
    load_s = round(time.perf_counter() - load_started, 4)
    resumed_from = step if loaded is not None else None
    emit(ctx, "start", attempt=train.attempt(), world_size=ctx.world_size, resumed_from=resumed_from, load_s=load_s)
    started, started_cpu, first_step = time.perf_counter(), time.process_time(), step

    def save() -> train.CheckpointInfo:
        state = {
            "model": net.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "world_size": ctx.world_size,
            "steps_per_epoch": steps_per_epoch,
        }
        info = ckpt.save(state, step)
        reporter.report(step, checkpoint_at=info.saved_at, checkpoint_step=step)
        emit(ctx, "checkpoint", step=step)
        return info

    while step < total:
        epoch, offset = divmod(step, steps_per_epoch)
        order = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        mine = order[ctx.rank :: ctx.world_size][: steps_per_epoch * args.batch_size].to(ctx.device)
        for b in range(offset, steps_per_epoch):
            if step % args.stop_check_every == 0 and stop.should_stop():
                save()
                emit(ctx, "preempted", step=step)
                reporter.close()
                train.teardown()
                train.exit_for_requeue()
            idx = mine[b * args.batch_size : (b + 1) * args.batch_size]
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            reporter.report(step)
            if step % args.log_every == 0 or step == first_step + 1:
                emit(ctx, "step", step=step, loss=round(float(loss.item()), 4))
                train.report({"loss": float(loss.item())}, step)  # stored per attempt, charted, on /metrics
            if step % args.checkpoint_every == 0 or step == total:  # the last one makes a rerun a no-op
                save()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu

    acc = accuracy(net, x_te.to(ctx.device), y_te.to(ctx.device))
    train.report({"accuracy": acc}, step)
    emit(
        ctx,
        "done",
        test_accuracy=round(acc, 4),
        steps=step,
        steps_this_attempt=step - first_step,
        train_s=round(elapsed, 3),
        train_cpu_s=round(cpu, 3),  # rank 0's own CPU time, all threads
        steps_per_s=round((step - first_step) / elapsed, 2) if elapsed > 0 else None,
    )
    reporter.close()
    train.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
