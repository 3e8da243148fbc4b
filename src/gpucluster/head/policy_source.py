"""The live policy: loaded from its file at start, reloaded when the file changes.

A reload that fails validation keeps the running policy (no job is dropped, nothing changes)
and leaves the error where `gpucluster policy show` and the API report it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from gpucluster.core.accounting import Accounting
from gpucluster.core.policy import Policy
from gpucluster.policyfile import PolicyFileError, load_policy_file

log = logging.getLogger("gpucluster.policy")

CHECK_EVERY_S = 1.0


class PolicySource:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        # errors surface at start; `accounting` is the file's prices: and budgets: sections
        self.policy, self.accounting = load_policy_file(path) if path is not None else (Policy(), Accounting())
        self.error: str | None = None
        self.loaded_at: float | None = None
        self._mtime = self._stat()
        self._checked_at = 0.0
        self.on_change: Callable[[str], None] | None = None  # told of every reload: the audit log

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
            self.policy, self.accounting = load_policy_file(self.path)
        except (PolicyFileError, ValueError, OSError) as e:
            self.error = str(e)
            log.error("policy file changed but is invalid; keeping the running policy:\n%s", e)
            if self.on_change is not None:
                self.on_change(f"invalid edit ignored: {e}")
            return False
        self.error = None
        self.loaded_at = now
        log.info("policy reloaded from %s", self.path)
        if self.on_change is not None:
            self.on_change("reloaded")
        return True
