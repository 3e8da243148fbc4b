"""Checkpoints: atomic writes, rotation, finding the newest, surviving a crash mid-save; newest
means written last (issue 17), an unreadable checkpoint is an error, numpy and custom objects load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpucluster.atomicfile import atomic_write  # noqa: E402
from gpucluster.train import checkpoint_dir  # noqa: E402
from gpucluster.train.checkpoint import ENV_TEST_CRASH_AT_STEP, CheckpointError, CheckpointManager  # noqa: E402

np = pytest.importorskip("numpy")


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_save_load_roundtrip(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    assert m.load_latest() is None
    m.save({"w": torch.arange(3.0), "step": 10}, step=10)
    got = m.load_latest()
    assert got is not None
    assert got.info.step == 10
    assert got.attempt == 1
    assert torch.equal(got.state["w"], torch.arange(3.0))


def test_keeps_the_last_k(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    for step in (5, 10, 15, 20):
        m.save({"step": step}, step=step)
    assert _names(tmp_path) == ["00000003-step-000000000015-attempt-1.pt", "00000004-step-000000000020-attempt-1.pt"]
    latest = m.latest()
    assert latest is not None and latest.step == 20 and latest.seq == 4


def test_newest_means_written_last_even_when_the_step_goes_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example renumbers its steps after an elastic resize: rotation kept the highest steps,
    so every new checkpoint was deleted right after being written (325 steps lost)."""
    m = CheckpointManager(tmp_path, keep=2)
    for step in (300, 325):
        m.save({"step": step}, step=step)
    monkeypatch.setenv("GPUCLUSTER_ATTEMPT", "2")  # resumed at another size: steps renumbered
    for step in (170, 180, 190):
        saved = m.save({"step": step}, step=step)
        assert saved.path.exists(), f"step {step} was rotated away as soon as it was written"
    assert [(c.step, c.attempt) for c in m.list()] == [(180, 2), (190, 2)]
    got = m.load_latest()
    assert got is not None and got.info.step == 190 and got.state == {"step": 190}


def test_checkpoints_named_by_earlier_versions_are_still_loaded_and_older_than_new_ones(tmp_path: Path) -> None:
    old = tmp_path / "step-000000000500.pt"
    torch.save({"format": 1, "step": 500, "saved_at": 1.0, "attempt": 1, "state": {"step": 500}}, old)
    m = CheckpointManager(tmp_path, keep=2)
    got = m.load_latest()
    assert got is not None and got.info.step == 500
    m.save({"step": 10}, step=10)
    latest = m.latest()
    assert latest is not None and latest.step == 10 and latest.seq == 1


