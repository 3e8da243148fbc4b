"""How long a job waits before its next restart after a failure.

One rule for the live head and the simulator, so a simulated failure costs what a real one
does. Doubling from 1 s keeps a single crash (a killed rank) back to training in well under
10 s, while a job that crashes at every start backs off to one try per 5 minutes instead of
churning through the queue.
"""

from __future__ import annotations

RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 300.0


def restart_backoff(restart: int, first_s: float = RESTART_BACKOFF_S, max_s: float = MAX_RESTART_BACKOFF_S) -> float:
    """Seconds the `restart`-th restart (1-based) waits: first_s doubling, at most max_s (the
    head's MAX_RESTART_BACKOFF_S; the simulator lets a cluster spec plan with another)."""
    if restart < 1:
        return 0.0
    return float(min(first_s * 2 ** min(restart - 1, 64), max_s))
