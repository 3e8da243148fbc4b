"""A capacity index a caller keeps across scheduling cycles, so `decide` does not rebuild it.

Why: building `Capacity` from every node and running job costs O(GPUs + running) per cycle
(~0.3 s at 10,000 nodes x 8 GPUs and 60,000 running jobs on a loaded 2-core machine), while
between two cycles only a few jobs start or end and the nodes rarely change. The index keeps
the last cycle's occupancy and applies the difference: jobs gone are released, jobs new (or
moved) are occupied. Each cycle then works inside a `trial` (a `with` block whose end undoes
the cycle's writes from an undo log), so the index itself never sees the cycle's tentative
starts.

`decide` stays a pure function of its snapshot: the trial's copy has the canonical order a fresh
`Capacity` has, so a plan made through the index equals one made without it (the unit tests
check this over random histories). The index is not thread-safe; one caller, one index.

A caller that knows which jobs started and ended (the simulator) builds it with `told=True` and
reports them (`add`, `remove`), so a cycle applies those instead of comparing every running job
with the last cycle's (O(running) a cycle: most of a cycle at 100,000 GPUs once forking was made
cheap). Only allocations matter for free capacity, so a running job replaced by another object
with the same allocation (a checkpoint) needs no report. The report is checked by count: a
running set of another size than the index holds sends the cycle to the full comparison.

A told index also keeps the running jobs' expected ends sorted (`backfill.EndBook`), so a cycle
that needs a reservation does not work out the end of every running job (O(running) a cycle,
the largest cost left on Philly). Ends also change when a stop begins (GPUs back after the
grace period), so the caller reports that too (`stopping`). After a full comparison, or for
another default time limit, the book is rebuilt from the cycle's running jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager

from gpucluster.core.backfill import EndBook
from gpucluster.core.counts import bump
from gpucluster.core.placement import Capacity
from gpucluster.core.types import Allocation, Node, RunningJob

_STARTED, _ENDED, _STOPPING = 0, 1, 2


class CapacityIndex:
    def __init__(self, told: bool = False) -> None:
        self._told = told
        self._changes: list[tuple[int, RunningJob]] = []  # (_STARTED / _ENDED / _STOPPING, job)
        self.diffs = 0  # cycles that compared every running job (told: a count mismatch)
        self._nodes: tuple[Node, ...] | None = None
        self._base: Capacity | None = None
        self._running: dict[int, Allocation] = {}
        self.rebuilds = 0  # full builds (first use, or the nodes changed): for tests and stats
        self._book: EndBook | None = None  # told only; None: to be built from the running jobs
        self._classes: Counter[int] = Counter()  # running jobs per priority class
        self._class_of: dict[int, int] = {}  # job id -> its class, as counted
        self._sharing: set[int] = set()  # running jobs whose first slice is a share of a GPU
        self._elastic: set[int] = set()  # running jobs that could be shrunk (a `min_gpus`)

    def capacity(self, nodes: tuple[Node, ...], running: Sequence[RunningJob]) -> Capacity:
        """An independent working copy of the free capacity for these nodes and running jobs
        (a full copy: for a cycle, `trial` is the cheap way)."""
        return self._base_for(nodes, running).fork()

    def current(self, nodes: tuple[Node, ...], running: Sequence[RunningJob]) -> Capacity:
        """The kept free capacity itself, brought up to these nodes and running jobs, to read
        only (a caller that takes or releases anything uses `trial`): no copy, no undo log."""
        return self._base_for(nodes, running)

    def trial(self, nodes: tuple[Node, ...], running: Sequence[RunningJob]) -> AbstractContextManager[Capacity]:
        """A working copy of the free capacity for these nodes and running jobs, for one cycle:
        valid inside the `with` block, whose end undoes what the cycle wrote (`Capacity.trial`;
        the base is brought up to date at this call, the `with` statement's own)."""
        return self._base_for(nodes, running).trial()

    def _base_for(self, nodes: tuple[Node, ...], running: Sequence[RunningJob]) -> Capacity:
        """The kept base, brought up to these nodes and running jobs."""
        base = self._base
        if base is None or (nodes is not self._nodes and nodes != self._nodes):
            self._base = Capacity(nodes, running)
            self._nodes = nodes
            self._running = {j.job_id: self._base.held(j.allocation, j.exclusive) for j in running}
            self._count_classes(running)
            self.rebuilds += 1
            self._changes.clear()
            self._book = None
            return self._base
        if self._told:
            self._apply_changes(base)
            if len(self._running) == len(running):
                return base
        self.diffs += 1
        self._book = None
        self._count_classes(running)
        # An exclusive job holds its nodes' other GPUs too (`Capacity.held`); the test inline, not a
        # call per running job: this runs over every running job each cycle.
        new = {j.job_id: base.held(j.allocation, True) if j.exclusive else j.allocation for j in running}
        old = self._running
        for job_id, alloc in old.items():
            now = new.get(job_id)
            if now is None or (now is not alloc and now != alloc):
                base.release(alloc)
        for job_id, alloc in new.items():
            was = old.get(job_id)
            if was is None or (was is not alloc and was != alloc):
                base.occupy(alloc)
        self._running = new
        return base

    def add(self, job: RunningJob) -> None:
        """A told index: `job` started (applied at the next `capacity`)."""
        if self._told:
            self._changes.append((_STARTED, job))

    def remove(self, job: RunningJob) -> None:
        """A told index: `job` ended; its GPUs are free again."""
        if self._told:
            self._changes.append((_ENDED, job))

    def stopping(self, job: RunningJob) -> None:
        """A told index: a stop of `job` (the object with `stopping` set) is under way, so its
        GPUs are expected back after the grace period. Unlike starts and ends, a forgotten
        report is not caught by the count check: reservations would then use its time limit."""
        if self._told:
            self._changes.append((_STOPPING, job))

    def end_book(self, running: Sequence[RunningJob], default_limit_s: float) -> EndBook | None:
        """A told index's expected ends of `running` (the jobs of the last `capacity` call),
        for a policy whose default time limit is `default_limit_s`; None for a comparing index."""
        if not self._told or self._base is None:
            return None
        if self._book is None or self._book.default != default_limit_s:
            self._book = EndBook.of(running, self._base.gpus, default_limit_s)
        return self._book

    def _count_classes(self, running: Sequence[RunningJob]) -> None:
        if not self._told:
            return  # a comparing index answers no `lowest_class`: the cycle makes its own pass
        self._class_of = {j.job_id: int(j.priority) for j in running}
        self._classes = Counter(self._class_of.values())
        self._sharing = {j.job_id for j in running if _shares(j)}
        self._elastic = {j.job_id for j in running if j.min_gpus is not None}

    def lowest_class(self) -> int | None:
        """A told index: the lowest priority class of the running jobs of the last `capacity`
        call (None: none runs, or a comparing index), kept from the reports rather than found
        by a pass over them."""
        return min(self._classes, default=None)

    def shares_running(self) -> bool | None:
        """A told index: whether the first slice of any running job of the last `capacity`
        call is a share of a GPU (None: a comparing index). Why: under LAS preemption the
        cycle asks it each time it builds its victim pool (`scheduler._Cycle._shares_running`),
        and a pass over every running job was 5% of whole Philly under `las`."""
        return bool(self._sharing) if self._told else None

    def elastic_running(self) -> bool | None:
        """A told index: whether any running job of the last `capacity` call is elastic (None:
        a comparing index), as `shares_running` keeps its answer. Why: the cycle asks it at its
        first preemption (`scheduler._Cycle._elastic_runs`), and its pass over every running
        job was ~1% of whole Philly under `las-gittins`."""
        return bool(self._elastic) if self._told else None

    def _apply_changes(self, base: Capacity) -> None:
        """The reported starts, ends and stops, in order: what the comparison in `capacity`
        would release and occupy (for whole GPUs the resulting state does not depend on the
        order), and the same for the book of expected ends."""
        running, book = self._running, self._book
        for kind, job in self._changes:
            job_id = job.job_id
            if kind == _STOPPING:
                if book is not None and job_id in running:
                    book.stop(job)
                continue
            was = running.pop(job_id, None)
            if was is not None:
                base.release(was)
                bump(self._classes, self._class_of.pop(job_id), -1)
                self._sharing.discard(job_id)
                self._elastic.discard(job_id)
                if book is not None:
                    book.remove(job_id)
            if kind == _STARTED:
                held = running[job_id] = base.held(job.allocation, job.exclusive)
                base.occupy(held)
                self._class_of[job_id] = int(job.priority)
                bump(self._classes, int(job.priority), 1)
                if _shares(job):
                    self._sharing.add(job_id)
                if job.min_gpus is not None:
                    self._elastic.add(job_id)
                if book is not None:
                    book.add(job)
        self._changes.clear()


def _shares(job: RunningJob) -> bool:
    """Whether the job's first slice is a share of a GPU (`scheduler._Cycle._shares_running`)."""
    slices = job.allocation.slices
    return bool(slices) and slices[0].share < 1
