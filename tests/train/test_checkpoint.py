"""Checkpoints: atomic writes, rotation, finding the newest, surviving a crash mid-save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpucluster.train import checkpoint_dir  # noqa: E402
from gpucluster.train.atomic import atomic_write  # noqa: E402
from gpucluster.train.checkpoint import ENV_TEST_CRASH_AT_STEP, CheckpointManager  # noqa: E402


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
    assert _names(tmp_path) == ["step-000000000015.pt", "step-000000000020.pt"]
    latest = m.latest()
    assert latest is not None and latest.step == 20


def test_newest_means_highest_step_not_newest_file(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=5)
    m.save({"step": 100}, step=100)
    m.save({"step": 9}, step=9)  # e.g. written later by a run that restarted from scratch
    got = m.load_latest()
    assert got is not None and got.info.step == 100


def test_leftover_temp_files_are_ignored_then_removed(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save({"step": 1}, step=1)
    (tmp_path / ".tmp-step-000000000002.pt-dead").write_bytes(b"torn")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [c.step for c in m.list()] == [1]
    CheckpointManager(tmp_path)  # the next attempt's manager cleans up
    assert _names(tmp_path) == ["notes.txt", "step-000000000001.pt"]


def test_unreadable_newest_falls_back_to_the_previous(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=3)
    m.save({"step": 1}, step=1)
    m.save({"step": 2}, step=2)
    m.path_for(2).write_bytes(b"bit rot")
    got = m.load_latest()
    assert got is not None and got.info.step == 1


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
    assert names[-1] == "step-000000000001.pt"
    assert any(n.startswith(".tmp-step-000000000002.pt") for n in names)  # the torn write
    got = CheckpointManager(tmp_path).load_latest()
    assert got is not None and got.info.step == 1
    assert torch.equal(got.state["w"], torch.ones(1000))


def test_sharded_checkpoint_roundtrip(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=1)
    m.save_sharded({"w": torch.arange(4.0)}, step=3)
    m.save_sharded({"w": torch.arange(4.0) * 2}, step=4)
    assert _names(tmp_path) == ["step-000000000004"]
    into = {"w": torch.zeros(4)}
    info = m.load_sharded_latest(into)
    assert info is not None and info.step == 4 and info.sharded
    assert torch.equal(into["w"], torch.arange(4.0) * 2)


def test_checkpoint_dir_prefers_the_clusters(tmp_path: Path) -> None:
    assert checkpoint_dir("cli", environ={"GPUCLUSTER_CHECKPOINT_DIR": "/c"}) == Path("/c")
    assert checkpoint_dir("cli", environ={}) == Path("cli")
    assert checkpoint_dir(None, environ={}) == Path("checkpoints")
