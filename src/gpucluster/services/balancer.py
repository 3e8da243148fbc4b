"""Which replica takes the next request: the ready one with the fewest requests outstanding.

Least outstanding requests (Envoy's LEAST_REQUEST, Ray Serve's power of two choices without the
sampling at this size) keeps a slow replica from piling up work; ties go round-robin so that
idle replicas share a light load evenly instead of the first one taking everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Endpoint:
    """One replica as the gateway sees it. `phase`: starting, ready, unready, draining; only
    `ready` ones get traffic. `in_flight`: requests sent and not yet fully answered."""

    replica_id: int
    url: str
    phase: str
    in_flight: int = 0


def pick(endpoints: Sequence[Endpoint], turn: int, exclude: frozenset[int] = frozenset()) -> Endpoint | None:
    """The ready endpoint with the fewest in flight, ties broken by `turn` (a counter the caller
    advances); None when none is ready. `exclude`: replicas that already failed this request."""
    ready = [e for e in endpoints if e.phase == "ready" and e.replica_id not in exclude]
    if not ready:
        return None
    least = min(e.in_flight for e in ready)
    tied = [e for e in ready if e.in_flight == least]
    return tied[turn % len(tied)]
