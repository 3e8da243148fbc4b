"""Checkpoints that survive crashes, preemption and restarts, in the job's checkpoint directory.

Layout of the directory (which the cluster keeps across every attempt of a job):

    step-000000001200.pt     one file, written by rank 0 (`save` / `load_latest`)
    step-000000001500/       a torch.distributed.checkpoint directory, one file per rank
                             (`save_sharded` / `load_sharded_latest`, for FSDP and other sharded state)
    .tmp-*                   an unfinished write; never loaded, removed by the next save

Only complete checkpoints carry a `step-*` name (see `gpucluster.train.atomic`), so "the newest
checkpoint" is simply the highest step, and a crash mid-save leaves the previous one in place.
The last `keep` checkpoints are kept; older ones are deleted only after a newer one is durable.

Under torch.distributed, `save`, `save_sharded`, `load_latest` and `load_sharded_latest` are
collective: every rank calls them. Rank 0 picks the checkpoint to load and tells the others, so
all ranks resume from the same step; saves end with a barrier, so no rank exits (or is killed
by a launcher reacting to its exit) before the checkpoint is on disk. With several nodes, the
directory must be on storage all nodes share.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpucluster.train import env as train_env
from gpucluster.train.atomic import TMP_PREFIX, atomic_rename_dir, atomic_write, fsync_dir

log = logging.getLogger(__name__)

_NAME = re.compile(r"^step-(\d{12})(\.pt)?$")
FORMAT_VERSION = 1

# Test hook: the rank-0 writer of this step SIGKILLs itself halfway through writing it.
ENV_TEST_CRASH_AT_STEP = "GPUCLUSTER_TEST_CRASH_AT_CHECKPOINT_STEP"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    sharded: bool
    saved_at: float | None = None  # wall-clock time of the save, when known


@dataclass(frozen=True)
class Loaded:
    """A loaded rank-0 checkpoint: the state the script saved, and where it came from."""

    state: dict[str, Any]
    info: CheckpointInfo
    attempt: int  # the attempt that wrote it


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _broadcast_from_rank0(value: str | None) -> str | None:
    if not _distributed():
        return value
    box: list[str | None] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class CheckpointManager:
    """Saves, finds, loads and rotates the checkpoints of one job.

    Create it on every rank after `gpucluster.train.setup()` (construction is collective: rank 0
    creates the directory and removes a crashed attempt's half-written files while the others
    wait). `directory` defaults to `gpucluster.train.checkpoint_dir()`.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory) if directory is not None else train_env.checkpoint_dir()
        self.keep = keep
        if _rank() == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
        _barrier()

    # --- finding -------------------------------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        out: list[CheckpointInfo] = []
        if not self.directory.is_dir():
            return out
        for entry in self.directory.iterdir():
            m = _NAME.match(entry.name)
            if m is None:
                continue
            sharded = m.group(2) is None
            if sharded != entry.is_dir():
                continue
            out.append(CheckpointInfo(int(m.group(1)), entry, sharded))
        out.sort(key=lambda c: c.step)
        return out

    def latest(self) -> CheckpointInfo | None:
        found = self.list()
        return found[-1] if found else None

    def path_for(self, step: int, *, sharded: bool = False) -> Path:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.directory / (f"step-{step:012d}" if sharded else f"step-{step:012d}.pt")

    # --- one file, written by rank 0 ---------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int) -> CheckpointInfo:
        """Save `state` (model/optimizer state dicts, counters) as the checkpoint of `step`.

        Collective under torch.distributed: rank 0 writes, every rank waits for it. The state of
        rank 0 is the state of all ranks under DDP, which keeps replicas identical.
        """
        final = self.path_for(step)
        saved_at = time.time()
        if _rank() == 0:
            payload = {
                "format": FORMAT_VERSION,
                "step": step,
                "saved_at": saved_at,
                "attempt": train_env.attempt(),
                "state": dict(state),
            }
            atomic_write(final, lambda f: torch.save(payload, f), crash_hook=_crash_hook_for(step))
            self._rotate()
        _barrier()
        return CheckpointInfo(step, final, False, saved_at)

    def load_latest(
        self, *, map_location: str | torch.device | None = "cpu", weights_only: bool = True
    ) -> Loaded | None:
        """Load the newest readable rank-0 checkpoint on every rank, or None if there is none.

        Rank 0 tries the newest first and falls back to older ones if a file cannot be read
        (a damaged disk; an interrupted save cannot cause it), then every rank loads that one.
        """
        chosen: Loaded | None = None
        if _rank() == 0:
            for info in reversed([c for c in self.list() if not c.sharded]):
                try:
                    chosen = self._read(info, map_location, weights_only)
                    break
                except Exception as e:  # a damaged file: say so and use the previous one
                    log.warning("checkpoint %s is unreadable (%s); trying an older one", info.path, e)
        path = _broadcast_from_rank0(str(chosen.info.path) if chosen else None)
        if path is None:
            return None
        if chosen is None:
            m = _NAME.match(Path(path).name)
            assert m is not None
            chosen = self._read(CheckpointInfo(int(m.group(1)), Path(path), False), map_location, weights_only)
        return chosen

    def _read(self, info: CheckpointInfo, map_location: str | torch.device | None, weights_only: bool) -> Loaded:
        payload = torch.load(info.path, map_location=map_location, weights_only=weights_only)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise ValueError(f"{info.path} is not a gpucluster checkpoint (format {FORMAT_VERSION})")
        done = CheckpointInfo(int(payload["step"]), info.path, False, float(payload["saved_at"]))
        return Loaded(dict(payload["state"]), done, int(payload["attempt"]))

    # --- sharded: torch.distributed.checkpoint, every rank writes its shard ---------------------

    def save_sharded(self, state_dict: dict[str, Any], step: int) -> CheckpointInfo:
        """Save sharded state (FSDP, DTensor) with torch.distributed.checkpoint; collective.

        All ranks write into one temporary directory (its name is the same on every rank);
        rank 0 publishes it with an atomic directory rename once every shard is written.
        """
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        final = self.path_for(step, sharded=True)
        tmp = self.directory / f"{TMP_PREFIX}{final.name}-attempt-{train_env.attempt()}"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        _dcp_save(state_dict, FileSystemWriter(str(tmp)))
        _barrier()
        saved_at = time.time()
        if _rank() == 0:
            if final.exists():  # this step was saved already (e.g. preempted right after resuming)
                shutil.rmtree(tmp)
            else:
                atomic_rename_dir(tmp, final)
            self._rotate()
        _barrier()
        return CheckpointInfo(step, final, True, saved_at)

    def load_sharded_latest(self, state_dict: dict[str, Any]) -> CheckpointInfo | None:
        """Load the newest sharded checkpoint into `state_dict` in place (collective)."""
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        newest = [c for c in self.list() if c.sharded]
        path = _broadcast_from_rank0(str(newest[-1].path) if newest and _rank() == 0 else None)
        if path is None:
            return None
        _dcp_load(state_dict, FileSystemReader(path))
        m = _NAME.match(Path(path).name)
        assert m is not None
        return CheckpointInfo(int(m.group(1)), Path(path), True)

    # --- housekeeping (rank 0) -------------------------------------------------------------

    def _rotate(self) -> None:
        found = self.list()
        for old in found[: max(0, len(found) - self.keep)]:
            if old.sharded:
                shutil.rmtree(old.path, ignore_errors=True)
            else:
                old.path.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def _remove_leftovers(self) -> None:
        """Delete half-written checkpoints of a crashed attempt (only one attempt runs at a time)."""
        for entry in self.directory.iterdir():
            if entry.name.startswith(TMP_PREFIX):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def _dcp_save(state_dict: dict[str, Any], writer: Any) -> None:
    """torch.distributed.checkpoint.save (torch >= 2.2) or save_state_dict (2.1)."""
    from torch.distributed.checkpoint import state_dict_saver

    no_dist = not (dist.is_available() and dist.is_initialized())
    save = getattr(state_dict_saver, "save", None) or state_dict_saver.save_state_dict
    save(state_dict, storage_writer=writer, no_dist=no_dist)


def _dcp_load(state_dict: dict[str, Any], reader: Any) -> None:
    from torch.distributed.checkpoint import state_dict_loader

    no_dist = not (dist.is_available() and dist.is_initialized())
    load = getattr(state_dict_loader, "load", None) or state_dict_loader.load_state_dict
    load(state_dict, storage_reader=reader, no_dist=no_dist)


def _crash_hook_for(step: int) -> Callable[[Path], None] | None:
    """For tests: a hook that tears the temporary file and kills this process with SIGKILL."""
    raw = os.environ.get(ENV_TEST_CRASH_AT_STEP)
    if not raw or int(raw) != step:
        return None

    def crash(tmp: Path) -> None:
        size = tmp.stat().st_size
        with open(tmp, "r+b") as f:
            f.truncate(size // 2)
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    return crash
