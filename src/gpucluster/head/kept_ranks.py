"""The head's inputs to `las` and `las-gittins` ranks, kept across plans the way the simulator
keeps them, so both run the same core path (core/rank_book.py; issues 15 and 25).

Why: under `las` and `runtime_model: gittins` the core ranks every queued job (under `las`
every one that ran before) each cycle unless it is handed a `RankBook` and maps whose write
logs say what changed (`Logged`). The simulator keeps those; the head read both maps anew each
plan and handed plain dicts, so only the simulator ran the kept path: a core path one caller
alone exercised. Here the head keeps:
- the attained GPU-seconds (`Store.attained_gpu_seconds`, read whole each plan as before) in one
  `Logged` map, written only where a value changed (`Logged.assign`), under any ranked ordering;
- the queued jobs' learned distributions in head/runtime_model.py's kept map (core/learned_kinds.py,
  as sim/learned.py);
- the book itself, which follows the cluster state's told queue index when the snapshot carries it.
All of it is the loop's own (never module-level): `submit --dry-run` plans on API threads from
`last_snapshot`, which gets copies of the maps and no book (`for_other_threads`).

Check mode (`GPUCLUSTER_CHECK_STATE`, `gpucluster up --debug`) compares, after each plan, the
book's ranks with `attained.gittins_ranks` over plain copies of the snapshot's maps (under plain
`las`, `attained.ranks`), and the kept distributions with a whole look-up
(`RuntimeModel.fresh_distributions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpucluster.core.attained import Ordering, gittins_ranks, ranks
from gpucluster.core.cluster_state import StateMismatch
from gpucluster.core.rank_book import Logged, RankBook
from gpucluster.core.runtime_predict import RunDistribution
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Node
from gpucluster.head.runtime_model import RuntimeModel
from gpucluster.store import Store


class KeptRanks:
    def __init__(self, store: Store, runtime: RuntimeModel) -> None:
        self.store = store
        self.runtime = runtime
        self.book = RankBook()
        self._attained: Logged[float] = Logged()

    def attained(self, ordering: Ordering) -> Mapping[int, float]:
        """What the snapshot's `attained` is: nothing unless the ordering ranks (no query); else
        the kept map (the book keeps plain `las` ranks too, as the simulator's does)."""
        if not ordering.ranked:
            return {}
        return self._attained.assign(self.store.attained_gpu_seconds())

    def book_for(self, ordering: Ordering) -> RankBook | None:
        """The book under any ranked ordering: `las` uses its team lines sorted by rank
        (`queueing.RankedLines`), Gittins ranks its ranks too."""
        return self.book if ordering.ranked else None

    @staticmethod
    def for_other_threads(snap: Snapshot) -> Snapshot:
        """`snap` as another thread may plan on it: the kept maps copied (the loop writes them
        at its next plan) and no book (not thread-safe, and a probe's queue is not the loop's)."""
        if snap.rank_book is None:
            return snap
        if type(snap.attained) is dict and type(snap.runtime_dist) is dict:  # nothing kept but the book
            return replace(snap, rank_book=None)
        return replace(snap, attained=dict(snap.attained), runtime_dist=dict(snap.runtime_dist), rank_book=None)

    def check(self, snap: Snapshot, ordering: Ordering, now: float, nodes: Iterable[Node]) -> None:
        """Check mode, after a plan on `snap`: StateMismatch unless the book's ranks equal
        `gittins_ranks` over plain copies of the snapshot's maps, and the kept distributions of
        its queued jobs equal a whole look-up (before the next refresh learns more runs), those of
        kinds waiting for the next relearn aside (`ordering.relearn_every_s`)."""
        book = snap.rank_book
        if book is None or ordering.mode != "las":
            return
        if not ordering.gittins:  # plain LAS: `attained.ranks`, the ranks above 0 (all the book names)
            got = book.ranks(snap.queued, ordering, snap.attained, snap.runtime_dist, now, snap.queue_index)
            want = {k: v for k, v in ranks(snap.queued, ordering, dict(snap.attained), {}, now).items() if v}
            if got != want:
                wrong = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
                raise StateMismatch(f"the head's kept LAS ranks differ from attained.ranks: jobs {wrong[:5]}")
            return
        want_dists = self.runtime.fresh_distributions(snap.queued, nodes)
        kept, lag = snap.runtime_dist, self.runtime.lagging(snap.queued)
        differ = [
            q.job_id
            for q in snap.queued
            if q.job_id not in lag and not _same(kept.get(q.job_id), want_dists.get(q.job_id))
        ]
        if differ:
            raise StateMismatch(
                f"the head's kept run-time distributions differ from a fresh look-up: jobs {differ[:5]}"
            )
        got = book.ranks(snap.queued, ordering, snap.attained, kept, now, snap.queue_index)
        want = gittins_ranks(snap.queued, ordering, dict(snap.attained), dict(kept), now)
        if got != want:
            wrong = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
            raise StateMismatch(f"the head's kept Gittins ranks differ from gittins_ranks: jobs {wrong[:5]}")


def _same(a: RunDistribution | None, b: RunDistribution | None) -> bool:
    """The same run times (a scaled distribution is a new object at each look-up)."""
    if a is b:
        return True
    return a is not None and b is not None and a.scale == b.scale and a.values == b.values
