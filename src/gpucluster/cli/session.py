"""`gpucluster run`, `attach`, `forward`: interactive sessions (issue 21).

`run` submits a session (a job of kind `session`), shows its place in the queue on one live
line while it waits, then attaches the terminal (cli/terminal.py) and exits with the command's
exit code. `attach` returns to a running session; `forward` makes a port of a session's node
reachable on this machine, through the head.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from gpucluster.cli.common import UrlOpt, call, err, fail, out, refuse_stray_option
from gpucluster.cli.common import head as _head
from gpucluster.cli.transport import job_path
from gpucluster.clientbase import ApiError, ClusterUnreachable
from gpucluster.connection import Head
from gpucluster.launch.env import exported_env

ENDED = ("succeeded", "failed", "cancelled")

POLL_S = 1.0
NOTEBOOK_START_S = 300.0  # how long Jupyter may take to answer once its session runs
LOST_WAIT_S = 10.0  # after a lost connection, how long the head gets to record the session's end
RECONNECT_S = 60.0  # how long a lost head (a restart) is waited for before giving up
MAX_RECONNECTS = 20


# Options of both `run` and `notebook`.
GpusOpt = Annotated[str, typer.Option(help="GPUs for the session, or a share of one GPU such as 0.5")]
GpuTypeOpt = Annotated[str | None, typer.Option("--gpu-type", help="GPU model, or a preference list")]
TimeLimitOpt = Annotated[
    str | None, typer.Option("--time-limit", help="e.g. 30m, 4h [default: the policy's session limit]")
]
NameOpt = Annotated[str | None, typer.Option(help="a name for the session")]
TeamOpt = Annotated[str | None, typer.Option(help="the team the session is accounted to")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", help="K=V, repeatable")]
ExportOpt = Annotated[str, typer.Option("--export", help="your environment for the session: ALL, NONE, or VAR,VAR,...")]
WorkdirOpt = Annotated[str | None, typer.Option(help="working directory [default: the current one]")]


def run(
    command: Annotated[list[str] | None, typer.Argument(help="the program and its arguments, after --")] = None,
    gpus: GpusOpt = "1",
    gpu_type: GpuTypeOpt = None,
    cpus: Annotated[float | None, typer.Option("--cpus", help="CPU cores [default: the policy's per GPU]")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="host memory, e.g. 16G [default: the policy's]")] = None,
    time_limit: TimeLimitOpt = None,
    name: NameOpt = None,
    team: TeamOpt = None,
    env: EnvOpt = None,
    export: ExportOpt = "ALL",
    workdir: WorkdirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Start an interactive session and attach to it: gpucluster run --gpus 1 -- bash

    Waits in the queue (its position and estimated start on one line), then the terminal is the
    session's: Ctrl-C, Ctrl-D and the window size pass through, and the command's exit code is
    this one's. Detach with Ctrl-] then d; `gpucluster attach JOB` returns."""
    refuse_stray_option(command, "run")
    if not command:
        fail("no command given; put it after --, e.g. gpucluster run --gpus 1 -- bash")
    fields = _session_fields(list(command), gpus, gpu_type, time_limit, name, team, env, export, workdir, {})
    fields.update({k: v for k, v in (("cpus", cpus), ("mem", mem)) if v is not None})
    with _head(url) as h:
        job_id, state = _submit_and_wait(h, fields)
        raise typer.Exit(_attach_or_report(h, job_id, state))