def test_leftover_temp_files_are_ignored_then_removed(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save({"step": 1}, step=1)
    (tmp_path / ".tmp-step-000000000002.pt-dead").write_bytes(b"torn")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [c.step for c in m.list()] == [1]
    CheckpointManager(tmp_path)  # the next attempt's manager cleans up
    assert _names(tmp_path) == ["00000001-step-000000000001-attempt-1.pt", "notes.txt"]


def test_an_unreadable_newest_checkpoint_is_an_error_naming_it_not_a_restart_from_zero(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=3)
    m.save({"step": 1}, step=1)
    broken = m.save({"step": 2}, step=2).path
    broken.write_bytes(b"bit rot")
    with pytest.raises(CheckpointError, match=rf"checkpoint {broken} cannot be loaded: .*on_unreadable='previous'"):
        m.load_latest()


def test_an_unreadable_newest_checkpoint_falls_back_by_option_with_a_recorded_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = CheckpointManager(tmp_path, keep=3)
    m.save({"step": 1}, step=1)
    broken = m.save({"step": 2}, step=2).path
    broken.write_bytes(b"bit rot")
    got = m.load_latest(on_unreadable="previous")
    assert got is not None and got.info.step == 1
    (skipped,) = got.skipped
    assert skipped.startswith(f"checkpoint {broken} cannot be loaded: ")
    assert skipped in caplog.text


class Schedule:
    """A script's own object in its checkpoint (torch's safe unpickler refuses it)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup


def test_numpy_and_the_scripts_own_objects_load_as_saved(tmp_path: Path) -> None:
    """With weights_only=True by default, a numpy array made every checkpoint "unreadable"
    and the job silently started over from step 0."""
    m = CheckpointManager(tmp_path)
    rng = np.random.default_rng(0)
    m.save({"rng": rng.bit_generator.state, "perm": np.arange(5), "schedule": Schedule(7)}, step=3)
    got = m.load_latest()
    assert got is not None and got.info.step == 3
    assert np.array_equal(got.state["perm"], np.arange(5)) and got.state["schedule"].warmup == 7


def test_a_pickle_someone_else_could_have_written_is_not_unpickled_in_full(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    path = m.save({"perm": np.arange(5)}, step=3).path
    os.chmod(tmp_path, 0o777)  # any account could have swapped the file
    with pytest.raises(CheckpointError, match="is writable by other accounts"):
        m.load_latest()
    os.chmod(tmp_path, 0o700)
    assert m.load_latest() is not None
    with pytest.raises(CheckpointError, match="Weights only load failed"):
        m.load_latest(weights_only=True)  # strict, by choice
    assert path.exists()


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    def boom(_f: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(tmp_path / "x.pt", boom)
    assert _names(tmp_path) == []


def test_kill_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    """A real SIGKILL of the writer while step 2 is half on disk (test hook)."""
    script = textwrap.dedent(
        f"""
        import torch
        from gpucluster.train.checkpoint import CheckpointManager
        m = CheckpointManager({str(tmp_path)!r})
        m.save({{"w": torch.ones(1000)}}, step=1)
        m.save({{"w": torch.zeros(1000)}}, step=2)
        """
    )
    env = {**os.environ, ENV_TEST_CRASH_AT_STEP: "2"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    names = _names(tmp_path)
    assert names[-1] == "00000001-step-000000000001-attempt-1.pt"
    assert any(n.startswith(".tmp-00000002-step-000000000002") for n in names)  # the torn write
    got = CheckpointManager(tmp_path).load_latest()
    assert got is not None and got.info.step == 1
    assert torch.equal(got.state["w"], torch.ones(1000))


def test_sharded_checkpoint_roundtrip(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=1)
    m.save_sharded({"w": torch.arange(4.0)}, step=3)
    m.save_sharded({"w": torch.arange(4.0) * 2}, step=4)
    assert _names(tmp_path) == ["00000002-step-000000000004-attempt-1"]
    into = {"w": torch.zeros(4)}
    info = m.load_sharded_latest(into)
    assert info is not None and info.step == 4 and info.sharded
    assert torch.equal(into["w"], torch.arange(4.0) * 2)


def test_checkpoint_dir_prefers_the_clusters(tmp_path: Path) -> None:
    assert checkpoint_dir("cli", environ={"GPUCLUSTER_CHECKPOINT_DIR": "/c"}) == Path("/c")
    assert checkpoint_dir("cli", environ={}) == Path("cli")
    assert checkpoint_dir(None, environ={}) == Path("checkpoints")


def test_async_sharded_save_is_published_only_when_written_and_loads_back(tmp_path: Path) -> None:
    """Issue 17: torch.distributed.checkpoint's async save; training may change the tensors
    right after the call (the state was staged), the checkpoint holds the values at the call."""
    m = CheckpointManager(tmp_path, keep=2)
    w = torch.arange(4.0)
    m.save_sharded_async({"w": w}, step=5)
    w.mul_(100)  # training goes on
    info = m.wait_async()
    assert info is not None and info.step == 5 and _names(tmp_path) == ["00000001-step-000000000005-attempt-1"]
    m.save_sharded_async({"w": w}, step=6)
    m.save({"step": 7}, step=7)  # a save waits for the one in flight: published in order
    assert [c.step for c in m.list()] == [6, 7]
    into = {"w": torch.zeros(4)}
    m.save_sharded_async({"w": torch.ones(4)}, step=8)
    assert m.wait_async() is not None and m.wait_async() is None
    got = m.load_sharded_latest(into)
    assert got is not None and got.step == 8 and torch.equal(into["w"], torch.ones(4))


_ASYNC_RANKS = """
import sys, torch
from gpucluster import train
ctx = train.setup()
m = train.CheckpointManager(sys.argv[1], keep=2)
w = torch.full((1000,), 7.0)  # replicated (as DDP's): DCP writes one copy
m.save_sharded_async({"w": w}, step=10)
for _ in range(3):  # training's own collectives go on while the shards are written
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
w.fill_(-1.0)
m.wait_async()
into = {"w": torch.zeros(1000)}
info = m.load_sharded_latest(into)
assert info.step == 10 and torch.equal(into["w"], torch.full((1000,), 7.0)), into["w"][:3]
train.teardown()
"""


def test_async_sharded_save_on_two_ranks_with_training_collectives_meanwhile(tmp_path: Path) -> None:
    from gpucluster.core.types import NodeSlice
    from gpucluster.launch.ranks import per_gpu_envs, pick_free_port

    script = tmp_path / "ranks.py"
    script.write_text(_ASYNC_RANKS)
    envs = per_gpu_envs((NodeSlice("n", (0, 1)),), {"n": "127.0.0.1"}, pick_free_port("127.0.0.1"), job_id=1, attempt=1)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "TORCHELASTIC_"))}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "ckpt")],
            env=pe.apply(base),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for pe in envs
    ]
    try:
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]  # two torch starts, shared cores
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
