"""Interactive sessions end to end: a real head, the real CLI on a real PTY (tests/e2e/ptyterm.py),
a real bash on the session's PTY on the node, WebSockets through the head."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from gpucluster.client import Client

from .headproc import HeadProcess, cli, free_port, passable_dir, pid_alive, wait_for
from .ptyterm import Term

CLI = [sys.executable, "-m", "gpucluster.cli.main"]
BASH = ["bash", "--norc", "--noprofile"]
PROMPT = "P> "


@pytest.fixture
def terms() -> Iterator[list[Term]]:
    """Every terminal a test opens, closed (its program killed by id) even after a failure."""
    opened: list[Term] = []
    yield opened
    for t in opened:
        t.close()


def term(terms: list[Term], head: HeadProcess, *args: str, token: str | None = None, rows: int = 24) -> Term:
    env = {**head.env, "TERM": "xterm"}
    if token is not None:
        env["GPUCLUSTER_TOKEN"] = token
    t = Term([*CLI, *args], env, rows=rows, cols=100)
    terms.append(t)
    return t


def run_bash(terms: list[Term], head: HeadProcess, rows: int = 24) -> tuple[Term, int]:
    """`gpucluster run -- bash` at its first prompt; the terminal and the session's job id."""
    t = term(terms, head, "run", "--gpus", "1", "--env", f"PS1={PROMPT}", "--", *BASH, rows=rows)
    job_id = int(t.expect(rb"session (\d+) submitted").group(1))
    t.expect(PROMPT)
    return t, job_id


