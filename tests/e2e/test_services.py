"""Services end to end (issue 23): a real head on virtual GPUs, replicas as real processes, the
gateway over HTTP. Every replica is a job of the module's head, killed with it at the end."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpucluster.client import ApiError, Client

from .headproc import SLACK, HeadProcess, cli, free_port, passable_dir, wait_for
from .servicekit import APP, Load, wait_ready


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with passable_dir("gc-services-") as path:
        (path / "pids").mkdir()
        os.chmod(path / "pids", 0o777)  # replicas (their submitters' accounts) write their pids here
        yield path


GATEWAY_PORT = free_port()  # up --gateway-port: the gateway alone on a port of its own


@pytest.fixture(scope="module")
def head(root: Path) -> Iterator[HeadProcess]:
    h = HeadProcess(root / "data", gpus=8, extra_args=("--gateway-port", str(GATEWAY_PORT)))
    try:
        yield h.start()
    finally:
        h.stop()
        h.kill_jobs()


def pid_of(root: Path, port: int) -> int:
    return int((root / "pids" / f"{port}.pid").read_text())


def test_two_replicas_serve_every_request_while_one_is_killed_and_the_head_restarts(
    head: HeadProcess, root: Path
) -> None:
    r = cli(
        head, "serve", "--name", "clf", "--gpus", "0.25", "--replicas", "2", "--readiness", "/health",
        "--env", f"PID_DIR={root / 'pids'}", "--", *APP,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"{head.url}/serve/clf/" in r.stdout
    with head.client() as c:
        svc = wait_ready(c, "clf", 2)
        ports = {r.port for r in svc.replicas}
        assert len(ports) == 2  # one port each: two replicas on one node never clash
        jobs = [c.job(r.job_id) for r in svc.replicas if r.job_id is not None]
        assert {j.name for j in jobs} == {f"clf.r{r.id}" for r in svc.replicas}
        assert all(j.state.value == "running" and j.spec.env["PORT"] == str(j_port) for j, j_port in
                   zip(jobs, [r.port for r in svc.replicas], strict=True))  # fmt: skip

        victim = svc.replicas[0]
        load = Load(f"{head.url}/serve/clf/", head.headers, workers=6, retry_unreachable=True)
        with load:
            wait_for(lambda: load.done >= 100, timeout=60, what="a fifth of the requests")
            os.kill(pid_of(root, victim.port), signal.SIGKILL)
            wait_for(lambda: load.done >= 250, timeout=120, what="half of the requests")
            svc = wait_for(
                lambda: (
                    (s := c.service("clf"))
                    and victim.id not in {r.id for r in s.replicas}
                    and sum(r.phase == "ready" for r in s.replicas) == 2
                    and s
                ),
                timeout=60,
                what="the killed replica replaced",
            )
            # The head dies (-9) and comes back: the replicas run on, are adopted and serve again.
            before = {r.job_id for r in svc.replicas}
            head.kill9()
            head.start()
            after = load.done
            wait_for(lambda: load.done >= max(500, after + 100), timeout=120, what="requests after the restart")
        # Every request answered 200; those the dead head cut or refused were sent again by the
        # client (connection errors only: no request got an error answer).
        assert set(load.outcomes) == {"200"} and load.done >= 500, load.outcomes
        assert load.retries > 0  # the head was down while requests were being sent
        assert ports <= {b["port"] for b in load.bodies}  # both served, and the replacement
        print(f"requests re-sent while the head restarted: {load.retries}")
    with head.client() as c:
        svc = wait_ready(c, "clf", 2)
        assert {r.job_id for r in svc.replicas} == before  # adopted, not restarted
        assert c.job(victim.job_id or 0).state.value == "failed"  # the killed one, accounted as a job
        c.delete_service("clf")


def test_the_gateway_streams_events_as_they_come_and_passes_bodies(head: HeadProcess) -> None:
    with head.client() as c:
        c.create_service("stream", APP, gpus=0.25, readiness="/health")
        wait_ready(c, "stream", 1)
        arrived = []
        with httpx.stream("GET", f"{head.url}/serve/stream/stream", headers=head.headers, timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrived.append((time.time(), float(line.split()[2])))
        assert len(arrived) == 3
        # Each event reached the client before the next was made (0.2 s apart at the replica).
        assert all(got < sent_next for (got, _), (_, sent_next) in itertools.pairwise(arrived))
        r2 = httpx.post(f"{head.url}/serve/stream/echo?x=1", content=b"hello", headers=head.headers, timeout=30)
        assert r2.status_code == 200 and r2.json()["echo"] == "hello"
        seen = httpx.get(f"{head.url}/serve/stream/a%2Fb/c?q=1", headers=head.headers, timeout=30).json()
        assert seen["path"] == "/a%2Fb/c?q=1" and seen["prefix"] == "/serve/stream"
        assert seen["auth"] is None  # the caller's token stays at the gateway
        zipped = httpx.get(f"{head.url}/serve/stream/gzip", headers=head.headers, timeout=30)
        assert zipped.headers["content-encoding"] == "gzip" and zipped.json()["port"]  # passed through as sent
        # A service's page cannot script the head's origin (where the dashboard keeps its token).
        assert r2.headers["content-security-policy"].startswith("sandbox") and "allow-same-origin" not in str(
            r2.headers
        )
        # The gateway's own port: the same service at /NAME/, mounted there for the links it makes,
        # the same callers' checks, and nothing of the API or the dashboard.
        gateway = f"http://127.0.0.1:{GATEWAY_PORT}"
        own = httpx.get(f"{gateway}/stream/a%2Fb/c?q=1", headers=head.headers, timeout=30)
        assert own.status_code == 200 and own.json()["path"] == "/a%2Fb/c?q=1" and own.json()["prefix"] == "/stream"
        assert httpx.get(f"{gateway}/stream/", timeout=30).status_code == 401  # no token, private service
        for api_path in ("/v1/jobs", "/v1/health", "/", "/serve/stream/"):
            r = httpx.get(f"{gateway}{api_path}", headers=head.headers, timeout=30)
            assert r.status_code == 404, (api_path, r.status_code, r.text)
        c.delete_service("stream")


def test_a_service_that_never_becomes_ready_fails_with_the_reason(head: HeadProcess) -> None:
    r = cli(
        head, "serve", "--name", "never", "--gpus", "0.25", "--readiness", "/health", "--startup-timeout", "3s",
        "--env", "NEVER_READY=1", "--", *APP,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    with head.client() as c, ThreadPoolExecutor(1) as pool:
        # A request held for a ready replica is answered when the service fails, not at its timeout.
        held = pool.submit(httpx.get, f"{head.url}/serve/never/", headers=head.headers, timeout=120)
        svc = wait_for(lambda: (s := c.service("never")).state == "failed" and s, timeout=60, what="the failure")
        answer = held.result(timeout=60 * SLACK)
        assert answer.status_code == 503 and "no replica became ready" in answer.json()["error"], answer.text
        assert "no replica answered GET /health with 2xx/3xx within its startup timeout (3 s)" in svc.reason
        wait_for(
            lambda: all(c.job(j).state.terminal for j in [r.id for r in c.jobs() if r.name.startswith("never.")]),
            timeout=60,
            what="its replicas to be stopped",
        )
        assert httpx.get(f"{head.url}/serve/never/", headers=head.headers).status_code == 404
    r = cli(head, "services")
    assert r.returncode == 0 and "never" in r.stdout and "failed" in r.stdout, r.stdout
    assert cli(head, "serve", "delete", "never").returncode == 0


def test_another_teams_member_gets_403_and_a_public_service_needs_no_token(head: HeadProcess) -> None:
    with head.client() as admin:
        outsider = admin.add_user("svc-outsider", ["nlp"]).token
        admin.create_service("priv", APP, gpus=0.25, readiness="/health", team="vision")
        wait_ready(admin, "priv", 1)
        assert httpx.get(f"{head.url}/serve/priv/", headers=head.headers).status_code == 200  # a cluster admin
        r = httpx.get(f"{head.url}/serve/priv/", headers={"Authorization": f"Bearer {outsider}"})
        assert r.status_code == 403 and "not in it and it is not public" in r.json()["error"]
        assert httpx.get(f"{head.url}/serve/priv/").status_code == 401  # no token
        with Client(head.url, token=outsider) as c:
            assert "priv" not in {s.name for s in c.services()}  # nor listed for them
        # The API: another team's member sees nothing of it; a teammate may not change an owner's.
        with Client(head.url, token=outsider) as c:
            for call in (lambda: c.service("priv"), lambda: c.update_service("priv", public=True)):
                with pytest.raises(ApiError, match="no service named 'priv'"):
                    call()
        teammate = admin.add_user("svc-teammate", ["vision"]).token
        with Client(head.url, token=teammate) as c:
            assert c.service("priv").team == "vision"
            with pytest.raises(ApiError, match="only they, an admin of its team, or a cluster admin"):
                c.delete_service("priv")
            assert httpx.get(f"{head.url}/serve/priv/", headers={"Authorization": f"Bearer {teammate}"}).is_success
        admin.update_service("priv", public=True)
        wait_for(lambda: httpx.get(f"{head.url}/serve/priv/").status_code == 200, timeout=30, what="public access")
        admin.delete_service("priv")


def test_load_scales_it_up_idle_scales_it_down_and_to_zero_and_a_held_request_is_answered(
    head: HeadProcess,
) -> None:
    with head.client() as c:
        c.create_service(
            "auto", APP, gpus=0.25, readiness="/health", min_replicas=0, max_replicas=3,
            target_concurrency=2, scale_down_delay_s=3,
        )  # fmt: skip
        wait_ready(c, "auto", 1)
        # 6 requests in flight, a target of 2 per replica: the autoscaler asks for 3 (its max).
        with Load(f"{head.url}/serve/auto/", head.headers, path="slow?s=0.3", workers=6) as load:
            step = time.monotonic()
            wait_for(
                lambda: sum(r.phase == "ready" for r in c.service("auto").replicas) >= 2,
                timeout=60,
                what="a scale-up under load",
            )
            scaled_in = time.monotonic() - step
            wait_for(
                lambda: sum(r.phase == "ready" for r in c.service("auto").replicas) == 3,
                timeout=60,
                what="the scale-up to 3",
            )
            wait_for(lambda: len({b.get("port") for b in load.bodies[-30:]}) == 3, timeout=30, what="all 3 serving")
        assert set(load.outcomes) == {"200"}, load.outcomes
        print(f"load step to a second ready replica: {scaled_in:.1f} s")
        # Idle: down (after draining), then to zero.
        wait_for(lambda: not c.service("auto").replicas, timeout=60, what="scale to zero")
        r = httpx.get(f"{head.url}/serve/auto/", headers=head.headers, timeout=120)  # held until one is ready
        assert r.status_code == 200, r.text
        c.delete_service("auto")


def test_a_rolling_update_under_load_loses_nothing(head: HeadProcess) -> None:
    with head.client() as c:
        c.create_service("roll", APP, gpus=0.25, readiness="/health", min_replicas=2, max_replicas=2)
        wait_ready(c, "roll", 2)
        with Load(f"{head.url}/serve/roll/", head.headers, workers=4) as load:
            wait_for(lambda: load.done >= 20, timeout=60, what="load before the update")
            r = cli(head, "serve", "update", "roll", "--env", "APP_VERSION=2")
            assert r.returncode == 0, r.stderr
            wait_for(
                lambda: (
                    (s := c.service("roll")).revision == 2
                    and len(s.replicas) == 2
                    and all(r.revision == 2 and r.phase == "ready" for r in s.replicas)
                ),
                timeout=120,
                what="every replica on revision 2",
            )
            wait_for(lambda: any(b.get("version") == "2" for b in load.bodies[-5:]), timeout=30, what="v2 answers")
        assert set(load.outcomes) == {"200"}, load.outcomes
        assert {b["version"] for b in load.bodies} == {"1", "2"}
        shown = json.loads(cli(head, "serve", "show", "roll", "--json").stdout)
        assert shown["stats"]["errors"] == 0 and shown["stats"]["requests"] >= load.done
        metrics = httpx.get(f"{head.url}/metrics", headers=head.headers).text
        assert 'gpucluster_service_replicas{phase="ready",service="roll",team="default"} 2.0' in metrics
        assert 'gpucluster_service_errors_total{service="roll",team="default"} 0.0' in metrics
        # Its GPU-hours: every replica job's so far (accrued by the accountant as they run).
        wait_for(lambda: service_gauge(head, "gpu_hours_total", "roll") > 0, timeout=60, what="GPU-hours accrued")
        assert c.delete_service("roll").state == "deleting"
        wait_for(lambda: "roll" not in {s.name for s in c.services()}, timeout=60, what="the service gone")
        replicas = [j for j in c.jobs() if j.name.startswith("roll.r")]
        assert len(replicas) >= 4 and all(j.state.value == "cancelled" for j in replicas)  # 2 + 2 rolled


def service_gauge(head: HeadProcess, metric: str, service: str) -> float:
    """`gpucluster_service_<metric>{service=...}` from the head's /metrics (-1 when absent)."""
    prefix = f'gpucluster_service_{metric}{{service="{service}",'
    lines = httpx.get(f"{head.url}/metrics", headers=head.headers).text.splitlines()
    return next((float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix)), -1.0)


