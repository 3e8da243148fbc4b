"""The CLI a new user meets (issue 19): it starts light, finds the head `up` started, and takes
--url/--token before or after the subcommand.

Why these tests: each CLI command cost ~0.9 s of CPU, mostly imports it never used (FastAPI
through the dashboard package, trio through httpcore); and after `up --port X` every command
still went to 8642. The CPU figure itself is machine-dependent and lives in bench/bench_cli.py;
here we check what stays true on any machine: which modules a command imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpucluster import userconfig
from gpucluster.cli.main import hoist_global_options
from tests.e2e.headproc import HeadProcess, wait_for

# A test here reads the url: the last `gpucluster up` wrote to the client config, which must be
# this module's head's: no head is spawned ahead of it or beside it (tests/e2e/conftest.py).
ITS_HEAD_STARTS_LAST = True

# What pip installs as the `gpucluster` script, plus a report of the modules it ended up with.
SCRIPT = """import sys, atexit, json
loaded = lambda: sorted(m for m in sys.modules if sys.modules[m])
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(loaded()) + "\\n"))
from gpucluster.cli.main import main
sys.exit(main())
"""
HEAVY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "trio", "httpx._main", "gpucluster.auth.wire", "torch")


def _script(tmp_path: Path) -> list[str]:
    path = tmp_path / "gpucluster"
    path.write_text(SCRIPT)
    return [sys.executable, str(path)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUCLUSTER_URL", "GPUCLUSTER_TOKEN")}
    return {**env, **extra}


def _modules(stderr: str) -> list[str]:
    import json

    line = next(ln for ln in stderr.splitlines() if ln.startswith("MODULES "))
    return list(json.loads(line.removeprefix("MODULES ")))


def test_read_commands_import_nothing_they_do_not_use(head: HeadProcess, tmp_path: Path) -> None:
    cli = _script(tmp_path)
    for args in (["jobs"], ["submit", "--", "true"], ["--help"], ["jobs", "--help"]):
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, env=_env(GPUCLUSTER_URL=head.url))
        assert r.returncode == 0, (args, r.stderr)
        loaded = _modules(r.stderr)
        heavy = [m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY]
        assert heavy == [], (args, heavy)


# What the commands that read and print never need (issue 19): the SDK's httpx and pydantic
# (they read the head's JSON as plain dicts, over a socket), rich for plain text into a pipe.
READ_PATH_FREE_OF = ("pydantic", "pydantic_core", "httpx", "httpcore", "rich", "http.client", "email", "ssl")


def test_read_commands_import_neither_pydantic_nor_httpx(head: HeadProcess, tmp_path: Path) -> None:
    cli = _script(tmp_path)
    with head.client() as c:
        job = c.submit(["true"], gpus=1)
        wait_for(lambda: c.job(job.id).state.value == "succeeded", what="a finished job to read")
        running = c.submit(["sleep", "600"], gpus=1)  # cancelled below
    commands = [
        ["jobs"], ["jobs", "--json"], ["jobs", "--state", "succeeded", "--limit", "5"], ["show", str(job.id)],
        ["show", str(job.id), "--json"], ["logs", str(job.id)], ["why", str(job.id)], ["queue"], ["nodes"],
        ["policy", "show"], ["submit", "--", "true"], ["submit", "--gpus", "1", "--env", "A=b", "--", "true"],
        ["cancel", str(running.id)], ["--help"], ["whoami"], ["usage"], ["usage", "--csv"], ["budgets"],
        ["admin", "users"], ["admin", "tokens"], ["admin", "audit", "--since", "1h"],
    ]  # fmt: skip
    for args in commands:
        r = _run(cli, *args, url=head.url)
        assert r.returncode == 0, (args, r.stderr)
        loaded = _modules(r.stderr)
        found = [m for m in loaded if m in READ_PATH_FREE_OF or m.split(".")[0] in READ_PATH_FREE_OF]
        assert found == [], (args, sorted({m.split(".")[0] for m in found}))


# What a plain `submit` (and `jobs`) never needs (issue 18): PyYAML for a config file `up` wrote
# in plain lines, and the scheduler core's types for the submitter's environment.
SUBMIT_PATH_FREE_OF = ("yaml", "gpucluster.core", "gpucluster.models")


def test_submit_reads_the_config_without_yaml_and_loads_no_core(head: HeadProcess, tmp_path: Path) -> None:
    assert "heads:" in userconfig.config_path().read_text()  # the token comes from the file `up` wrote
    cli = _script(tmp_path)
    for args in (["submit", "--", "true"], ["submit", "--gpus", "1", "--env", "A=b", "--", "true"], ["jobs"]):
        r = _run(cli, *args, url=head.url)
        assert r.returncode == 0, (args, r.stderr)
        found = [m for m in _modules(r.stderr) if any(m == p or m.startswith(p + ".") for p in SUBMIT_PATH_FREE_OF)]
        assert found == [], (args, found)


def test_up_records_its_url_so_later_commands_find_it(head: HeadProcess, tmp_path: Path) -> None:
    """No --url, no $GPUCLUSTER_URL: the config file's url:, written by this head's `up`."""
    assert userconfig.load().url == head.url
    r = subprocess.run([*_script(tmp_path), "jobs", "--json"], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0 and r.stdout.strip().startswith("["), r.stderr
    assert f"now go to {head.url}" in head.log_path.read_text()


def test_global_options_before_or_after_the_subcommand(head: HeadProcess, tmp_path: Path) -> None:
    cli = _script(tmp_path)
    for args in (
        ["--url", head.url, "jobs"],
        ["jobs", "--url", head.url],
        ["--url", head.url, "--token", head.token or "", "jobs"],
        ["jobs", "--url", head.url, "--token", head.token or ""],
    ):
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, env=_env())
        assert r.returncode == 0, (args, r.stderr)
    for args in (["--token", "gc_wrong", "jobs", "--url", head.url], ["jobs", "--url", head.url, "--token=gc_wrong"]):
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, env=_env())
        assert r.returncode == 1 and "token is not valid" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_hoisting_leaves_a_command_s_own_arguments_alone() -> None:
    assert hoist_global_options(["jobs", "--token", "T"]) == ["--token", "T", "jobs"]
    assert hoist_global_options(["cancel", "3", "--token=T"]) == ["--token", "T", "cancel", "3"]
    assert hoist_global_options(["--token", "T", "jobs"]) == ["--token", "T", "jobs"]
    kept = ["submit", "--gpus", "2", "--", "python", "x.py", "--token", "T"]
    assert hoist_global_options(kept) == kept
    assert hoist_global_options(["submit", "python", "x.py", "--token", "T"]) == [
        "submit", "python", "x.py", "--token", "T",
    ]  # fmt: skip
    assert hoist_global_options(["submit", "--token", "T", "--", "x"]) == ["--token", "T", "submit", "--", "x"]


def test_unknown_command_still_says_so(tmp_path: Path) -> None:
    r = subprocess.run([*_script(tmp_path), "jbos"], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode != 0 and "jbos" in r.stderr and "Traceback" not in r.stderr


def _run(cli: list[str], *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = _env(GPUCLUSTER_URL=url) if url else _env()
    return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, env=env)


def test_help_shows_every_default_and_flags_look_like_flags(tmp_path: Path) -> None:
    """Rich markup swallowed every `[...]` in help strings (`[default: ...]`, `gpucluster[ray]`)."""
    cli = _script(tmp_path)

    def shown(*args: str) -> str:
        return " ".join(_run(cli, *args).stdout.split())  # help wraps to the terminal's width

    up = shown("up", "--help")
    assert "[default: 8642" in up and "gpucluster[ray]" in up and "[default: ~/.local/share/gpucluster" in up
    submit = shown("submit", "--help")
    assert "[default: http://127.0.0.1:8642]" in submit and "[default: 1]" in submit
    assert "<bool>" not in submit and "--shell " in submit
    assert "preempted" in shown("jobs", "--help")
    assert "2025-01-31" in shown("admin", "audit", "--help")


def test_bad_inputs_answer_one_line_and_exit_1(head: HeadProcess, tmp_path: Path) -> None:
    cli = _script(tmp_path)
    typo = tmp_path / "typo.yaml"
    typo.write_text("comand: [python, train.py]\ngpus: 1\n")
    cases = [
        (["submit", "-f", str(typo)], f"{typo}:1: comand: unknown field; did you mean command?"),
        (["show", "abc"], "job_id"),
        (["show"], "Missing argument"),
        (["jobs", "--bogus"], "No such option: --bogus"),
        (["jobs", "--limit", "0"], "--limit"),
        (["jbos"], "No such command 'jbos'"),
        (["jobs", "--state", "nope"], "state: 'nope': Input should be"),
        (["admin", "audit", "--since", "yesterday"], "--since: cannot read 'yesterday'"),
        # A mistyped option before the command is not taken for the command (a job running `--gpuz`).
        (["submit", "--gpuz", "2", "--", "true"], "no such option: --gpuz; see `gpucluster submit --help`"),
        (["submit", "--gpus", "1", "--nmae", "x", "--", "true"], "no such option: --nmae"),
        (["run", "--gpuz", "1", "--", "bash"], "no such option: --gpuz; see `gpucluster run --help`"),
        (["serve", "--nmae", "x", "--", "true"], "no such option: --nmae; see `gpucluster serve --help`"),
    ]
    for args, needle in cases:
        r = _run(cli, *args, url=head.url)
        lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("MODULES ")]
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, lines)
        assert "state.0" not in lines[0]
    assert _run(cli, "admin", "audit", "--since", "2025-01-31", url=head.url).returncode == 0
    with head.client() as c:
        assert not [j for j in c.jobs() if j.spec.command and j.spec.command[0].startswith("-")]


def test_estimates_say_what_they_assume(head: HeadProcess, tmp_path: Path) -> None:
    """A start estimate holds only if running jobs use their whole limit; the default 1 h is said."""
    cli = _script(tmp_path)
    with head.client() as c:
        c.submit(["sleep", "600"], gpus=8)
        waiting = c.submit(["sleep", "600"], gpus=8)
        wait_for(lambda: c.job(waiting.id).estimated_start is not None, what="an estimate for the waiting job")
    why = _run(cli, "why", str(waiting.id), url=head.url)
    assumption = (
        "(assuming jobs run as long as similar finished jobs did, else their whole time limit,"
        " the default 1h where none is set)"
    )
    assert assumption in why.stdout
    assert "EST. START: assuming" in _run(cli, "queue", url=head.url).stdout
