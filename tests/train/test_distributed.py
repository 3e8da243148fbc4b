"""DDP setup from the torchrun environment, and gradient compression hooks (one process, gloo)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from gpucluster.launch.ranks import pick_free_port  # noqa: E402
from gpucluster.train import register_compression, setup, teardown  # noqa: E402
from gpucluster.train.distributed import store_prefix  # noqa: E402


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(pick_free_port("127.0.0.1")),
        "GPUCLUSTER_RDZV_PREFIX": "gpucluster/job-3/attempt-2/",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    yield
    teardown()


def test_setup_joins_a_group_under_the_attempts_prefix(one_rank: None) -> None:
    ctx = setup(rdzv_timeout_s=10, collective_timeout_s=10)
    assert ctx.distributed and ctx.backend == "gloo" and ctx.is_main
    assert ctx.store_prefix == "gpucluster/job-3/attempt-2/restart-0/"
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_no_torchrun_env_means_one_plain_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    ctx = setup()
    assert not ctx.distributed and ctx.world_size == 1 and not dist.is_initialized()


def test_torchrun_restarts_get_their_own_prefix() -> None:
    assert store_prefix({"GPUCLUSTER_RDZV_PREFIX": "p/", "TORCHELASTIC_RESTART_COUNT": "2"}) == "p/restart-2/"
    assert store_prefix({}) == "gpucluster/local/restart-0/"


@pytest.mark.parametrize("kind", ["none", "fp16", "bf16", "powersgd"])
def test_compression_hooks_train(one_rank: None, kind: str) -> None:
    setup(rdzv_timeout_s=10, collective_timeout_s=10)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    register_compression(model, kind, powersgd_start_iter=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    losses = []
    for _ in range(5):  # past PowerSGD's plain all-reduce warm-up
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_unknown_compression_is_refused(one_rank: None) -> None:
    setup(rdzv_timeout_s=10, collective_timeout_s=10)
    with pytest.raises(ValueError, match="allowed: none, fp16, bf16, powersgd"):
        register_compression(DistributedDataParallel(torch.nn.Linear(2, 2)), "int8")
