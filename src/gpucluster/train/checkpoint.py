"""Checkpoints that survive crashes, preemption and restarts, in the job's checkpoint directory.

Layout of the directory (which the cluster keeps across every attempt of a job):

    00000007-step-000000001200-attempt-2.pt   one file, written by rank 0 (`save` / `load_latest`)
    00000008-step-000000001500-attempt-2/     a torch.distributed.checkpoint directory, one file
                             per rank (`save_sharded` / `load_sharded_latest`, for FSDP and other
                             sharded state)
    .tmp-*                   an unfinished write; never loaded, removed by the next save
    step-000000001200.pt     the names of earlier versions, still found and loaded (oldest of all)

The first number is the write sequence of the directory (one more than the highest found, by
rank 0, and only one attempt runs at a time), so "the newest checkpoint" is the one written
last, whatever its step: a script that renumbers its steps (after an elastic resize, say) would
otherwise see each new checkpoint rotated away right after it was written, because rotation
kept the highest steps. Only complete checkpoints carry such a name (see
`gpucluster.atomicfile`), so a crash mid-save leaves the previous one in place. The last `keep`
checkpoints are kept; older ones are deleted only after a newer one is durable.

A checkpoint that cannot be loaded is an error (`CheckpointError`, naming the file and why), not
a silent start from step 0; `load_latest(on_unreadable="previous")` falls back to older ones and
records each one it skipped in `Loaded.skipped` and the log. Loading tries torch's safe
`weights_only` unpickler first; what it refuses (numpy arrays, the script's own classes) is
loaded in full only from a file this account owns in a directory nobody else may write, that is,
one the job's own processes wrote (a job runs as its submitter; its directory is 0700).

Under torch.distributed, `save`, `save_sharded`, `load_latest` and `load_sharded_latest` are
collective: every rank calls them. Rank 0 picks the checkpoint to load and tells the others, so
all ranks resume from the same step; saves end with a barrier, so no rank exits (or is killed
by a launcher reacting to its exit) before the checkpoint is on disk. With several nodes, the
directory must be on storage all nodes share.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import signal
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from gpucluster.atomicfile import TMP_PREFIX, atomic_rename_dir, atomic_write, fsync_dir
from gpucluster.errors import GpuclusterError
from gpucluster.train import env as train_env
from gpucluster.train.distributed import async_checkpoint_group

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(?:(\d{8})-)?step-(\d{12})(?:-attempt-(\d+))?(\.pt)?$")
FORMAT_VERSION = 1

# Test hook: the rank-0 writer of this step SIGKILLs itself halfway through writing it.
ENV_TEST_CRASH_AT_STEP = "GPUCLUSTER_TEST_CRASH_AT_CHECKPOINT_STEP"


class CheckpointError(RuntimeError, GpuclusterError):
    """A checkpoint exists but cannot be loaded: the attempt fails with this reason rather than
    start again from step 0 (which would look like success while losing all the work)."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    sharded: bool
    saved_at: float | None = None  # wall-clock time of the save, when known
    seq: int = 0  # the write sequence in the directory (0: a name of an earlier version)
    attempt: int | None = None  # the attempt that wrote it, when the name says

    def order(self) -> tuple[int, int, int]:
        """Newest last: write sequence, then (for names of earlier versions) attempt and step."""
        return (self.seq, self.attempt or 0, self.step)


