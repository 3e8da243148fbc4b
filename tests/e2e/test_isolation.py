"""Tenant isolation, tried as a hostile member would: a real root head, two Unix accounts in two
teams, and each attack of issue 14 against the operating-system layer under the API, with its
inverse (a member still reads and writes their own job's files, checkpoints and logs).

Every job here runs as `gciso_alice` or `gciso_bob`, accounts this module makes and removes. The
head's data dir is a directory other accounts may pass through (as /var/lib is), else no job run
as its submitter could reach its own directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpucluster.auth.unix import account_exists
from gpucluster.client import ApiError, Client
from gpucluster.executors.base import LaunchSpec, Running
from gpucluster.executors.cgroups import detect as detect_cgroups
from gpucluster.executors.local import LocalExecutor
from gpucluster.models import Job

from .headproc import HeadProcess, passable_dir, pid_alive, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd: a root head and two accounts"
)

ACCOUNTS = ("gciso_alice", "gciso_bob")
POLICY = "teams:\n  red: {weight: 1}\n  blue: {weight: 1}\nunknown_teams: reject\n"
HEAD_SECRET = "head-only-s3cret-7f1e"  # in the head's environment: no job may see it
# A job on a busy two-core machine starts in well under a second; the margin is for CI's load.
JOB_TIMEOUT_S = 60.0


@dataclass
class Tenants:
    head: HeadProcess
    root: Path  # the passable directory holding the data dir and each account's workdir
    alice: Client  # team red, runs as gciso_alice
    bob: Client  # team blue, runs as gciso_bob

    @property
    def data(self) -> Path:
        return self.head.data_dir

    def workdir(self, account: str) -> str:
        return str(self.root / account)


def _make_account(name: str) -> None:
    if account_exists(name):
        return
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)


@pytest.fixture(scope="module")
def tenants() -> Iterator[Tenants]:
    made = [a for a in ACCOUNTS if not account_exists(a)]
    for account in ACCOUNTS:
        _make_account(account)
    try:
        with passable_dir("gc-iso-") as root:
            for account in ACCOUNTS:
                home = root / account
                home.mkdir()
                entry = pwd.getpwnam(account)
                os.chown(home, entry.pw_uid, entry.pw_gid)
                os.chmod(home, 0o700)
            policy = root / "policy.yaml"
            policy.write_text(POLICY)
            head = HeadProcess(root / "data", gpus=4, extra_args=("--policy", str(policy)))
            os.environ["GC_HEAD_SECRET"] = HEAD_SECRET  # the head inherits it at start
            try:
                head.start()
            finally:
                del os.environ["GC_HEAD_SECRET"]
            try:
                with head.client() as admin:
                    alice = admin.add_user("alice", ["red"], unix_user=ACCOUNTS[0])
                    bob = admin.add_user("bob", ["blue"], unix_user=ACCOUNTS[1])
                with Client(head.url, token=alice.token) as a, Client(head.url, token=bob.token) as b:
                    yield Tenants(head, root, a, b)
            finally:
                head.stop()
                head.kill_jobs()
    finally:
        for account in made:
            subprocess.run(["userdel", account], check=False, capture_output=True)


def sh(c: Client, script: str, workdir: str, **fields: object) -> int:
    return c.submit(["/bin/sh", "-c", script], gpus=1, workdir=workdir, **fields).id


def ended(c: Client, job_id: int) -> Job:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (j := c.job(job_id)).state.terminal and j, timeout=JOB_TIMEOUT_S, what=f"job {job_id} to end"
    )


def running(c: Client, job_id: int) -> Job:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (j := c.job(job_id)).state.value == "running" and j, timeout=JOB_TIMEOUT_S, what=f"job {job_id} to run"
    )


def log_shows(c: Client, job_id: int, text: str) -> str:
    return wait_for(  # type: ignore[no-any-return]
        lambda: text in (out := c.logs(job_id)) and out, timeout=JOB_TIMEOUT_S, what=f"{text!r} in job {job_id}'s log"
    )


# ---- the job runs as its submitter, and root never runs the submitter's code --------------------


def test_a_job_runs_as_its_submitter_and_uses_its_own_files(tenants: Tenants) -> None:
    """The inverse of every attack below: a member's job writes and reads its checkpoints and
    workdir, and its log reaches the member (and a teammate-facing API) as before."""
    a = tenants.alice
    script = 'id -un; echo saved > "$GPUCLUSTER_CHECKPOINT_DIR/ck"; cat "$GPUCLUSTER_CHECKPOINT_DIR/ck"; echo hi > note'
    job = sh(a, script, tenants.workdir("gciso_alice"))
    assert ended(a, job).state.value == "succeeded", a.job(job).reason
    assert a.logs(job) == "gciso_alice\nsaved\n"
    alice = pwd.getpwnam("gciso_alice")
    job_dir = tenants.data / "jobs" / str(job)
    made = (job_dir, job_dir / "checkpoints", job_dir / "attempt-1", job_dir / "attempt-1" / "output.log")
    for path in (*made, job_dir / "checkpoints" / "ck"):
        assert path.stat().st_uid == alice.pw_uid, path
    # What gpucluster makes is private; what the job writes follows a login's umask (022), inside
    # its 0700 directory, which no other account can enter.
    for path in made:
        assert path.stat().st_mode & 0o077 == 0, f"{path} is open to others: {oct(path.stat().st_mode)}"
    assert (job_dir / "checkpoints" / "ck").stat().st_mode & 0o777 == 0o644
    assert (tenants.root / "gciso_alice" / "note").stat().st_uid == alice.pw_uid


def test_ld_preload_in_a_jobs_environment_never_runs_as_root(tenants: Tenants, tmp_path: Path) -> None:
    """Measured before: `--env LD_PRELOAD=evil.so` ran the member's code as root in the shim."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the preloaded library")
    proof = tenants.root / "proof"
    proof.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(proof, 0o1777)
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n#include <fcntl.h>\n"
        "__attribute__((constructor)) static void evil(void) {\n"
        f'  char p[256]; snprintf(p, sizeof p, "{proof}/ran-as-%d-pid-%d", (int)getuid(), (int)getpid());\n'
        "  close(open(p, O_CREAT | O_WRONLY, 0644));\n}\n"
    )
    lib = tenants.root / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    os.chmod(lib, 0o755)
    a = tenants.alice
    job = a.submit(["true"], gpus=1, workdir=tenants.workdir("gciso_alice"), env={"LD_PRELOAD": str(lib)}).id
    assert ended(a, job).state.value == "succeeded", a.job(job).reason
    uids = {int(p.name.split("-")[2]) for p in proof.iterdir()}
    assert uids == {pwd.getpwnam("gciso_alice").pw_uid}, "the library ran as someone other than the job's user"


