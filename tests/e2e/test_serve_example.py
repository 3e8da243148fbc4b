"""examples/serve_classifier end to end: train the ddp_classifier briefly, serve its checkpoint
through a real head's gateway, and read held-out digits with it, in concurrent batches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .headproc import HeadProcess, passable_dir
from .servicekit import wait_ready

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with passable_dir("gc-serve-example-") as path:
        yield path


@pytest.fixture(scope="module")
def head(root: Path) -> Iterator[HeadProcess]:
    h = HeadProcess(root / "data", gpus=2)
    try:
        yield h.start()
    finally:
        h.stop()
        h.kill_jobs()


def test_the_example_serves_a_trained_checkpoint_in_batches(head: HeadProcess, root: Path) -> None:
    ckpt = root / "ckpt"
    trained = subprocess.run(
        [sys.executable, str(EXAMPLES / "ddp_classifier" / "train.py"), "--epochs", "8", "--checkpoint-dir", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr
    ckpt.chmod(0o755)
    sys.path.insert(0, str(EXAMPLES / "ddp_classifier"))
    from train import load_data  # the same held-out split the training used

    _, _, x_test, y_test = load_data(0)
    raw = x_test  # standardized; the server takes raw pixels: undo it with its own statistics
    sys.path.insert(0, str(EXAMPLES / "serve_classifier"))
    from server import standardization

    mean, std = standardization()
    pixels = (raw * std + mean).tolist()
    with head.client() as c:
        c.create_service(
            "digits",
            [sys.executable, str(EXAMPLES / "serve_classifier" / "server.py"), "--checkpoint", str(ckpt)],
            gpus=0.5,
            readiness="/health",
        )
        wait_ready(c, "digits", 1, timeout=120)
        url = f"{head.url}/serve/digits/predict"

        def ask(rows: list[list[float]]) -> list[int]:
            r = httpx.post(url, json={"pixels": rows}, headers=head.headers, timeout=60)
            assert r.status_code == 200, r.text
            return list(r.json()["labels"])

        with ThreadPoolExecutor(16) as pool:  # one image per request, 16 at a time: batched by the server
            labels = [x[0] for x in pool.map(ask, [[row] for row in pixels])]
        accuracy = sum(int(a == b) for a, b in zip(labels, y_test.tolist(), strict=True)) / len(labels)
        assert accuracy > 0.9, accuracy
        info = httpx.get(f"{head.url}/serve/digits/info", headers=head.headers).json()
        assert str(ckpt) in info["weights"]
        assert info["images"] == len(pixels) and info["batches"] < len(pixels)  # several per forward pass
        c.delete_service("digits")
