"""Job id -> the learned run-time distribution of jobs like it, kept across cycles for
`ordering.runtime_model: gittins` (issues 15, 24 and 25); the head and the simulator feed it.

Why one piece for both: the Gittins ordering ranks a queued job by the run times of finished
jobs of its shape (core/runtime_predict.py). The head learns those runs from its store
(head/runtime_model.py), the simulator from the replay's finished jobs (sim/learned.py); both
hand the core the same kind of map, and the ranks kept across cycles (core/rank_book.py) read
its write log to learn whose distribution changed. So both keep it the same way, here:
- jobs are grouped by shape (`_Kind`), so a shape is looked up once, not once per job;
- a learned run changes only the similarity keys that name its team or its user (every key
  names one or the other), so only the kinds of those teams and users are looked up again, and
  only the jobs of a kind whose distribution changed get a new entry (rebuilding the map after
  every finished run was a fifth of a Philly replay);
- a kind keeps where its keys are looked up (`RuntimePredictor.lookups`): building them again
  at each look-up was most of that cost;
- the kinds touched by learned runs are looked up again at most every `every_s` of the caller's
  clock (`ordering.relearn_every_s`, core/attained.py says why); a kind first seen meanwhile is
  looked up at once, with every run learned so far. `waiting(job_id)` says whether a job's
  entry may lag the predictor (check mode compares the others with a whole look-up).
The map handed out (`distributions`) is `Logged`, one object for the life of this one.

Not thread-safe: one owner (the head's loop, the simulator's engine); the predictor itself is
guarded by its owner where other threads read it (head/runtime_model.py).
"""

from __future__ import annotations

from gpucluster.core.rank_book import Logged
from gpucluster.core.runtime_predict import JobShape, Lookups, RunDistribution, RuntimePredictor


class _Kind:
    """The jobs of one shape, where its distribution is looked up, and the distribution they
    were last given."""

    __slots__ = ("dist", "jobs", "lookups", "shape")

    def __init__(self, shape: JobShape, lookups: Lookups, dist: RunDistribution | None) -> None:
        self.shape = shape
        self.lookups = lookups
        self.dist = dist
        self.jobs: set[int] = set()


class LearnedKinds:
    """Told which jobs come (with their shapes) and go, and which shapes learned a run; read
    once per snapshot (`distributions`)."""

    def __init__(self, predictor: RuntimePredictor) -> None:
        self.predictor = predictor
        self._kinds: dict[JobShape, _Kind] = {}
        self._kind_of: dict[int, _Kind] = {}  # job -> its kind
        self._by_team: dict[str, set[_Kind]] = {}
        self._by_user: dict[str, set[_Kind]] = {}
        # What the snapshot carries; its log tells core/rank_book.py whose distribution changed.
        self._dists: Logged[RunDistribution] = Logged()
        self._dirty_teams: set[str] = set()  # learned a run since the kinds were last looked up again
        self._dirty_users: set[str] = set()
        self._relearned_at: float | None = None  # the caller's clock when they last were

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._kind_of

    def arrived(self, job_id: int, shape: JobShape) -> None:
        """`job_id` is of `shape` from now on (a job told again takes its new shape)."""
        if job_id in self._kind_of:
            self.left(job_id)
        kind = self._kinds.get(shape)
        if kind is None:
            lookups = self.predictor.lookups(shape)
            kind = self._kinds[shape] = _Kind(shape, lookups, self.predictor.distribution_from(lookups))
            self._by_team.setdefault(shape.team, set()).add(kind)
            if shape.user:
                self._by_user.setdefault(shape.user, set()).add(kind)
        kind.jobs.add(job_id)
        self._kind_of[job_id] = kind
        if kind.dist is not None:
            self._dists[job_id] = kind.dist

    def learned(self, shape: JobShape) -> None:
        """The predictor learned a run of `shape` (`RuntimePredictor.add`): the kinds of its team
        and user are looked up again at the next `distributions`."""
        self._dirty_teams.add(shape.team)
        if shape.user:
            self._dirty_users.add(shape.user)

    def left(self, job_id: int) -> None:
        kind = self._kind_of.pop(job_id, None)
        if kind is None:
            return
        kind.jobs.discard(job_id)
        self._dists.pop(job_id, None)
        if not kind.jobs:  # no job of it left: forgotten (looked up again if one comes)
            del self._kinds[kind.shape]
            self._by_team[kind.shape.team].discard(kind)
            if kind.shape.user:
                self._by_user[kind.shape.user].discard(kind)

    def waiting(self, job_id: int) -> bool:
        """Whether runs learned since the last relearn may change the distribution of `job_id`'s
        kind (its entry then lags a whole look-up until the next one); False for a job not told of."""
        kind = self._kind_of.get(job_id)
        if kind is None:
            return False
        shape = kind.shape
        return shape.team in self._dirty_teams or (bool(shape.user) and shape.user in self._dirty_users)

    def distributions(self, now: float = 0.0, every_s: float = 0.0) -> Logged[RunDistribution]:
        """Job id -> the run times of finished jobs like it, for every job told of with such
        history: the same map each call, changed only for the kinds that learned a run, and
        for those only when `every_s` has passed on the caller's clock (`now`) since the last
        time (0: at every call; a clock that went back relearns at once)."""
        last = self._relearned_at
        if (self._dirty_teams or self._dirty_users) and (
            every_s <= 0 or last is None or now - last >= every_s or now < last
        ):
            self._relearned_at = now
            touched: set[_Kind] = set()
            for team in self._dirty_teams:
                touched |= self._by_team.get(team, set())
            for user in self._dirty_users:
                touched |= self._by_user.get(user, set())
            self._dirty_teams.clear()
            self._dirty_users.clear()
            for kind in touched:
                d = self.predictor.distribution_from(kind.lookups)
                if d is kind.dist:
                    continue
                kind.dist = d
                if d is None:
                    for job_id in kind.jobs:
                        self._dists.pop(job_id, None)
                else:
                    self._dists.update(dict.fromkeys(kind.jobs, d))
        return self._dists