# ---- nothing of the head's or another team's is readable --------------------------------------


def test_a_job_reads_neither_the_heads_state_nor_another_teams_files(tenants: Tenants) -> None:
    """Measured before: a job read state.db (every team's commands, --env secrets, token digests
    and the job-token key) and every team's logs and checkpoints."""
    b, a = tenants.bob, tenants.alice
    victim = sh(b, 'echo bob-log-secret; echo bob-ckpt-secret > "$GPUCLUSTER_CHECKPOINT_DIR/ck"; sleep 120',
                tenants.workdir("gciso_bob"), env={"BOB_TOKEN": "bob-env-secret"})  # fmt: skip
    log_shows(b, victim, "bob-log-secret")
    data = tenants.data
    targets = [
        data / "state.db",
        data / "run" / str(victim) / "attempt-1" / "spec.json",  # bob's command and environment
        data / "jobs" / str(victim) / "attempt-1" / "output.log",
        data / "jobs" / str(victim) / "checkpoints" / "ck",
    ]
    script = "".join(f"cat {t} 2>&1; " for t in targets) + f"ls {data} 2>&1; ls {data / 'run'} 2>&1; echo end"
    thief = sh(a, script, tenants.workdir("gciso_alice"))
    assert ended(a, thief).state.value == "succeeded"
    out = a.logs(thief)
    assert out.count("Permission denied") == len(targets) + 2, out
    for secret in ("bob-log-secret", "bob-ckpt-secret", "bob-env-secret", "SQLite format"):
        assert secret not in out
    # Through the API, bob's job is not alice's to read either.
    with pytest.raises(ApiError) as refused:
        a.logs(victim)
    assert refused.value.status in (403, 404) and "bob-log-secret" not in str(refused.value)
    b.cancel(victim)
    ended(b, victim)


