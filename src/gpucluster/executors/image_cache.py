"""A node's image cache: the cluster's images kept by last use, the oldest removed past a size cap.

Why: every image a container job pulls stays in the node's podman store, and a busy node fills
its disk with images no job has used in weeks. The cap (`gpucluster up --image-cache-size`,
DEFAULT_CAP_BYTES) bounds the store; the images removed first are those the cluster's jobs used
least recently (LRU).

What it may remove, and why that is safe:
- only images the cluster's own jobs used on this node (recorded here, by reference, at each
  launch): an image an admin pulled or built by hand is never touched, though its size counts;
- never one a container uses, running or stopped: `podman ps --all` is asked right before, those
  images are kept whatever their age, and `podman rmi` is run without `--force`, so podman itself
  refuses an image a container took meanwhile; nor one an attempt of this executor was launched
  with and has not been cleaned up after (it may still be pulling, before its container exists);
- only the store of the head's own account (`--container-config`'s storage.conf, else the
  system's): the rootful store under a root head running jobs of a head without accounts. A
  member's job runs in that member's rootless store (one per account, under its home or the
  storage.conf's `rootless_storage_path`); those stores are the accounts' own, counted against
  their own disk and quota, and are not pruned: pruning them would mean running podman as each
  account. Their images are not recorded here either.

Sizes are podman's (`podman images`: each image with all its layers, so layers shared by two
images count twice and the cap is conservative). State: `images.json` in the head's data dir
(reference -> last use), written atomically, so last uses survive a head restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucluster.containers import stored_name
from gpucluster.executors._shim import write_json_atomic
from gpucluster.executors.podman import ContainerNode

log = logging.getLogger(__name__)

DEFAULT_CAP_BYTES = 100 << 30  # 100 GiB: a few large training images on a node's local disk


@dataclass(frozen=True)
class StoredImage:
    id: str
    names: tuple[str, ...]  # the references it is tagged as (registry/name:tag)
    size: int


def evictions(
    images: Iterable[StoredImage], last_used: Mapping[str, float], in_use: Iterable[str], cap: int
) -> list[StoredImage]:
    """The images to remove, oldest last use first, until the store is within `cap` bytes.

    An image is a candidate only if every name it has is one of the cluster's (`last_used`) and
    none is in use (by reference or by id): removing one tag of an image also tagged otherwise
    would free nothing, and an image used by anyone stays."""
    stored = list(images)
    total = sum(i.size for i in stored)
    if total <= cap:
        return []
    busy = set(in_use)
    candidates = [
        i
        for i in stored
        if i.names and all(n in last_used for n in i.names) and i.id not in busy and not busy.intersection(i.names)
    ]
    candidates.sort(key=lambda i: (max(last_used[n] for n in i.names), i.id))
    out = []
    for image in candidates:
        if total <= cap:
            break
        out.append(image)
        total -= image.size
    return out


class ImageCache:
    """The cache's record and its pruning, for one node's (the head's own account's) store."""

    def __init__(
        self, node: ContainerNode, state: Path, cap_bytes: int, on_removed: Callable[[str], None] | None = None
    ) -> None:
        self.node, self.state, self.cap = node, state, cap_bytes
        self.on_removed = on_removed  # a reference removed: the head forgets it was here
        self._lock = threading.Lock()
        self._busy: dict[str, str] = {}  # run dir of a launched, not yet cleaned attempt -> its image
        try:
            loaded = json.loads(state.read_text())
            self._used: dict[str, float] = {str(k): float(v) for k, v in loaded.items()}
        except (OSError, ValueError, AttributeError):
            self._used = {}
        self._pruning = threading.Lock()
        self._again = threading.Event()

    def known(self) -> set[str]:
        """The references the cluster's jobs used here and the cache has not removed."""
        with self._lock:
            return set(self._used)

    def launched(self, run_dir: str, image: str, at: float) -> None:
        """An attempt runs `image` in this store: in use until `cleaned`, and used now."""
        ref = stored_name(image)
        if ref is None:
            return  # an archive, loaded by id at each launch: nothing to keep by name
        with self._lock:
            self._busy[run_dir] = ref
            self._used[ref] = at
            self._save()

    def cleaned(self, run_dir: str) -> None:
        """An attempt has ended and been cleaned up: prune (in the background, one at a time)."""
        with self._lock:
            was = self._busy.pop(run_dir, None)
        if was is not None:
            self.prune_soon()

    def prune_soon(self) -> None:
        self._again.set()
        if self._pruning.acquire(blocking=False):
            threading.Thread(target=self._prune_loop, name="image-cache", daemon=True).start()

    def _prune_loop(self) -> None:
        try:
            while self._again.is_set():
                self._again.clear()
                try:
                    self.prune()
                except Exception:  # a pruning failure must never reach the executor's caller
                    log.exception("image cache: pruning failed")
        finally:
            self._pruning.release()

    def _save(self) -> None:
        with contextlib.suppress(OSError):
            write_json_atomic(self.state, self._used)

    def _podman(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.node.config_env}
        return subprocess.run(
            [self.node.podman, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd="/",
        )

    def stored(self) -> list[StoredImage] | None:
        listed = self._podman("images", "--format", "json")
        if listed.returncode != 0:
            return None
        try:
            rows = json.loads(listed.stdout or "[]")
        except ValueError:
            return None
        return [
            StoredImage(str(r.get("Id", "")), tuple(r.get("Names") or ()), int(r.get("Size") or 0))
            for r in rows
            if isinstance(r, dict)
        ]

    def in_use(self) -> set[str] | None:
        """Images (by reference and id) of every container in the store, running or not, and of
        the attempts launched here and not yet cleaned; None when podman cannot say."""
        listed = self._podman("ps", "--all", "--format", "json")
        if listed.returncode != 0:
            return None
        try:
            rows = json.loads(listed.stdout or "[]")
        except ValueError:
            return None
        out = {str(r.get(k)) for r in rows if isinstance(r, dict) for k in ("Image", "ImageID") if r.get(k)}
        with self._lock:
            out |= set(self._busy.values())
        return out

    def prune(self) -> list[str]:
        """Remove the least recently used of the cluster's images past the cap; the references
        removed. Nothing when podman cannot list its images or containers."""
        stored, busy = self.stored(), self.in_use()
        if stored is None or busy is None:
            return []
        with self._lock:
            here = {n for i in stored for n in i.names}
            for gone in [r for r in self._used if r not in here and r not in self._busy.values()]:
                del self._used[gone]  # removed by hand, or never made it: no longer ours to count
            used = dict(self._used)
        removed: list[str] = []
        for image in evictions(stored, used, busy, self.cap):
            done = self._podman("rmi", *image.names)  # no --force: podman refuses one in use
            if done.returncode != 0:
                log.info("image cache: kept %s: %s", ", ".join(image.names), done.stderr.strip())
                continue
            log.info("image cache: removed %s (%d bytes, least recently used)", ", ".join(image.names), image.size)
            removed += image.names
        if removed:
            with self._lock:
                for ref in removed:
                    self._used.pop(ref, None)
                self._save()
            for ref in removed:
                if self.on_removed is not None:
                    self.on_removed(ref)
        return removed
