"""The services' autoscaler (a fake clock) and balancer, as pure functions of what they are fed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.services.autoscaler import Autoscaler, ScaleBounds
from gpucluster.services.balancer import Endpoint, pick
from gpucluster.services.listeners import listener_uids
from gpucluster.services.runtime import Access, Runtimes
from gpucluster.services.spec import ServiceSpec, parse_replicas

BOUNDS = ScaleBounds(min_replicas=1, max_replicas=4, target_concurrency=2.0, scale_down_delay_s=30.0)


def run(scaler: Autoscaler, start: float, end: float, in_flight: int, bounds: ScaleBounds = BOUNDS) -> int:
    """Feed `in_flight` every 0.25 s from `start` to `end`; the count wanted at the end."""
    t, want = start, 0
    while t <= end:
        scaler.observe(t, in_flight)
        want = scaler.desired(t, bounds)
        t += 0.25
    return want


def test_load_scales_up_at_once_to_in_flight_over_target() -> None:
    scaler = Autoscaler(initial=1, now=0.0)
    assert run(scaler, 0.0, 1.0, in_flight=1) == 1
    assert run(scaler, 1.25, 4.0, in_flight=5) == 3  # ceil(5 / 2)


def test_scale_up_is_capped_at_max() -> None:
    scaler = Autoscaler(initial=1, now=0.0)
    assert run(scaler, 0.0, 3.0, in_flight=100) == 4


def test_scale_down_waits_out_the_delay_then_follows_the_load() -> None:
    scaler = Autoscaler(initial=1, now=0.0)
    assert run(scaler, 0.0, 3.0, in_flight=8) == 4
    assert run(scaler, 3.25, 20.0, in_flight=1) == 4  # lower for less than 30 s: kept
    assert run(scaler, 20.25, 40.0, in_flight=1) == 1  # lower for more than 30 s: down


def test_a_gap_in_a_burst_does_not_scale_down() -> None:
    scaler = Autoscaler(initial=1, now=0.0)
    run(scaler, 0.0, 3.0, in_flight=6)
    assert run(scaler, 3.25, 8.0, in_flight=0) == 3
    assert run(scaler, 8.25, 10.0, in_flight=6) == 3


def test_scale_to_zero_when_idle_and_back_to_one_for_a_held_request() -> None:
    bounds = ScaleBounds(min_replicas=0, max_replicas=3, target_concurrency=4.0, scale_down_delay_s=10.0)
    scaler = Autoscaler(initial=1, now=0.0)
    assert run(scaler, 0.0, 5.0, in_flight=0, bounds=bounds) == 1  # the initial replica, for the delay
    assert run(scaler, 5.25, 20.0, in_flight=0, bounds=bounds) == 0
    scaler.observe(20.25, 1)  # one request held at the gateway: below the target, yet it needs a replica
    assert scaler.desired(20.25, bounds) == 1


def test_min_replicas_is_a_floor() -> None:
    bounds = ScaleBounds(min_replicas=2, max_replicas=4, target_concurrency=2.0, scale_down_delay_s=0.0)
    scaler = Autoscaler(initial=2, now=0.0)
    assert run(scaler, 0.0, 10.0, in_flight=0, bounds=bounds) == 2


def test_balancer_takes_the_ready_replica_with_fewest_in_flight() -> None:
    eps = [Endpoint(1, "u1", "ready", 3), Endpoint(2, "u2", "ready", 1), Endpoint(3, "u3", "starting", 0)]
    assert pick(eps, 0) is eps[1]


def test_balancer_never_picks_starting_draining_or_unready_replicas() -> None:
    eps = [Endpoint(1, "u1", "starting"), Endpoint(2, "u2", "draining"), Endpoint(3, "u3", "unready")]
    assert pick(eps, 0) is None


def test_balancer_spreads_ties_round_robin_and_skips_excluded() -> None:
    eps = [Endpoint(1, "u1", "ready"), Endpoint(2, "u2", "ready")]
    assert {pick(eps, t).replica_id for t in range(4)} == {1, 2}  # type: ignore[union-attr]
    assert all(pick(eps, t, frozenset({1})) is eps[1] for t in range(4))


@pytest.mark.parametrize(("text", "bounds"), [("2", (2, 2)), ("1..4", (1, 4)), ("0..3", (0, 3))])
def test_replicas_read_as_a_count_or_a_range(text: str, bounds: tuple[int, int]) -> None:
    assert parse_replicas(text) == bounds


@pytest.mark.parametrize("text", ["x", "4..1", "0", "1..", "-1..2"])
def test_bad_replicas_say_how_to_write_them(text: str) -> None:
    with pytest.raises(ValueError, match="replicas"):
        parse_replicas(text)


def test_a_replica_is_a_job_told_its_port() -> None:
    spec = ServiceSpec(name="clf", command=["python", "server.py"], gpus=0.5, env={"A": "1"})
    job = spec.replica_job(7, 20007)
    assert job.name == "clf.r7" and job.env == {"A": "1", "PORT": "20007"} and job.gpus == 0.5


def test_a_service_may_not_set_port_itself() -> None:
    with pytest.raises(ValueError, match="PORT is set by the cluster"):
        ServiceSpec(name="clf", command=["x"], env={"PORT": "1"})


def test_listener_uids_reads_the_listening_sockets_of_a_port(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:4E20 00000000:0000 0A 00000000:00000000 00:00000000 00000000  65534        0 1\n"
        "   1: 0100007F:4E20 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n"
        "   2: 00000000:4E21 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 3\n"
    )
    assert listener_uids(20000, (table,)) == {65534}  # the listener's, not the connection's
    assert listener_uids(20001, (table,)) == {1000}
    assert listener_uids(20002, (table,)) == set()
    assert listener_uids(20000, (tmp_path / "missing",)) is None


def test_a_requests_per_second_target_scales_on_whichever_wants_more() -> None:
    bounds = ScaleBounds(
        min_replicas=1, max_replicas=8, target_concurrency=10.0, scale_down_delay_s=0.0, target_rps=50.0
    )
    scaler = Autoscaler(initial=1, now=0.0)
    t = 0.0
    while t <= 3.0:  # 2 in flight (1 replica by concurrency) but 220 requests/s: 5 replicas
        scaler.observe(t, 2, rps=220.0)
        want = scaler.desired(t, bounds)
        t += 0.25
    assert want == 5


def test_runtime_rate_counts_recent_answers_on_its_clock() -> None:
    now = [100.0]
    rt = Runtimes(clock=lambda: now[0])
    rt.set_service("s", Access("t", False), [])
    for i in range(30):
        now[0] = 100.0 + i * 0.1  # 10 answers a second for 3 s
        rt.record("s", 0.001, ok=True)
    assert rt.rate("s", 2.0) == pytest.approx(10.0, abs=0.6)
    assert rt.stats("s").requests == 30