def test_the_heads_environment_and_the_shims_command_line_reveal_nothing(tenants: Tenants) -> None:
    """Measured before: jobs inherited the head's whole environment (a database password), and the
    root shim's argv showed every team's full command to every account through `ps`."""
    b = tenants.bob
    marker = "bob-argv-secret-93a1"
    job = sh(b, f"env; sleep 120 # {marker}", tenants.workdir("gciso_bob"))
    out = log_shows(b, job, "GPUCLUSTER_JOB_ID=")
    assert HEAD_SECRET not in out and "GC_HEAD_SECRET" not in out
    assert "LD_PRELOAD" not in out and "GPUCLUSTER_TOKEN=" not in out
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if proc.stat().st_uid == 0 and marker.encode() in (proc / "cmdline").read_bytes():
                pytest.fail(f"a root process shows bob's command: {(proc / 'cmdline').read_bytes()!r}")
    b.cancel(job)
    ended(b, job)


def test_a_workdir_is_entered_as_the_user_not_as_root(tenants: Tenants) -> None:
    """Measured before: --workdir was entered as root before the setuid, so a job read a file
    behind a 0700 root-only directory."""
    private = tenants.root / "root-only"
    (private / "inside").mkdir(parents=True, exist_ok=True)
    os.chmod(private, 0o700)
    os.chmod(private / "inside", 0o755)
    (private / "inside" / "secret").write_text("root-secret\n")
    a = tenants.alice
    job = sh(a, "cat secret", str(private / "inside"))
    final = ended(a, job)
    assert final.state.value == "failed"
    assert f"cannot enter the workdir {private / 'inside'} as gciso_alice" in (final.reason or "")
    assert "root-secret" not in a.logs(job)


def test_a_log_swapped_for_a_link_serves_nothing_of_its_target(tenants: Tenants) -> None:
    """The head reads logs (as root) from a directory the user owns: a link to /etc/shadow, or to
    another team's log, must read as nothing."""
    a = tenants.alice
    log = '"$GPUCLUSTER_CHECKPOINT_DIR/../attempt-1/output.log"'
    script = f"echo before; rm {log}; ln -s /etc/shadow {log}; sleep 120"
    job = sh(a, script, tenants.workdir("gciso_alice"))
    link = tenants.data / "jobs" / str(job) / "attempt-1" / "output.log"
    wait_for(link.is_symlink, timeout=JOB_TIMEOUT_S, what="the job to swap its log for a link")
    assert "root:" not in a.logs(job)
    a.cancel(job)
    ended(a, job)


# ---- processes: every one is the job's, and none outlives it ----------------------------------


def test_a_setsid_child_does_not_outlive_its_job(tenants: Tenants) -> None:
    """Measured before: a job's `setsid` child ran on after the job, on its GPU, unseen."""
    if not detect_cgroups().usable:
        pytest.skip(f"no cgroups here: {detect_cgroups().describe()}")
    a = tenants.alice
    script = "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' & while [ ! -s escaped.pid ]; do sleep 0.05; done"
    workdir = tenants.root / "gciso_alice"
    job = sh(a, script, str(workdir))
    assert ended(a, job).state.value == "succeeded", a.job(job).reason
    escaped = int((workdir / "escaped.pid").read_text())
    wait_for(lambda: not pid_alive(escaped), timeout=JOB_TIMEOUT_S, what="the escaped child to be killed with its job")