@dataclass(frozen=True)
class Loaded:
    """A loaded rank-0 checkpoint: the state the script saved, and where it came from."""

    state: dict[str, Any]
    info: CheckpointInfo
    attempt: int  # the attempt that wrote it
    skipped: tuple[str, ...] = ()  # newer checkpoints that could not be read, and why (fallback only)


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
        self._pending_async: tuple[Any, Path, Path] | None = None  # an async save in flight
        if _rank() == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
        _barrier()

    # --- finding -------------------------------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest written first (never ordered by step alone)."""
        out: list[CheckpointInfo] = []
        if not self.directory.is_dir():
            return out
        for entry in self.directory.iterdir():
            info = _parse(entry)
            if info is not None and info.sharded == entry.is_dir():
                out.append(info)
        out.sort(key=CheckpointInfo.order)
        return out

    def latest(self) -> CheckpointInfo | None:
        found = self.list()
        return found[-1] if found else None

    def path_for(self, step: int, *, sharded: bool = False, seq: int | None = None) -> Path:
        """Where the next checkpoint of `step` goes (`seq`: its write sequence; default the next)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if seq is None:
            found = self.list()
            seq = (found[-1].seq if found else 0) + 1
        name = f"{seq:08d}-step-{step:012d}-attempt-{train_env.attempt()}"
        return self.directory / (name if sharded else f"{name}.pt")

    # --- one file, written by rank 0 ---------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int) -> CheckpointInfo:
        """Save `state` (model/optimizer state dicts, counters) as the checkpoint of `step`.

        Collective under torch.distributed: rank 0 writes, every rank waits for it. The state of
        rank 0 is the state of all ranks under DDP, which keeps replicas identical. An async
        save in flight is finished first, so checkpoints are published in the order written.
        """
        self.wait_async()
        final = Path(_broadcast_from_rank0(str(self.path_for(step)) if _rank() == 0 else None) or "")
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
        return replace(_parse(final) or CheckpointInfo(step, final, False), saved_at=saved_at)

    def load_latest(
        self,
        *,
        map_location: str | torch.device | None = "cpu",
        weights_only: bool | None = None,
        on_unreadable: Literal["fail", "previous"] = "fail",
    ) -> Loaded | None:
        """Load the newest rank-0 checkpoint on every rank, or None if there is none at all.

        A newest checkpoint that cannot be read raises CheckpointError on every rank (with the
        file and the reason), so the attempt fails and says why instead of training from step 0.
        `on_unreadable="previous"` falls back to older ones instead; each one skipped is logged
        as a warning and listed in `Loaded.skipped`. `weights_only`: None (the default) is torch's
        safe unpickler, then a full load of a file only this account could have written (see the
        module's docstring); True is the safe unpickler alone; False trusts any file.
        """
        if on_unreadable not in ("fail", "previous"):
            raise ValueError(f"on_unreadable must be 'fail' or 'previous', got {on_unreadable!r}")
        chosen: Loaded | None = None
        problem: str | None = None
        if _rank() == 0:
            skipped: list[str] = []
            for info in reversed([c for c in self.list() if not c.sharded]):
                try:
                    chosen = replace(self._read(info, map_location, weights_only), skipped=tuple(skipped))
                    break
                except Exception as e:
                    why = f"checkpoint {info.path} cannot be loaded: {_one_line(e)}"
                    if on_unreadable == "fail":
                        problem = f"{why} (load_latest(on_unreadable='previous') falls back to an older one)"
                        break
                    log.warning("%s; trying an older one", why)
                    skipped.append(why)
        message = f"!{problem}" if problem else (str(chosen.info.path) if chosen else None)
        path = _broadcast_from_rank0(message)
        if path is not None and path.startswith("!"):
            raise CheckpointError(path[1:])
        if path is None:
            return None
        if chosen is None:
            found = _parse(Path(path))
            assert found is not None
            chosen = self._read(found, map_location, weights_only)
        return chosen

    def _read(self, info: CheckpointInfo, map_location: str | torch.device | None, weights_only: bool | None) -> Loaded:
        payload = _load(info.path, map_location, weights_only)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
            raise ValueError(f"{info.path} is not a gpucluster checkpoint (format {FORMAT_VERSION})")
        done = replace(info, step=int(payload["step"]), saved_at=float(payload["saved_at"]))
        return Loaded(dict(payload["state"]), done, int(payload["attempt"]))

    # --- sharded: torch.distributed.checkpoint, every rank writes its shard ---------------------

    def save_sharded(self, state_dict: dict[str, Any], step: int) -> CheckpointInfo:
        """Save sharded state (FSDP, DTensor) with torch.distributed.checkpoint; collective.

        All ranks write into one temporary directory (its name is the same on every rank);
        rank 0 publishes it with an atomic directory rename once every shard is written.
        """
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        tmp, final = self._sharded_target(step)
        _dcp_save(state_dict, FileSystemWriter(str(tmp)))
        saved_at = time.time()
        self._publish(tmp, final)
        return replace(_parse(final) or CheckpointInfo(step, final, True), saved_at=saved_at)

    def _sharded_target(self, step: int) -> tuple[Path, Path]:
        """Collective: after the save in flight, the (temporary, final) directory of a sharded
        save of `step`, the temporary one made empty; every rank writes into the directory rank 0
        named (its write sequence is rank 0's count)."""
        self.wait_async()
        final = Path(_broadcast_from_rank0(str(self.path_for(step, sharded=True)) if _rank() == 0 else None) or "")
        tmp = self.directory / f"{TMP_PREFIX}{final.name}"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        return tmp, final

    def _publish(self, tmp: Path, final: Path) -> None:
        """Collective: once every rank's shard is in `tmp`, rank 0 renames it to `final` and rotates."""
        _barrier()
        if _rank() == 0:
            if final.exists():  # this step was saved already (e.g. preempted right after resuming)
                shutil.rmtree(tmp)
            else:
                atomic_rename_dir(tmp, final)
            self._rotate()
        _barrier()

    def save_sharded_async(self, state_dict: dict[str, Any], step: int) -> CheckpointInfo:
        """Like `save_sharded`, but training goes on while the shards are written: the state is
        copied to CPU memory now (the only pause), then torch.distributed.checkpoint's
        `async_save` writes it from a background thread; once every rank's shard and the
        metadata are on disk, rank 0 publishes the directory (atomic rename) and rotates.

        Collective, like every save. One save is in flight at a time: the next one (async or
        not) and `wait_async()` wait for it first. Call `wait_async()` before exiting (after a
        SIGTERM, say), or the last checkpoint stays a `.tmp-*` directory that is never loaded.
        The background writes use a gloo process group of their own, so they never interleave
        with training's collectives (the advice of torch's async_save for NCCL jobs too).
        """
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import async_save

        tmp, final = self._sharded_target(step)
        no_dist = not (dist.is_available() and dist.is_initialized())
        future = async_save(
            state_dict,
            storage_writer=FileSystemWriter(str(tmp)),
            process_group=None if no_dist else async_checkpoint_group(),
            no_dist=no_dist,
        )
        self._pending_async = (future, tmp, final)
        return replace(_parse(final) or CheckpointInfo(step, final, True), saved_at=time.time())

    def wait_async(self) -> CheckpointInfo | None:
        """Wait for the save in flight (if any) to be written and published; its info, or None.
        Raises what the background write raised (a full disk), on the rank it happened."""
        pending, self._pending_async = self._pending_async, None
        if pending is None:
            return None
        future, tmp, final = pending
        # A Future, or (newer torch, with a stager) a response whose upload completes later.
        (future.result if hasattr(future, "result") else future.upload_completion.result)()
        self._publish(tmp, final)
        return replace(_parse(final) or CheckpointInfo(0, final, True), saved_at=time.time())

    def load_sharded_latest(self, state_dict: dict[str, Any]) -> CheckpointInfo | None:
        """Load the newest sharded checkpoint into `state_dict` in place (collective)."""
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        newest = [c for c in self.list() if c.sharded]
        path = _broadcast_from_rank0(str(newest[-1].path) if newest and _rank() == 0 else None)
        if path is None:
            return None
        try:
            _dcp_load(state_dict, FileSystemReader(path))
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} cannot be loaded: {_one_line(e)}") from e
        info = _parse(Path(path))
        assert info is not None
        return info

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


def _parse(path: Path) -> CheckpointInfo | None:
    """What a checkpoint's name says (None: not a complete checkpoint)."""
    m = _NAME.match(path.name)
    if m is None:
        return None
    seq, step, attempt, suffix = m.groups()
    return CheckpointInfo(int(step), path, suffix is None, seq=int(seq or 0), attempt=int(attempt) if attempt else None)


def _one_line(e: BaseException) -> str:
    """An exception as one line of reasonable length, without terminal colour codes."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(e)).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def _own_and_private(path: Path) -> str | None:
    """Why `path` may hold someone else's pickle, or None when only this account could have
    written it: it and its directory are this account's and writable by nobody else."""
    uid = os.geteuid()
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != uid:
            return f"{p} belongs to uid {st.st_uid}, not to this account (uid {uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (p.is_dir() and st.st_mode & stat.S_ISVTX):
            return f"{p} is writable by other accounts (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _load(path: Path, map_location: str | torch.device | None, weights_only: bool | None) -> Any:
    """torch.load that accepts what `save` wrote (numpy arrays, the script's own objects) safely."""
    if weights_only is not None:
        return torch.load(path, map_location=map_location, weights_only=weights_only)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # the safe unpickler refused a global: whose file is it?
        why_not = _own_and_private(path)
        if why_not is not None:
            refused = _one_line(e).split(". ", 1)[0]  # torch's first sentence; the rest is advice
            raise pickle.UnpicklingError(f"not unpickled in full, {why_not} ({refused})") from e
        return torch.load(path, map_location=map_location, weights_only=False)


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