SYSTEM_PYTHON = "/usr/bin/python3"  # one `nobody` may run (a virtualenv under /root is not)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs root: a listener of another account"
)
def test_another_accounts_listener_on_a_replicas_port_never_gets_traffic(head: HeadProcess, root: Path) -> None:
    """The port is picked by the head; another account binding it first is not the replica."""
    with head.client() as c:
        # The replica (run as this test's account) waits for a file before it binds its port.
        gate = root / "gate"
        command = ["/bin/sh", "-c", f'while [ ! -e {gate} ]; do sleep 0.1; done; exec "$@"', "sh", *APP]
        c.create_service("hijack", command, gpus=0.25, readiness="/health", env={"PID_DIR": str(root / "pids")})
        port = wait_for(
            lambda: (rs := c.service("hijack").replicas) and rs[0].phase == "starting" and rs[0].port,
            timeout=60,
            what="the replica running",
        )
        log_size = head.log_path.stat().st_size
        squat = root / "squat"  # what the squatter serves: a /health that answers 200
        squat.mkdir()
        (squat / "health").write_text("ok")
        squat.chmod(0o755)
        (squat / "health").chmod(0o644)
        squatter = subprocess.Popen(
            [SYSTEM_PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(squat)],
            user="nobody",
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(
                lambda: f"port {port} of replica job" in head.log_path.read_text()[log_size:],
                timeout=60,
                what="the head to notice the other account's listener",
            )
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # it would pass the probe
            assert c.service("hijack").replicas[0].phase == "starting"  # not ready: the gateway sends it nothing
        finally:
            squatter.kill()
            squatter.wait(10)
        gate.touch()  # now the replica binds its port and is ready
        wait_ready(c, "hijack", 1)
        assert httpx.get(f"{head.url}/serve/hijack/", headers=head.headers).json()["port"] == port
        c.delete_service("hijack")
