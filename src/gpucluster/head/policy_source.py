"""The live policy: loaded from its file at start, reloaded when the file changes.

A reload that fails validation keeps the running policy (no job is dropped, nothing changes)
and leaves the error where `gpucluster policy show` and the API report it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpucluster.core.policy import Policy
from gpucluster.policyfile import PolicyFileError, load_policy

log = logging.getLogger("gpucluster.policy")

CHECK_EVERY_S = 1.0


class PolicySource:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.policy = load_policy(path) if path is not None else Policy()  # errors surface at start
        self.error: str | None = None
        self.loaded_at: float | None = None
        self._mtime = self._stat()
        self._checked_at = 0.0

    def _stat(self) -> float | None:
        if self.path is None:
            return None
        try:
            return self.path.stat().st_mtime_ns / 1e9
        except OSError:
            return None

    def maybe_reload(self, now: float) -> bool:
        """Reload if the file changed; True if a new policy is now in force."""
        if self.path is None or now - self._checked_at < CHECK_EVERY_S:
            return False
        self._checked_at = now
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            self.policy = load_policy(self.path)
        except (PolicyFileError, ValueError, OSError) as e:
            self.error = str(e)
            log.error("policy file changed but is invalid; keeping the running policy:\n%s", e)
            return False
        self.error = None
        self.loaded_at = now
        log.info("policy reloaded from %s", self.path)
        return True