def test_the_exit_status_is_kept_when_the_job_deletes_its_own_directory(tenants: Tenants) -> None:
    """Measured before: a job whose attempt dir was removed was recorded `failed: process lost`
    although it exited 0. The exit record is the head's, where no job can touch it."""
    a = tenants.alice
    job = sh(a, 'rm -rf "$GPUCLUSTER_CHECKPOINT_DIR/.."/* ; exit 0', tenants.workdir("gciso_alice"))
    final = ended(a, job)
    assert final.state.value == "succeeded", final.reason


def test_cleanup_signals_no_process_by_a_remembered_number(tmp_path: Path) -> None:
    """Measured before: after a head restart, cleanup killpg'ed a finished job's old process group
    id, and SIGKILLed an unrelated process that had reused it. Now nothing is signalled by a number
    whose owner is not known to be the job: the handle's shim is gone, so a stranger in its old
    group survives both cleanup and a kill."""
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        handle = {"pid": gone.pid, "pgid": stranger.pid, "start_ticks": 1, "run_dir": str(tmp_path)}
        executor = LocalExecutor()
        executor.cleanup(handle)
        executor.signal(handle, signal.SIGKILL)
        time.sleep(0.2)  # a signal, had one been sent, is delivered at once; this only lets it land
        assert stranger.poll() is None, "a process of no job was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_job_opens_only_its_own_gpus(tmp_path: Path) -> None:
    """Measured before: CUDA_VISIBLE_DEVICES was the only fence. Through the executor, a job given
    GPU 1 of 0-2 opens /dev/nvidia1 and nvidiactl, and is refused the others by its device cgroup.
    The device nodes are real (char 195:N, made here); with no driver behind them an open that the
    fence lets through fails ENXIO, one it denies EPERM."""
    support = detect_cgroups()
    if not support.devices:
        pytest.skip(f"no v1 devices controller: {support.describe()}")
    nodes = {}
    for minor in (0, 1, 2, 255):
        path = tmp_path / f"nvidia{minor}"
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        except PermissionError:
            pytest.skip("cannot make device nodes here")
        nodes[minor] = str(path)
    probe = (
        "import errno, os\n"
        f"for minor, path in sorted({nodes!r}.items()):\n"
        "    try:\n        os.close(os.open(path, os.O_RDWR)); print(minor, 'opened')\n"
        "    except OSError as e:\n        print(minor, errno.errorcode[e.errno])\n"
    )
    executor = LocalExecutor(cgroup_support=support, instance="test-fence", gpu_minors={0: 0, 1: 1, 2: 2})
    spec = LaunchSpec(
        job_id=1, attempt=1, argv=[sys.executable, "-c", probe], env={"CUDA_VISIBLE_DEVICES": "1"},
        workdir=str(tmp_path), run_dir=tmp_path / "run", log_path=tmp_path / "job" / "output.log",
    )  # fmt: skip
    handle = executor.launch(spec)
    try:
        wait_for(lambda: not isinstance(executor.poll(handle), Running), timeout=JOB_TIMEOUT_S, what="the probe")
    finally:
        executor.signal(handle, signal.SIGKILL)
        executor.cleanup(handle)
    lines = (tmp_path / "job" / "output.log").read_text().split("\n")
    assert lines[:4] == ["0 EPERM", "1 ENXIO", "2 EPERM", "255 ENXIO"], lines


def test_an_attempt_records_what_its_whole_process_tree_used(tenants: Tenants) -> None:
    """Accounting through the cgroup: CPU of the job and of a child that left its process group,
    and the peak memory, in the ended attempt (`gpucluster show`, GET /v1/jobs/{id})."""
    if not detect_cgroups().usable:
        pytest.skip(f"no cgroups here: {detect_cgroups().describe()}")
    a = tenants.alice
    burn = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    job = sh(a, f"setsid sh -c '{burn}' & {burn}; wait", tenants.workdir("gciso_alice"))
    final = ended(a, job)
    assert final.state.value == "succeeded", final.reason
    (attempt,) = final.attempts
    assert attempt.cpu_s is not None and attempt.cpu_s > 0.2, attempt
    assert attempt.memory_peak_bytes is not None and attempt.memory_peak_bytes > 0, attempt
