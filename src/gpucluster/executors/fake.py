"""An in-memory executor for unit tests of the head: no processes, outcomes set by the test."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.executors.base import Exited, Handle, LaunchError, LaunchSpec, Lost, Running, Status


@dataclass
class FakeProcess:
    spec: LaunchSpec
    status: Status = field(default_factory=Running)
    signals: list[int] = field(default_factory=list)


class FakeExecutor:
    def __init__(self) -> None:
        self.processes: dict[tuple[int, int], FakeProcess] = {}
        self.fail_launch: dict[int, str] = {}
        self.exit_on_signal: dict[int, int] = {}  # signal -> exit code the fake job exits with

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.job_id in self.fail_launch:
            raise LaunchError(self.fail_launch[spec.job_id])
        self.processes[(spec.job_id, spec.attempt)] = FakeProcess(spec)
        return {"job_id": spec.job_id, "attempt": spec.attempt}

    def recover(self, run_dir: Path) -> Handle | None:
        return None

    def _proc(self, handle: Handle) -> FakeProcess:
        return self.processes[(int(handle["job_id"]), int(handle["attempt"]))]

    def poll(self, handle: Handle) -> Status:
        key = (int(handle["job_id"]), int(handle["attempt"]))
        if key not in self.processes:
            return Lost("unknown to the fake executor")
        return self.processes[key].status

    def signal(self, handle: Handle, signum: int) -> None:
        proc = self._proc(handle)
        proc.signals.append(signum)
        if signum in self.exit_on_signal and isinstance(proc.status, Running):
            proc.status = Exited(self.exit_on_signal[signum], signum)

    def cleanup(self, handle: Handle) -> None:
        pass

    # test controls
    def running(self) -> list[int]:
        return sorted(j for (j, _), p in self.processes.items() if isinstance(p.status, Running))

    def finish(self, job_id: int, exit_code: int = 0) -> None:
        for (j, _), p in self.processes.items():
            if j == job_id and isinstance(p.status, Running):
                p.status = Exited(exit_code)