def ws_status(head: HeadProcess, path: str, token: str | None) -> int:
    """The HTTP status with which the head answers a WebSocket upgrade of `path`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with connect(f"ws://127.0.0.1:{head.port}{path}", additional_headers=headers, open_timeout=30):
            return 101
    except InvalidStatus as e:
        return int(e.response.status_code)


def test_a_session_types_resizes_interrupts_and_returns_the_exit_code(head: HeadProcess, terms: list[Term]) -> None:
    t, job_id = run_bash(terms, head, rows=30)
    t.send("echo $((6 * 7))-answer\r")
    t.expect("42-answer")
    t.send("stty size\r")
    t.expect("30 100")
    t.resize(40, 132)  # SIGWINCH to the CLI, which sends the new size to the remote PTY
    t.send("stty size\r")
    t.expect("40 132")
    t.send("tty; echo CUDA=$CUDA_VISIBLE_DEVICES\r")
    t.expect(r"/dev/pts/\d+")
    t.expect(r"CUDA=\d")  # the same GPU isolation as a batch job
    t.send("sleep 4321; echo not-interrupted\r")  # a duration no other test's sleep has
    with head.client() as c:
        # The remote `sleep` runs (seen from the node) before Ctrl-C is typed.
        sleeper = wait_for(lambda: _pids_of(["sleep", "4321"]), timeout=20, what="the remote sleep")
        t.send("\x03")
        t.send("echo rc=$?\r")
        t.expect("rc=130")
        assert not any(pid_alive(p) for p in sleeper)
        assert b"\nnot-interrupted" not in t.output  # its own line: the echo of the command line aside
        t.expect(PROMPT)  # at its prompt: a Ctrl-D typed ahead, while the PTY is still cooked, is lost
        t.send("\x04")  # Ctrl-D: end of input to bash, which exits with the last status (0)
        assert t.wait() == 0
        job = wait_for(lambda: (j := c.job(job_id)).state.terminal and j, timeout=30, what="the session to end")
        assert job.kind == "session" and job.exit_code == 0 and job.state.value == "succeeded"
        transcript = c.logs(job_id)
        assert "42-answer" in transcript and "rc=130" in transcript

    t2, job2 = run_bash(terms, head)
    t2.send("exit 7\r")
    assert t2.wait() == 7
    with head.client() as c:
        assert wait_for(lambda: c.job(job2).exit_code == 7, timeout=30, what="exit code 7 recorded")


def _pids_of(argv: list[str]) -> list[int]:
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if f.read() == want:
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_detach_reattach_client_kill_and_head_restart_keep_the_session(
    head_factory: type[HeadProcess], tmp_path: Path, terms: list[Term]
) -> None:
    head = head_factory(tmp_path / "data").start()
    t, job_id = run_bash(terms, head)
    t.send("X=kept; echo pid=$$\r")
    shell = int(t.expect(rb"pid=(\d+)").group(1))

    t.send(b"\x1dd")  # Ctrl-] then d
    assert t.wait() == 0
    assert b"detached from session" in t.output and pid_alive(shell)

    t = term(terms, head, "attach", str(job_id))
    t.send("echo again-$X-$$\r")
    t.expect(f"again-kept-{shell}")
    second = term(terms, head, "attach", str(job_id))  # attached from elsewhere: the first lets go
    t.expect(r"\[gpucluster\] attached from elsewhere; detached here")
    assert t.wait() == 0
    t = second
    t.send("echo taken-$X\r")
    t.expect("taken-kept")
    os.kill(t.pid, signal.SIGKILL)  # the client dies: the session does not
    t.wait()

    t = term(terms, head, "attach", str(job_id))
    t.send("echo third-$X\r")
    t.expect("third-kept")
    head.kill9()  # the head dies under an attached client, which waits for it
    t.expect("lost the head; reconnecting to session")
    assert pid_alive(shell)
    head = head_factory(tmp_path / "data", port=head.port).start()
    t.send("echo back-$X-$$\r")  # typed while the client reconnects: kept, and sent once attached
    t.expect(f"back-kept-{shell}")
    t.send(b"\x1dd")
    assert t.wait() == 0

    t = term(terms, head, "attach", str(job_id))  # and a new client attaches through the new head
    t.send("echo new-$X\r")
    t.expect("new-kept")
    t.send("exit 3\r")
    assert t.wait() == 3
    with head.client() as c:
        assert wait_for(lambda: c.job(job_id).exit_code == 3, timeout=30, what="the exit code after the restart")
    r = cli(head, "attach", str(job_id))  # an ended session: its end, and its exit code
    assert r.returncode == 3 and f"session {job_id} failed" in r.stderr


def test_only_the_owner_attaches_and_only_the_team_forwards(head: HeadProcess, terms: list[Term]) -> None:
    me = os.environ.get("USER") or "root"
    with head.client() as admin:
        alice = admin.add_user("alice", ["vision"], unix_user=me).token
        carol = admin.add_user("carol", ["vision"], unix_user=me).token
        bob = admin.add_user("bob", ["nlp"], unix_user=me).token
    with Client(head.url, token=alice) as c:
        job = c.submit(["sleep", "1000"], interactive=True, workdir="/tmp")
        wait_for(lambda: c.job(job.id).state.value == "running", timeout=30, what="the session to run")
    attach, fwd = f"/v1/jobs/{job.id}/attach", f"/v1/jobs/{job.id}/forward/9"
    assert ws_status(head, attach, bob) == 403  # another team's
    assert ws_status(head, fwd, bob) == 403
    assert ws_status(head, attach, carol) == 403  # her team's, not her own: typing would run as alice
    assert ws_status(head, "/v1/jobs/999999/attach", alice) == 403  # the same as another team's
    assert ws_status(head, attach, None) == 401
    r = cli(head, "attach", str(job.id), token=bob)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: no job with id {job.id}"  # as `logs` and `show` say it
    r = cli(head, "forward", str(job.id), "9", "--local", "0", token=bob)
    assert r.returncode == 1 and f"job {job.id} is not a job of your teams" in r.stderr
    r = cli(head, "forward", str(job.id), "9", "--local", "0", token=carol)  # allowed; nothing listens there
    assert r.returncode == 1 and "nothing answers on port 9" in r.stderr

    # An open terminal ends within moments of its token's revocation.
    with connect(f"ws://127.0.0.1:{head.port}{attach}", additional_headers={"Authorization": f"Bearer {alice}"}) as ws:
        tokens = json.loads(cli(head, "admin", "tokens", "--user", "alice", "--json").stdout)
        assert cli(head, "admin", "revoke", str(tokens[0]["id"])).returncode == 0
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(timeout=30)
    with head.client() as admin:
        admin.cancel(job.id)
    audit = json.loads(cli(head, "admin", "audit", "--json").stdout)
    assert ("alice", "attach", f"job {job.id}") in {(e["user"], e["action"], e["target"]) for e in audit}
    assert ("carol", "forward", f"job {job.id}") not in {(e["user"], e["action"], e["target"]) for e in audit}


def test_a_forwarded_port_serves_a_real_http_request(head: HeadProcess, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello through the head\n")
    port, local = free_port(), free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with head.client() as c:
        job = c.submit(server, interactive=True, workdir=str(site))
        wait_for(lambda: c.job(job.id).state.value == "running", timeout=30, what="the session to run")
        wait_for(lambda: b"Serving HTTP" in _log_bytes(c, job.id), timeout=30, what="the server to listen")
    assert f"job-{job.id} (session)" in cli(head, "jobs").stdout  # a session is a job, marked as one
    assert f"interactive session (gpucluster attach {job.id}" in cli(head, "show", str(job.id)).stdout
    fwd = subprocess.Popen(
        [*CLI, "forward", str(job.id), str(port), "--local", str(local)],
        env=head.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert fwd.stdout is not None
        line = fwd.stdout.readline().decode()
        assert f"forwarding 127.0.0.1:{local} -> job {job.id} port {port}" in line, line
        for _ in range(3):  # several connections, one tunnel each
            r = httpx.get(f"http://127.0.0.1:{local}/hello.txt", timeout=30)
            assert r.status_code == 200 and r.text == "hello through the head\n"
    finally:
        os.killpg(fwd.pid, signal.SIGKILL)
        fwd.wait(10)
        with head.client() as c:
            c.cancel(job.id)


def _log_bytes(c: Client, job_id: int) -> bytes:
    return c.logs(job_id).encode()


def test_bad_session_requests_get_one_line_errors(head: HeadProcess, tmp_path: Path) -> None:
    r = cli(head, "run", "--gpus", "64", "--", "bash")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "asks for 64 GPUs but this cluster can never host that" in r.stderr
    r = cli(head, "run", "--gpus", "1")
    assert r.returncode == 1 and "no command given" in r.stderr
    with head.client() as c:
        batch = c.submit(["sleep", "1000"], workdir="/tmp")
        wait_for(lambda: c.job(batch.id).state.value == "running", timeout=30, what="the batch job to run")
        r = cli(head, "attach", str(batch.id))
        assert r.returncode == 1 and f"job {batch.id} is a batch job, not a session" in r.stderr
        c.cancel(batch.id)
    spec = {"command": ["bash"], "interactive": True, "per_gpu": True, "gpus": 2}
    answer = httpx.post(f"{head.url}/v1/jobs", json=spec, headers=head.headers)
    assert answer.status_code == 422 and "an interactive session is one process on one node" in answer.json()["error"]


def test_the_policy_session_class_limits_gpus_and_time(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("interactive: {max_gpus_per_user: 2, time_limit: 1h, priority: high}\n")
    head = head_factory(tmp_path / "data", extra_args=("--policy", str(policy))).start()
    with head.client() as c:
        first = c.submit(["sleep", "1000"], interactive=True, gpus=2, workdir="/tmp")
        assert first.spec.priority == "high" and first.spec.time_limit == 3600  # the class's
        r = cli(head, "run", "--gpus", "1", "--", "bash")
        assert r.returncode == 1 and "your sessions would hold 3 GPUs; the policy allows 2 per user" in r.stderr
        c.cancel(first.id)
        wait_for(lambda: c.job(first.id).state.terminal, timeout=30, what="the first session to end")
        r = cli(head, "run", "--gpus", "1", "--time-limit", "2h", "--", "bash")
        assert r.returncode == 1 and "sessions may run at most 1h" in r.stderr
        # Six at once, one GPU each: the limit holds (each submission counts the ones before it).
        spec = {"command": ["sleep", "1000"], "interactive": True, "gpus": 1, "workdir": "/tmp"}
        with ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(
                    lambda _: httpx.post(f"{head.url}/v1/jobs", json=spec, headers=head.headers, timeout=60), range(6)
                )
            )
        accepted = [a.json()["id"] for a in answers if a.status_code == 201]
        assert len(accepted) == 2 and sorted(a.status_code for a in answers) == [201, 201, 422, 422, 422, 422]
        for job_id in accepted:
            c.cancel(job_id)


def test_an_idle_session_is_warned_in_its_terminal_then_stopped(
    head_factory: type[HeadProcess], tmp_path: Path, terms: list[Term]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("interactive: {idle: {after: 2s, grace: 3s, action: stop}}\n")
    head = head_factory(tmp_path / "data", extra_args=("--policy", str(policy), "--telemetry-interval", "0.2s")).start()
    t, job_id = run_bash(terms, head)

    def gpus_at(percent: float) -> None:  # synthetic telemetry: what the job says it does
        r = httpx.post(f"{head.url}/v1/jobs/{job_id}/progress", json={"gpu_utilization": percent}, headers=head.headers)
        assert r.status_code == 204, r.text

    gpus_at(0)
    t.expect(r"\[gpucluster\] this session is idle \(GPUs at or under 1% and no input for \d+s\); it will be stopped")
    with head.client() as c:
        # The dashboard shows it too: the flag is stored just after the terminal is told (under
        # load the terminal's line can arrive first).
        wait_for(lambda: [f.flag for f in c.job(job_id).flags] == ["idle"], what="the idle flag")
    t.send("echo still-here\r")  # a key withdraws the warning
    t.expect(r"\[gpucluster\] activity again: the session stays")
    gpus_at(100)  # busy GPUs and a silent terminal (a long training step): not idle
    with head.client() as c:
        wait_for(lambda: not c.job(job_id).flags, timeout=20, what="the idle flag to go")
    gpus_at(0)
    t.expect(r"\[gpucluster\] this session is idle")
    t.expect(r"\[gpucluster\] stopped: idle session")
    code = t.wait()
    assert code in (137, 143), code  # SIGTERM; an interactive bash ignores it, so SIGKILL after the grace
    with head.client() as c:
        job = wait_for(lambda: (j := c.job(job_id)).state.terminal and j, timeout=30, what="the session to end")
        assert job.state.value == "failed" and job.reason.startswith("stopped: idle session")


# What `jupyter lab` does for `gpucluster notebook`, in a few lines (Jupyter is not installed
# here): serve HTTP on 127.0.0.1:--port, and answer only requests with the JUPYTER_TOKEN.
FAKE_JUPYTER = """#!PYTHON
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(next(a for a in sys.argv if a.startswith("--port=")).split("=")[1])
assert sys.argv[1:4] == ["lab", "--no-browser", "--ip=127.0.0.1"], sys.argv
class Lab(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/lab?token=" + os.environ["JUPYTER_TOKEN"]
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(b"jupyter lab" if ok else b"bad token")
print("fake jupyter lab on", port, flush=True)
HTTPServer(("127.0.0.1", port), Lab).serve_forever()
"""


def test_notebook_prints_a_url_that_reaches_jupyter_through_the_head(head: HeadProcess, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "jupyter").write_text(FAKE_JUPYTER.replace("PYTHON", sys.executable))
    (bin_dir / "jupyter").chmod(0o755)
    port, local = free_port(), free_port()
    env = {**head.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    argv = [*CLI, "notebook", "--gpus", "1", "--port", str(port), "--local", str(local), "--workdir", "/tmp"]
    nb = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert nb.stdout is not None
        url = nb.stdout.readline().decode().strip()
        assert url.startswith(f"http://127.0.0.1:{local}/lab?token="), url
        r = httpx.get(url, timeout=30)
        assert r.status_code == 200 and r.text == "jupyter lab"
        assert httpx.get(url + "x", timeout=30).status_code == 403  # the token is checked
        with head.client() as c:
            [job] = [j for j in c.jobs() if j.kind == "session" and j.state.value == "running"]
            assert job.spec.command[:2] == ["jupyter", "lab"] and not any("token" in a for a in job.spec.command)
    finally:
        os.killpg(nb.pid, signal.SIGKILL)
        nb.wait(10)
    with head.client() as c:
        c.cancel(job.id)

    r = subprocess.run(  # no Jupyter in the session's environment: said in one line
        [*CLI, "notebook", "--workdir", "/tmp", "--port", str(port)],
        env={**head.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "before Jupyter answered" in r.stderr and "pip install jupyterlab" in r.stderr


def test_a_cancel_says_so_in_the_terminal_and_stops_the_running_command(head: HeadProcess, terms: list[Term]) -> None:
    t, job_id = run_bash(terms, head)
    t.send("sleep 4322\r")
    sleeper = wait_for(lambda: _pids_of(["sleep", "4322"]), timeout=20, what="the remote sleep")
    assert cli(head, "cancel", str(job_id)).returncode == 0
    t.expect(r"\[gpucluster\] the session is being stopped \(SIGTERM\)")
    assert t.wait() in (137, 143)
    assert not any(pid_alive(p) for p in sleeper)
    with head.client() as c:
        assert wait_for(lambda: c.job(job_id).state.value == "cancelled", timeout=30, what="the session cancelled")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root head runs sessions as other accounts")
def test_a_root_head_runs_the_session_as_its_owner_and_only_the_head_reaches_its_socket(
    head_factory: type[HeadProcess], terms: list[Term]
) -> None:
    with passable_dir("gc-sess-") as root:  # the job's directory must be reachable by `nobody`
        head = head_factory(root / "data").start()
        with head.client() as admin:
            nob = admin.add_user("nob", ["t"], unix_user="nobody").token
        t = term(terms, head, "run", "--workdir", "/tmp", "--env", f"PS1={PROMPT}", "--", *BASH, token=nob)
        job_id = int(t.expect(rb"session (\d+) submitted").group(1))
        t.expect(PROMPT)
        t.send("echo me=$(id -un)\r")
        t.expect("me=nobody")
        sock = root / "data" / "run" / str(job_id) / "attempt-1" / "session.sock"
        st = sock.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
        assert (sock.parent.stat().st_mode & 0o777) == 0o700
        probe = f"import socket; socket.socket(socket.AF_UNIX).connect({str(sock)!r})"
        t.send(f"python3 -c {probe!r} 2>&1 | tail -1\r")  # as nobody, from inside the session
        t.expect("PermissionError")
        t.send("exit 4\r")
        assert t.wait() == 4


def test_a_waiting_session_shows_its_place_in_the_queue_then_starts(
    head_factory: type[HeadProcess], tmp_path: Path, terms: list[Term]
) -> None:
    head = head_factory(tmp_path / "data", gpus=1).start()
    with head.client() as c:
        batch = c.submit(["sleep", "1000"], workdir="/tmp", time_limit="1h")
        wait_for(lambda: c.job(batch.id).state.value == "running", timeout=30, what="the batch job to hold the GPU")
        t = term(terms, head, "run", "--gpus", "1", "--env", f"PS1={PROMPT}", "--", *BASH)
        t.expect(r"session \d+ queued, position 1, estimated start \d\d:\d\d")  # the live line
        quitter = term(terms, head, "run", "--", *BASH)  # Ctrl-C while it waits: cancelled
        gave_up = int(quitter.expect(rb"session (\d+) submitted").group(1))
        quitter.expect("position 2")
        quitter.send("\x03")
        assert quitter.wait() == 130
        assert c.job(gave_up).state.value == "cancelled"
        c.cancel(batch.id)
    t.expect(PROMPT)  # the GPU freed, the session starts and attaches
    t.send("exit\r")
    assert t.wait() == 0