def notebook(
    gpus: GpusOpt = "1",
    port: Annotated[int, typer.Option(help="Jupyter's port on the session's node", min=1, max=65535)] = 8888,
    local: Annotated[
        int | None, typer.Option("--local", help="the port here [default: the same]", min=0, max=65535)
    ] = None,
    gpu_type: GpuTypeOpt = None,
    time_limit: TimeLimitOpt = None,
    name: NameOpt = None,
    team: TeamOpt = None,
    env: EnvOpt = None,
    export: ExportOpt = "ALL",
    workdir: WorkdirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Start Jupyter Lab in a session (it must be installed in your environment there) and print
    a URL that reaches it from this machine, through the head; Ctrl-C stops the forwarding, the
    notebook goes on (`gpucluster forward JOB PORT` again, `gpucluster cancel JOB` to end it).

    The notebook listens on the node's loopback only, with a token made here (sent as
    JUPYTER_TOKEN with your environment, which only you and cluster admins can read), so other
    jobs on that node cannot use it."""
    import secrets

    from gpucluster.cli import terminal  # here, not at every CLI command's start

    token = secrets.token_urlsafe(24)
    command = ["jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0"]
    fields = _session_fields(
        command, gpus, gpu_type, time_limit, name, team, env, export, workdir, {"JUPYTER_TOKEN": token}
    )
    with _head(url) as h:
        job_id, state = _submit_and_wait(h, fields)
        if state in ENDED:
            raise typer.Exit(_ended(h, job_id))
        uri, headers, ssl_context = h.websocket(job_path(job_id, f"forward/{port}"))

        def open_tunnel() -> Any:
            return terminal.open_ws(uri, headers, ssl_context)

        err.print(f"session {job_id} running; waiting for Jupyter on port {port}", markup=False, highlight=False)
        deadline = time.monotonic() + NOTEBOOK_START_S
        while True:
            try:
                open_tunnel().close()
                break
            except terminal.Refused as e:
                refused = e
            job = call(h.json, "GET", job_path(job_id))
            if str(job.state) in ENDED:
                hint = (
                    " (is Jupyter installed in your environment? pip install jupyterlab)"
                    if job.exit_code == 127
                    else ""
                )
                fail(f"session {job_id} {job.state} before Jupyter answered: {job.reason}{hint}; "
                     f"its output: gpucluster logs {job_id}")  # fmt: skip
            if refused.status != 502 or time.monotonic() > deadline:
                fail(str(refused))
            time.sleep(0.5)
    listener = _listen(port if local is None else local)
    bound = listener.getsockname()[1]
    out.print(f"http://127.0.0.1:{bound}/lab?token={token}", markup=False, highlight=False)
    sys.stdout.flush()
    err.print(
        f"session {job_id}: Jupyter forwarded to 127.0.0.1:{bound}; Ctrl-C stops the forwarding (the notebook "
        f"goes on; gpucluster cancel {job_id} ends it)",
        markup=False,
        highlight=False,
    )
    _serve(listener, open_tunnel)


def _session_fields(
    command: list[str],
    gpus: str,
    gpu_type: str | None,
    time_limit: str | None,
    name: str | None,
    team: str | None,
    env: list[str] | None,
    export: str,
    workdir: str | None,
    secret_env: dict[str, str],
) -> dict[str, Any]:
    """The submission of a session. `secret_env` goes with the exported environment, which only
    the owner and cluster admins can read back (`env` is shown to the team)."""
    fields: dict[str, Any] = {"command": command, "interactive": True, "gpus": gpus}
    optional = {
        "gpu_type": gpu_type.split(",") if gpu_type and "," in gpu_type else gpu_type,
        "time_limit": time_limit,
        "name": name,
        "team": team,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    # The terminal's type is the terminal's, not the environment's: sent whatever --export says.
    pairs = {"TERM": os.environ.get("TERM") or "xterm-256color"}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--env {item!r}: write it as KEY=VALUE")
        pairs[key] = value
    fields["env"] = pairs
    try:
        exported = exported_env(os.environ, export)
    except ValueError as e:
        fail(str(e))
    if exported is not None or secret_env:
        fields["exported_env"] = {**(exported or {}), **secret_env}
    fields["workdir"] = str(Path(workdir or os.getcwd()).expanduser().absolute())
    return fields


def _submit_and_wait(h: Head, fields: dict[str, Any]) -> tuple[int, str]:
    """Submit the session and wait for it to run (a live status line); Ctrl-C cancels it."""
    job = call(h.json, "POST", "/v1/jobs", body=fields)
    job_id = int(job.id)
    err.print(f"session {job_id} submitted; Ctrl-C while it waits cancels it", markup=False, highlight=False)
    try:
        return job_id, _wait_running(h, job_id)
    except KeyboardInterrupt:
        _clear_line()
        call(h.json, "POST", job_path(job_id, "cancel"))
        fail(f"session {job_id} cancelled while it waited", 130)


def attach(
    job_id: Annotated[int, typer.Argument(help="the session's job id")],
    url: UrlOpt = None,
) -> None:
    """Return to a running session (the terminal as `run` gives it); detach with Ctrl-] then d."""
    with _head(url) as h:
        try:
            state = _wait_running(h, job_id)
        except KeyboardInterrupt:
            _clear_line()
            raise typer.Exit(130) from None
        raise typer.Exit(_attach_or_report(h, job_id, state))


def forward(
    job_id: Annotated[int, typer.Argument(help="the job (a session) whose port to reach")],
    port: Annotated[int, typer.Argument(help="the port on the job's node", min=1, max=65535)],
    local: Annotated[
        int | None, typer.Option("--local", help="the port here [default: the same]", min=0, max=65535)
    ] = None,
    url: UrlOpt = None,
) -> None:
    """Reach a port of a session's node from this machine, through the head:
    gpucluster forward 42 8888 (then open http://127.0.0.1:8888). Ctrl-C stops."""
    from gpucluster.cli import terminal  # here, not at every CLI command's start

    with _head(url) as h:
        uri, headers, ssl_context = h.websocket(job_path(job_id, f"forward/{port}"))

    def open_tunnel() -> Any:
        return terminal.open_ws(uri, headers, ssl_context)

    try:  # one tunnel first: a refusal (403, no such job, nothing on that port) is said at once
        open_tunnel().close()
    except terminal.Refused as e:
        fail(str(e))
    listener = _listen(port if local is None else local)
    err.print(
        f"forwarding 127.0.0.1:{listener.getsockname()[1]} -> job {job_id} port {port}; Ctrl-C stops",
        markup=False,
        highlight=False,
    )
    _serve(listener, open_tunnel)


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as e:
        listener.close()
        fail(f"cannot listen on 127.0.0.1:{port}: {e.strerror}; choose another --local")
    listener.listen(64)
    return listener


def _serve(listener: socket.socket, open_tunnel: Any) -> None:
    from gpucluster.cli import terminal  # here, not at every CLI command's start

    try:
        terminal.serve_forward(listener, open_tunnel, lambda m: err.print(f"forward: {m}", markup=False))
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()


# ---- waiting and attaching -------------------------------------------------------------------


def _wait_running(h: Head, job_id: int) -> str:
    """Until the job runs or has ended (its state), a live status line on stderr meanwhile."""
    shown = False
    polls = 0
    with _ctrl_c_between_requests() as interrupted:
        while True:
            state = _poll_once(h, job_id, shown)
            if interrupted.is_set():
                raise KeyboardInterrupt
            if state is not None:
                return state
            shown = True
            # Soon at first (a free GPU starts the session within a scheduling cycle), then every
            # POLL_S; Ctrl-C ends the wait at once.
            if interrupted.wait(min(POLL_S, 0.02 * 2**polls)):
                raise KeyboardInterrupt
            polls += 1


@contextmanager
def _ctrl_c_between_requests() -> Iterator[threading.Event]:
    """Ctrl-C while waiting sets an event that the wait checks between requests, instead of
    raising KeyboardInterrupt wherever the main thread is. Why: an interrupt that lands inside an
    HTTP request may leave the client's connection mid-exchange for the cancel sent next on the
    same client (the likely cause of a CI run where a waiting `run` never exited after Ctrl-C and
    its session stayed queued). The previous handler is put back afterwards."""
    interrupted = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        interrupted.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _poll_once(h: Head, job_id: int, shown: bool) -> str | None:
    """The job's state if it runs or has ended; otherwise None, with its live line shown."""
    job = call(h.json, "GET", job_path(job_id))
    state = str(job.state)
    if state == "running" or state in ENDED:
        if shown:
            _clear_line()
        return state
    line = f"session {job_id} {state}"
    if state == "queued":
        page = call(h.json, "GET", "/v1/queue", {"job": job_id, "limit": 1})
        if page.entries:
            line += f", position {page.entries[0].position}"
        start = page.entries[0].job.estimated_start if page.entries else None
        if start:
            line += f", estimated start {time.strftime('%H:%M', time.localtime(start))}"
        if job.reason:
            line += f" ({job.reason})"
    sys.stderr.write("\r\x1b[K" + line[:200])
    sys.stderr.flush()
    return None


def _clear_line() -> None:
    sys.stderr.write("\r\x1b[K")
    sys.stderr.flush()


def _attach_or_report(h: Head, job_id: int, state: str) -> int:
    """Attach to the running session, again after a lost connection (a head restart); the
    exit code to leave with."""
    from gpucluster.cli import terminal  # here, not at every CLI command's start

    if state in ENDED:
        return _ended(h, job_id)
    for attempt in range(MAX_RECONNECTS + 1):
        rows, cols = terminal.terminal_size()
        uri, headers, ssl_context = h.websocket(job_path(job_id, "attach"), {"rows": rows, "cols": cols})
        try:
            ws = terminal.open_ws(uri, headers, ssl_context)
        except terminal.Refused as e:
            if attempt == 0:
                fail(str(e))
            return _gave_up(job_id, str(e))
        code = terminal.attach(ws)
        if code in (terminal.DETACHED, terminal.TAKEN_OVER):
            how = "detached from" if code == terminal.DETACHED else "attached elsewhere:"
            err.print(
                f"\n{how} session {job_id}; it goes on. Return with: gpucluster attach {job_id}",
                markup=False,
                highlight=False,
            )
            return 0
        if code != terminal.LOST:
            return code
        after = _after_lost(h, job_id)
        if after is not None:
            return after
    return _gave_up(job_id, "the connection kept dropping")


def _after_lost(h: Head, job_id: int) -> int | None:
    """After a lost connection: the exit code to leave with, or None to attach again.

    The session may have been killed outright (a stop's SIGKILL takes its server too): the head
    records how it ended within moments. A head that is gone (restarting) is waited for, up to
    RECONNECT_S: the session goes on without it."""
    said = False
    ended_by = time.monotonic() + LOST_WAIT_S
    head_by = time.monotonic() + RECONNECT_S
    try:
        while True:
            try:
                job = h.json("GET", job_path(job_id))
            except ClusterUnreachable:
                if not said:
                    err.print(
                        f"\nlost the head; reconnecting to session {job_id} for up to {RECONNECT_S:.0f} s "
                        "(Ctrl-C gives up; the session goes on)",
                        markup=False,
                        highlight=False,
                    )
                    said = True
                if time.monotonic() > head_by:
                    return _gave_up(job_id, "the head did not come back")
                time.sleep(1.0)
                continue
            except ApiError as e:
                return _gave_up(job_id, str(e))
            if str(job.state) in ENDED:
                return _ended(h, job_id)
            if str(job.state) != "running":  # preempted: back in the queue
                return _gave_up(job_id, f"it is {job.state}")
            if said or time.monotonic() > ended_by:
                return None  # the head is back, or the connection dropped while it ran: again
            time.sleep(0.2)
    except KeyboardInterrupt:
        return _gave_up(job_id, "interrupted")


def _gave_up(job_id: int, why: str) -> int:
    err.print(
        f"\nlost the connection to session {job_id} ({why}); it goes on. Return with: gpucluster attach {job_id}",
        markup=False,
        highlight=False,
    )
    return 255


def _ended(h: Head, job_id: int) -> int:
    job = call(h.json, "GET", job_path(job_id))
    err.print(f"session {job_id} {job.state}: {job.reason}", markup=False, highlight=False)
    code = job.exit_code
    return int(code) if code is not None else 1
