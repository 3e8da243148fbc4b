"""launch/ranks.py: the torchrun environment and command for every process of an allocation."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.core.types import NodeSlice
from gpucluster.launch.ranks import (
    ENV_RDZV_PREFIX,
    REQUEUE_EXIT_CODE,
    AttemptOutcome,
    attempt_outcome,
    launcher_commands,
    per_gpu_envs,
    pick_free_port,
    placements,
    rendezvous_prefix,
)

TWO_NODES = (NodeSlice("a", (4, 5)), NodeSlice("b", (0, 1)))
ADDRS = {"a": "10.0.0.1", "b": "10.0.0.2"}


def test_ranks_are_node_major_in_allocation_order() -> None:
    got = [(p.rank, p.local_rank, p.node_rank, p.node, p.gpu_index) for p in placements(TWO_NODES)]
    assert got == [(0, 0, 0, "a", 4), (1, 1, 0, "a", 5), (2, 0, 1, "b", 0), (3, 1, 1, "b", 1)]


def test_per_gpu_env_is_torchruns() -> None:
    envs = per_gpu_envs(TWO_NODES, ADDRS, 29500, job_id=7, attempt=3)
    assert [e.env["RANK"] for e in envs] == ["0", "1", "2", "3"]
    third = envs[2].env
    assert third["LOCAL_RANK"] == "0"
    assert third["WORLD_SIZE"] == "4"
    assert third["LOCAL_WORLD_SIZE"] == "2"
    assert third["NODE_RANK"] == third["GROUP_RANK"] == "1"
    assert third["GROUP_WORLD_SIZE"] == "2"
    assert third["MASTER_ADDR"] == "10.0.0.1"  # rank 0's node, for every rank
    assert third["MASTER_PORT"] == "29500"
    assert third["CUDA_VISIBLE_DEVICES"] == "0,1"  # node-local list, device = cuda:LOCAL_RANK
    assert envs[1].env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert {e.env[ENV_RDZV_PREFIX] for e in envs} == {"gpucluster/job-7/attempt-3/"}


def test_isolated_gpus_show_one_device_as_local_rank_zero() -> None:
    envs = per_gpu_envs(TWO_NODES, ADDRS, 29500, job_id=1, attempt=1, isolate_gpus=True)
    assert [(e.env["CUDA_VISIBLE_DEVICES"], e.env["LOCAL_RANK"]) for e in envs] == [
        ("4", "0"),
        ("5", "0"),
        ("0", "0"),
        ("1", "0"),
    ]


def test_defaults_yield_to_the_jobs_own_env_and_rank_vars_do_not() -> None:
    (pe,) = per_gpu_envs((NodeSlice("a", (0,)),), ADDRS, 1234, job_id=1, attempt=1)
    assert "OMP_NUM_THREADS" not in pe.defaults  # one process per node: torchrun leaves it alone
    pe4 = per_gpu_envs((NodeSlice("a", (0, 1, 2, 3)),), ADDRS, 1234, job_id=1, attempt=1)[0]
    merged = pe4.apply({"OMP_NUM_THREADS": "8", "RANK": "99", "PATH": "/bin"})
    assert merged["OMP_NUM_THREADS"] == "8"
    assert merged["RANK"] == "0"
    assert merged["PATH"] == "/bin"
    assert pe4.apply({})["OMP_NUM_THREADS"] == "1"


def test_every_attempt_has_its_own_prefix() -> None:
    prefixes = {rendezvous_prefix(j, a) for j in (1, 2) for a in (1, 2, 3)}
    assert len(prefixes) == 6
    with pytest.raises(ValueError):
        rendezvous_prefix(1, 0)


def test_launcher_mode_runs_one_torchrun_per_node() -> None:
    cmds = launcher_commands(TWO_NODES, ADDRS, 29400, ["python3", "train.py", "--lr", "1"], job_id=2, attempt=1)
    assert [c.node for c in cmds] == ["a", "b"]
    assert cmds[1].argv == (
        "python3",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=2",
        "--master-addr=10.0.0.1",
        "--master-port=29400",
        "--max-restarts=0",
        "--rdzv-conf=timeout=60",
        "train.py",
        "--lr",
        "1",
    )
    assert cmds[1].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cmds[0].env[ENV_RDZV_PREFIX] == "gpucluster/job-2/attempt-1/"


@pytest.mark.parametrize(
    ("argv", "tail"),
    [
        (["python", "-m", "pkg.train", "x"], ("--module", "pkg.train", "x")),
        (["python", "-u", "t.py"], ("--no-python", "python", "-u", "t.py")),
        (["./run.sh", "x"], ("--no-python", "./run.sh", "x")),
    ],
)
def test_launcher_mode_keeps_any_command(argv: list[str], tail: tuple[str, ...]) -> None:
    (cmd,) = launcher_commands((NodeSlice("a", (0,)),), ADDRS, 1, argv, job_id=1, attempt=1)
    assert cmd.argv[-len(tail) :] == tail


def test_bad_allocations_are_refused() -> None:
    with pytest.raises(ValueError, match="same number of GPUs"):
        launcher_commands((NodeSlice("a", (0, 1)), NodeSlice("b", (0,))), ADDRS, 1, ["x"], job_id=1, attempt=1)
    with pytest.raises(ValueError, match="no address"):
        per_gpu_envs((NodeSlice("zz", (0,)),), ADDRS, 1, job_id=1, attempt=1)
    with pytest.raises(ValueError, match="twice"):
        placements((NodeSlice("a", (0,)), NodeSlice("a", (1,))))
    with pytest.raises(ValueError, match="port"):
        per_gpu_envs((NodeSlice("a", (0,)),), ADDRS, 70000, job_id=1, attempt=1)


def test_a_picked_port_is_held_from_other_processes_but_open_to_the_server() -> None:
    """The CI flake: a port found free, released, and taken by someone else's bind or connect
    before rank 0's TCPStore bound it. A picked port now stays reserved by the kernel (TIME_WAIT):
    a plain bind, as another process's would be, is refused; the server's SO_REUSEADDR bind (which
    TCPStore, uvicorn and PostgreSQL all do) gets it, and so does the next one after it closed."""
    port = pick_free_port("127.0.0.1")
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE
    # The kernel's own picks (bind to port 0, as pick_free_port and every ephemeral port) skip it.
    picks = []
    try:
        for _ in range(200):
            s = socket.socket()
            picks.append(s)
            s.bind(("127.0.0.1", 0))
        assert port not in {s.getsockname()[1] for s in picks}
    finally:
        for s in picks:
            s.close()
    for _ in range(2):
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()


def test_a_tcpstore_master_binds_a_picked_port() -> None:
    pytest.importorskip("torch")
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    port = pick_free_port("127.0.0.1")
    store = TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=30), multi_tenant=True)
    store.set("k", "v")
    assert store.port == port and store.get("k") == b"v"


def test_requeue_code_means_nothing_else() -> None:
    assert REQUEUE_EXIT_CODE not in (0, 1, 2, 120, 255) and not 64 <= REQUEUE_EXIT_CODE <= 78
    assert REQUEUE_EXIT_CODE < 124  # not a shell code, not 128 + signal


def test_attempt_outcome() -> None:
    assert attempt_outcome([0, 0, 0, 0]) is AttemptOutcome.SUCCEEDED
    assert attempt_outcome([REQUEUE_EXIT_CODE] * 4) is AttemptOutcome.REQUEUE
    assert attempt_outcome([REQUEUE_EXIT_CODE, 0]) is AttemptOutcome.REQUEUE
    assert attempt_outcome([REQUEUE_EXIT_CODE, 1, REQUEUE_EXIT_CODE]) is AttemptOutcome.FAILED
    assert attempt_outcome([0, -9, 1, 1]) is AttemptOutcome.FAILED
    assert attempt_outcome([143]) is AttemptOutcome.FAILED


# A rank that writes its environment to DIR/env-RANK.json.
_DUMP = "import json, os, sys; json.dump(dict(os.environ), open(f'{sys.argv[1]}/env-{os.environ[\"RANK\"]}.json', 'w'))"


def test_per_gpu_env_has_every_variable_a_real_torchrun_rank_gets(tmp_path: Path) -> None:
    """Issue 17: `--per-gpu` set none of TORCHELASTIC_*, so is_torchelastic_launched() was False and
    no error file was written. A real torchrun's worker environment is the reference."""
    pytest.importorskip("torch")
    script = tmp_path / "dump.py"
    script.write_text(_DUMP)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    port = pick_free_port("127.0.0.1")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2"]
    argv += ["--master-addr=127.0.0.1", f"--master-port={port}", str(script), str(tmp_path)]
    done = subprocess.run(argv, env=base, capture_output=True, timeout=120, cwd=tmp_path)  # 2 Python starts
    assert done.returncode == 0, done.stderr.decode()
    slices = (NodeSlice("n", (0, 1)),)
    ours = per_gpu_envs(
        slices, {"n": "127.0.0.1"}, port, job_id=7, attempt=2, max_restarts=3, error_file=lambda p: f"/e/{p.rank}"
    )
    for rank in (0, 1):
        theirs = json.loads((tmp_path / f"env-{rank}.json").read_text())
        added = {k: v for k, v in theirs.items() if base.get(k) != v and k not in ("PWD", "LC_CTYPE", "_")}
        mine = ours[rank].apply({})
        assert set(added) <= set(mine), f"missing: {sorted(set(added) - set(mine))}"
        differ = {k for k in added if added[k] != mine[k]}
        # ours name the job, its attempt and restarts, its own error file, and no agent's store
        assert differ == {
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_ERROR_FILE",
            "TORCHELASTIC_USE_AGENT_STORE",
        }, {k: (added[k], mine[k]) for k in differ}
        assert (mine["TORCHELASTIC_RUN_ID"], mine["TORCHELASTIC_RESTART_COUNT"]) == ("gpucluster-job-7", "1")
        assert (mine["TORCHELASTIC_MAX_RESTARTS"], mine["TORCHELASTIC_ERROR_FILE"]) == ("3", f"/e/{rank}")
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store, no agent


