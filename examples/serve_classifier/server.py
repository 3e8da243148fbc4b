"""Serve the ddp_classifier example's model: batched digit predictions over HTTP, on CPU.

Loads the newest checkpoint of a training run (`--checkpoint DIR`, the run's checkpoint dir)
if given, else serves an untrained model (for trying the plumbing). Listens on $PORT (the
cluster gives each replica its own) or `--port`.

    POST /predict  {"pixels": [[64 values 0..16], ...]}  ->  {"labels": [...], "batch": N}
    GET  /health   200 once the model is loaded
    GET  /info     where the weights came from, requests and batches so far

Batching: requests that arrive while the model is busy wait together, and the next forward
pass takes up to `--max-batch` images from all of them (waiting at most `--max-wait-ms` for a
batch to fill), so a loaded replica runs a few large matrix products instead of many small ones.

    gpucluster serve --name digits --gpus 0.25 --replicas 1..3 --readiness /health \\
        -- python examples/serve_classifier/server.py --checkpoint /path/to/checkpoints
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ddp_classifier"))
from gpucluster import train
from train import DigitsNet, digits


class PredictIn(BaseModel):
    pixels: list[list[float]] = Field(min_length=1, max_length=1024, description="8x8 images, 64 values each")


@dataclass
class _Pending:
    images: torch.Tensor
    done: asyncio.Future[list[int]]


@dataclass
class Batcher:
    """Runs the model on batches gathered from concurrent requests (one forward pass at a time)."""

    model: DigitsNet
    mean: torch.Tensor
    std: torch.Tensor
    max_batch: int = 64
    max_wait_s: float = 0.005
    queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    batches: int = 0
    images: int = 0

    async def predict(self, images: torch.Tensor) -> list[int]:
        done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(images, done))
        return await done

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            size = len(batch[0].images)
            deadline = loop.time() + self.max_wait_s
            while size < self.max_batch:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
                batch.append(item)
                size += len(item.images)
            x = torch.cat([p.images for p in batch])
            labels = await asyncio.to_thread(self._forward, x)
            self.batches += 1
            self.images += len(x)
            at = 0
            for p in batch:
                n = len(p.images)
                if not p.done.done():
                    p.done.set_result(labels[at : at + n])
                at += n

    def _forward(self, x: torch.Tensor) -> list[int]:
        with torch.no_grad():
            return [int(v) for v in self.model((x - self.mean) / self.std).argmax(dim=1)]


def load_model(checkpoint: str | None) -> tuple[DigitsNet, str]:
    model = DigitsNet()
    source = "untrained (no --checkpoint)"
    if checkpoint:
        loaded = train.CheckpointManager(Path(checkpoint)).load_latest(map_location="cpu")
        if loaded is None:
            raise SystemExit(f"no checkpoint in {checkpoint}; train first (examples/ddp_classifier)")
        model.load_state_dict(loaded.state["model"])
        source = f"{checkpoint} step {loaded.state['step']}"
    model.eval()
    return model, source


def standardization(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set's pixel mean and spread, as train.py standardizes (same seeded split)."""
    import numpy as np

    x, y = digits()
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        test[members[: round(len(members) * 0.25)]] = True
    mean, std = x[~test].mean(axis=0), x[~test].std(axis=0) + 1.0
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)


def create_app(batcher: Batcher, source: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(batcher.run())  # the one loop that runs the model
        yield
        task.cancel()

    app = FastAPI(title="digits", lifespan=lifespan)
    requests = 0

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return {"weights": source, "requests": requests, "batches": batcher.batches, "images": batcher.images}

    @app.post("/predict")
    async def predict(body: PredictIn) -> dict[str, Any]:
        nonlocal requests
        if any(len(row) != 64 for row in body.pixels):
            raise HTTPException(422, "each image is 64 pixel values (8x8, 0..16)")
        requests += 1
        labels = await batcher.predict(torch.tensor(body.pixels, dtype=torch.float32))
        return {"labels": labels, "batch": len(labels)}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a training run's checkpoint dir (its newest checkpoint is loaded)")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    args = p.parse_args()
    torch.set_num_threads(1)  # one core per replica: replicas scale out, not up
    model, source = load_model(args.checkpoint)
    mean, std = standardization()
    batcher = Batcher(model, mean, std, args.max_batch, args.max_wait_ms / 1000)
    uvicorn.run(create_app(batcher, source), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
