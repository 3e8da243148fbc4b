"""Health and draining through a fake NVML with scripted readings, on the hand-driven head."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM

import pytest

from gpucluster.core.policy import HealthPolicy
from gpucluster.core.states import JobState

from .telemetrykit import Telemetry, make_telemetry


@pytest.fixture
def t(tmp_path: Path) -> Iterator[Telemetry]:
    tel = make_telemetry(tmp_path)
    yield tel
    tel.close()


def drained(t: Telemetry) -> dict[str, str]:
    return {n: s.reason for n, s in t.cluster.head.telemetry.node_states().items() if s.drained}


def test_hot_gpu_drains_node_running_job_continues_new_job_waits_until_it_cools(t: Telemetry) -> None:
    c = t.cluster
    running = c.submit(gpus=2)
    t.step()
    assert c.state(running) is JobState.RUNNING
    t.script(g5={"temp": 95})
    t.step()
    assert drained(t) == {"n1": "GPU 5 at 95 C, over 90 C"}
    waiting = c.submit(gpus=1)
    t.step()
    t.step()
    assert c.state(waiting) is JobState.QUEUED  # nothing new on a drained node
    assert c.state(running) is JobState.RUNNING  # and nothing stopped
    assert c.proc(running).signals == []
    t.script()  # cooled down: a temperature problem clears by itself, and so does its drain
    t.step()
    assert drained(t) == {}
    assert c.state(waiting) is JobState.RUNNING


def test_threshold_comes_from_the_policy(t: Telemetry) -> None:
    t.policy(health=HealthPolicy(max_temperature_c=99))
    t.script(g0={"temp": 95})
    t.step()
    assert drained(t) == {}


def test_uncorrectable_ecc_drains_until_an_operator_undrains(t: Telemetry) -> None:
    t.script(g2={"ecc": 3})
    t.step()
    assert drained(t) == {"n1": "GPU 2: 3 uncorrectable ECC errors"}
    problems = t.cluster.head.telemetry.problems()
    assert problems[("n1", 2)].kind == "ecc"
    t.script()  # the counter reads 0 again (driver reloaded): still needs a person
    t.step()
    assert "n1" in drained(t)
    assert t.monitor.undrain("n1", t.cluster.clock())
    t.step()
    assert drained(t) == {}
    assert t.cluster.head.telemetry.problems() == {}


def test_fatal_xid_drains_but_an_application_xid_does_not(t: Telemetry) -> None:
    t.script(g1={"xids": [13]})  # graphics engine exception: usually the program's own fault
    t.step()
    assert drained(t) == {}
    t.script(g1={"xids": [13, 79]})
    t.step()
    assert drained(t) == {"n1": "GPU 1: fatal XID 79 (GPU has fallen off the bus)"}


def test_silent_node_is_drained_and_comes_back_when_it_reports_again(t: Telemetry) -> None:
    t.policy(health=HealthPolicy(node_timeout_s=30))
    t.step()
    assert t.nvml.STATE is not None
    t.nvml.STATE["fail"] = "Driver Not Loaded"
    for _ in range(5):
        t.step(dt=5)
    assert drained(t) == {}  # 25 s: within the timeout
    t.step(dt=10)
    reason = drained(t)["n1"]
    assert reason.startswith("no telemetry for 35s") and "Driver Not Loaded" in reason
    t.nvml.STATE["fail"] = None
    t.step()
    assert drained(t) == {}


def test_user_drain_keeps_its_reason_over_health(t: Telemetry) -> None:
    tel = t.cluster.head.telemetry
    tel.set_drained("n1", True, "maintenance", "user", t.cluster.clock())
    t.script(g0={"temp": 99})
    t.step()
    assert drained(t) == {"n1": "maintenance"}
    assert ("n1", 0) in tel.problems()
    t.script()
    t.step()
    assert drained(t) == {"n1": "maintenance"}  # health never undrains what a person drained


def test_drain_state_survives_a_head_restart(tmp_path: Path) -> None:
    from gpucluster.store import Store
    from gpucluster.store.telemetry import TelemetryStore

    t = make_telemetry(tmp_path)
    t.script(g4={"ecc": 1})
    t.step()
    t.close()
    store = Store(tmp_path / "state.db")
    try:
        states = TelemetryStore(store).node_states()
        assert states["n1"].drained and "ECC" in states["n1"].reason
    finally:
        store.close()


def test_stopping_job_on_drained_node_still_gets_its_grace_and_ends(t: Telemetry) -> None:
    c = t.cluster
    job = c.submit(gpus=8)
    t.step()
    t.script(g0={"ecc": 1})
    t.step()
    c.fake.exit_on_signal[SIGTERM] = 143
    c.service.cancel(job)
    t.step()
    assert c.state(job) is JobState.CANCELLED
