"""The queue index's lines split by guarantee, kept across cycles (core/split_kept.py), are
`split_guaranteed`'s whatever came before: jobs that come, go or are replaced by another object,
and answers of `guaranteed` that change from one cycle to the next."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.policy import Policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.split_kept import KeptSplit
from gpucluster.core.types import JobRequest, Priority

from .builders import job
from .guaranteed_split import split_guaranteed

POLICY = Policy()  # priority classes: a line per (class, team)
NOW = 1000.0
SIZES = (1.0, 2.0, 4.0, 8.0)

STEPS = ["arrive", "arrive", "leave", "replace", "resize", "quota", "cycle"]


def _job(jid: int, n: int) -> JobRequest:
    # Most of class NORMAL: long lines, in which a few new jobs are matched to the old ones.
    return job(jid).team("ab"[jid % 2]).gpus(SIZES[n % 4]).priority(Priority(1 + n // 7)).at(float(jid)).build()


@pytest.mark.parametrize("seed", range(8))
def test_kept_splits_are_fresh_splits_over_any_history(seed: int) -> None:
    """After every cycle of a random history (jobs that come and go, replaced by an equal object
    or by one asking another size, answers that flip), the kept split equals `split_guaranteed`
    of the same index lines with the same answers; a cycle in which nothing changed hands out
    the very lists of the one before. A line split again on its identity alone, its answers not
    asked again, or a replaced job keeping the slot of the object it replaced, splits otherwise."""
    rng = random.Random(seed)
    queued: dict[int, JobRequest] = {}
    index, kept = QueueIndex(), KeptSplit()
    within = {(t, g): g < 4 for t in "ab" for g in SIZES}
    last: dict[int, dict[str, list[JobRequest]]] | None = None
    changed = True
    for _ in range(600):
        what, jid, n = rng.choice(STEPS), rng.randrange(48), rng.randrange(8)
        if what == "arrive" and jid not in queued:
            queued[jid] = _job(jid, n)
        elif what == "leave" and jid in queued:
            del queued[jid]
        elif what == "replace" and jid in queued:
            queued[jid] = replace(queued[jid])  # equal, another object
        elif what == "resize" and jid in queued:
            queued[jid] = replace(queued[jid], gpus=SIZES[n % 4])  # another object, another demand
        elif what == "quota":
            key = ("ab"[n % 2], SIZES[n % 4])
            within[key] = not within[key]
        elif what == "cycle":
            index.update(tuple(queued.values()), POLICY)
            presorted = index.sorted_in(POLICY, NOW)

            def guaranteed(j: JobRequest) -> bool:
                return within[(j.team, j.gpus)]

            got = kept.split(presorted, guaranteed)
            assert got == split_guaranteed(presorted, guaranteed)
            if not changed and last is not None:
                for level, per in got[2].items():
                    assert all(line is last[level][team] for team, line in per.items())
            last, changed = got[2], False
            continue
        else:
            continue
        changed = True
