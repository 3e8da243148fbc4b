"""The idle rule of sessions (telemetry/session_idle.py): both signals, a warning, then the stop."""

from __future__ import annotations

from gpucluster.core.policy import InteractivePolicy
from gpucluster.core.types import Allocation
from gpucluster.store.telemetry import Holding, JobFlag
from gpucluster.telemetry.session_idle import SessionReclaim

POLICY = InteractivePolicy(idle_after_s=600, idle_grace_s=300)


class Book:
    """What the rule did: notices per run dir, flags, stop requests; and the quiet time it reads."""

    def __init__(self) -> None:
        self.quiet: float | None = 0.0
        self.told: list[str] = []
        self.flags: dict[int, JobFlag] = {}
        self.stops: list[tuple[int, str, str]] = []

    def reclaim(self, policy: InteractivePolicy = POLICY) -> SessionReclaim:
        return SessionReclaim(
            lambda: policy,
            lambda job_id, reason, message: self.stops.append((job_id, reason, message)) is None,
            lambda flag: self.flags.__setitem__(flag.job_id, flag),
            lambda job_id: self.flags.pop(job_id, None) and None,
            probe=lambda run_dir: self.quiet,
            tell=lambda run_dir, text: self.told.append(text) is None,
        )


JOB = Holding(7, Allocation(()), {"run_dir": "/run/7/attempt-1"}, None, "session")


def test_gpus_idle_alone_or_a_quiet_terminal_alone_is_not_idle() -> None:
    book = Book()
    rule = book.reclaim()
    book.quiet = 30.0  # typed half a minute ago
    rule.check(JOB, gpus_idle_since=0.0, now=5000.0)  # GPUs idle for 5000 s
    book.quiet = 5000.0
    rule.check(JOB, gpus_idle_since=None, now=5000.0)  # nobody typed, but the GPUs work
    assert book.told == [] and book.flags == {} and book.stops == []


def test_warned_then_stopped_after_the_grace_unless_used_in_between() -> None:
    book = Book()
    rule = book.reclaim()
    book.quiet = 700.0
    rule.check(JOB, gpus_idle_since=0.0, now=650.0)  # both idle for 650 s, past `after` (600)
    assert len(book.told) == 1 and "it will be stopped in 5m" in book.told[0]
    assert book.flags[7].flag == "idle" and book.stops == []
    book.quiet = 10.0  # a key: the warning is withdrawn
    rule.check(JOB, gpus_idle_since=0.0, now=800.0)
    assert book.told[-1] == "activity again: the session stays" and book.flags == {} and book.stops == []
    book.quiet = 700.0
    rule.check(JOB, gpus_idle_since=0.0, now=1000.0)  # warned again
    rule.check(JOB, gpus_idle_since=0.0, now=1200.0)  # within the grace: nothing more
    assert book.stops == []
    rule.check(JOB, gpus_idle_since=0.0, now=1300.0)
    assert [(j, r) for j, r, _ in book.stops] == [(7, "policy")]
    assert book.stops[0][2].startswith("stopped: idle session")


def test_notify_only_warns_and_no_after_never_reclaims() -> None:
    book = Book()
    book.quiet = 10_000.0
    rule = book.reclaim(InteractivePolicy(idle_after_s=60, idle_grace_s=0, idle_action="notify"))
    for now in (100.0, 200.0, 300.0):
        rule.check(JOB, gpus_idle_since=0.0, now=now)
    assert len(book.told) == 1 and "reported" in book.told[0] and book.stops == []
    book = Book()
    book.quiet = 10_000.0
    rule = book.reclaim(InteractivePolicy())
    rule.check(JOB, gpus_idle_since=0.0, now=10_000.0)
    assert book.told == [] and book.stops == []
