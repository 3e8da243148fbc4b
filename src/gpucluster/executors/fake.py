"""An in-memory executor for unit tests of the head: no processes, outcomes set by the test."""

from __future__ import annotations

from pathlib import Path

from gpucluster.executors.base import Exited, Handle, LaunchError, LaunchSpec, Lost, Running, Status, combined


class FakeProcess:
    """One launched attempt: one status per process (rank); `status` speaks for all of them."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.ranks: list[Status] = [Running() for _ in range(max(1, len(spec.processes)))]
        self.signals: list[int] = []

    @property
    def status(self) -> Status:
        return combined(self.ranks)

    @status.setter
    def status(self, value: Status) -> None:
        """Every process ends (or runs) the same way."""
        self.ranks = [value for _ in self.ranks]


class FakeExecutor:
    def __init__(self) -> None:
        self.processes: dict[tuple[int, int], FakeProcess] = {}
        self.fail_launch: dict[int, str] = {}
        self.exit_on_signal: dict[int, int] = {}  # signal -> exit code the fake job exits with
        self.recoverable: dict[str, Handle] = {}  # run_dir -> what `recover` finds there

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.job_id in self.fail_launch:
            raise LaunchError(self.fail_launch[spec.job_id])
        self.processes[(spec.job_id, spec.attempt)] = FakeProcess(spec)
        handle: Handle = {"job_id": spec.job_id, "attempt": spec.attempt}
        if spec.processes:
            handle["ranks"] = [{"rank": r} for r in range(len(spec.processes))]
        return handle

    def recover(self, run_dir: Path) -> Handle | None:
        return self.recoverable.get(str(run_dir))

    def _proc(self, handle: Handle) -> FakeProcess:
        return self.processes[(int(handle["job_id"]), int(handle["attempt"]))]

    def poll(self, handle: Handle) -> Status:
        return combined(self.poll_ranks(handle))

    def poll_ranks(self, handle: Handle) -> list[Status]:
        key = (int(handle["job_id"]), int(handle["attempt"]))
        if key not in self.processes:
            return [Lost("unknown to the fake executor")]
        ranks = list(self.processes[key].ranks)
        started = {int(r["rank"]) for r in handle.get("ranks", [{"rank": 0}])}
        return [s if i in started else Lost("this rank was never started") for i, s in enumerate(ranks)]

    def signal(self, handle: Handle, signum: int) -> None:
        proc = self._proc(handle)
        proc.signals.append(signum)
        if signum in self.exit_on_signal:
            proc.ranks = [
                Exited(self.exit_on_signal[signum], signum, stopped=True) if isinstance(s, Running) else s
                for s in proc.ranks
            ]

    def cleanup(self, handle: Handle) -> None:
        pass

    # test controls
    def running(self) -> list[int]:
        return sorted(j for (j, _), p in self.processes.items() if isinstance(p.status, Running))

    def finish(self, job_id: int, exit_code: int = 0, stopped: bool | None = None) -> None:
        """The job's running attempt ends; `stopped` as the shim reports it (None: not said)."""
        for (j, _), p in self.processes.items():
            if j == job_id and isinstance(p.status, Running):
                p.status = Exited(exit_code, stopped=stopped)

    def end_rank(self, job_id: int, rank: int, status: Status, attempt: int | None = None) -> None:
        """One process of the job's latest (or given) attempt ends."""
        n = attempt if attempt is not None else max(a for (j, a) in self.processes if j == job_id)
        self.processes[(job_id, n)].ranks[rank] = status
