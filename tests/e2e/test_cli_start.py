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
from tests.e2e.headproc import HeadProcess

# What pip installs as the `gpucluster` script, plus a report of the modules it ended up with.
SCRIPT = """import sys, atexit, json
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(sorted(m for m in sys.modules if sys.modules[m])) + "\\n"))
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