def test_per_gpu_ranks_are_torchelastic_launched_and_record_their_errors(tmp_path: Path) -> None:
    """Two real ranks with our environment: is_torchelastic_launched(), a gloo group from
    env:// (rank 0 hosts the store), and `@record` writes the failing rank's error file."""
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys, torch.distributed as dist\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    assert dist.is_torchelastic_launched()\n"
        "    dist.init_process_group('gloo')\n"
        "    dist.barrier()\n"
        "    if dist.get_rank() == 1:\n"
        "        raise RuntimeError('boom on rank 1')\n"
        "main()\n"
    )
    port = pick_free_port("127.0.0.1")
    envs = per_gpu_envs(
        (NodeSlice("n", (0, 1)),),
        {"n": "127.0.0.1"},
        port,
        job_id=1,
        attempt=1,
        error_file=lambda p: str(tmp_path / f"error-{p.rank}.json"),
    )
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, str(script)], env=pe.apply(base), cwd=tmp_path, stderr=subprocess.PIPE)
        for pe in envs
    ]
    try:
        codes = [p.wait(timeout=120) for p in procs]  # two torch imports on a shared machine
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 1], [p.stderr.read().decode() if p.stderr else "" for p in procs]
    error = json.loads((tmp_path / "error-1.json").read_text())
    assert "boom on rank 1" in error["message"]["message"]
    assert not (tmp_path / "error-0.json").exists()
