"""The job runs in its submitter's environment, as under `sbatch --export=ALL` (issue 17), end to
end: a real head, the real CLI run from a shell with a venv active and a PYTHONPATH. Before,
`python` in the job was the head's interpreter (another one, without the venv's packages) and
the venv, PYTHONPATH and the caller's variables were gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.headproc import HeadProcess
from tests.e2e.test_jobs import CLI, finished

PROBE = (
    "import json, os, sys, mymod; print(json.dumps({'prefix': sys.prefix, 'venv': os.environ.get('VIRTUAL_ENV'), "
    "'mod': mymod.WHERE, 'secret': os.environ.get('MY_SETTING'), 'home': os.environ.get('HOME'), "
    "'token': os.environ.get('GPUCLUSTER_TOKEN')}))"
)


def _shell(tmp_path: Path) -> dict[str, str]:
    """A caller's shell with a venv activated (as `source venv/bin/activate` does) and PYTHONPATH."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mymod.py").write_text(f"WHERE = {str(lib)!r}\n")
    # A head whose own PATH finds another python (the test's), so only the export can find the venv's.
    return {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        # the caller's own PYTHONPATH after it (this checkout's sources, for the CLI itself)
        "PYTHONPATH": os.pathsep.join(p for p in (str(lib), os.environ.get("PYTHONPATH")) if p),
        "MY_SETTING": "from-my-shell",
        "GPUCLUSTER_TOKEN": "never-sent",
    }


def _submit(head: HeadProcess, shell: dict[str, str], *options: str) -> dict[str, object]:
    r = subprocess.run(
        [*CLI, "submit", *options, "--", "python", "-c", PROBE],
        env={**shell, "GPUCLUSTER_URL": head.url, "GPUCLUSTER_TOKEN": head.token or ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.split()[2])
    done = finished(head, job, timeout=60)  # a Python start on a shared machine
    with head.client() as c:
        log = c.logs(job)
    assert done.state.value == "succeeded", f"{done.reason}\n{log}"
    return dict(json.loads(log.splitlines()[-1]))


def test_a_job_runs_with_the_submitters_venv_pythonpath_and_variables(head: HeadProcess, tmp_path: Path) -> None:
    shell = _shell(tmp_path)
    seen = _submit(head, shell)
    assert seen["prefix"] == shell["VIRTUAL_ENV"] == seen["venv"]  # `python` is the venv's
    assert seen["mod"] == str(tmp_path / "lib") and seen["secret"] == "from-my-shell"
    assert seen["token"] is None  # the caller's GPUCLUSTER_* never travel
    assert seen["home"] == os.path.expanduser("~")  # the account's home, as on its shell


def test_export_narrows_what_is_sent(head: HeadProcess, tmp_path: Path) -> None:
    shell = _shell(tmp_path)
    only = _submit(head, shell, "--export", "PATH,VIRTUAL_ENV,PYTHONPATH")
    assert only["prefix"] == shell["VIRTUAL_ENV"] and only["secret"] is None
    bad = subprocess.run(
        [*CLI, "submit", "--export", "GPUCLUSTER_TOKEN", "--", "true"],
        env={**shell, "GPUCLUSTER_URL": head.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "--export: GPUCLUSTER_TOKEN is set by the cluster or the node" in bad.stderr
