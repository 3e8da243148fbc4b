"""The reference split of the queue index's lines by guarantee, for the tests: what
core/split_kept.py keeps across cycles, worked out afresh from each line (test_split_kept.py
checks the kept split against it, test_scheduler_queue_index.py checks it against `sort_in`)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, count, repeat
from operator import attrgetter, is_, not_

from gpucluster.core.queueing import GUARANTEED_LEVEL, Presorted, Sorted
from gpucluster.core.types import JobRequest

_DEMAND = attrgetter("demand")


def split_guaranteed(presorted: Presorted, guaranteed: Callable[[JobRequest], bool]) -> Sorted:
    """`queueing.sort_in(queued, policy, now, guaranteed)` from `sort_in_plain`'s lists of the
    same jobs (a `QueueIndex`'s): each team line of a level split into the jobs within their
    team's guaranteed quota (`GUARANTEED_LEVEL` above) and the rest, each in the order it had
    (by age, as `sort_in`'s). Held and aged jobs do not depend on quotas. `guaranteed` reads a
    job's team and shape alone (`scheduler._Cycle._guaranteed`), so it is asked once per
    distinct `demand` (which holds both). The cycle's own split was this until the kept one
    (core/split_kept.py) replaced it."""
    held, aged, levels = presorted
    out: dict[int, dict[str, list[JobRequest]]] = {}
    memo: dict[tuple[object, ...], bool] = {}
    get = memo.get
    for level in list(levels):
        for team, line in levels[level].items():
            demands = list(map(_DEMAND, line))
            mask = list(map(get, demands))
            if None in mask:
                for i in compress(count(), map(is_, mask, repeat(None))):
                    hit = memo.get(demands[i])
                    if hit is None:
                        hit = memo[demands[i]] = guaranteed(line[i])
                    mask[i] = hit
            ours = list(compress(line, mask))
            if ours:
                out.setdefault(level + GUARANTEED_LEVEL, {})[team] = ours
            if len(ours) != len(line):
                out.setdefault(level, {})[team] = line if not ours else list(compress(line, map(not_, mask)))
    return held, aged, out
